//! The only module allowed `unsafe`: raw syscalls and kernel ABI structs that rustix/libc lack.
//!
//! Each public function is a thin, typed forward to one syscall (the rustix style): it takes
//! `BorrowedFd`s, returns `io::Result`, and retries nothing — policy lives above. Constants and
//! structs are carried here because Debian's uapi headers are older than the kernels we run on.
#![allow(unsafe_code)]

pub mod cmsg;
pub mod cow;
pub mod cpu;
pub mod mem;
pub mod netns;
pub mod socket;
pub mod splice;
#[doc(hidden)]
pub mod testing;
pub mod udp;
pub mod udp_msg;
pub mod udp_send;
pub mod uffd;
pub mod uring;
pub mod xsk;
pub mod zcrecv;
pub mod zcrx;
pub mod zerocopy;
