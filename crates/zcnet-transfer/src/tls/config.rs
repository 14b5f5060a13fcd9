//! The rustls configurations of both ends: TLS 1.3 only, the `ring` provider, no tickets,
//! secrets extractable (for kTLS).

use super::error::TlsError;
use super::identity::Identity;
use super::trust::{self, Expect};
use std::sync::Arc;

/// rustls's `ring` provider with AES-128-GCM first: ring lists AES-256-GCM first, whose 14
/// rounds cost about 40 % more per byte than AES-128's 10 for no protection a transfer
/// needs (both are TLS 1.3's own suites); the peer's order is followed, and both ends put
/// AES-128-GCM first.
fn provider() -> rustls::crypto::CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    p
}

/// The sender's (client's) TLS configuration for `expect`, offering `suites` (all three
/// TLS 1.3 suites when empty; tests and measurements pin one); the verifier is returned
/// too, to settle trust after the handshake.
pub fn client_config(
    expect: Expect,
    suites: &[rustls::CipherSuite],
) -> Result<(Arc<rustls::ClientConfig>, Arc<trust::FingerprintVerifier>), TlsError> {
    let mut provider = provider();
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
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
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
