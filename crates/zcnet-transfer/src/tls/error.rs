//! Why a TLS channel failed, and why a sender refused a receiver's key.

use super::fingerprint::{Fingerprint, FingerprintError};
use std::path::PathBuf;

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
    /// Not a fingerprint, or a certificate whose key cannot be read.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
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
    /// The peer's first bytes are not TLS: a zcnet without encryption (an older version, or
    /// one run with plaintext), or another program.
    #[error("the peer does not speak TLS ({0}): it may be an older zcnet or one running in plaintext, which this end does not accept")]
    NotTls(rustls::Error),
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

/// Why a sender refused a receiver's key: the loud message, with both fingerprints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The key is not the pinned one.
    #[error("the receiver's key is not the pinned one: expected {expected}, the receiver presented {presented}; refusing to send (someone may be intercepting the connection, or the receiver has a new key: check it there)")]
    Pinned {
        /// The pinned fingerprint.
        expected: Fingerprint,
        /// The receiver's.
        presented: Fingerprint,
    },
    /// The host presented another key than the one recorded for it.
    #[error("WARNING: THE RECEIVER'S KEY FOR {host} HAS CHANGED. It was {known} and is now {presented}. Someone may be intercepting the connection (a man in the middle), or the receiver's key was replaced. Refusing to send. If the change is expected, remove the line for {host} from {file} (or pin the new key with --fingerprint).")]
    Changed {
        /// The host's name as given.
        host: String,
        /// The fingerprint recorded.
        known: Fingerprint,
        /// The fingerprint presented now.
        presented: Fingerprint,
        /// The known-hosts file.
        file: PathBuf,
    },
}
