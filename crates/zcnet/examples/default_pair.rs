//! A `Sender`/`Receiver` pair on default configurations (the `auto` path) over loopback,
//! nothing else: the program to run under `strace -f -e trace=openat,open,creat` to see
//! that the library, unasked, opens no file (no profile, no clock card in `/dev/shm`).
//!
//! `cargo run -p zcnet --example default_pair`

use std::io::Read;
use zcnet::{Listener, ReceiverConfig, Sender, SenderConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = Listener::bind("127.0.0.1:0".parse()?, &ReceiverConfig::default())?;
    let addr = listener.local_addr()?;
    let sending = std::thread::spawn(move || -> Result<_, zcnet::Error> {
        let mut tx = Sender::connect(addr, &SenderConfig::default())?;
        let data: Vec<u8> = (0..4u32 << 20).map(|i| i as u8).collect();
        tx.send_slice(&data)?;
        tx.finish()
    });
    let mut got = Vec::new();
    listener.accept()?.read_to_end(&mut got)?;
    let expect: Vec<u8> = (0..4u32 << 20).map(|i| i as u8).collect();
    assert!(got == expect, "every byte arrived, in order");
    println!("{}", sending.join().unwrap()?);
    Ok(())
}
