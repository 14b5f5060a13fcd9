//! Every task waiting for a stream's loans to come back is woken when they do, whoever
//! reads the completions: the stream's own driver, another `flush_loans`, or a sender.
//!
//! Found by the cancellation test hanging now and then in CI: the driver took the
//! error-queue event, `flush_loans` (woken by it) found the bits already cleared and went
//! back to sleep, and the driver's drain then released the last loan — with no event left
//! to wake the sleeper. Every byte was acknowledged, every call completed, and
//! `flush_loans` waited for ever.

mod common;

use bytes::Bytes;
use common::{bounded, pattern_vec, read_verified, stalled_pair};
use std::sync::Arc;
use zcnet::Stats;
use zcnet_tokio::{Policy, ZcConfig};

/// Rounds: the race is narrow (a few per hundred rounds of one waiter before the fix),
/// so each round has several waiters and there are many rounds.
const ROUNDS: usize = 40;
const WAITERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flush_loans_waiter_wakes_when_another_task_drains_the_last_completion() {
    for round in 0..ROUNDS {
        let stats = Arc::new(Stats::new());
        let config = ZcConfig::new()
            .policy(Policy::always())
            .stats(stats.clone());
        let (mut s, r) = stalled_pair(config).await;
        // The receiver starts late and reads slowly, so loans are in flight while the
        // waiters line up.
        let reader = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            read_verified(r).await
        });
        let len = (64 << 10) * (1 + round % 4);
        bounded(
            format!("round {round}: send_bytes"),
            s.send_bytes(Bytes::from(pattern_vec(0, len))),
        )
        .await
        .unwrap();
        let s = Arc::new(s);
        // Each waiter on a thread of its own (as a `block_on` caller is), so it runs while
        // the driver drains rather than after it on the driver's worker.
        let waiters: Vec<_> = (0..WAITERS)
            .map(|_| {
                let s = s.clone();
                let rt = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || rt.block_on(s.flush_loans()))
            })
            .collect();
        for (i, w) in waiters.into_iter().enumerate() {
            let what = format!(
                "round {round}: waiter {i} of {WAITERS}, {} loans left, {}",
                s.loans_in_flight(),
                stats.snapshot()
            );
            bounded(what, w).await.unwrap().unwrap();
        }
        assert_eq!(s.loans_in_flight(), 0);
        let st = stats.snapshot();
        assert_eq!(
            st.tx_completed_calls, st.tx_calls_zerocopy,
            "round {round}: every call completed once the waiters are back: {st}"
        );
        let mut s = Arc::into_inner(s).expect("the waiters are done with the stream");
        tokio::io::AsyncWriteExt::shutdown(&mut s).await.unwrap();
        drop(s);
        let got = bounded(format!("round {round}: the reader"), reader)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, len as u64, "round {round}: every byte arrives");
    }
}
