//! A buffer the kernel may still read is never dropped: not when a `send_zc` future is
//! dropped at any of its await points, not when the stream itself is dropped, and not
//! when the runtime shuts down under it (then it is leaked, and counted).
//!
//! Each buffer records, when dropped, how many zero-copy calls the kernel had completed;
//! since nothing is sent after the cancelled buffer, that must be every call made.

mod common;

use bytes::Bytes;
use common::{bounded, pattern_vec, read_verified, stalled_pair, Watched};
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::Poll;
use tokio::io::AsyncWriteExt;
use zcnet::Stats;
use zcnet_tokio::{Policy, ZcConfig};

const LEN: usize = 1 << 20;

fn config(stats: &Arc<Stats>) -> ZcConfig {
    ZcConfig::new()
        .policy(Policy::always())
        .stats(stats.clone())
}

/// Polls `fut` until it has returned `Pending` `k` times (or finished); returns whether it
/// finished.
async fn poll_pending_times<F: Future>(fut: std::pin::Pin<&mut F>, k: usize) -> bool {
    let mut fut = fut;
    let mut pendings = 0;
    poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(_) => Poll::Ready(true),
        Poll::Pending => {
            pendings += 1;
            if pendings >= k {
                Poll::Ready(false)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_zc_future_dropped_at_any_await_point_keeps_its_buffer_until_completion() {
    let mut cancelled_in_flight = 0;
    for k in 1..=8 {
        let stats = Arc::new(Stats::new());
        let (mut s, r) = stalled_pair(config(&stats)).await;
        // The receiver reads slowly, so the send passes many await points.
        let reader = tokio::spawn(async move {
            let mut r = r;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            read_verified(&mut r).await
        });
        let (buf, log) = Watched::new(pattern_vec(0, LEN), stats.clone());
        let finished = {
            let fut = s.send_zc(buf);
            tokio::pin!(fut);
            poll_pending_times(fut.as_mut(), k).await
        };
        if !finished {
            let alive = log.lock().unwrap().is_none();
            if alive {
                cancelled_in_flight += 1;
            }
        }
        let calls_made = stats.snapshot().tx_calls_zerocopy;
        let what = format!(
            "k={k}: flush_loans, {} loans, {}",
            s.loans_in_flight(),
            stats.snapshot()
        );
        bounded(what, s.flush_loans()).await.unwrap();
        let at_drop = log.lock().unwrap().expect("released once complete");
        assert_eq!(
            at_drop, calls_made,
            "k={k}: dropped with {at_drop} of {calls_made} calls complete"
        );
        bounded("shutdown", s.shutdown()).await.unwrap();
        drop(s);
        let got = bounded("the reader", reader).await.unwrap().unwrap();
        assert_eq!(
            got,
            stats.snapshot().tx_bytes(),
            "k={k}: every queued byte arrives"
        );
    }
    assert!(
        cancelled_in_flight > 0,
        "no cancellation caught a buffer in flight: the test did not test"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_zc_cancelled_while_waiting_for_its_completion_keeps_the_buffer() {
    let stats = Arc::new(Stats::new());
    let (mut s, mut r) = stalled_pair(config(&stats)).await;
    // Fill the peer's tiny window by copying, leaving room in our send buffer, so the next
    // bytes are queued at once but cannot leave: their completion cannot come.
    let filler = pattern_vec(0, 32 << 10);
    s.write_all(&filler).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let (buf, log) = Watched::new(pattern_vec(filler.len() as u64, 4096), stats.clone());
    let r1 = tokio::time::timeout(std::time::Duration::from_millis(100), s.send_zc(buf)).await;
    assert!(r1.is_err(), "no completion while the peer's window is shut");
    let st = stats.snapshot();
    assert_eq!(st.tx_bytes_zerocopy, 4096, "every byte was queued: {st}");
    assert!(
        log.lock().unwrap().is_none(),
        "dropped while the kernel holds it"
    );
    assert_eq!(s.loans_in_flight(), 1);
    let calls_made = st.tx_calls_zerocopy;
    let reader = tokio::spawn(async move { read_verified(&mut r).await });
    let what = format!(
        "flush_loans, {} loans, {}",
        s.loans_in_flight(),
        stats.snapshot()
    );
    bounded(what, s.flush_loans()).await.unwrap();
    assert_eq!(log.lock().unwrap().unwrap(), calls_made);
    bounded("shutdown", s.shutdown()).await.unwrap();
    drop(s);
    let got = bounded("the reader", reader).await.unwrap().unwrap();
    assert_eq!(got, stats.snapshot().tx_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_keeps_its_loans_until_completion_then_closes() {
    let stats = Arc::new(Stats::new());
    let (mut s, mut r) = stalled_pair(config(&stats)).await;
    let (buf, log) = Watched::new(pattern_vec(0, 1 << 20), stats.clone());
    // send_bytes returns once queued; 1 MiB does not fit, so give it a moment and cancel.
    let bytes = Bytes::from_owner(buf);
    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), s.send_bytes(bytes)).await;
    assert!(s.loans_in_flight() > 0, "a loan is in flight");
    drop(s);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(log.lock().unwrap().is_none(), "freed under the kernel");
    let calls_made = stats.snapshot().tx_calls_zerocopy;
    // Reading lets the data go; the driver then releases the buffer and closes (EOF).
    let got = bounded("the reader", read_verified(&mut r)).await.unwrap();
    assert_eq!(got, stats.snapshot().tx_bytes());
    for _ in 0..200 {
        if log.lock().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        log.lock().unwrap().expect("released after completion"),
        calls_made
    );
}

#[test]
fn a_runtime_shut_down_under_a_loan_leaks_it_rather_than_free_it() {
    let stats = Arc::new(Stats::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let leaked_before = zcnet_tokio::leaked_loans();
    let (r, log) = rt.block_on(async {
        let (mut s, r) = stalled_pair(config(&stats)).await;
        let (buf, log) = Watched::new(pattern_vec(0, 1 << 20), stats.clone());
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            s.send_bytes(Bytes::from_owner(buf)),
        )
        .await;
        assert!(s.loans_in_flight() > 0);
        drop(s);
        (r.into_std().unwrap(), log)
    });
    drop(rt);
    assert!(log.lock().unwrap().is_none(), "freed under the kernel");
    assert!(zcnet_tokio::leaked_loans() > leaked_before);
    drop(r);
}
