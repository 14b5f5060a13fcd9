//! Pre-shared-token authentication by challenge and response (HMAC-SHA256, RustCrypto's
//! `hmac` + `sha2`). Each side sends a random 32-byte challenge in its `Hello`; each proves
//! it knows the token by returning `HMAC(token, label ‖ receiver_nonce ‖ sender_nonce)` with
//! a label per role, so a reflected answer is useless. The token never crosses the wire,
//! and answers are compared in constant time.

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
            Role::Sender => b"zcnet-v1 sender proof",
            Role::Receiver => b"zcnet-v1 receiver proof",
        }
    }
}

/// A fresh random challenge from the OS.
pub fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(n)
}

fn keyed(
    token: &[u8],
    role: Role,
    receiver_nonce: &[u8; 32],
    sender_nonce: &[u8; 32],
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes keys of any length");
    m.update(role.label());
    m.update(receiver_nonce);
    m.update(sender_nonce);
    m
}

/// The proof `role` sends.
pub fn prove(
    token: &[u8],
    role: Role,
    receiver_nonce: &[u8; 32],
    sender_nonce: &[u8; 32],
) -> [u8; 32] {
    keyed(token, role, receiver_nonce, sender_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks the proof `role` sent, in constant time.
pub fn verify(
    token: &[u8],
    role: Role,
    receiver_nonce: &[u8; 32],
    sender_nonce: &[u8; 32],
    mac: &[u8; 32],
) -> bool {
    keyed(token, role, receiver_nonce, sender_nonce)
        .verify_slice(mac)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_token_role_and_nonces() {
        let (r, s) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(r, s, "nonces are random");
        let p = prove(b"secret", Role::Sender, &r, &s);
        assert!(verify(b"secret", Role::Sender, &r, &s, &p));
        assert!(!verify(b"Secret", Role::Sender, &r, &s, &p));
        assert!(
            !verify(b"secret", Role::Receiver, &r, &s, &p),
            "a reflected proof fails"
        );
        assert!(!verify(b"secret", Role::Sender, &s, &r, &p));
        let mut bad = p;
        bad[0] ^= 1;
        assert!(!verify(b"secret", Role::Sender, &r, &s, &bad));
    }
}
