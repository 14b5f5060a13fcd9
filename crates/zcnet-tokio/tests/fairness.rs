//! A task that sends on a socket that never fills must still let the other tasks of its
//! worker run: every completed operation spends tokio's cooperative budget, as tokio's own
//! sockets do. Loopback UDP never blocks a sender (a full receive queue drops), so without
//! the budget a sending loop on a current-thread runtime returns `Pending` never, and a
//! receiving task on the same runtime would get no turn until the sender stopped.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zcnet_msg::{MsgConfig, MsgEvent, MsgTx};
use zcnet_tokio::ZcUdpSocket;

const MESSAGES: u64 = 1000;
const LEN: usize = 1000;

/// Message `seed`: its seed in the first eight bytes, then bytes derived from it.
fn body(seed: u64) -> Vec<u8> {
    let mut v: Vec<u8> = (0..LEN)
        .map(|i| (seed as usize * 31 + i * 7) as u8)
        .collect();
    v[..8].copy_from_slice(&seed.to_le_bytes());
    v
}

#[test]
fn a_sender_that_never_blocks_still_lets_other_tasks_run() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = MsgConfig::new(MsgTx::Copy);
        let r = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = r.local_addr().unwrap();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(to).unwrap();
        let rx = ZcUdpSocket::from_std(r, &cfg).unwrap();
        let tx = ZcUdpSocket::from_std(s, &cfg).unwrap();

        // The receiving task checks every message it gets, byte for byte.
        let received = Arc::new(AtomicU64::new(0));
        let got = received.clone();
        let receiver = tokio::spawn(async move {
            loop {
                match rx.recv().await.expect("recv") {
                    MsgEvent::Message(m) => {
                        let mut seed = [0u8; 8];
                        seed.copy_from_slice(&m.data[..8]);
                        let seed = u64::from_le_bytes(seed);
                        assert!(seed < MESSAGES, "a seed never sent: {seed}");
                        assert_eq!(&m.data[..], &body(seed)[..], "message {seed}");
                        got.fetch_add(1, Ordering::Relaxed);
                    }
                    // The receive queue overflows while the sender runs: losses are fine.
                    MsgEvent::Lost(_) => {}
                }
            }
        });

        for seed in 0..MESSAGES {
            tx.send_slice(&body(seed)).await.expect("send_slice");
        }
        // Read before this task awaits anything that could block: whatever the receiver
        // got so far, it got while the sending loop ran.
        let during = received.load(Ordering::Relaxed);
        let s = tx.stats().snapshot();
        assert!(
            s.tx_bytes_copy >= MESSAGES * LEN as u64,
            "every message sent: {s}"
        );
        assert!(
            during > 0,
            "the receiving task never ran while {MESSAGES} sends completed at once"
        );
        receiver.abort();
    });
}
