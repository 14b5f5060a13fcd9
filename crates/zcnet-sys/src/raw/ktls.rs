//! Kernel TLS (`Documentation/networking/tls.rst`): after a userspace TLS 1.3 handshake the
//! connection's traffic keys are handed to the kernel, which then encrypts what is written
//! to the socket (`TLS_TX`) and decrypts what is read (`TLS_RX`), so `sendfile`/`splice` keep
//! moving file data without it passing through user space.
//!
//! Three steps, each one socket option: attach the `tls` upper-layer protocol to a
//! connected TCP socket ([`attach_ulp`], `TCP_ULP "tls"`), then give it each direction's
//! key, IV and record sequence number ([`set_keys`], `SOL_TLS`/`TLS_TX` or `TLS_RX` with a
//! `tls12_crypto_info_*` struct). Not every kernel has the `tls` module: the kernel answers
//! `TCP_ULP` with `ENOENT` when it is missing (and `/proc/sys/net/ipv4/tcp_available_ulp`
//! does not list it), which [`KtlsError`] names as a typed reason so the caller can count
//! the fallback.
//!
//! The crypto-info structs are our own copies of `linux/tls.h` (uapi), TLS 1.3 only, for the
//! three ciphers rustls negotiates: AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SOL_TLS` (linux/socket.h).
pub const SOL_TLS: i32 = 282;
/// `TCP_ULP` (linux/tcp.h): attach an upper-layer protocol to a TCP connection.
pub const TCP_ULP: i32 = 31;
/// `TLS_TX` (linux/tls.h): the transmit direction's keys.
pub const TLS_TX: i32 = 1;
/// `TLS_RX` (linux/tls.h): the receive direction's keys.
pub const TLS_RX: i32 = 2;
/// `TLS_1_3_VERSION` (linux/tls.h): 0x0304.
pub const TLS_1_3_VERSION: u16 = 0x0304;
/// `TLS_CIPHER_AES_GCM_128`.
pub const TLS_CIPHER_AES_GCM_128: u16 = 51;
/// `TLS_CIPHER_AES_GCM_256`.
pub const TLS_CIPHER_AES_GCM_256: u16 = 52;
/// `TLS_CIPHER_CHACHA20_POLY1305`.
pub const TLS_CIPHER_CHACHA20_POLY1305: u16 = 54;
/// Where the kernel lists the upper-layer protocols it has loaded.
pub const AVAILABLE_ULP: &str = "/proc/sys/net/ipv4/tcp_available_ulp";

/// `struct tls_crypto_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CryptoInfoHeader {
    /// `version`: [`TLS_1_3_VERSION`].
    pub version: u16,
    /// `cipher_type`: one of the `TLS_CIPHER_*` values.
    pub cipher_type: u16,
}

/// `struct tls12_crypto_info_aes_gcm_128` (the name is the kernel's; TLS 1.3 uses it too).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AesGcm128 {
    /// `info`.
    pub info: CryptoInfoHeader,
    /// `iv`: the last 8 bytes of the TLS 1.3 per-direction IV.
    pub iv: [u8; 8],
    /// `key`.
    pub key: [u8; 16],
    /// `salt`: the first 4 bytes of the IV.
    pub salt: [u8; 4],
    /// `rec_seq`: the next record's sequence number, big-endian.
    pub rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_aes_gcm_256`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AesGcm256 {
    /// `info`.
    pub info: CryptoInfoHeader,
    /// `iv`: the last 8 bytes of the IV.
    pub iv: [u8; 8],
    /// `key`.
    pub key: [u8; 32],
    /// `salt`: the first 4 bytes of the IV.
    pub salt: [u8; 4],
    /// `rec_seq`, big-endian.
    pub rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_chacha20_poly1305` (no salt: the whole 12-byte IV is `iv`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chacha20Poly1305 {
    /// `info`.
    pub info: CryptoInfoHeader,
    /// `iv`: the whole IV.
    pub iv: [u8; 12],
    /// `key`.
    pub key: [u8; 32],
    /// `rec_seq`, big-endian.
    pub rec_seq: [u8; 8],
}

/// One direction's TLS 1.3 traffic keys, as the kernel takes them.
#[derive(Clone, PartialEq, Eq)]
pub enum CryptoInfo {
    /// `TLS_AES_128_GCM_SHA256`.
    AesGcm128(AesGcm128),
    /// `TLS_AES_256_GCM_SHA384`.
    AesGcm256(AesGcm256),
    /// `TLS_CHACHA20_POLY1305_SHA256`.
    Chacha20Poly1305(Chacha20Poly1305),
}

impl std::fmt::Debug for CryptoInfo {
    /// Names the cipher only: the struct holds a traffic key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CryptoInfo({})", self.cipher_name())
    }
}

