//! iperf3's own control protocol (TCP), as `iperf3` 3.x speaks it — the pure half: no
//! sockets, no clocks. The runners in the `zcnet` binary (`zcnet bench -s` / `-c`) drive it.
//!
//! The protocol, read from iperf3's sources (`src/iperf_api.c`, `iperf_server_api.c`,
//! `iperf_client_api.c`, `iperf_tcp.c`):
//!
//! 1. The client connects the control connection and sends a [`Cookie`]: 36 characters and
//!    a NUL ([`cookie`]). Every data connection later opens with the same cookie, which is
//!    how the server knows which test a data connection belongs to.
//! 2. The server drives the test with one-byte [`State`]s ([`state`]): `PARAM_EXCHANGE`
//!    (the client sends its [`TestParams`] as a length-prefixed JSON object, [`frame`],
//!    [`params`]), `CREATE_STREAMS` (the client connects `-P` data connections — twice as
//!    many with `--bidir`, the client's sending ones first), `TEST_START`, `TEST_RUNNING`.
//! 3. The client ends the test (its `-t` timer, or `-n` bytes sent or received) with
//!    `TEST_END`; the server answers `EXCHANGE_RESULTS`, the client sends its [`Results`]
//!    and the server its own ([`results`]); `DISPLAY_RESULTS`, and the client closes with
//!    `IPERF_DONE`.
//!
//! [`output`] builds iperf3's `-J` document (`start`, `intervals`, `end`) and its
//! `--json-stream` events from what a side measured, with zcnet's own figures added under
//! keys iperf3 does not use (`end.zcnet`, `start.zcnet`), never changing iperf3's.

pub mod budget;
pub mod cookie;
pub mod error;
pub mod frame;
pub mod output;
pub mod params;
pub mod results;
pub mod state;
pub mod udp;

pub use cookie::{Cookie, COOKIE_SIZE};
pub use error::Iperf3Error;
pub use params::{Direction, TestParams};
pub use results::{Results, StreamResult};
pub use state::State;

/// iperf3's default port (`-p`).
pub const DEFAULT_PORT: u16 = 5201;

/// iperf3's default TCP block size (`-l`): 128 KiB (`DEFAULT_TCP_BLKSIZE`).
pub const DEFAULT_BLKSIZE: u64 = 128 * 1024;

/// iperf3's default test length (`-t`), seconds.
pub const DEFAULT_SECONDS: u32 = 10;
