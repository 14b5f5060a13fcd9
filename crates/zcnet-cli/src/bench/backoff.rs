//! What a bench server does when `accept(2)` fails or a thread cannot be started: back off
//! instead of spinning, and say so at most once a second.
//!
//! At its descriptor limit (`EMFILE`, or the system's, `ENFILE`) a listener stays readable —
//! the connection waits in the backlog — so a loop that polls, fails to accept and polls
//! again spins on one core and writes a line per turn (hundreds of thousands a second).
//! Resource errors (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) wait 10 ms, doubling to one
//! second while they last; a success resets the wait. Errors that concern one connection
//! only (`ECONNABORTED`, `EPERM` from a firewall) do not wait. Either way the log carries
//! one line a second at most, with how many were left out.

use std::time::{Duration, Instant};

/// The first wait after a resource error.
const FIRST: Duration = Duration::from_millis(10);
/// The longest wait: the server answers again within a second of descriptors coming back.
const LONGEST: Duration = Duration::from_secs(1);
/// One line per this at most.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// At most one line per second; counts what it left out.
#[derive(Debug, Default)]
pub(crate) struct LogLimit {
    last: Option<Instant>,
    left_out: u64,
}

impl LogLimit {
    /// Whether to write a line at `now`; if so, how many were left out since the last one.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < LOG_EVERY => {
                self.left_out += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.left_out))
            }
        }
    }

    /// `msg`, with how many like it were left out, if a line is due at `now`.
    pub(crate) fn line(&mut self, now: Instant, msg: std::fmt::Arguments<'_>) -> Option<String> {
        self.allow(now).map(|n| match n {
            0 => msg.to_string(),
            n => format!("{msg} ({n} more like it in the last second not shown)"),
        })
    }
}

/// The accept loop's state between failures.
#[derive(Debug)]
pub(crate) struct AcceptBackoff {
    wait: Duration,
    log: LogLimit,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            wait: FIRST,
            log: LogLimit::default(),
        }
    }
}

/// Errors that say the process (or the system) is out of something, not that one
/// connection went wrong.
fn is_resource(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

impl AcceptBackoff {
    /// After `accept` failed with `e` at `now`: how long to wait before accepting again,
    /// and the line to log, if one is due.
    pub(crate) fn failed(
        &mut self,
        e: &std::io::Error,
        now: Instant,
    ) -> (Duration, Option<String>) {
        let wait = if is_resource(e) {
            let w = self.wait;
            self.wait = (self.wait * 2).min(LONGEST);
            w
        } else {
            Duration::ZERO
        };
        let line = if wait.is_zero() {
            self.log.line(now, format_args!("accept: {e}"))
        } else {
            self.log.line(
                now,
                format_args!(
                    "accept: {e}; waiting {} ms before accepting again",
                    wait.as_millis()
                ),
            )
        };
        (wait, line)
    }

    /// After a connection was accepted: the next failure waits the shortest time again.
    pub(crate) fn succeeded(&mut self) {
        self.wait = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EMFILE)
    }

    #[test]
    fn resource_errors_wait_longer_each_time_up_to_a_second_and_reset() {
        let mut b = AcceptBackoff::default();
        let t = Instant::now();
        let waits: Vec<u128> = (0..10)
            .map(|_| b.failed(&emfile(), t).0.as_millis())
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(&emfile(), t).0, FIRST);
        let enfile = std::io::Error::from_raw_os_error(libc::ENFILE);
        assert!(b.failed(&enfile, t).0 > Duration::ZERO);
        let aborted = std::io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert_eq!(b.failed(&aborted, t).0, Duration::ZERO);
    }

    #[test]
    fn one_line_a_second_with_what_was_left_out() {
        let mut b = AcceptBackoff::default();
        let t = Instant::now();
        let first = b
            .failed(&emfile(), t)
            .1
            .expect("the first failure is logged");
        assert!(first.contains("accept:"), "{first}");
        assert!(!first.contains("not shown"), "{first}");
        for i in 1..1000u64 {
            let at = t + Duration::from_micros(i * 900);
            assert!(b.failed(&emfile(), at).1.is_none(), "line at {i}");
        }
        let next = b
            .failed(&emfile(), t + Duration::from_secs(1))
            .1
            .expect("a line a second later");
        assert!(next.contains("999 more like it"), "{next}");
    }
}