fn header(cipher_type: u16) -> CryptoInfoHeader {
    CryptoInfoHeader {
        version: TLS_1_3_VERSION,
        cipher_type,
    }
}

impl CryptoInfo {
    /// AES-128-GCM from a TLS 1.3 traffic key, its 12-byte IV and the next record's
    /// sequence number (RFC 8446 §5.3: the nonce is the IV XOR the sequence number; the
    /// kernel keeps the IV split as a 4-byte salt and 8 bytes).
    pub fn aes_gcm_128(key: [u8; 16], iv: [u8; 12], seq: u64) -> CryptoInfo {
        CryptoInfo::AesGcm128(AesGcm128 {
            info: header(TLS_CIPHER_AES_GCM_128),
            iv: iv[4..].try_into().expect("8 bytes"),
            key,
            salt: iv[..4].try_into().expect("4 bytes"),
            rec_seq: seq.to_be_bytes(),
        })
    }

    /// AES-256-GCM, as [`Self::aes_gcm_128`].
    pub fn aes_gcm_256(key: [u8; 32], iv: [u8; 12], seq: u64) -> CryptoInfo {
        CryptoInfo::AesGcm256(AesGcm256 {
            info: header(TLS_CIPHER_AES_GCM_256),
            iv: iv[4..].try_into().expect("8 bytes"),
            key,
            salt: iv[..4].try_into().expect("4 bytes"),
            rec_seq: seq.to_be_bytes(),
        })
    }

    /// ChaCha20-Poly1305, as [`Self::aes_gcm_128`].
    pub fn chacha20_poly1305(key: [u8; 32], iv: [u8; 12], seq: u64) -> CryptoInfo {
        CryptoInfo::Chacha20Poly1305(Chacha20Poly1305 {
            info: header(TLS_CIPHER_CHACHA20_POLY1305),
            iv,
            key,
            rec_seq: seq.to_be_bytes(),
        })
    }

    /// The cipher's name, for messages.
    pub fn cipher_name(&self) -> &'static str {
        match self {
            CryptoInfo::AesGcm128(_) => "AES-128-GCM",
            CryptoInfo::AesGcm256(_) => "AES-256-GCM",
            CryptoInfo::Chacha20Poly1305(_) => "ChaCha20-Poly1305",
        }
    }

    /// The struct's address and size, as `setsockopt` takes them.
    fn raw(&self) -> (*const libc::c_void, libc::socklen_t) {
        fn of<T>(v: &T) -> (*const libc::c_void, libc::socklen_t) {
            (
                (v as *const T).cast(),
                std::mem::size_of::<T>() as libc::socklen_t,
            )
        }
        match self {
            CryptoInfo::AesGcm128(v) => of(v),
            CryptoInfo::AesGcm256(v) => of(v),
            CryptoInfo::Chacha20Poly1305(v) => of(v),
        }
    }
}

/// A direction of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// What this end sends (`TLS_TX`).
    Tx,
    /// What this end receives (`TLS_RX`).
    Rx,
}

impl Direction {
    fn optname(self) -> i32 {
        match self {
            Direction::Tx => TLS_TX,
            Direction::Rx => TLS_RX,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Direction::Tx => "TLS_TX",
            Direction::Rx => "TLS_RX",
        }
    }
}

