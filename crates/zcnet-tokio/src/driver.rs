//! The completion driver: one tokio task per stream (not a thread) that reads the error
//! queue whenever it signals and a loan is waiting, so completions are consumed even when
//! no caller awaits them (`send_bytes`, a dropped `send_zc` future, a dropped stream).
//!
//! When the stream is dropped with loans in flight the driver shuts the write side down (the
//! peer sees the same FIN a close would send after the queued data) and keeps the socket
//! open until every completion has come: the kernel returns the pages when the data is
//! acknowledged, when the peer resets, or when TCP's own retransmission timeout gives up.
//! Only then is the socket closed and the driver gone.
//!
//! A UDP socket's driver does not watch the error queue while the application keeps
//! sending: its sends read the completions themselves (`send_lent` in batches, `buffer`
//! when the pool runs dry, `send_zc` for its own), and watching would keep the socket in
//! its epoll instance, where every sent batch wakes it (`readiness.rs`). The driver looks
//! once the socket has been idle for [`IDLE`], and then waits for the error queue.

use crate::conn::{Conn, Socket};
use crate::readiness::Watch;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

/// How long a socket watched only while waited on must go without a send before its
/// driver reads and waits for the completions itself.
pub(crate) const IDLE: Duration = Duration::from_millis(2);

/// Runs until the stream is dropped and no loan is left.
pub(crate) async fn drive<S: Socket>(conn: Arc<Conn<S>>) {
    loop {
        if conn.loans_in_flight() == 0 {
            if conn.is_closed() {
                return;
            }
            conn.wake_driver.notified().await;
            continue;
        }
        if conn.is_closed() {
            conn.socket().close_write();
            // An error here (the error queue unreadable) leaves the loans to be leaked when
            // the last reference goes; nothing is freed under the kernel.
            let _ = poll_fn(|cx| conn.poll_completions(cx)).await;
            return;
        }
        if S::WATCH == Watch::WhileWaited {
            let seen = conn.activity();
            tokio::select! {
                _ = tokio::time::sleep(IDLE) => {}
                _ = conn.wake_driver.notified() => continue,
            }
            if conn.activity() != seen {
                continue;
            }
            if conn.drain().is_err() {
                return;
            }
            if conn.loans_in_flight() == 0 {
                continue;
            }
        }
        tokio::select! {
            r = poll_fn(|cx| conn.poll_completions(cx)) => {
                if r.is_err() {
                    return;
                }
            }
            _ = conn.wake_driver.notified() => {}
        }
    }
}
