//! The control protocol between `zcnet bench --client` and `zcnet bench --server`, in the
//! manner of iperf3's control channel: one TCP connection per run carries the parameters,
//! the server's accept or reject (with a reason), and at the end each side's measurements;
//! the data itself moves on `streams` separate connections.
//!
//! Framing: a 4-byte big-endian length, then that many bytes of one JSON object. Every
//! object carries the protocol version under the key `"zcnet_bench"`, which doubles as the
//! magic: a peer that is not zcnet (an iperf3 client on the wrong port, a port scanner) is
//! told so rather than misparsed, and a peer of another version is named with its version
//! before anything else is read — new fields never reach an old parser. Frames are capped
//! at [`MAX_FRAME`] so a stranger cannot make us allocate gigabytes.
//!
//! The conversation:
//!
//! ```text
//! client                                   server
//!   Hello{params}          ─────────────▶  validate (known paths, sane numbers)
//!                          ◀─────────────  Accept{data_port} | Reject{reason}
//!   N data connections     ═════════════▶  N receivers (echo back in rr)
//!   Done{client's report}  ─────────────▶
//!                          ◀─────────────  Result{server's report} | Error{reason}
//! ```
//!
//! A UDP message run (`--proto udp`, `zcnet_msg`) opens with
//! `HelloUdp{params, udp}` instead; the data port is then a UDP port, and while messages flow
//! the server sends `Ack{resolved}` (messages delivered or reported lost so far) on the
//! control connection: UDP has no flow control of its own, and the client keeps a window of
//! unacknowledged messages so that a run measures CPU per delivered byte rather than drops.
//!
//! Everything here is pure or generic over `Read`/`Write`, so it is tested without sockets.

use super::report::{Mode, SideReport};
pub use crate::refusal::Refusal;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// The protocol version this build speaks. Bump on any change to the messages.
/// 2: UDP message runs (`hello_udp`, `ack`) and message counts in the side reports.
pub const PROTOCOL_VERSION: u32 = 2;
/// Key of the version field, present in every frame.
pub const VERSION_KEY: &str = "zcnet_bench";
/// Largest frame accepted.
pub const MAX_FRAME: usize = 1 << 20;
/// The server's default control port (iperf3 uses 5201).
pub const DEFAULT_PORT: u16 = 5301;

/// Most concurrent data connections one run may ask for.
pub const MAX_STREAMS: u32 = 64;
/// Most buffers per connection.
pub const MAX_RING: u32 = 4096;
/// Largest send size.
pub const MAX_SIZE: u64 = 1 << 30;
/// Most memory the buffers of one run may take on the server (`streams × ring × size`).
pub const MAX_RUN_MEMORY: u64 = 4 << 30;
/// Longest run, seconds.
pub const MAX_SECONDS: f64 = 24.0 * 3600.0;
/// Largest message of a UDP message run: reassembly reserves a message's whole length, and
/// the server holds a window of them.
pub const MAX_UDP_MESSAGE: u64 = 16 << 20;
/// Transmit paths of a UDP message run: how `zcnet_msg::MsgSender` sends a loaned buffer
/// — `plain` one datagram per `sendmsg`, copied (the baseline: GSO off); `copy` GSO batches,
/// copied; `zerocopy` GSO batches with `MSG_ZEROCOPY`; `uring` GSO batches by io_uring
/// `SEND_ZC` from the registered pool (`MsgTx::Uring`) — or `lm`: Lightweight Messages over
/// AF_XDP (`zcnet_afxdp`), which pairs only with receive path `lm`.
pub const UDP_TX: [&str; 5] = ["plain", "copy", "zerocopy", "uring", "lm"];
/// Receive paths of a UDP message run: `gro` is `MsgReceiver` with `UDP_GRO` (up to 64 KiB
/// of datagrams per read), `copy` the same with GRO off (one datagram per read), `lm` an
/// `LmSocket` assembling in place in its UMEM (with transmit path `lm` only).
pub const UDP_RX: [&str; 3] = ["copy", "gro", "lm"];

/// Whether a UDP transmit and receive path can meet: `lm` is a transport of its own (its
/// frames carry an LM header and need an admitting receiver), so it pairs only with itself.
pub fn udp_paths_pair(tx: &str, rx: &str) -> bool {
    (tx == "lm") == (rx == "lm")
}

