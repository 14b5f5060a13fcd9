//! An axum server of a large `Bytes` body, sent zero-copy, in one call:
//! `zcnet_tokio::axum::serve(listener, router)`.
//!
//! ```text
//! cargo run --release -p zcnet-tokio --example axum_large_body -- [--mib 256] [--serve]
//! ```
//!
//! `GET /blob` answers with `--mib` MiB of a checkable pattern (byte `i` is `i % 251`),
//! held in one `Bytes`: each response is a reference to it, and `ZcIo` sends it with
//! `MSG_ZEROCOPY` (where the route is not local: on loopback the kernel would copy at
//! delivery anyway, so zcnet copies and counts it as `local_delivery`). The program
//! fetches the body once with a minimal HTTP/1.1 client of its own, checks every byte and
//! exits; `--serve` keeps serving on 127.0.0.1:8080 instead, for curl:
//!
//! ```text
//! curl -s http://127.0.0.1:8080/blob | python3 -c 'import sys; d=sys.stdin.buffer.read(); \
//!     assert all(b == i % 251 for i, b in enumerate(d)); print(len(d), "bytes ok")'
//! ```
//!
//! Only public crates: copy it as it is.

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use std::future::IntoFuture;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use zcnet_tokio::ZcListener;

const PERIOD: usize = 251;

/// GETs `path` from `addr` over HTTP/1.1 and checks the body against the pattern; returns
/// its length.
async fn fetch_checked(addr: std::net::SocketAddr, path: &str) -> std::io::Result<u64> {
    let mut s = BufReader::new(TcpStream::connect(addr).await?);
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.get_mut().write_all(req.as_bytes()).await?;
    let mut line = String::new();
    s.read_line(&mut line).await?;
    assert!(line.starts_with("HTTP/1.1 200"), "status line: {line:?}");
    let mut length = None;
    loop {
        line.clear();
        s.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<u64>().ok();
            }
        }
    }
    let length = length.expect("a Content-Length");
    let mut buf = vec![0u8; 256 << 10];
    let mut pos = 0u64;
    while pos < length {
        let n = s.read(&mut buf).await?;
        assert!(n > 0, "the body ended at {pos} of {length} bytes");
        for (i, b) in buf[..n].iter().enumerate() {
            let at = pos + i as u64;
            assert_eq!(*b, (at % PERIOD as u64) as u8, "byte {at} is wrong");
        }
        pos += n as u64;
    }
    Ok(pos)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut mib = 256usize;
    let mut serve_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mib" => mib = args.next().ok_or("--mib needs a value")?.parse()?,
            "--serve" => serve_only = true,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let body: Bytes = (0..mib << 20).map(|i| (i % PERIOD) as u8).collect();
    let len = body.len() as u64;
    let router = Router::new().route("/blob", get(move || std::future::ready(body.clone())));

    let addr = if serve_only {
        "127.0.0.1:8080"
    } else {
        "127.0.0.1:0"
    };
    let listener = ZcListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("serving {len} bytes at http://{addr}/blob");
    let server = tokio::spawn(zcnet_tokio::axum::serve(listener, router).into_future());
    if serve_only {
        server.await??;
        return Ok(());
    }
    let got = fetch_checked(addr, "/blob").await?;
    assert_eq!(got, len);
    println!("fetched {got} bytes, every byte checked");
    server.abort();
    Ok(())
}
