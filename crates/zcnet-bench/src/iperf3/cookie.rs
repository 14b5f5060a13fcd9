//! The cookie: 36 characters and a NUL that open the control connection and every data
//! connection of one test (`make_cookie` in iperf3's `iperf_api.c`; `COOKIE_SIZE` = 37).

use super::error::Iperf3Error;

/// Bytes on the wire: 36 characters and the terminating NUL.
pub const COOKIE_SIZE: usize = 37;

/// iperf3's alphabet for cookies (base32's lower-case letters and digits).
const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// One test's cookie.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cookie([u8; COOKIE_SIZE]);

impl Cookie {
    /// A cookie from 36 random bytes (the caller's randomness; iperf3 uses `random()`).
    pub fn from_random(r: &[u8; COOKIE_SIZE - 1]) -> Cookie {
        let mut c = [0u8; COOKIE_SIZE];
        for (d, s) in c.iter_mut().zip(r) {
            *d = ALPHABET[usize::from(s % 32)];
        }
        Cookie(c)
    }

    /// The 37 bytes a peer sent. iperf3 itself compares cookies with `strcmp` and checks
    /// nothing else; we also insist on printable characters and the NUL, so a stranger (a
    /// zcnet bench `--client`, whose frames begin with a zero length byte, or a browser) is
    /// named for what it is instead of parked as a test nobody will finish.
    pub fn parse(b: &[u8; COOKIE_SIZE]) -> Result<Cookie, Iperf3Error> {
        let body = &b[..COOKIE_SIZE - 1];
        if b[COOKIE_SIZE - 1] != 0 || !body.iter().all(|c| (0x21..0x7f).contains(c)) {
            let shown: String = b
                .iter()
                .take(8)
                .map(|c| format!("{c:02x}"))
                .collect::<Vec<_>>()
                .join(" ");
            return Err(Iperf3Error::BadCookie(format!("first bytes {shown}")));
        }
        Ok(Cookie(*b))
    }

    /// The bytes to send.
    pub fn as_bytes(&self) -> &[u8; COOKIE_SIZE] {
        &self.0
    }

    /// The 36 characters (what iperf3's `-J` shows as `start.cookie`).
    pub fn as_str(&self) -> &str {
        // parse and from_random admit only printable ASCII before the NUL.
        std::str::from_utf8(&self.0[..COOKIE_SIZE - 1]).unwrap_or("")
    }
}

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cookie({})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_map_into_the_alphabet_and_round_trip() {
        let mut r = [0u8; 36];
        for (i, b) in r.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        let c = Cookie::from_random(&r);
        assert_eq!(c.as_str().len(), 36);
        assert!(c.as_str().bytes().all(|b| ALPHABET.contains(&b)));
        assert_eq!(c.as_bytes()[36], 0);
        assert_eq!(Cookie::parse(c.as_bytes()).unwrap(), c);
    }

    #[test]
    fn a_real_iperf3_cookie_parses() {
        let mut b = [0u8; 37];
        b[..36].copy_from_slice(b"22bwfuyp7bmo5lfvmzgebpi5o7ngpnibenaf");
        assert_eq!(
            Cookie::parse(&b).unwrap().as_str(),
            "22bwfuyp7bmo5lfvmzgebpi5o7ngpnibenaf"
        );
    }

    #[test]
    fn strangers_are_refused() {
        // A zcnet bench frame: a big-endian length starting with zero bytes.
        let mut b = [0u8; 37];
        b[3] = 40;
        b[4] = b'{';
        assert!(matches!(Cookie::parse(&b), Err(Iperf3Error::BadCookie(_))));
        // No NUL at the end.
        let b = [b'a'; 37];
        assert!(Cookie::parse(&b).is_err());
        // A control character inside.
        let mut b = [b'a'; 37];
        b[36] = 0;
        b[5] = b'\n';
        assert!(Cookie::parse(&b).is_err());
    }
}