/// The transport a run's data takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    /// Byte streams over TCP (`zcnet::Sender`/`Receiver`).
    #[default]
    Tcp,
    /// Whole messages over UDP (`zcnet_msg`).
    Udp,
}

impl Proto {
    /// JSON/CLI name (the report's `transport`).
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// What a UDP message run needs beyond [`Params`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdpParams {
    /// `rr`: the client's UDP port for replies, on the control connection's client address
    /// (the client's request socket is connected to the server's data port, so replies
    /// come to a socket of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_port: Option<u16>,
}

/// A hello the server accepted: the parameters, and for a UDP message run its extras.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    /// The parameters.
    pub params: Params,
    /// `Some` for a UDP message run.
    pub udp: Option<UdpParams>,
}

impl RunRequest {
    /// The run's transport.
    pub fn proto(&self) -> Proto {
        if self.udp.is_some() {
            Proto::Udp
        } else {
            Proto::Tcp
        }
    }
}

/// How long a run goes on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// Total payload bytes over all streams (`rr`: request bytes).
    Bytes(u64),
    /// Seconds of sending.
    Seconds(f64),
}

/// What the client asks the server to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Stream or request/response.
    pub mode: Mode,
    /// Transmit path (the client's; in `rr` the server's responses take it too).
    pub tx: String,
    /// Receive path (the server's; in `rr` the client's too).
    pub rx: String,
    /// Bytes per send, and per request and response in `rr`.
    pub size: u64,
    /// Data connections.
    pub streams: u32,
    /// Buffers in rotation per connection.
    pub ring: u32,
    /// Write every word before sending, read every word after receiving.
    pub touch: bool,
    /// When the run ends.
    pub limit: Limit,
    /// Bytes the receiver asks for per receive call (netperf's `-M`); `None`: as many as
    /// the sender writes, at least 256 KiB. Stream runs over TCP only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<u64>,
}

impl Params {
    /// Checks the numbers and that the paths this side must run are ones it knows
    /// (`known_tx`/`known_rx` are this build's path names). The server runs the receive
    /// path, and in `rr` the transmit path too; a transmit path it does not know is the
    /// client's business in a stream run.
    pub fn validate(&self, known_tx: &[&str], known_rx: &[&str]) -> Result<(), Refusal> {
        self.check_against(known_tx, known_rx).map_err(Refusal)
    }

