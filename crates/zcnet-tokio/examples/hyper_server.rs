//! An unmodified hyper server sending large response bodies with `MSG_ZEROCOPY`.
//!
//! ```text
//! cargo run --release -p zcnet-tokio --example hyper_server -- [--addr 127.0.0.1:8080]
//!     [--bytes 1073741824] [--always] [--copy] [--plain] [--requests N]
//! curl -s http://127.0.0.1:8080/ | python3 -c 'import sys; d=sys.stdin.buffer.read(); \
//!     assert all(b == i % 251 for i, b in enumerate(d)); print(len(d), "bytes ok")'
//! ```
//!
//! `GET /` answers with `--bytes` (default 1 GiB) of a checkable pattern (byte `i` is
//! `i % 251`), as 1 MiB `Bytes` frames with a `Content-Length`; this example uses only
//! public crates (zcnet-tokio, tokio, hyper, bytes), so it can be copied as it is. Each connection's [`ZcStream`] is wrapped
//! in a [`ZcIo`] and the body in a [`ZcBody`] sharing one [`Lender`], so hyper's vectored
//! writes of those frames go zero-copy; headers are copied. `--always` asks for zero-copy
//! even where completions keep saying the kernel copied (loopback, veth); by default
//! (`auto`) the stream stops asking after 16 MiB of such bytes, counted, and its cost check
//! sends to copy what costs more zero-copy. `--copy` never asks for zero-copy (the stream's own
//! cost, for comparison). `--plain` serves the same body on
//! a plain `tokio::net::TcpStream`, for comparison. After `--requests` connections (default:
//! never) the server prints its CPU time and exits. Each connection's stats are printed.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use zcnet_tokio::{Lender, Policy, ZcBody, ZcConfig, ZcIo, ZcStream};

/// The pattern's period: byte `i` of a body is `i % PERIOD`.
const PERIOD: usize = 251;
/// Frame size.
const FRAME: usize = 1 << 20;

/// One frame and a period more of the pattern, made once: every frame is a slice of it (a
/// reference count, no copy), starting where the body's offset falls in the period.
fn table() -> &'static Bytes {
    static TABLE: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..FRAME + PERIOD).map(|i| (i % PERIOD) as u8).collect())
}

/// `total` bytes of the pattern in 1 MiB frames sliced from [`table`].
struct PatternBody {
    pos: u64,
    total: u64,
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.pos >= self.total {
            return Poll::Ready(None);
        }
        let n = (FRAME as u64).min(self.total - self.pos) as usize;
        let start = (self.pos % PERIOD as u64) as usize;
        let frame = table().slice(start..start + n);
        self.pos += n as u64;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.pos >= self.total
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.total - self.pos)
    }
}

struct Args {
    addr: String,
    bytes: u64,
    always: bool,
    copy: bool,
    plain: bool,
    requests: Option<u64>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:8080".into(),
        bytes: 1 << 30,
        always: false,
        copy: false,
        plain: false,
        requests: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--addr" => a.addr = val()?,
            "--bytes" => a.bytes = val()?.parse().map_err(|e| format!("--bytes: {e}"))?,
            "--requests" => {
                a.requests = Some(val()?.parse().map_err(|e| format!("--requests: {e}"))?)
            }
            "--always" => a.always = true,
            "--copy" => a.copy = true,
            "--plain" => a.plain = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let listener = tokio::net::TcpListener::bind(&args.addr).await?;
    println!(
        "serving {} bytes on http://{} ({})",
        args.bytes,
        listener.local_addr()?,
        if args.plain {
            "plain TcpStream"
        } else {
            "ZcStream"
        }
    );
    let policy = if args.always {
        Policy::always()
    } else if args.copy {
        Policy::default().with_min_zerocopy_bytes(usize::MAX)
    } else {
        Policy::default()
    };
    let mut served = 0;
    let mut tasks = Vec::new();
    while args.requests.is_none_or(|n| served < n) {
        let (tcp, peer) = listener.accept().await?;
        served += 1;
        let total = args.bytes;
        let service = move |lender: Option<Lender>| {
            service_fn(move |_req: Request<hyper::body::Incoming>| {
                let body = PatternBody { pos: 0, total };
                let lender = lender.clone();
                async move {
                    Ok::<_, Infallible>(Response::new(match lender {
                        Some(l) => http_body_util::Either::Left(ZcBody::new(body, l)),
                        None => http_body_util::Either::Right(body),
                    }))
                }
            })
        };
        let builder = hyper::server::conn::http1::Builder::new();
        tasks.push(if args.plain {
            tokio::spawn(async move {
                let r = builder
                    .serve_connection(TokioIo::new(tcp), service(None))
                    .await;
                println!("{peer}: plain TcpStream done {r:?}");
            })
        } else {
            let stream = ZcStream::from_tokio(tcp, ZcConfig::new().policy(policy))?;
            let stats = stream.stats().clone();
            let lender = Lender::new();
            let io = ZcIo::new(stream, lender.clone());
            tokio::spawn(async move {
                let r = builder
                    .serve_connection(TokioIo::new(io), service(Some(lender)))
                    .await;
                println!("{peer}: {} ({r:?})", stats.snapshot());
            })
        });
    }
    for t in tasks {
        t.await?;
    }
    println!("server process CPU: {:?}", process_cpu());
    Ok(())
}

/// This process's CPU time so far.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug
struct Cpu {
    user: std::time::Duration,
    sys: std::time::Duration,
}

/// User and system CPU time from `/proc/self/stat` (fields 14 and 15, in the kernel's
/// `USER_HZ` ticks: 100 per second on Linux).
fn process_cpu() -> Option<Cpu> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' do not.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i)?.parse::<u64>().ok();
    let tick = std::time::Duration::from_millis(10);
    // After the name: field 3 is f[0], so fields 14 and 15 are f[11] and f[12].
    Some(Cpu {
        user: tick * ticks(11)? as u32,
        sys: tick * ticks(12)? as u32,
    })
}
