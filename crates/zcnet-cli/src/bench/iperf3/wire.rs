//! Blocking reads and writes of iperf3's control messages on a `TcpStream`: states, the
//! cookie, JSON frames, and `SERVER_ERROR`'s two numbers.

use std::io::{Read, Write};
use std::net::TcpStream;
use zcnet_bench::iperf3::{frame, Cookie, Iperf3Error, State, COOKIE_SIZE};

/// iperf3's `IEUNIMP` ("not implemented yet"): what an iperf3 client is told when it asks
/// for a test zcnet does not run. The reason is in the server's log.
pub(crate) const IE_UNIMP: i32 = 13;
/// iperf3's `IEDURATION`: `-t` over its maximum (a day).
pub(crate) const IE_DURATION: i32 = 5;
/// iperf3's `IENUMSTREAMS`: `-P` over its maximum (128), or more streams than the server's
/// `--max-memory` could ever hold at this `-l`.
pub(crate) const IE_NUM_STREAMS: i32 = 6;
/// iperf3's `IEBLOCKSIZE`: `-l` over its maximum (512 MiB), or one block larger than the
/// server's `--max-memory` holds.
pub(crate) const IE_BLOCK_SIZE: i32 = 7;
/// iperf3's `IECREATESTREAM`: a stream could not be started (no thread for it).
pub(crate) const IE_CREATE_STREAM: i32 = 200;
/// iperf3's `IERECVPARAMS`: the parameters did not parse.
pub(crate) const IE_RECV_PARAMS: i32 = 114;
/// iperf3's `IESTREAMCONNECT`: data connections did not arrive.
pub(crate) const IE_STREAM_CONNECT: i32 = 203;
/// iperf3's `IESTREAMWRITE`: a data connection failed.
pub(crate) const IE_STREAM_WRITE: i32 = 205;

pub(crate) fn write_state(c: &mut TcpStream, s: State) -> Result<(), Iperf3Error> {
    c.write_all(&[s.byte()])
        .map_err(Iperf3Error::io("writing a state"))
}

pub(crate) fn read_state(c: &mut TcpStream) -> Result<State, Iperf3Error> {
    let mut b = [0u8; 1];
    c.read_exact(&mut b)
        .map_err(Iperf3Error::io("reading a state"))?;
    State::from_byte(b[0])
}

pub(crate) fn read_cookie(c: &mut TcpStream) -> Result<Cookie, Iperf3Error> {
    let mut b = [0u8; COOKIE_SIZE];
    c.read_exact(&mut b)
        .map_err(Iperf3Error::io("reading the cookie"))?;
    Cookie::parse(&b)
}

pub(crate) fn write_cookie(c: &mut TcpStream, cookie: &Cookie) -> Result<(), Iperf3Error> {
    c.write_all(cookie.as_bytes())
        .map_err(Iperf3Error::io("writing the cookie"))
}

pub(crate) fn write_json(c: &mut TcpStream, v: &serde_json::Value) -> Result<(), Iperf3Error> {
    frame::write(c, v)
}

pub(crate) fn read_json(c: &mut TcpStream) -> Result<serde_json::Value, Iperf3Error> {
    frame::read(c)
}

/// `SERVER_ERROR`, then iperf3's error number and an errno, each a big-endian `int32`.
pub(crate) fn write_server_error(c: &mut TcpStream, i_errno: i32, errno: i32) {
    let mut b = vec![State::ServerError.byte()];
    b.extend_from_slice(&i_errno.to_be_bytes());
    b.extend_from_slice(&errno.to_be_bytes());
    let _ = c.write_all(&b);
}

/// The two numbers after a `SERVER_ERROR`.
pub(crate) fn read_server_error(c: &mut TcpStream) -> Iperf3Error {
    let mut b = [0u8; 8];
    match c.read_exact(&mut b) {
        Ok(()) => Iperf3Error::Remote {
            i_errno: i32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            errno: i32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        },
        Err(e) => Iperf3Error::Io {
            context: "reading SERVER_ERROR's numbers",
            source: e,
        },
    }
}

/// A cookie from the kernel's randomness.
pub(crate) fn new_cookie() -> std::io::Result<Cookie> {
    let mut r = [0u8; COOKIE_SIZE - 1];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut r)?;
    Ok(Cookie::from_random(&r))
}
