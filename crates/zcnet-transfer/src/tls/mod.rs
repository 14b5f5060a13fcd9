//! TLS 1.3 for transfers (issue 45), with rustls and its `ring` provider: the receiver is
//! the TLS server and is known by its key ([`identity`]); the sender is the client and
//! trusts exactly a pinned fingerprint or the key it recorded for the host ([`trust`]).
//! [`Channel`] is the blocking connection; [`SealedSender`] encrypts into the loan buffers
//! a zero-copy `zcnet::Sender` sends ([`loan`]); [`ktls`] hands the keys to the kernel
//! where it has the `tls` module.
//!
//! The token is bound to the channel: both ends mix [`Channel::binding`] (an RFC 8446 §7.5
//! exporter value, equal at both ends only if they share one TLS session) into the proofs
//! of the transfer handshake ([`crate::auth::bound_transcript`],
//! [`crate::handshake::ReceiverHandshake::bound_to_channel`]), so an attacker who terminates
//! TLS on both sides — two sessions, two exporter values — fails the proof even when it
//! relays every handshake frame unchanged.
//!
//! Only TLS 1.3 is offered (rustls's `tls12` feature is off), with rustls's three TLS 1.3
//! suites: AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305. No session tickets or early data:
//! every connection is a full handshake, so the exporter binds a fresh key exchange.

pub mod channel;
pub mod identity;
pub mod ktls;
pub mod loan;
pub mod trust;

pub use channel::Channel;
pub use identity::{Fingerprint, Identity};
pub use loan::SealedSender;
pub use trust::{Expect, KnownHosts, Refusal, Trust};

use std::path::PathBuf;
use std::sync::Arc;

/// The RFC 8446 §7.5 exporter label of the token binding (`EXPORTER-` prefixed, as RFC
/// 5705 §4 asks of new labels).
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-zcnet-transfer-token-binding";
/// Bytes of the exported binding value.
pub const BINDING_LEN: usize = 32;
/// The server name the sender gives rustls. Receivers are known by key, not by name, and
/// SNI is off, so this never reaches the wire.
const SERVER_NAME: &str = "zcnet";

/// Why a TLS channel failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A system call or file failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An identity (key pair, certificate) that cannot be used.
    #[error("TLS identity{}: {reason}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Identity {
        /// The file, if any.
        path: Option<PathBuf>,
        /// What is wrong.
        reason: String,
    },
    /// A private key file others may read.
    #[error("the private key file {} has mode {mode:04o}: group and others must not read it (chmod 600 it)", path.display())]
    KeyPermissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Not a fingerprint.
    #[error("not a key fingerprint: {0:?} (expected SHA256: and 64 hex digits, as the receiver prints it)")]
    BadFingerprint(String),
    /// A host name a known-hosts line cannot hold.
    #[error("a host name for the known-hosts file cannot be empty or hold spaces: {0:?}")]
    BadHost(String),
    /// The sender refused the receiver's key.
    #[error("{0}")]
    Refused(Refusal),
    /// The receiver presented no key (cannot happen after a completed handshake).
    #[error("the receiver presented no certificate")]
    NoPeerKey,
    /// A record failed its authentication check: bytes were changed on the way.
    #[error("a TLS record failed its integrity check, so bytes were changed on the way (or the peer is not the one that did the handshake); the connection is dropped: {0}")]
    Tampered(rustls::Error),
    /// The peer ended the session with an alert (its own check failed, or it refused us).
    #[error("the peer ended the TLS session with the alert {0:?} (it refused our key or our bytes, or detected tampering)")]
    PeerAlert(rustls::AlertDescription),
    /// The connection ended without the peer's `close_notify`: what arrived may be cut short.
    #[error("the connection ended without TLS close_notify: the data may have been cut short on the way")]
    Truncated,
    /// The connection ended during the handshake.
    #[error("the connection ended during the TLS handshake (is the peer a zcnet of this version, with encryption on?)")]
    HandshakeEof,
    /// Any other TLS failure.
    #[error("TLS: {0}")]
    Tls(rustls::Error),
}

impl TlsError {
    /// Sorts a rustls error into what it means for the user.
    pub(crate) fn from_rustls(e: rustls::Error) -> TlsError {
        use rustls::{CertificateError, Error as E};
        match e {
            E::DecryptError => TlsError::Tampered(e),
            E::AlertReceived(a) => TlsError::PeerAlert(a),
            E::InvalidCertificate(CertificateError::Other(ref o)) => {
                match o.0.downcast_ref::<TlsError>() {
                    Some(TlsError::Refused(r)) => TlsError::Refused(r.clone()),
                    _ => TlsError::Tls(e),
                }
            }
            e => TlsError::Tls(e),
        }
    }

    /// An I/O error from rustls's `read_tls`/`write_tls` or the socket.
    pub(crate) fn io(op: &str, source: std::io::Error) -> TlsError {
        match source
            .get_ref()
            .and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            Some(e) => TlsError::from_rustls(e.clone()),
            None => TlsError::Io {
                op: op.to_string(),
                source,
            },
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The sender's (client's) TLS configuration for `expect`, offering `suites` (all three
/// TLS 1.3 suites when empty; tests and measurements pin one); the verifier is returned
/// too, to settle trust after the handshake.
pub fn client_config(
    expect: Expect,
    suites: &[rustls::CipherSuite],
) -> Result<(Arc<rustls::ClientConfig>, Arc<trust::FingerprintVerifier>), TlsError> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !suites.is_empty() {
        provider
            .cipher_suites
            .retain(|s| suites.contains(&s.suite()));
    }
    let provider = Arc::new(provider);
    let verifier =
        trust::FingerprintVerifier::new(expect, provider.signature_verification_algorithms);
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    cfg.enable_sni = false;
    cfg.enable_secret_extraction = true;
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok((Arc::new(cfg), verifier))
}

/// The receiver's (server's) TLS configuration with `identity`.
pub fn server_config(identity: &Identity) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Tls)?
        .with_no_client_auth()
        .with_single_cert(vec![identity.certificate().clone()], identity.key())
        .map_err(|e| TlsError::Identity {
            path: None,
            reason: format!("rustls refused the key and certificate: {e}"),
        })?;
    cfg.enable_secret_extraction = true;
    // No tickets: no post-handshake message a kernel taking over the keys would have to
    // parse, and nothing to resume from.
    cfg.send_tls13_tickets = 0;
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(cfg))
}