    fn check_against(&self, known_tx: &[&str], known_rx: &[&str]) -> Result<(), String> {
        let list = |v: &[&str]| v.join(", ");
        if !known_rx.contains(&self.rx.as_str()) {
            return Err(format!(
                "unknown receive path {:?} on this server (it knows: {})",
                self.rx,
                list(known_rx)
            ));
        }
        if self.mode == Mode::Rr && !known_tx.contains(&self.tx.as_str()) {
            return Err(format!(
                "unknown transmit path {:?} on this server, needed for rr responses (it knows: {})",
                self.tx,
                list(known_tx)
            ));
        }
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(format!(
                "size {} out of range (1 ..= {MAX_SIZE} bytes)",
                self.size
            ));
        }
        if self.streams == 0 || self.streams > MAX_STREAMS {
            return Err(format!(
                "streams {} out of range (1 ..= {MAX_STREAMS})",
                self.streams
            ));
        }
        if self.ring == 0 || self.ring > MAX_RING {
            return Err(format!(
                "ring {} out of range (1 ..= {MAX_RING})",
                self.ring
            ));
        }
        let memory = u64::from(self.streams)
            .saturating_mul(u64::from(self.ring))
            .saturating_mul(self.size);
        if self.mode == Mode::Rr && memory > MAX_RUN_MEMORY {
            return Err(format!(
                "streams × ring × size = {memory} bytes of buffers exceeds {MAX_RUN_MEMORY}"
            ));
        }
        if let Some(r) = self.read {
            if r == 0 || r > MAX_SIZE {
                return Err(format!(
                    "read size {r} out of range (1 ..= {MAX_SIZE} bytes)"
                ));
            }
            if self.mode == Mode::Rr {
                return Err("a read size applies to stream runs (rr reads whole responses)".into());
            }
        }
        match self.limit {
            Limit::Bytes(0) => return Err("byte count must be at least 1".into()),
            Limit::Seconds(s) if !(s > 0.0 && s <= MAX_SECONDS) => {
                return Err(format!("time {s} s out of range (0 < t <= {MAX_SECONDS})"))
            }
            _ => {}
        }
        Ok(())
    }

    /// The limits a UDP message run adds to [`Params::validate`]: one sender per run (the
    /// receiver checks every id of one session), messages of at most [`MAX_UDP_MESSAGE`].
    pub fn udp_limits(&self) -> Result<(), Refusal> {
        self.check_udp_limits().map_err(Refusal)
    }

    fn check_udp_limits(&self) -> Result<(), String> {
        if self.streams != 1 {
            return Err(format!(
                "a UDP message run has one sender (streams 1), not {}",
                self.streams
            ));
        }
        if self.read.is_some() {
            return Err("a read size applies to TCP streams (UDP reads whole messages)".into());
        }
        if self.size > MAX_UDP_MESSAGE {
            return Err(format!(
                "message size {} out of range for UDP (1 ..= {MAX_UDP_MESSAGE} bytes)",
                self.size
            ));
        }
        Ok(())
    }

    /// Validates a UDP message run: the paths against [`UDP_TX`] and [`UDP_RX`] (both ends
    /// run both in `rr`; the sender's path is checked in a stream run too, since there is
    /// no other), the numbers, [`Params::udp_limits`], and a reply port for `rr`.
    pub fn validate_udp(&self, udp: &UdpParams) -> Result<(), Refusal> {
        self.check_udp(udp).map_err(Refusal)
    }

    fn check_udp(&self, udp: &UdpParams) -> Result<(), String> {
        if !UDP_TX.contains(&self.tx.as_str()) {
            return Err(format!(
                "transmit path {:?} is not a UDP message path (UDP knows: {})",
                self.tx,
                UDP_TX.join(", ")
            ));
        }
        if !UDP_RX.contains(&self.rx.as_str()) {
            return Err(format!(
                "receive path {:?} is not a UDP message path (UDP knows: {})",
                self.rx,
                UDP_RX.join(", ")
            ));
        }
        if !udp_paths_pair(&self.tx, &self.rx) {
            return Err(format!(
                "{}→{}: lm is a transport of its own and pairs only with lm (--tx lm --rx lm)",
                self.tx, self.rx
            ));
        }
        self.check_against(&UDP_TX, &UDP_RX)?;
        self.check_udp_limits()?;
        if self.mode == Mode::Rr && udp.reply_port.is_none_or(|p| p == 0) {
            return Err("a UDP rr run needs the client's reply port".into());
        }
        Ok(())
    }
}

/// Bytes between id stamps in a UDP run's message ([`MessagePattern`]).
pub const STAMP_EVERY: usize = 1024;
/// Bytes of one stamp.
pub const STAMP_LEN: usize = 8;
/// Key bit of a reply's stamps in a UDP `rr` run: a reply to request `id` is keyed
/// `id | REPLY_KEY`, so a server that echoes the request does not pass.
pub const REPLY_KEY: u64 = 1 << 63;

/// The bytes of every message of a UDP message run (both ends must agree on them, so they
/// are part of the protocol): a pseudo-random reference of `size` bytes with the
/// message's key stamped over the first [`STAMP_LEN`] bytes of every [`STAMP_EVERY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessagePattern {
    reference: Vec<u8>,
}

impl MessagePattern {
    /// The pattern of `size`-byte messages.
    pub fn new(size: usize) -> MessagePattern {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ size as u64;
        let mut reference = Vec::with_capacity(size + 8);
        while reference.len() < size {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            reference.extend_from_slice(&x.to_le_bytes());
        }
        reference.truncate(size);
        MessagePattern { reference }
    }

    /// The message size.
    pub fn len(&self) -> usize {
        self.reference.len()
    }

    /// Whether messages are empty (never, in a run: sizes start at 1).
    pub fn is_empty(&self) -> bool {
        self.reference.is_empty()
    }

    /// The bytes every message shares outside its stamps: what a sender writes into a
    /// buffer once.
    pub fn reference(&self) -> &[u8] {
        &self.reference
    }

