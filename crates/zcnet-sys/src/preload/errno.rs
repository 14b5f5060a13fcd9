//! A C call's result, as the interposer and the C library's forwards both speak it.

/// An `errno` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's `errno` now.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

/// A C call's result: a count, or `-1` with `errno`.
pub type SysResult = Result<usize, Errno>;
