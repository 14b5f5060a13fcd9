//! CPU time of the calling thread or process (`getrusage(2)`).

use std::io;
use std::time::Duration;

/// User and system CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rusage {
    /// Time in user mode.
    pub user: Duration,
    /// Time in the kernel on our behalf (softirq work done in our context included, softirq
    /// run by ksoftirqd or on the other core not).
    pub sys: Duration,
}

fn tv(t: libc::timeval) -> Duration {
    Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000)
}

fn getrusage(who: i32) -> io::Result<Rusage> {
    // SAFETY: rusage is plain old data; all-zero is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a live local the kernel fills.
    if unsafe { libc::getrusage(who, &mut ru) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Rusage {
        user: tv(ru.ru_utime),
        sys: tv(ru.ru_stime),
    })
}

/// CPU time of the calling thread (`RUSAGE_THREAD`).
pub fn thread() -> io::Result<Rusage> {
    getrusage(libc::RUSAGE_THREAD)
}

/// The calling thread's CPU time in nanoseconds, from `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`:
/// the scheduler's own runtime count, precise to the nanosecond, where `RUSAGE_THREAD`'s
/// user/system split is sampled at the tick. What a check over a few milliseconds of one
/// connection's sends can read (rustix: this clock cannot fail on Linux).
pub fn thread_cpu_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (ts.tv_sec.max(0) as u64) * 1_000_000_000 + ts.tv_nsec.max(0) as u64
}

/// CPU time of the whole process (`RUSAGE_SELF`).
pub fn process() -> io::Result<Rusage> {
    getrusage(libc::RUSAGE_SELF)
}

/// Clock ticks per second for /proc/stat (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 {
        v as u64
    } else {
        100
    }
}

/// Pins the calling thread to CPU `cpu` (`sched_setaffinity(2)` on thread 0 = the caller).
/// For benchmarks that put the two ends of a connection on different cores, so their CPU
/// time does not depend on where the scheduler happens to put them.
pub fn pin_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is beyond CPU_SETSIZE"),
        ));
    }
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE (checked above), so the bit lies inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a live, initialised cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod pin_tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_only() {
        // The CPU this process may use for sure: the one it runs on now.
        // SAFETY: sched_getcpu has no preconditions.
        let want = unsafe { libc::sched_getcpu() };
        assert!(want >= 0);
        let got = std::thread::spawn(move || {
            pin_thread(want as usize).unwrap();
            // Many short runs: a thread not pinned would be moved now and then.
            (0..1000)
                .map(|_| {
                    std::thread::yield_now();
                    // SAFETY: as above.
                    unsafe { libc::sched_getcpu() }
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        assert!(
            got.iter().all(|&c| c == want),
            "pinned to CPU {want}: {got:?}"
        );
        assert!(pin_thread(libc::CPU_SETSIZE as usize).is_err());
    }
}
