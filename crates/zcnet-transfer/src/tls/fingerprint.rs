//! A receiver's key as a sender knows it: the SHA-256 of its certificate's subject public
//! key info (the "SPKI" pin of RFC 7469 §2.4), so a certificate re-issued for the same key
//! keeps it, as an ssh host key does.

use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// Why a fingerprint could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// Text that is not a fingerprint.
    #[error("not a key fingerprint: {0:?} (expected SHA256: and 64 hex digits, as the receiver prints it)")]
    Text(String),
    /// A certificate that does not parse.
    #[error("the certificate does not parse: {0}")]
    Certificate(String),
}

/// SHA-256 of a certificate's subject public key info. Displayed as `SHA256:` and 64
/// lowercase hex digits, the stable text form a user copies to `--fingerprint`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER-encoded `SubjectPublicKeyInfo` (the outer `SEQUENCE`
    /// included).
    pub fn of_spki(spki_der: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(spki_der).into())
    }

    /// The fingerprint of the key a DER certificate carries (parsed with rustls's own
    /// parser, `webpki`).
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Result<Fingerprint, FingerprintError> {
        let ee = webpki::EndEntityCert::try_from(cert)
            .map_err(|e| FingerprintError::Certificate(e.to_string()))?;
        Ok(Fingerprint::of_spki(ee.subject_public_key_info().as_ref()))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SHA256:")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Fingerprint {
    type Err = FingerprintError;

    /// Takes the [`Display`](fmt::Display) form; the `SHA256:` prefix is optional, hex
    /// digits may be upper case and pairs separated by `:` (as other tools print them).
    fn from_str(s: &str) -> Result<Fingerprint, FingerprintError> {
        let t = s.trim();
        let t = t
            .strip_prefix("SHA256:")
            .or_else(|| t.strip_prefix("sha256:"))
            .unwrap_or(t);
        let hex: Vec<u8> = t.bytes().filter(|&b| b != b':').collect();
        let bad = || FingerprintError::Text(s.to_string());
        if hex.len() != 64 {
            return Err(bad());
        }
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks(2).enumerate() {
            out[i] = digit(pair[0]).ok_or_else(bad)? << 4 | digit(pair[1]).ok_or_else(bad)?;
        }
        Ok(Fingerprint(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_print_and_parse_in_one_stable_form() {
        let fp = Fingerprint([0xab; 32]);
        let s = fp.to_string();
        assert_eq!(s, format!("SHA256:{}", "ab".repeat(32)));
        assert_eq!(s.parse::<Fingerprint>().unwrap(), fp);
        let upper_colons = format!("sha256:{}", ["AB"; 32].join(":"));
        assert_eq!(upper_colons.parse::<Fingerprint>().unwrap(), fp);
        assert_eq!("ab".repeat(32).parse::<Fingerprint>().unwrap(), fp);
        for bad in ["", "SHA256:ab", &"zz".repeat(32), &"ab".repeat(33)] {
            assert!(bad.parse::<Fingerprint>().is_err(), "{bad}");
        }
    }
}
