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
pub mod config;
pub mod error;
pub mod fingerprint;
pub mod identity;
pub mod ktls;
pub mod link;
pub mod loan;
pub mod trust;

pub use channel::Channel;
pub use config::{client_config, server_config};
pub use error::{Refusal, TlsError};
pub use fingerprint::{Fingerprint, FingerprintError};
pub use identity::Identity;
pub use link::TlsLink;
pub use loan::SealedSender;
pub use trust::{Expect, KnownHosts, Trust};

/// The RFC 8446 §7.5 exporter label of the token binding (`EXPORTER-` prefixed, as RFC
/// 5705 §4 asks of new labels).
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-zcnet-transfer-token-binding";
/// Bytes of the exported binding value.
pub const BINDING_LEN: usize = 32;
/// The server name the sender gives rustls. Receivers are known by key, not by name, and
/// SNI is off, so this never reaches the wire.
pub(crate) const SERVER_NAME: &str = "zcnet";
