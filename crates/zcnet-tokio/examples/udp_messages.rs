//! 10,000 messages of 64 KiB over UDP with `ZcUdpSocket`: whole messages out (GSO batches),
//! whole messages in (GRO), every message delivered byte for byte or reported lost by id —
//! the last ones too, once the sender's mark says how many it sent.
//!
//! ```text
//! cargo run --release -p zcnet-tokio --example udp_messages -- [--count 10000] [--kib 64]
//!     [--zerocopy] [--slow]
//! ```
//!
//! Message `id`'s bytes are a pattern the receiver can check (byte `i` is
//! `(id + i) % 251`). `--zerocopy` sends from pool buffers with `MSG_ZEROCOPY`
//! (`send_lent`; on loopback zcnet copies instead, counted as `local_delivery`, since the
//! kernel would copy at delivery anyway). `--slow` makes the receiver pause now and then,
//! so its socket overflows and messages are lost — and reported. The program exits with
//! an error if any id is neither delivered nor reported lost. Only public crates.

use std::sync::Arc;
use std::time::Duration;
use zcnet_tokio::{MsgConfig, MsgEvent, MsgTx, ZcUdpSocket};

const PERIOD: u64 = 251;

fn fill(id: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = ((id + i as u64) % PERIOD) as u8;
    }
}

fn is_message(id: u64, data: &[u8], len: usize) -> bool {
    data.len() == len
        && data
            .iter()
            .enumerate()
            .all(|(i, b)| *b == ((id + i as u64) % PERIOD) as u8)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut count, mut kib, mut zerocopy, mut slow) = (10_000u64, 64usize, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--count" => count = args.next().ok_or("--count needs a value")?.parse()?,
            "--kib" => kib = args.next().ok_or("--kib needs a value")?.parse()?,
            "--zerocopy" => zerocopy = true,
            "--slow" => slow = true,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let len = kib << 10;
    let tx = if zerocopy {
        MsgTx::Zerocopy
    } else {
        MsgTx::Copy
    };
    // A short reorder window: a lost message is reported 200 ms after the receiver
    // learned of a later id (or of the sender's mark).
    let cfg = MsgConfig::new(tx)
        .max_message(len.max(1 << 20))
        .reorder_window(Duration::from_millis(200));
    let rx = ZcUdpSocket::bind("127.0.0.1:0".parse()?, &cfg)?;
    let sender = Arc::new(ZcUdpSocket::connect(rx.local_addr()?, &cfg)?);

    let send = {
        let s = sender.clone();
        tokio::spawn(async move {
            let mut plain = vec![0u8; len];
            for id in 0..count {
                fill(id, &mut plain);
                let sent = if zerocopy {
                    // A pool buffer laid out with room for each datagram's header.
                    let mut buf = s.buffer(len).await?;
                    buf.copy_from(&plain);
                    s.send_lent(buf).await?.id
                } else {
                    s.send_slice(&plain).await?
                };
                assert_eq!(sent, id);
            }
            // Done: say how many were sent, and say it again for a while (a mark is one
            // datagram; an overrun receiver may drop it too).
            for _ in 0..20 {
                s.send_mark().await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok::<_, std::io::Error>(())
        })
    };

    let (mut delivered, mut lost) = (0u64, 0u64);
    let mut seen = vec![false; count as usize];
    while delivered + lost < count {
        let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .map_err(|_| {
                format!("stuck: {delivered} delivered, {lost} lost of {count}: ids unaccounted")
            })??;
        match ev {
            MsgEvent::Message(m) => {
                assert!(is_message(m.id, &m, len), "message {} is wrong", m.id);
                assert!(!std::mem::replace(&mut seen[m.id as usize], true));
                delivered += 1;
                rx.recycle(m).await;
                if slow && delivered.is_multiple_of(500) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            MsgEvent::Lost(l) => {
                for id in l.ids() {
                    assert!(!std::mem::replace(&mut seen[id as usize], true));
                }
                lost += l.count;
            }
        }
    }
    send.abort();
    let st = rx.msg_stats().snapshot();
    println!(
        "{count} messages of {len} bytes: {delivered} delivered and checked, {lost} reported \
         lost ({} by gap, {} by timeout), none unaccounted; {} GRO reads",
        st.lost_gap, st.lost_timeout, st.gro_reads
    );
    Ok(())
}
