//! The bookkeeping of `MSG_ZEROCOPY` completions, shared by every sender that uses it (the
//! `zerocopy` and `cow` transmit paths, and `zcnet-msg`'s UDP sender).
//!
//! * `completion` — pure: which calls the kernel still references, which loans are free.
//! * `reap` — the socket half: wait for the error queue, drain it, apply each notification.
//!
//! Mechanism: kernel `Documentation/networking/msg_zerocopy.rst` ("Notification Reception").

pub(crate) mod completion;
pub(crate) mod reap;

pub use completion::{Completed, Completions};
pub use reap::reap_each;