    /// The stamp of `key` in block `block`: splitmix64's finaliser, so every bit of the key
    /// (the reply bit too) changes every byte of the stamp — a 1-byte reply differs from
    /// its request.
    fn stamp(key: u64, block: usize) -> [u8; STAMP_LEN] {
        let z = key
            .wrapping_add((block as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
            .wrapping_add(crate::mix::GAMMA);
        crate::mix::finalise(z).to_le_bytes()
    }

    /// `(offset, length)` of every stamp.
    fn stamp_slots(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let len = self.len();
        (0..len)
            .step_by(STAMP_EVERY)
            .map(move |o| (o, STAMP_LEN.min(len - o)))
    }

    /// Message `key`'s stamps: `(offset, bytes, length)`, the first `length` bytes written
    /// at `offset` (the last stamp of a message may be cut short by its end).
    pub fn stamps(&self, key: u64) -> impl Iterator<Item = (usize, [u8; STAMP_LEN], usize)> + '_ {
        self.stamp_slots()
            .enumerate()
            .map(move |(k, (o, n))| (o, Self::stamp(key, k), n))
    }

    /// Message `key`'s bytes.
    pub fn expected(&self, key: u64) -> Vec<u8> {
        let mut v = self.reference.clone();
        for (o, stamp, n) in self.stamps(key) {
            v[o..o + n].copy_from_slice(&stamp[..n]);
        }
        v
    }

    /// Whether `data` is message `key`, every byte.
    pub fn matches(&self, data: &[u8], key: u64) -> bool {
        data.len() == self.len()
            && self.stamps(key).all(|(o, stamp, n)| {
                let end = (o + STAMP_EVERY).min(self.len());
                data[o..o + n] == stamp[..n] && data[o + n..end] == self.reference[o + n..end]
            })
    }

    /// Checks `data` against message `key`; the error names the first byte that differs.
    pub fn check(&self, data: &[u8], key: u64) -> Result<(), Refusal> {
        self.first_difference(data, key).map_err(Refusal)
    }

    fn first_difference(&self, data: &[u8], key: u64) -> Result<(), String> {
        if data.len() != self.len() {
            return Err(format!(
                "{} bytes where {} were sent",
                data.len(),
                self.len()
            ));
        }
        if self.matches(data, key) {
            return Ok(());
        }
        let at = data
            .iter()
            .zip(self.expected(key))
            .position(|(a, b)| *a != b)
            .unwrap_or(0);
        Err(format!("differs at byte {at} of {}", self.len()))
    }
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Client → server: the run it wants.
    Hello {
        /// The parameters.
        params: Params,
    },
    /// Client → server: a UDP message run it wants (`--proto udp`).
    HelloUdp {
        /// The parameters (`tx` from [`UDP_TX`], `rx` from [`UDP_RX`]).
        params: Params,
        /// What a UDP run needs besides.
        udp: UdpParams,
    },
    /// Server → client, during a UDP message run: this many of the client's messages are
    /// resolved (delivered, or reported lost). The client's flow-control window.
    Ack {
        /// Messages delivered or reported lost so far.
        resolved: u64,
    },
    /// Server → client: go ahead, data connections to this port.
    Accept {
        /// Port of the data listener (same address as the control connection).
        data_port: u16,
    },
    /// Server → client: not this run, and why.
    Reject {
        /// Human-readable reason.
        reason: String,
    },
    /// Client → server: the client's data phase is over; its measurements.
    Done {
        /// The client's side.
        report: SideReport,
    },
    /// Server → client: the server's measurements.
    Result {
        /// The server's side.
        report: SideReport,
    },
    /// Either way: the run failed on this side.
    Error {
        /// Human-readable reason.
        reason: String,
    },
}

impl Message {
    /// The message's type name, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::HelloUdp { .. } => "hello_udp",
            Message::Ack { .. } => "ack",
            Message::Accept { .. } => "accept",
            Message::Reject { .. } => "reject",
            Message::Done { .. } => "done",
            Message::Result { .. } => "result",
            Message::Error { .. } => "error",
        }
    }
}

/// Why a control exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The connection failed.
    #[error("control connection: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection where a message was due.
    #[error("the peer closed the control connection")]
    Closed,
    /// A length prefix beyond [`MAX_FRAME`]: not a zcnet peer, or a broken one.
    #[error("the peer sent a {0}-byte frame (limit {MAX_FRAME}): it does not speak the zcnet bench protocol")]
    FrameTooLarge(u64),
    /// Valid framing but no version key.
    #[error(
        "the peer does not speak the zcnet bench protocol (no \"{VERSION_KEY}\" version field)"
    )]
    NotZcnet,
    /// The peer speaks another version.
    #[error("protocol version mismatch: this side speaks zcnet bench protocol {ours}, the peer {theirs}{}",
        reason.as_ref().map(|r| format!(" (the peer says: {r})")).unwrap_or_default())]
    VersionMismatch {
        /// [`PROTOCOL_VERSION`].
        ours: u32,
        /// The peer's.
        theirs: u64,
        /// The peer's reject reason, when its frame carried one.
        reason: Option<String>,
    },
    /// Right version, but the message does not parse (bad parameters, unknown type).
    #[error("malformed control message: {0}")]
    Malformed(String),
    /// The server said no.
    #[error("the server rejected the run: {0}")]
    Rejected(String),
    /// The peer reported a failure.
    #[error("the peer failed: {0}")]
    Peer(String),
    /// A message out of turn.
    #[error("expected a {expected} message, got {got}")]
    Unexpected {
        /// What was due.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
}

