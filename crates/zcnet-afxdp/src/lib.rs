//! zcnet-afxdp: AF_XDP sockets, and Lightweight Messages over them — whole UDP messages
//! whose payload the application writes once and the receiver reads in place. A transport
//! of its own beside zcnet's TCP and UDP paths: it takes zcnet's [`zcnet::Stats`] and
//! [`zcnet::FallbackReason`] to count its bytes and fallbacks as every other path does,
//! and nothing else of the core; a user of `zcnet::Sender` compiles none of it (no aya, no
//! XDP loader).
//!
//! ```no_run
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use std::time::Duration;
//! use zcnet_afxdp::{LmConfig, LmError, LmEvent, LmSocket};
//!
//! const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
//! const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
//!
//! /// On host A: a message of 100 kB to B; returns its number.
//! fn send() -> Result<u32, LmError> {
//!     let mut tx = LmSocket::open(LmConfig::new(SocketAddrV4::new(A, 7710)))?;
//!     println!("{:?}", tx.notes()); // why a fast path is not in use, if one is not
//!     let mut buf = tx.loan(100_000)?; // the transmit region, with header holes
//!     buf.copy_from(&[7u8; 100_000]); // or write_at, fragments_mut: written once
//!     buf.send(SocketAddrV4::new(B, 7710)) // admission, headers, frames last-first
//! }
//!
//! /// On host B: the next message, read in place.
//! fn receive() -> Result<(), LmError> {
//!     let mut rx = LmSocket::open(LmConfig::new(SocketAddrV4::new(B, 7710)))?;
//!     match rx.recv(Duration::from_secs(5))? {
//!         Some(LmEvent::Message(m)) => println!("{}: {} bytes, in place {}", m.id, m.len(), m.in_place),
//!         Some(LmEvent::Lost(l)) => println!("{} lost: {:?}", l.id, l.reason),
//!         None => println!("nothing within 5 s"),
//!     }
//!     println!("{:?}\n{}", rx.stats(), rx.io_stats().snapshot()); // messages; bytes, fallbacks
//!     Ok(())
//! }
//! # fn main() { let _ = (send, receive); }
//! ```
//!
//! # Lightweight Messages
//!
//! Jin, Zhang, Tan, "Lightweight Messages" ([`guide`]). A message of up to
//! [`LmConfig::max_message`] bytes goes from one [`LmSocket`] to another with its payload
//! written once, by the application, and never moved by user space again:
//!
//! * **Application-level fragmentation** (§3.1). [`LmSocket::loan`] lends a transmit region
//!   of the UMEM laid out as frames: a header hole, a fragment's payload, the next hole...
//!   The application writes the payload into it ([`LmBuf::write_at`],
//!   [`LmBuf::fragments_mut`]); [`LmBuf::send`] fills the holes with Ethernet, IPv4, UDP and
//!   LM headers and puts the frames on the XSK TX ring, **last fragment first**.
//! * **Admission control** (§3.3). Before any fragment, the sender asks (`LM_REQ`) and the
//!   receiver answers `LM_ACQ_OK` with a token, or `LM_ACQ_REJ` while it assembles another
//!   sender's message; a rejected sender backs off and asks again. The receiver's XDP program
//!   (`bpf/lm.c`) lets through only the admitted sender's frames, in order, so a second
//!   sender can never interleave. `LM_ENDME` says the last fragment is out.
//! * **Driver-level defragmentation** (§3.2). On admission the receiver posts one FILL chunk
//!   per fragment, last fragment first, at addresses chosen so that each frame's payload
//!   lands right in front of the previous arrival's, over its headers. When the last frame
//!   (fragment 0) is in, the message is one contiguous slice of the UMEM, handed to the
//!   application in place by [`LmSocket::recv`].
//!
//! What the paper did not need: a lost fragment leaves FILL chunks posted, so the next
//! admission asks its sender for one PAD frame per leftover chunk ahead of its fragments;
//! and a message is delivered only if every one of its fragment slots was filled in order,
//! so loss or reordering is a lost message ([`LmEvent::Lost`]), never wrong bytes.
//!
//! **Fallbacks, counted** ([`zcnet::FallbackReason`] in [`LmSocket::io_stats`]): on a
//! driver without XSK zero-copy (veth, here) the socket binds in copy mode and the kernel
//! copies each frame between its skb and the UMEM (`xsk_copy_mode`); without AF_XDP at all
//! (program refused, bind or attach refused, queue taken by another socket) the same frames
//! go through the kernel's UDP socket and are assembled by copying (`xsk_unavailable`). The
//! wire format ([`wire`]) is the same, so either end may fall back alone.
//!
//! # AF_XDP sockets
//!
//! The ground under LM, usable alone: [`XskSocket`] is the safe layer over
//! [`zcnet_sys::xsk`], which owns the UMEM and keeps the ledger of what the kernel holds.
//!
//! * [`XskSocket`] — one socket with its own UMEM of [`XskConfig::frame_count`] frames;
//!   [`XskSocket::bind`] to an interface queue in a [`BindMode`] (zero-copy refused → copy,
//!   with the errno kept in the [`Binding`]).
//! * [`RxFrame`] — a received frame, borrowed in place from the UMEM; dropping it posts its
//!   chunk back on the FILL ring. [`TxFrame`] — a free frame to write a packet into.
//! * [`RedirectProgram`] — the XDP program that steers frames to the socket, attached in an
//!   [`AttachMode`].
//! * [`wire::udp`] — Ethernet/IPv4/UDP headers for what arrives and what leaves.
//!
//! A socket, its bind and the program's attach act in the network namespace of the thread
//! that calls them. A socket needs `CAP_NET_RAW`, a program `CAP_BPF` and `CAP_NET_ADMIN`
//! (root has them); without them an [`LmSocket`] takes the kernel's UDP path and says so in
//! [`LmSocket::notes`]. The XDP programs are compiled from `bpf/*.c` and committed: building
//! this crate needs no clang.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod lm;
mod program;
pub mod wire;
mod xsk;

pub use lm::{
    LmBuf, LmConfig, LmError, LmEvent, LmLost, LmMessage, LmProgram, LmSocket, LmStats, LossReason,
    Progress,
};
pub use program::{AttachMode, RedirectProgram};
pub use xsk::{
    BindMode, Binding, Placed, RxFrame, TxFrame, XskConfig, XskError, XskSocket, XskStatistics,
};

/// `docs/lm-afxdp.md`: Lightweight Messages over AF_XDP — the crates chosen and why, the
/// socket layer, the XDP programs, the protocol, what was measured.
#[cfg(not(doctest))]
#[doc = include_str!("../docs/lm-afxdp.md")]
pub mod guide {}
