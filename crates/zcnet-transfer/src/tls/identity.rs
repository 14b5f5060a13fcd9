//! The receiver's key pair and certificate. A receiver is known by its key's
//! [`Fingerprint`]. The key pair is generated on
//! first use ([`Identity::load_or_generate`], ECDSA P-256 with `rcgen`) into a directory the
//! caller names — the library picks no path of its own — as one PEM file of mode 0600 that
//! holds the private key and a self-signed certificate.

use super::error::TlsError;
use super::fingerprint::Fingerprint;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A receiver's private key and certificate.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    fingerprint: Fingerprint,
}

impl fmt::Debug for Identity {
    /// The fingerprint only: the key is secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.fingerprint)
    }
}

impl Identity {
    /// The file [`Identity::load_or_generate`] keeps in its directory.
    pub const FILE: &'static str = "tls-identity.pem";

    /// A fresh key pair and a self-signed certificate for it, in memory only.
    pub fn generate() -> Result<Identity, TlsError> {
        let ck = rcgen::generate_simple_self_signed(vec!["zcnet".to_string()]).map_err(|e| {
            TlsError::Identity {
                path: None,
                reason: format!("generating a key pair: {e}"),
            }
        })?;
        let pem = format!("{}{}", ck.signing_key.serialize_pem(), ck.cert.pem());
        Identity::from_pem(pem.as_bytes(), None)
    }

    /// The identity kept in `dir` (its [`Identity::FILE`]), generated there on first use:
    /// the directory is created (mode 0700) if missing, the file written with mode 0600 and
    /// published only whole (linked into place, never over another's). Returns whether it
    /// was created now. A key file readable by group or others is refused, as ssh refuses
    /// an unprotected private key.
    pub fn load_or_generate(dir: &Path) -> Result<(Identity, bool), TlsError> {
        let path = dir.join(Identity::FILE);
        match Identity::from_file(&path) {
            Ok(id) => return Ok((id, false)),
            Err(TlsError::Io { ref source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let io = |op: &str, p: &Path| {
            let op = format!("{op} {}", p.display());
            move |source| TlsError::Io { op, source }
        };
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io("creating", dir))?;
        }
        let ck = rcgen::generate_simple_self_signed(vec!["zcnet".to_string()]).map_err(|e| {
            TlsError::Identity {
                path: Some(path.clone()),
                reason: format!("generating a key pair: {e}"),
            }
        })?;
        let pem = format!("{}{}", ck.signing_key.serialize_pem(), ck.cert.pem());
        let tmp = dir.join(format!(
            ".{}.{:016x}.tmp",
            Identity::FILE,
            u64::from_ne_bytes(
                crate::auth::nonce().map_err(io("random for", dir))?[..8]
                    .try_into()
                    .expect("8")
            )
        ));
        let written = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(pem.as_bytes())?;
            f.sync_all()
        })();
        written.map_err(io("writing", &tmp))?;
        // A link fails where a file is already: two first uses at once keep one identity.
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok((Identity::from_pem(pem.as_bytes(), Some(&path))?, true)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok((Identity::from_file(&path)?, false))
            }
            Err(e) => Err(TlsError::Io {
                op: format!("publishing {}", path.display()),
                source: e,
            }),
        }
    }

    /// An identity from one PEM file holding a private key and a certificate (the first of
    /// each), refused if group or others may read it.
    pub fn from_file(path: &Path) -> Result<Identity, TlsError> {
        let meta = fs::metadata(path).map_err(|source| TlsError::Io {
            op: format!("reading {}", path.display()),
            source,
        })?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TlsError::KeyPermissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let bytes = fs::read(path).map_err(|source| TlsError::Io {
            op: format!("reading {}", path.display()),
            source,
        })?;
        Identity::from_pem(&bytes, Some(path))
    }

    /// An identity from a certificate file and a key file (`--tls-cert`/`--tls-key`); the
    /// key file is held to mode 0600 or stricter like [`Identity::from_file`].
    pub fn from_files(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
        let key_only = Identity::from_file(key).err();
        let key_pem = match key_only {
            // A key file holds no certificate: that is expected here.
            None | Some(TlsError::Identity { .. }) => fs::read(key),
            Some(e) => return Err(e),
        }
        .map_err(|source| TlsError::Io {
            op: format!("reading {}", key.display()),
            source,
        })?;
        let cert_pem = fs::read(cert).map_err(|source| TlsError::Io {
            op: format!("reading {}", cert.display()),
            source,
        })?;
        Identity::from_pem(&[key_pem, cert_pem].concat(), Some(cert))
    }

    fn from_pem(pem: &[u8], path: Option<&Path>) -> Result<Identity, TlsError> {
        let bad = |reason: String| TlsError::Identity {
            path: path.map(Path::to_path_buf),
            reason,
        };
        let key =
            PrivateKeyDer::from_pem_slice(pem).map_err(|e| bad(format!("no private key: {e}")))?;
        let cert =
            CertificateDer::from_pem_slice(pem).map_err(|e| bad(format!("no certificate: {e}")))?;
        let fingerprint = Fingerprint::of_certificate(&cert).map_err(|e| bad(e.to_string()))?;
        Ok(Identity {
            cert,
            key,
            fingerprint,
        })
    }

    /// What a sender pins.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The certificate (DER).
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    pub(super) fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }

    /// Where [`Identity::load_or_generate`] keeps the identity of `dir`.
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(Identity::FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_generated_once_with_mode_0600_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("state/zcnet");
        let (a, created) = Identity::load_or_generate(&home).unwrap();
        assert!(created);
        let meta = fs::metadata(Identity::path_in(&home)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(&home).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let (b, created) = Identity::load_or_generate(&home).unwrap();
        assert!(!created);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.certificate(), b.certificate());
        // Nothing else is left in the directory (no temporary file).
        assert_eq!(fs::read_dir(&home).unwrap().count(), 1);
        // Another directory, another key.
        let (c, _) = Identity::load_or_generate(&dir.path().join("other")).unwrap();
        assert_ne!(a.fingerprint(), c.fingerprint());
        // The fingerprint is the certificate's key's.
        assert_eq!(
            Fingerprint::of_certificate(a.certificate()).unwrap(),
            a.fingerprint()
        );
    }

    #[test]
    fn a_key_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        Identity::load_or_generate(dir.path()).unwrap();
        let path = Identity::path_in(dir.path());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = Identity::load_or_generate(dir.path()).unwrap_err();
        assert!(
            matches!(e, TlsError::KeyPermissions { mode: 0o644, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("0644"), "{e}");
    }

    #[test]
    fn separate_certificate_and_key_files_load() {
        let dir = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["x".to_string()]).unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        fs::write(&cert, ck.cert.pem()).unwrap();
        fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        let id = Identity::from_files(&cert, &key).unwrap();
        assert_eq!(
            id.fingerprint(),
            Fingerprint::of_spki(&rcgen::PublicKeyData::subject_public_key_info(
                &ck.signing_key
            ))
        );
    }
}
