//! Pre-shared-token authentication by challenge and response (HMAC-SHA256, RustCrypto's
//! `hmac` + `sha2`). Each side sends a random 32-byte challenge in its `Hello`; each proves
//! it knows the token by returning `HMAC(token, label ‖ transcript)` with a label per role,
//! so a reflected answer is useless, over the handshake's frames as sent ([`transcript`]:
//! both `Hello`s — so both nonces, the version offered and the version chosen — and the
//! sender's `Open`/`Join`), so a field changed on the way (a lowered version, say) fails the
//! proof (protocol version 8; before it the proofs covered the nonces only). The token never
//! crosses the wire, and answers are compared in constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Which side computes the MAC (each uses its own label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that sends files.
    Sender,
    /// The side that receives them.
    Receiver,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Sender => b"zcnet-v8 sender proof",
            Role::Receiver => b"zcnet-v8 receiver proof",
        }
    }
}

/// A fresh random challenge from the OS.
pub fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(n)
}

/// What both proofs cover: the receiver's `Hello`, the sender's `Hello` and the sender's
/// `Open` or `Join`, each frame whole as encoded (header included), in that order. Every
/// frame has a fixed length here, so the concatenation is unambiguous.
pub fn transcript(receiver_hello: &[u8], sender_hello: &[u8], stream: &[u8]) -> Vec<u8> {
    [receiver_hello, sender_hello, stream].concat()
}

/// What both proofs cover over a TLS channel: the channel's exporter value
/// ([`crate::tls::Channel::binding`]) and then the [`transcript`]. Both ends compute the same
/// value only if they are the two ends of one TLS session, so a party that terminates TLS
/// towards each of them (and relays the handshake frames unchanged) fails the proof.
pub fn bound_transcript(
    binding: &[u8; 32],
    receiver_hello: &[u8],
    sender_hello: &[u8],
    stream: &[u8],
) -> Vec<u8> {
    [
        b"zcnet tls channel ".as_slice(),
        binding,
        receiver_hello,
        sender_hello,
        stream,
    ]
    .concat()
}

fn keyed(token: &[u8], role: Role, transcript: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes keys of any length");
    m.update(role.label());
    m.update(transcript);
    m
}

/// The proof `role` sends over `transcript` ([`transcript`]).
pub fn prove(token: &[u8], role: Role, transcript: &[u8]) -> [u8; 32] {
    keyed(token, role, transcript)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks the proof `role` sent over `transcript`, in constant time.
pub fn verify(token: &[u8], role: Role, transcript: &[u8], mac: &[u8; 32]) -> bool {
    keyed(token, role, transcript).verify_slice(mac).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_token_role_and_transcript() {
        let (r, s) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(r, s, "nonces are random");
        let t = transcript(&r, &s, b"open");
        let p = prove(b"secret", Role::Sender, &t);
        assert!(verify(b"secret", Role::Sender, &t, &p));
        assert!(!verify(b"Secret", Role::Sender, &t, &p));
        assert!(
            !verify(b"secret", Role::Receiver, &t, &p),
            "a reflected proof fails"
        );
        assert!(!verify(
            b"secret",
            Role::Sender,
            &transcript(&s, &r, b"open"),
            &p
        ));
        // Any byte of the handshake changed on the way fails the proof.
        for i in 0..t.len() {
            let mut bent = t.clone();
            bent[i] ^= 1;
            assert!(!verify(b"secret", Role::Sender, &bent, &p), "byte {i}");
        }
        // Bound to a channel, the proof differs from the unbound one and from one bound to
        // another channel.
        let b = bound_transcript(&[1; 32], &r, &s, b"open");
        let pb = prove(b"secret", Role::Sender, &b);
        assert!(verify(b"secret", Role::Sender, &b, &pb));
        assert!(!verify(b"secret", Role::Sender, &t, &pb));
        assert!(!verify(
            b"secret",
            Role::Sender,
            &bound_transcript(&[2; 32], &r, &s, b"open"),
            &pb
        ));
        let mut bad = p;
        bad[0] ^= 1;
        assert!(!verify(b"secret", Role::Sender, &t, &bad));
    }
}
