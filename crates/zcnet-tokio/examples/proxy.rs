//! A TCP proxy on tokio with zero-copy sends and cancellation: each direction is its own
//! task on a `ZcStream`'s owned halves, and a forward that takes longer than a deadline is
//! cancelled — then continued from where the stream says it stopped.
//!
//! ```text
//! cargo run --release -p zcnet-tokio --example proxy -- [--mib 256] [--deadline-us 200]
//! ```
//!
//! The program runs all three parties on loopback: a client sends `--mib` MiB of a
//! checkable pattern (byte `i` is `i % 251`) through the proxy to a server that checks
//! every byte and echoes it back; the client checks every byte of the echo too. The
//! proxy forwards with `send_bytes` under `tokio::time::timeout(deadline)`; when the
//! timeout fires mid-send, `take_cancelled()` says how many bytes of that buffer were
//! queued and the proxy sends the rest. Only public crates: copy it as it is.

use bytes::{Bytes, BytesMut};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use zcnet_tokio::{OwnedReadHalf, OwnedWriteHalf, ZcListener, ZcStream};

const PERIOD: u64 = 251;

fn pattern(pos: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((pos + i) % PERIOD) as u8)
        .collect()
}

/// Checks that `data` is the pattern from stream offset `pos`.
fn check(pos: u64, data: &[u8]) {
    for (i, b) in data.iter().enumerate() {
        let want = ((pos + i as u64) % PERIOD) as u8;
        assert_eq!(*b, want, "byte {} of the stream is wrong", pos + i as u64);
    }
}

/// What one direction of the proxy did.
#[derive(Debug, Default)]
struct Forwarded {
    bytes: u64,
    cancelled: u64,
}

/// Copies `from` to `to` until the end of the stream, each piece sent with `send_bytes`
/// under `deadline`; a cancelled send is continued from where it stopped.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    deadline: Duration,
) -> std::io::Result<Forwarded> {
    let mut done = Forwarded::default();
    loop {
        let mut buf = BytesMut::zeroed(256 << 10);
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        let mut piece: Bytes = buf.freeze();
        loop {
            match tokio::time::timeout(deadline, to.send_bytes(piece.clone())).await {
                Ok(sent) => {
                    sent?;
                    break;
                }
                Err(_elapsed) => {
                    // The send was dropped part-way: the stream knows how far it got, and
                    // refuses further writes until we have asked.
                    done.cancelled += 1;
                    let queued = to.take_cancelled().map_or(0, |c| c.queued);
                    piece = piece.slice(queued..);
                    if piece.is_empty() {
                        break;
                    }
                }
            }
        }
        done.bytes += n as u64;
    }
    to.flush_loans().await?;
    to.shutdown().await?;
    Ok(done)
}

/// The server: checks every byte and echoes it.
async fn echo_server(listener: TcpListener) -> std::io::Result<u64> {
    let (mut s, _) = listener.accept().await?;
    let mut buf = vec![0u8; 256 << 10];
    let mut pos = 0;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            s.shutdown().await?;
            return Ok(pos);
        }
        check(pos, &buf[..n]);
        s.write_all(&buf[..n]).await?;
        pos += n as u64;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut mib = 256u64;
    let mut deadline = Duration::from_micros(200);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--mib" => mib = v.parse()?,
            "--deadline-us" => deadline = Duration::from_micros(v.parse()?),
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let total = mib << 20;

    let server = TcpListener::bind("127.0.0.1:0").await?;
    let server_addr = server.local_addr()?;
    let server = tokio::spawn(echo_server(server));

    let proxy = ZcListener::bind("127.0.0.1:0").await?;
    let proxy_addr = proxy.local_addr()?;
    let proxy = tokio::spawn(async move {
        let (client_side, _) = proxy.accept().await?;
        let server_side = ZcStream::connect(server_addr).await?;
        let (from_client, to_client) = client_side.into_split();
        let (from_server, to_server) = server_side.into_split();
        let up = tokio::spawn(forward(from_client, to_server, deadline));
        let down = tokio::spawn(forward(from_server, to_client, deadline));
        let (up, down) = (up.await??, down.await??);
        Ok::<_, std::io::Error>((up, down))
    });

    let client = TcpStream::connect(proxy_addr).await?;
    let (mut r, mut w) = client.into_split();
    let sender = tokio::spawn(async move {
        let mut pos = 0;
        while pos < total {
            let n = (total - pos).min(1 << 20) as usize;
            w.write_all(&pattern(pos, n)).await?;
            pos += n as u64;
        }
        w.shutdown().await
    });
    let mut buf = vec![0u8; 256 << 10];
    let mut echoed = 0;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        check(echoed, &buf[..n]);
        echoed += n as u64;
    }
    sender.await??;
    let at_server = server.await??;
    let (up, down) = proxy.await??;
    assert_eq!(at_server, total, "every byte reached the server");
    assert_eq!(echoed, total, "every byte came back");
    println!(
        "{total} bytes through the proxy and back, every byte checked; \
         up: {} bytes, {} sends cancelled and continued; down: {} bytes, {} cancelled",
        up.bytes, up.cancelled, down.bytes, down.cancelled
    );
    Ok(())
}
