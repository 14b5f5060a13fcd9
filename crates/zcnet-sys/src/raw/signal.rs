//! Signals taken synchronously: blocked in the calling thread (`pthread_sigmask(2)`) and
//! received with `sigwaitinfo(2)`, which also says who sent each one — what a parent that
//! relays signals to its child (`zcnet run`, as `perf stat` does) needs to tell a `kill`
//! aimed at it from a terminal's signal that its child received too.

use std::io;

/// A set of signal numbers.
#[derive(Clone, Copy)]
pub struct SigSet(libc::sigset_t);

impl std::fmt::Debug for SigSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n: Vec<i32> = (1..65).filter(|&s| self.contains(s)).collect();
        f.debug_tuple("SigSet").field(&n).finish()
    }
}

impl SigSet {
    /// The set of `signals`.
    pub fn of(signals: &[i32]) -> SigSet {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `s` is a live sigset_t; an invalid number is refused with EINVAL, not UB.
        unsafe {
            libc::sigemptyset(&mut s);
            for &n in signals {
                libc::sigaddset(&mut s, n);
            }
        }
        SigSet(s)
    }

    /// Whether `n` is in the set.
    pub fn contains(&self, n: i32) -> bool {
        // SAFETY: a live, initialised sigset_t.
        unsafe { libc::sigismember(&self.0, n) == 1 }
    }

    /// Blocks the set in the calling thread (threads it starts later inherit the mask; a
    /// program started with `std::process::Command` gets an empty mask).
    pub fn block(&self) -> io::Result<()> {
        // SAFETY: a live set; the old mask is not asked for.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &self.0, std::ptr::null_mut()) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(r))
        }
    }

    /// Makes the program `cmd` starts begin with this set unblocked: a signal mask is
    /// inherited across `fork` and `exec`, and `std::process::Command` leaves it as it is.
    pub fn unblocked_in(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let set = self.0;
        // SAFETY: the closure runs in the child between `fork` and `exec`, where only
        // async-signal-safe calls are sound: it makes one, pthread_sigmask (signal-safety(7)),
        // on a set copied in before the fork, and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                Ok(())
            });
        }
    }

    /// Waits for one signal of the set (which must be blocked) and takes it.
    pub fn wait(&self) -> io::Result<Received> {
        loop {
            // SAFETY: siginfo_t is plain data the call fills in.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: a live set and a live siginfo_t.
            let n = unsafe { libc::sigwaitinfo(&self.0, &mut info) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            return Ok(Received {
                signal: n,
                // SAFETY: si_pid is valid for the codes that name a sender (SI_USER,
                // SI_QUEUE, SI_TKILL, CLD_*); for others it reads the union's bytes.
                pid: unsafe { info.si_pid() },
                sent: info.si_code <= 0,
            });
        }
    }
}

/// Ends this process by signal `n`'s default action (a parent relaying its child's end):
/// the disposition reset, the signal unblocked and raised. Exits with `128 + n` if the
/// signal's default is not to end the process.
pub fn die_by(n: i32) -> ! {
    // SAFETY: resetting one signal's disposition to the default and unblocking it changes
    // no memory this program owns; raise(3) delivers it to the calling thread.
    unsafe {
        libc::signal(n, libc::SIG_DFL);
        let set = SigSet::of(&[n]);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set.0, std::ptr::null_mut());
        libc::raise(n);
    }
    std::process::exit(128 + n)
}

/// One signal taken by [`SigSet::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Its number.
    pub signal: i32,
    /// The sender's pid, for a sent signal (or the child, for `SIGCHLD`).
    pub pid: i32,
    /// Sent by a process (`kill`, `sigqueue`, `tgkill`: `si_code <= 0`), not raised by the
    /// kernel (a terminal's `^C`, which the whole foreground process group receives).
    pub sent: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_signal_sent_to_this_thread_is_taken_with_its_sender() {
        std::thread::spawn(|| {
            let set = SigSet::of(&[libc::SIGUSR2]);
            set.block().unwrap();
            assert!(set.contains(libc::SIGUSR2) && !set.contains(libc::SIGUSR1));
            let me = rustix::thread::gettid();
            // SAFETY: tgkill with our own pid and thread id and a blocked signal.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    me.as_raw_nonzero().get(),
                    libc::SIGUSR2,
                )
            };
            assert_eq!(r, 0);
            let got = set.wait().unwrap();
            assert_eq!(got.signal, libc::SIGUSR2);
            assert!(got.sent);
            assert_eq!(got.pid as u32, std::process::id());
        })
        .join()
        .unwrap();
    }
}
