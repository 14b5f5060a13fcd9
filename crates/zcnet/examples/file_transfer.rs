//! A blocking file server and client with zcnet: the server sends a file with
//! [`zcnet::Sender::send_file`] (`sendfile(2)`, no copy through user space), the client
//! receives it into a file with [`zcnet::Receiver::recv_to_file`] (`splice(2)`), and checks
//! every byte.
//!
//! ```text
//! cargo run --release -p zcnet --example file_transfer -- [--mib 256]
//! ```
//!
//! Both ends run in this program, on loopback: the server thread accepts one connection,
//! sends the file's length (8 bytes, big-endian) and then the file; the client reads the
//! length, receives that many bytes into a new file and compares the two files. Byte `i` of
//! the file is `i % 251`, so a misplaced byte cannot pass. Only public crates (zcnet,
//! tempfile for the scratch directory): copy it as it is.

use std::io::{Read, Write};
use std::net::TcpListener;
use zcnet::{Receiver, ReceiverConfig, Sender, SenderConfig};

const PERIOD: usize = 251;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut mib = 256u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mib" => mib = args.next().ok_or("--mib needs a value")?.parse()?,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let len = mib << 20;
    let dir = tempfile::tempdir()?;
    let src_path = dir.path().join("served");
    let dst_path = dir.path().join("received");
    {
        let mut f = std::fs::File::create(&src_path)?;
        let block: Vec<u8> = (0..PERIOD << 12).map(|i| (i % PERIOD) as u8).collect();
        let mut left = len as usize;
        while left > 0 {
            let n = left.min(block.len());
            f.write_all(&block[..n])?;
            left -= n;
        }
        f.sync_all()?;
    }

    // The server: a plain std listener; each accepted stream becomes a zcnet Sender.
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let served = src_path.clone();
    let server = std::thread::spawn(move || -> Result<zcnet::StatsSnapshot, zcnet::Error> {
        let (stream, _) = listener
            .accept()
            .map_err(|e| zcnet::Error::io("accept", e))?;
        let mut tx = Sender::from_stream(stream, &SenderConfig::default())?;
        let file = std::fs::File::open(&served).map_err(|e| zcnet::Error::io("open", e))?;
        let size = file
            .metadata()
            .map_err(|e| zcnet::Error::io("stat", e))?
            .len();
        tx.send_slice(&size.to_be_bytes())?;
        tx.send_file(&file, 0, size)?;
        // FIN, every loan back, and the counters.
        tx.finish()
    });

    // The client.
    let mut rx = Receiver::connect(addr, &ReceiverConfig::default())?;
    let mut header = [0u8; 8];
    let mut got = 0;
    while got < header.len() {
        let n = rx.recv_into(&mut header[got..])?;
        if n == 0 {
            return Err("the server closed before the length".into());
        }
        got += n;
    }
    let size = u64::from_be_bytes(header);
    let out = std::fs::File::create(&dst_path)?;
    let received = rx.recv_to_file(&out, 0, size)?;
    out.sync_all()?;
    let tx_stats = server.join().map_err(|_| "the server panicked")??;

    // Every byte, in order.
    assert_eq!(received, len, "the length");
    let (mut a, mut b) = (
        std::fs::File::open(&src_path)?,
        std::fs::File::open(&dst_path)?,
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut pos = 0u64;
    loop {
        let n = a.read(&mut ba)?;
        if n == 0 {
            break;
        }
        b.read_exact(&mut bb[..n])?;
        for (i, (x, y)) in ba[..n].iter().zip(&bb[..n]).enumerate() {
            assert_eq!(x, y, "byte {} differs", pos + i as u64);
            assert_eq!(
                *x as usize,
                (pos as usize + i) % PERIOD,
                "byte {} of the source",
                pos + i as u64
            );
        }
        pos += n as u64;
    }
    assert_eq!(b.read(&mut bb)?, 0, "the received file is not longer");
    println!(
        "{len} bytes served with send_file and received with recv_to_file, every byte checked"
    );
    println!("server: {tx_stats}");
    println!("client: {}", rx.stats().snapshot());
    Ok(())
}
