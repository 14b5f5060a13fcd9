//! Kernel writes into pages still in flight. The protection is user-mode only
//! (`UFFD_USER_MODE_ONLY`, see `zcnet::cow`): a `read` or `recv` into a buffer whose
//! earlier contents a zero-copy send still reads fails with `EFAULT` instead of taking
//! the copy-on-write. A program that reads into the buffer it just sent (`socat`, any
//! read-then-write relay) does exactly that, so such a receive goes into scratch memory and
//! is copied in by user-mode writes, which the engine resolves. The same holds for `pread`
//! from a file (nginx without sendfile reads the next chunk into the buffer it just sent).

use crate::globals::{count_detour, zc_ever};
use crate::table::known;
use zcnet_sys::preload::{RecvCall, SysResult};

/// Receives `call` into the program's buffers, or through scratch if any is protected.
pub fn recv(mut call: RecvCall<'_>) -> SysResult {
    if !zc_ever() || !call.bufs().iter().any(|b| zcnet::cow::is_protected(b)) {
        return call.forward();
    }
    let total: usize = call.bufs().iter().map(|b| b.len()).sum();
    let mut scratch = vec![0u8; total];
    let n = call.forward_into(&mut scratch)?;
    // A count beyond the buffers (MSG_TRUNC on a datagram socket) copies what fits.
    let mut left = &scratch[..n.min(total)];
    for b in call.bufs_mut() {
        if left.is_empty() {
            break;
        }
        let k = b.len().min(left.len());
        b[..k].copy_from_slice(&left[..k]);
        left = &left[k..];
    }
    count_detour();
    if let Some(s) = known(call.fd()) {
        s.counters.detour();
    }
    Ok(n)
}