impl ProtocolError {
    /// What receiving `got` when `expected` was due means: the peer's own failure if it sent
    /// an `error`, otherwise a message out of turn.
    pub fn unexpected(expected: &'static str, got: Message) -> ProtocolError {
        match got {
            Message::Error { reason } => ProtocolError::Peer(reason),
            other => ProtocolError::Unexpected {
                expected,
                got: other.kind(),
            },
        }
    }
}

/// Serialises `msg` with the version key into one frame (length prefix included).
pub fn encode(msg: &Message) -> Vec<u8> {
    encode_with_version(msg, PROTOCOL_VERSION)
}

/// [`encode`] claiming another version (tests of mismatched peers).
pub fn encode_with_version(msg: &Message, version: u32) -> Vec<u8> {
    let mut v = serde_json::to_value(msg).unwrap_or_else(
        |e| serde_json::json!({"type": "error", "reason": format!("cannot encode: {e}")}),
    );
    if let Some(o) = v.as_object_mut() {
        o.insert(VERSION_KEY.into(), version.into());
    }
    let body = v.to_string().into_bytes();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes one frame's body: version first, then the message.
pub fn decode(body: &[u8]) -> Result<Message, ProtocolError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|_| ProtocolError::NotZcnet)?;
    let obj = v.as_object().ok_or(ProtocolError::NotZcnet)?;
    let version = obj
        .get(VERSION_KEY)
        .and_then(|x| x.as_u64())
        .ok_or(ProtocolError::NotZcnet)?;
    if version != u64::from(PROTOCOL_VERSION) {
        return Err(ProtocolError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: version,
            reason: obj
                .get("reason")
                .and_then(|r| r.as_str())
                .map(str::to_string),
        });
    }
    let mut obj = obj.clone();
    obj.remove(VERSION_KEY);
    serde_json::from_value(serde_json::Value::Object(obj))
        .map_err(|e| ProtocolError::Malformed(e.to_string()))
}

/// Writes one message.
pub fn write_message(w: &mut impl Write, msg: &Message) -> Result<(), ProtocolError> {
    w.write_all(&encode(msg))?;
    w.flush()?;
    Ok(())
}

/// Reads one frame's body.
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, ProtocolError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        r => r?,
    }
    let n = u32::from_be_bytes(len) as u64;
    if n as usize > MAX_FRAME {
        return Err(ProtocolError::FrameTooLarge(n));
    }
    let mut body = vec![0u8; n as usize];
    match r.read_exact(&mut body) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        r => r?,
    }
    Ok(body)
}

/// Reads and decodes one message.
pub fn read_message(r: &mut impl Read) -> Result<Message, ProtocolError> {
    decode(&read_frame(r)?)
}

/// The server's answer to a client's first frame: the run to make, or the `Reject` to send
/// back (and log) with why. `known_tx`/`known_rx` are this build's TCP path names; a UDP
/// message run is checked against [`UDP_TX`]/[`UDP_RX`].
pub fn answer_hello(
    first: Result<Message, ProtocolError>,
    known_tx: &[&str],
    known_rx: &[&str],
) -> Result<RunRequest, Refusal> {
    match first {
        Ok(Message::Hello { params }) => params
            .validate(known_tx, known_rx)
            .map(|()| RunRequest { params, udp: None }),
        Ok(Message::HelloUdp { params, udp }) => {
            params.validate_udp(&udp).map(|()| RunRequest {
                params,
                udp: Some(udp),
            })
        }
        Ok(other) => Err(Refusal(format!(
            "expected a hello message, got {}",
            other.kind()
        ))),
        Err(ProtocolError::VersionMismatch { theirs, .. }) => Err(Refusal(format!(
            "protocol version mismatch: the client speaks zcnet bench protocol {theirs}, this server {PROTOCOL_VERSION}"
        ))),
        Err(e) => Err(Refusal(e.to_string())),
    }
}