/// Why kTLS could not be set up. Every variant but [`KtlsError::Os`] means "not here": the
/// caller falls back to userspace TLS and counts the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KtlsError {
    /// `TCP_ULP "tls"` answered `ENOENT`: the kernel has no `tls` module (not built, or not
    /// loadable here).
    #[error("kTLS unavailable: the kernel has no `tls` upper-layer protocol (TCP_ULP answered ENOENT; tcp_available_ulp: {available})")]
    NoModule {
        /// What `/proc/sys/net/ipv4/tcp_available_ulp` lists (or why it could not be read).
        available: String,
    },
    /// `TCP_ULP` itself is unknown (`ENOPROTOOPT`): a kernel built without upper-layer
    /// protocols.
    #[error("kTLS unavailable: the kernel does not know TCP_ULP ({errno})")]
    NoUlp {
        /// The errno's name.
        errno: &'static str,
    },
    /// The socket is not a connected TCP socket (`ENOTCONN`), or has another upper-layer
    /// protocol already (`EEXIST`).
    #[error("kTLS unavailable on this socket: TCP_ULP answered {errno}")]
    Socket {
        /// The errno's name.
        errno: &'static str,
    },
    /// The kernel has the module but refused this cipher's keys (`EINVAL`, `ENOPROTOOPT`,
    /// `EBUSY`: a kernel too old for TLS 1.3 or this cipher, or keys set twice).
    #[error("kTLS unavailable: the kernel refused {dir} keys for TLS 1.3 {cipher} ({errno})")]
    Cipher {
        /// `TLS_TX` or `TLS_RX`.
        dir: &'static str,
        /// The cipher.
        cipher: &'static str,
        /// The errno's name.
        errno: &'static str,
    },
    /// Any other failure of the call.
    #[error("kTLS setup failed: {0}")]
    Os(#[source] io::Error),
}

fn errno_name(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOENT) => "ENOENT",
        Some(libc::ENOPROTOOPT) => "ENOPROTOOPT",
        Some(libc::ENOTCONN) => "ENOTCONN",
        Some(libc::EEXIST) => "EEXIST",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::EBUSY) => "EBUSY",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        _ => "another errno",
    }
}

/// What `TCP_ULP "tls"` failing with `e` means (pure: the mapping is tested without a kernel
/// that has each answer). `available` is read only when the answer is `ENOENT`.
pub fn classify_ulp_error(e: io::Error, available: impl FnOnce() -> String) -> KtlsError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => KtlsError::NoModule {
            available: available(),
        },
        Some(libc::ENOPROTOOPT) => KtlsError::NoUlp {
            errno: errno_name(&e),
        },
        Some(libc::ENOTCONN | libc::EEXIST | libc::EOPNOTSUPP) => KtlsError::Socket {
            errno: errno_name(&e),
        },
        _ => KtlsError::Os(e),
    }
}

/// What `SOL_TLS`/`TLS_TX`/`TLS_RX` failing with `e` means.
pub fn classify_key_error(e: io::Error, dir: Direction, info: &CryptoInfo) -> KtlsError {
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOPROTOOPT | libc::EBUSY | libc::EOPNOTSUPP) => {
            KtlsError::Cipher {
                dir: dir.name(),
                cipher: info.cipher_name(),
                errno: errno_name(&e),
            }
        }
        _ => KtlsError::Os(e),
    }
}

/// The upper-layer protocols the kernel has now (`tcp_available_ulp`, space-separated).
pub fn available_ulps() -> io::Result<String> {
    std::fs::read_to_string(AVAILABLE_ULP).map(|s| s.trim().to_string())
}

fn available_text() -> String {
    match available_ulps() {
        Ok(s) if s.is_empty() => "none".into(),
        Ok(s) => s,
        Err(e) => format!("unreadable: {e}"),
    }
}

/// `setsockopt(fd, SOL_TCP, TCP_ULP, "tls")`: makes a connected TCP socket a kTLS socket
/// (it still moves plaintext until [`set_keys`]). Loads the `tls` module if the kernel can.
pub fn attach_ulp(fd: BorrowedFd<'_>) -> Result<(), KtlsError> {
    const NAME: &[u8] = b"tls";
    // SAFETY: `fd` is a live descriptor (borrowed for this call); the option value is
    // `NAME`'s 3 bytes, valid for the call's duration, and the kernel only reads them (it
    // copies at most the given length, and takes a name without a trailing NUL).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_TCP,
            TCP_ULP,
            NAME.as_ptr().cast(),
            NAME.len() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(classify_ulp_error(
            io::Error::last_os_error(),
            available_text,
        ));
    }
    Ok(())
}

