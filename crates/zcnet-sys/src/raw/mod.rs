//! One typed forward per syscall (or socket option), with the kernel ABI it needs.

pub mod cmsg;
pub mod cpu;
pub mod epoll;
pub mod ktls;
pub mod signal;
pub mod socket;
pub mod splice;
pub mod udp;
pub mod udp_msg;
pub mod udp_send;
pub mod zcrecv;
pub mod zerocopy;