/// The client's reading of the server's answer: the data port, or why not.
pub fn read_accept(answer: Result<Message, ProtocolError>) -> Result<u16, ProtocolError> {
    match answer? {
        Message::Accept { data_port } => Ok(data_port),
        Message::Reject { reason } => Err(ProtocolError::Rejected(reason)),
        other => Err(ProtocolError::unexpected("accept", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    const TX: &[&str] = &["copy", "zerocopy"];
    const RX: &[&str] = &["copy", "mmap"];

    fn params() -> Params {
        Params {
            mode: Mode::Stream,
            tx: "zerocopy".into(),
            rx: "mmap".into(),
            size: 65536,
            streams: 2,
            ring: 16,
            touch: true,
            limit: Limit::Bytes(1 << 30),
            read: None,
        }
    }

    fn udp_params(mode: Mode) -> Params {
        Params {
            mode,
            tx: "zerocopy".into(),
            rx: "gro".into(),
            size: 1 << 20,
            streams: 1,
            ring: 16,
            touch: false,
            limit: Limit::Bytes(1 << 24),
            read: None,
        }
    }

    #[test]
    fn a_pattern_tells_messages_apart() {
        for size in [1usize, 7, 8, 9, 1023, 1024, 1025, 1472, 65536, 1 << 20] {
            let p = MessagePattern::new(size);
            let a = p.expected(5);
            assert_eq!(a.len(), size);
            assert!(p.check(&a, 5).is_ok(), "{size}");
            assert!(p.matches(&a, 5));
            // Another id, or the reply to the same id, differs (in the stamps) — in the
            // first byte already, so even 1-byte messages tell these apart.
            for other in [4, 6, 5 | REPLY_KEY] {
                assert!(!p.matches(&a, other), "{size} {other}");
                assert_ne!(p.expected(other)[0], a[0], "{size} {other}");
            }
            // One changed byte anywhere is caught and named.
            for at in [0, size / 2, size - 1] {
                let mut b = a.clone();
                b[at] ^= 0x40;
                let e = p.check(&b, 5).unwrap_err();
                assert!(e.contains(&format!("byte {at} ")), "{size}: {e}");
            }
            let e = p.check(&a[..size - 1], 5).unwrap_err();
            assert!(e.contains("were sent"), "{e}");
        }
        // A fragment of message 6 placed into message 5 at the same offset differs.
        let p = MessagePattern::new(4096);
        let (mut a, b) = (p.expected(5), p.expected(6));
        a[2048..3072].copy_from_slice(&b[2048..3072]);
        assert!(p.check(&a, 5).unwrap_err().contains("byte 2048"));
        // The reference is not periodic within a message: a shifted message differs.
        let p = MessagePattern::new(8192);
        let a = p.expected(1);
        let mut shifted = a[1..].to_vec();
        shifted.push(0);
        assert!(!p.matches(&shifted, 1));
    }

    #[test]
    fn udp_runs_are_checked_against_the_udp_paths() {
        let udp = UdpParams { reply_port: None };
        let rr = UdpParams {
            reply_port: Some(4000),
        };
        let hello = |params: Params, udp: &UdpParams| {
            answer_hello(
                Ok(Message::HelloUdp {
                    params,
                    udp: udp.clone(),
                }),
                TX,
                RX,
            )
        };
        let ok = hello(udp_params(Mode::Stream), &udp).unwrap();
        assert_eq!(ok.proto(), Proto::Udp);
        assert_eq!(ok.udp, Some(udp.clone()));
        assert!(hello(udp_params(Mode::Rr), &rr).is_ok());
        let cases: Vec<(Params, &UdpParams, &str)> = vec![
            (
                Params {
                    tx: "file".into(),
                    ..udp_params(Mode::Stream)
                },
                &udp,
                "transmit path \"file\" is not a UDP message path",
            ),
            (
                Params {
                    rx: "mmap".into(),
                    ..udp_params(Mode::Stream)
                },
                &udp,
                "receive path \"mmap\" is not a UDP message path",
            ),
            (
                Params {
                    streams: 2,
                    ..udp_params(Mode::Stream)
                },
                &udp,
                "one sender",
            ),
            (
                Params {
                    size: MAX_UDP_MESSAGE + 1,
                    ..udp_params(Mode::Stream)
                },
                &udp,
                "out of range for UDP",
            ),
            (
                Params {
                    size: 0,
                    ..udp_params(Mode::Stream)
                },
                &udp,
                "size 0",
            ),
            (udp_params(Mode::Rr), &udp, "reply port"),
            (
                Params {
                    read: Some(65536),
                    ..udp_params(Mode::Stream)
                },
                &udp,
                "TCP streams",
            ),
        ];
        for (p, u, want) in cases {
            let e = hello(p.clone(), u).expect_err(&format!("{p:?} should be rejected"));
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        }
        // `gro` is no TCP path: a TCP hello naming it is turned down by the TCP lists.
        let e = answer_hello(
            Ok(Message::Hello {
                params: Params {
                    rx: "gro".into(),
                    ..params()
                },
            }),
            TX,
            RX,
        )
        .unwrap_err();
        assert!(e.contains("unknown receive path \"gro\""), "{e}");
    }

    fn round_trip(m: &Message) -> Result<Message, ProtocolError> {
        let mut c = Cursor::new(encode(m));
        read_message(&mut c)
    }

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Message::Hello { params: params() },
            Message::Hello {
                params: Params {
                    read: Some(65536),
                    ..params()
                },
            },
            Message::Accept { data_port: 4242 },
            Message::Reject {
                reason: "no".into(),
            },
            Message::Done {
                report: SideReport::default(),
            },
            Message::Result {
                report: SideReport {
                    bytes_received: 7,
                    ..Default::default()
                },
            },
            Message::Error {
                reason: "boom".into(),
            },
            Message::HelloUdp {
                params: udp_params(Mode::Rr),
                udp: UdpParams {
                    reply_port: Some(9),
                },
            },
            Message::Ack { resolved: 42 },
            Message::Done {
                report: SideReport {
                    messages_sent: 10,
                    messages_received: 8,
                    messages_lost: 2,
                    ..Default::default()
                },
            },
        ];
        for m in &msgs {
            assert_eq!(&round_trip(m).unwrap(), m);
        }
        // Several frames back to back on one stream.
        let mut buf = Vec::new();
        for m in &msgs {
            write_message(&mut buf, m).unwrap();
        }
        let mut c = Cursor::new(buf);
        for m in &msgs {
            assert_eq!(&read_message(&mut c).unwrap(), m);
        }
        assert!(matches!(read_message(&mut c), Err(ProtocolError::Closed)));
    }

    #[test]
    fn frames_carry_the_version_key() {
        let f = encode(&Message::Accept { data_port: 1 });
        let v: serde_json::Value = serde_json::from_slice(&f[4..]).unwrap();
        assert_eq!(v[VERSION_KEY], PROTOCOL_VERSION);
        assert_eq!(v["type"], "accept");
        assert_eq!(
            u32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
            f.len() - 4
        );
    }

    #[test]
    fn version_mismatch_is_named_on_both_sides() {
        // A newer client's hello reaches this server ...
        let hello = encode_with_version(&Message::Hello { params: params() }, 99);
        let got = read_message(&mut Cursor::new(hello));
        assert!(matches!(
            got,
            Err(ProtocolError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: 99,
                ..
            })
        ));
        let reason = answer_hello(got, TX, RX).unwrap_err();
        assert!(reason.contains("protocol version mismatch"), "{reason}");
        assert!(reason.contains("99"), "{reason}");
        // ... and an older server's reject reaches this client, reason included.
        let reject = encode_with_version(
            &Message::Reject {
                reason: reason.0.clone(),
            },
            99,
        );
        let err = read_accept(read_message(&mut Cursor::new(reject))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("version mismatch"), "{text}");
        assert!(text.contains(&reason.0), "{text}");
    }

    #[test]
    fn strangers_are_told_apart_from_peers() {
        // iperf3's client opens with a 37-byte cookie: read as a length it is huge.
        let mut c = Cursor::new(b"abcdefghijklmnopqrstuvwxyz0123456789\0".to_vec());
        assert!(matches!(
            read_frame(&mut c),
            Err(ProtocolError::FrameTooLarge(_))
        ));
        // JSON without the version key.
        let body = br#"{"type":"hello"}"#;
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        assert!(matches!(
            read_message(&mut Cursor::new(f)),
            Err(ProtocolError::NotZcnet)
        ));
        // Not JSON at all.
        let mut f = 3u32.to_be_bytes().to_vec();
        f.extend_from_slice(b"\xff\x00x");
        assert!(matches!(
            read_message(&mut Cursor::new(f)),
            Err(ProtocolError::NotZcnet)
        ));
        // Truncated frame.
        let mut f = encode(&Message::Accept { data_port: 1 });
        f.truncate(f.len() - 1);
        assert!(matches!(
            read_message(&mut Cursor::new(f)),
            Err(ProtocolError::Closed)
        ));
    }

    #[test]
    fn bad_parameters_are_rejected_with_a_reason() {
        let ok = params();
        assert_eq!(ok.validate(TX, RX), Ok(()));
        let cases: Vec<(Params, &str)> = vec![
            (
                Params {
                    rx: "zcrx".into(),
                    ..params()
                },
                "unknown receive path \"zcrx\"",
            ),
            (
                Params {
                    mode: Mode::Rr,
                    tx: "cow".into(),
                    ..params()
                },
                "unknown transmit path \"cow\"",
            ),
            (
                Params {
                    size: 0,
                    ..params()
                },
                "size 0 out of range",
            ),
            (
                Params {
                    size: MAX_SIZE + 1,
                    ..params()
                },
                "out of range",
            ),
            (
                Params {
                    streams: 0,
                    ..params()
                },
                "streams 0",
            ),
            (
                Params {
                    streams: MAX_STREAMS + 1,
                    ..params()
                },
                "streams",
            ),
            (
                Params {
                    ring: 0,
                    ..params()
                },
                "ring 0",
            ),
            (
                Params {
                    limit: Limit::Bytes(0),
                    ..params()
                },
                "byte count",
            ),
            (
                Params {
                    read: Some(0),
                    ..params()
                },
                "read size 0 out of range",
            ),
            (
                Params {
                    read: Some(MAX_SIZE + 1),
                    ..params()
                },
                "read size",
            ),
            (
                Params {
                    mode: Mode::Rr,
                    tx: "copy".into(),
                    read: Some(65536),
                    ..params()
                },
                "stream runs",
            ),
            (
                Params {
                    limit: Limit::Seconds(f64::NAN),
                    ..params()
                },
                "time",
            ),
            (
                Params {
                    limit: Limit::Seconds(-1.0),
                    ..params()
                },
                "time",
            ),
            (
                Params {
                    mode: Mode::Rr,
                    tx: "copy".into(),
                    streams: 64,
                    ring: 4096,
                    size: 1 << 20,
                    ..params()
                },
                "exceeds",
            ),
        ];
        for (p, want) in cases {
            let got = answer_hello(Ok(Message::Hello { params: p.clone() }), TX, RX);
            let e = got.expect_err(&format!("{p:?} should be rejected"));
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        }
        // A stream run's transmit path is the client's business.
        let p = Params {
            tx: "cow".into(),
            ..params()
        };
        assert_eq!(
            answer_hello(Ok(Message::Hello { params: p.clone() }), TX, RX),
            Ok(RunRequest {
                params: p,
                udp: None
            })
        );
        // Out-of-turn and unknown fields.
        assert!(answer_hello(Ok(Message::Accept { data_port: 1 }), TX, RX)
            .unwrap_err()
            .contains("expected a hello"));
        let mut v = serde_json::to_value(Message::Hello { params: params() }).unwrap();
        v["params"]["color"] = "blue".into();
        v[VERSION_KEY] = PROTOCOL_VERSION.into();
        let body = v.to_string();
        let e = answer_hello(decode(body.as_bytes()), TX, RX).unwrap_err();
        assert!(e.contains("unknown field") && e.contains("color"), "{e}");
    }

    #[test]
    fn accept_reading() {
        assert_eq!(
            read_accept(Ok(Message::Accept { data_port: 9 })).unwrap(),
            9
        );
        assert!(matches!(
            read_accept(Ok(Message::Reject { reason: "x".into() })),
            Err(ProtocolError::Rejected(r)) if r == "x"
        ));
        assert!(matches!(
            read_accept(Ok(Message::Error { reason: "x".into() })),
            Err(ProtocolError::Peer(_))
        ));
        assert!(matches!(
            read_accept(Ok(Message::Done {
                report: SideReport::default()
            })),
            Err(ProtocolError::Unexpected {
                expected: "accept",
                got: "done"
            })
        ));
    }
}