/// `setsockopt(fd, SOL_TLS, TLS_TX or TLS_RX, info)`: from now on the kernel encrypts (Tx) or
/// decrypts (Rx) this socket's records with `info`'s key, starting at its sequence number.
/// Call [`attach_ulp`] first. The caller must have sent (Tx) or read (Rx) every byte of the
/// userspace TLS stream up to the record `info` starts at.
pub fn set_keys(fd: BorrowedFd<'_>, dir: Direction, info: &CryptoInfo) -> Result<(), KtlsError> {
    let (ptr, len) = info.raw();
    // SAFETY: `fd` is a live descriptor; `ptr`/`len` are the address and exact size of a
    // `#[repr(C)]` struct laid out as the kernel's `tls12_crypto_info_*` (checked in this
    // module's tests), borrowed from `info` for the call's duration and only read by the
    // kernel, which copies it.
    let r = unsafe { libc::setsockopt(fd.as_raw_fd(), SOL_TLS, dir.optname(), ptr, len) };
    if r < 0 {
        return Err(classify_key_error(io::Error::last_os_error(), dir, info));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    /// Sizes and offsets of `linux/tls.h` (uapi): the header's field sizes, packed with no
    /// padding (every member is a `__u16` or a byte array).
    #[test]
    fn crypto_info_layouts_are_the_kernels() {
        assert_eq!(size_of::<CryptoInfoHeader>(), 4);
        assert_eq!(size_of::<AesGcm128>(), 4 + 8 + 16 + 4 + 8);
        assert_eq!(
            (
                offset_of!(AesGcm128, iv),
                offset_of!(AesGcm128, key),
                offset_of!(AesGcm128, salt),
                offset_of!(AesGcm128, rec_seq)
            ),
            (4, 12, 28, 32)
        );
        assert_eq!(size_of::<AesGcm256>(), 4 + 8 + 32 + 4 + 8);
        assert_eq!(
            (
                offset_of!(AesGcm256, iv),
                offset_of!(AesGcm256, key),
                offset_of!(AesGcm256, salt),
                offset_of!(AesGcm256, rec_seq)
            ),
            (4, 12, 44, 48)
        );
        assert_eq!(size_of::<Chacha20Poly1305>(), 4 + 12 + 32 + 8);
        assert_eq!(
            (
                offset_of!(Chacha20Poly1305, iv),
                offset_of!(Chacha20Poly1305, key),
                offset_of!(Chacha20Poly1305, rec_seq)
            ),
            (4, 16, 48)
        );
        // And the libc crate's copies of the same structs agree.
        assert_eq!(
            size_of::<AesGcm128>(),
            size_of::<libc::tls12_crypto_info_aes_gcm_128>()
        );
        assert_eq!(
            size_of::<AesGcm256>(),
            size_of::<libc::tls12_crypto_info_aes_gcm_256>()
        );
        assert_eq!(
            size_of::<Chacha20Poly1305>(),
            size_of::<libc::tls12_crypto_info_chacha20_poly1305>()
        );
        assert_eq!(
            (SOL_TLS, TLS_TX, TLS_RX),
            (libc::SOL_TLS, libc::TLS_TX, libc::TLS_RX)
        );
    }

    #[test]
    fn the_iv_is_split_into_salt_and_iv_and_the_sequence_is_big_endian() {
        let iv: [u8; 12] = std::array::from_fn(|i| i as u8 + 1);
        let CryptoInfo::AesGcm128(a) = CryptoInfo::aes_gcm_128([7; 16], iv, 0x0102) else {
            panic!()
        };
        assert_eq!(a.info, header(TLS_CIPHER_AES_GCM_128));
        assert_eq!(a.salt, [1, 2, 3, 4]);
        assert_eq!(a.iv, [5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(a.rec_seq, [0, 0, 0, 0, 0, 0, 1, 2]);
        let CryptoInfo::AesGcm256(b) = CryptoInfo::aes_gcm_256([7; 32], iv, 3) else {
            panic!()
        };
        assert_eq!((b.salt, b.info.cipher_type), ([1, 2, 3, 4], 52));
        let CryptoInfo::Chacha20Poly1305(c) = CryptoInfo::chacha20_poly1305([7; 32], iv, 3) else {
            panic!()
        };
        assert_eq!((c.iv, c.info.cipher_type), (iv, 54));
        assert_eq!(c.info.version, 0x0304);
        // Debug never prints the key.
        let d = format!("{:?}", CryptoInfo::aes_gcm_128([0xab; 16], iv, 0));
        assert!(!d.contains("171") && !d.contains("ab"), "{d}");
    }

    #[test]
    fn errnos_map_to_reasons() {
        let e = classify_ulp_error(io::Error::from_raw_os_error(libc::ENOENT), || {
            "mptcp".into()
        });
        assert!(matches!(&e, KtlsError::NoModule { available } if available == "mptcp"));
        assert_eq!(
            e.to_string(),
            "kTLS unavailable: the kernel has no `tls` upper-layer protocol (TCP_ULP answered ENOENT; tcp_available_ulp: mptcp)"
        );
        let e = classify_ulp_error(io::Error::from_raw_os_error(libc::ENOPROTOOPT), || {
            unreachable!("read only for ENOENT")
        });
        assert!(matches!(
            e,
            KtlsError::NoUlp {
                errno: "ENOPROTOOPT"
            }
        ));
        let e = classify_ulp_error(io::Error::from_raw_os_error(libc::ENOTCONN), String::new);
        assert!(matches!(e, KtlsError::Socket { errno: "ENOTCONN" }));
        let e = classify_ulp_error(io::Error::from_raw_os_error(libc::EIO), String::new);
        assert!(matches!(e, KtlsError::Os(_)));
        let info = CryptoInfo::aes_gcm_256([0; 32], [0; 12], 0);
        let e = classify_key_error(
            io::Error::from_raw_os_error(libc::EINVAL),
            Direction::Rx,
            &info,
        );
        assert_eq!(
            e.to_string(),
            "kTLS unavailable: the kernel refused TLS_RX keys for TLS 1.3 AES-256-GCM (EINVAL)"
        );
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// The real kernel's answer on a connected loopback pair: where `tls` is not listed in
    /// `tcp_available_ulp` (and root cannot load it) the answer is the typed "no module"
    /// reason naming what is listed; where it is, the socket becomes a kTLS socket and takes
    /// keys for each cipher, and a second attach is refused.
    #[test]
    fn attaching_tls_gives_the_kernels_answer() {
        let (c, _s) = pair();
        match attach_ulp(c.as_fd()) {
            Err(KtlsError::NoModule { available }) => {
                let listed = available_ulps().unwrap_or_default();
                assert!(
                    !listed.split_whitespace().any(|u| u == "tls"),
                    "ENOENT although tcp_available_ulp lists tls: {listed}"
                );
                assert_eq!(available, if listed.is_empty() { "none" } else { &listed });
            }
            Ok(()) => {
                let infos = [
                    CryptoInfo::aes_gcm_128([1; 16], [2; 12], 0),
                    CryptoInfo::aes_gcm_256([1; 32], [2; 12], 0),
                    CryptoInfo::chacha20_poly1305([1; 32], [2; 12], 0),
                ];
                set_keys(c.as_fd(), Direction::Tx, &infos[0]).unwrap();
                set_keys(c.as_fd(), Direction::Rx, &infos[0]).unwrap();
                for info in &infos[1..] {
                    let (c, _s) = pair();
                    attach_ulp(c.as_fd()).unwrap();
                    match set_keys(c.as_fd(), Direction::Tx, info) {
                        Ok(()) | Err(KtlsError::Cipher { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                assert!(matches!(
                    attach_ulp(c.as_fd()),
                    Err(KtlsError::Socket { errno: "EEXIST" })
                ));
            }
            Err(e) => panic!("unexpected answer to TCP_ULP tls: {e}"),
        }
        // Keys without the ULP: SOL_TLS is unknown to a plain TCP socket.
        let (c, _s) = pair();
        let e = set_keys(
            c.as_fd(),
            Direction::Tx,
            &CryptoInfo::aes_gcm_128([0; 16], [0; 12], 0),
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                KtlsError::Cipher {
                    errno: "ENOPROTOOPT",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn an_unconnected_socket_is_refused() {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        match attach_ulp(s.as_fd()) {
            // Without the module the kernel fails the lookup before it looks at the socket.
            Err(KtlsError::NoModule { .. }) | Err(KtlsError::Socket { errno: "ENOTCONN" }) => {}
            other => panic!("{other:?}"),
        }
    }
}
