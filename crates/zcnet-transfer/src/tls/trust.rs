//! Which receiver a sender trusts: exactly a pinned fingerprint, or the one it saw the first
//! time it met that host (trust on first use, kept in a known-hosts file the caller names,
//! as ssh keeps host keys). There are no certificate authorities: a receiver is a key.
//!
//! [`FingerprintVerifier`] is rustls's `ServerCertVerifier` for this. It still checks the
//! handshake signature with the presented key (so the peer holds the private key), but
//! instead of a chain to a root it compares the key's [`Fingerprint`]. A mismatch ends the
//! handshake with a [`Refusal`] naming both fingerprints; a first meeting is recorded only
//! once the handshake has completed ([`KnownHosts::record`], called by the channel).

use super::error::{Refusal, TlsError};
use super::fingerprint::Fingerprint;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What the sender expects of the receiver's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Exactly this key (`--fingerprint`).
    Pinned(Fingerprint),
    /// The key recorded for `host` in `file`, or, the first time, whatever key the host
    /// presents (recorded once the handshake completes).
    KnownHosts {
        /// The known-hosts file (the caller names it; created mode 0600 on first record).
        file: PathBuf,
        /// How the user named the host (`address:port` as given): the key is per name.
        host: String,
    },
}

/// How a receiver's key came to be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// It is the pinned key.
    Pinned(Fingerprint),
    /// It is the key recorded for the host.
    Known(Fingerprint),
    /// First meeting: the key was recorded in the known-hosts file (an attacker on the path
    /// of this first connection would not be noticed: say so to the user).
    FirstUse(Fingerprint),
}

/// A known-hosts file: one `host fingerprint` per line, `#` comments.
#[derive(Debug, Clone)]
pub struct KnownHosts {
    path: PathBuf,
}

impl KnownHosts {
    /// The file at `path` (it need not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> KnownHosts {
        KnownHosts { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fingerprint recorded for `host` (the last line for it wins).
    pub fn lookup(&self, host: &str) -> Result<Option<Fingerprint>, TlsError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(TlsError::Io {
                    op: format!("reading {}", self.path.display()),
                    source,
                })
            }
        };
        let mut found = None;
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            if let (Some(h), Some(fp)) = (words.next(), words.next()) {
                if h == host {
                    found = Some(fp.parse()?);
                }
            }
        }
        Ok(found)
    }

    /// Appends `host fingerprint` (the file created mode 0600 if missing).
    pub fn record(&self, host: &str, fp: Fingerprint) -> Result<(), TlsError> {
        let io = |source| TlsError::Io {
            op: format!("recording {host} in {}", self.path.display()),
            source,
        };
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(TlsError::BadHost(host.to_string()));
        }
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(io)?;
        f.write_all(format!("{host} {fp}\n").as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io)
    }
}

/// rustls's server-certificate check for [`Expect`]: the handshake signature by the
/// provider's algorithms, the key by its fingerprint.
#[derive(Debug)]
pub struct FingerprintVerifier {
    expect: Expect,
    algorithms: WebPkiSupportedAlgorithms,
    /// The key the receiver presented, once checked.
    seen: Mutex<Option<Fingerprint>>,
}

impl FingerprintVerifier {
    /// A verifier for `expect`, checking signatures with `algorithms` (the provider's).
    pub fn new(expect: Expect, algorithms: WebPkiSupportedAlgorithms) -> Arc<FingerprintVerifier> {
        Arc::new(FingerprintVerifier {
            expect,
            algorithms,
            seen: Mutex::new(None),
        })
    }

    /// After the handshake: how the key came to be trusted, recording a first meeting.
    pub fn settle(&self) -> Result<Trust, TlsError> {
        let fp = self
            .seen
            .lock()
            .expect("not poisoned")
            .ok_or(TlsError::NoPeerKey)?;
        match &self.expect {
            Expect::Pinned(_) => Ok(Trust::Pinned(fp)),
            Expect::KnownHosts { file, host } => {
                let hosts = KnownHosts::new(file);
                match hosts.lookup(host)? {
                    Some(known) if known == fp => Ok(Trust::Known(fp)),
                    Some(known) => Err(TlsError::Refused(Refusal::Changed {
                        host: host.clone(),
                        known,
                        presented: fp,
                        file: file.clone(),
                    })),
                    None => {
                        hosts.record(host, fp)?;
                        Ok(Trust::FirstUse(fp))
                    }
                }
            }
        }
    }

    fn check(&self, fp: Fingerprint) -> Result<(), TlsError> {
        match &self.expect {
            Expect::Pinned(expected) if *expected == fp => Ok(()),
            Expect::Pinned(expected) => Err(TlsError::Refused(Refusal::Pinned {
                expected: *expected,
                presented: fp,
            })),
            Expect::KnownHosts { file, host } => match KnownHosts::new(file).lookup(host)? {
                Some(known) if known != fp => Err(TlsError::Refused(Refusal::Changed {
                    host: host.clone(),
                    known,
                    presented: fp,
                    file: file.clone(),
                })),
                _ => Ok(()),
            },
        }
    }
}

/// A [`TlsError`] carried through rustls (which ends the handshake with a `certificate_unknown`
/// alert) and taken back out by the channel.
fn through_rustls(e: TlsError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

impl ServerCertVerifier for FingerprintVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let fp = Fingerprint::of_certificate(end_entity).map_err(|e| through_rustls(e.into()))?;
        self.check(fp).map_err(through_rustls)?;
        *self.seen.lock().expect("not poisoned") = Some(fp);
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // The config offers TLS 1.3 only.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hosts_record_and_look_up_per_host() {
        let dir = tempfile::tempdir().unwrap();
        let kh = KnownHosts::new(dir.path().join("known_hosts"));
        assert_eq!(kh.lookup("a:1").unwrap(), None);
        kh.record("a:1", Fingerprint([1; 32])).unwrap();
        kh.record("b:2", Fingerprint([2; 32])).unwrap();
        assert_eq!(kh.lookup("a:1").unwrap(), Some(Fingerprint([1; 32])));
        assert_eq!(kh.lookup("b:2").unwrap(), Some(Fingerprint([2; 32])));
        assert_eq!(kh.lookup("a:2").unwrap(), None);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(kh.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(
            kh.record("a b", Fingerprint([1; 32])),
            Err(TlsError::BadHost(_))
        ));
    }

    #[test]
    fn a_changed_key_names_both_fingerprints_and_the_file() {
        let e = Refusal::Changed {
            host: "h:1".into(),
            known: Fingerprint([1; 32]),
            presented: Fingerprint([2; 32]),
            file: "/x/known".into(),
        }
        .to_string();
        for want in [
            "HAS CHANGED",
            &Fingerprint([1; 32]).to_string(),
            &Fingerprint([2; 32]).to_string(),
            "/x/known",
        ] {
            assert!(e.contains(want), "{want} missing from {e}");
        }
    }
}
