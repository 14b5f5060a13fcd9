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

/// CPU time of the calling thread (`RUSAGE_THREAD`), up to date.
///
/// `getrusage` reports the thread's runtime as the scheduler last recorded it (at a tick or
/// a context switch), not including the slice running now: a thread that did 1 ms of work
/// without sleeping or meeting a 4 ms tick read 0 s (a bench receiver that found 4 MiB
/// already queued did). Reading the thread CPU clock first makes the kernel record the
/// running slice (`task_sched_runtime` → `update_curr`), so the total that `getrusage`
/// then splits into user and system is exact.
pub fn thread() -> io::Result<Rusage> {
    let _ = thread_cpu_ns();
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

/// CPU time of the whole process (`RUSAGE_SELF`), the calling thread's running slice
/// included (as in [`thread`]; other threads' running slices are as last recorded).
pub fn process() -> io::Result<Rusage> {
    let _ = thread_cpu_ns();
    getrusage(libc::RUSAGE_SELF)
}

/// The calling thread's kernel id (`gettid(2)`), read once per thread and cached: a sender
/// asks on every send whether it still runs on the thread it announced
/// (`zcnet::peer_card`), which must cost a thread-local read, not a system call.
pub fn thread_id() -> i32 {
    thread_local! {
        static TID: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    }
    TID.with(|t| {
        if t.get() == 0 {
            t.set(rustix::thread::gettid().as_raw_nonzero().get());
        }
        t.get()
    })
}

/// Run time in nanoseconds of thread `tid` of process `pid`, from
/// `/proc/PID/task/TID/schedstat` (its first field: the scheduler's `sum_exec_runtime`, the
/// count `CLOCK_THREAD_CPUTIME_ID` reads for the thread itself). How a receiver reads the
/// CPU clock of a sending thread in another process, where POSIX thread clocks reach only
/// threads of one's own. `None` if the thread is gone or the kernel keeps no schedstat
/// (`CONFIG_SCHED_INFO` off).
pub fn thread_cpu_ns_of(pid: u32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    s.split_ascii_whitespace().next()?.parse().ok()
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

/// Pins the calling thread to CPU `cpu` (`sched_setaffinity(2)` with pid 0: this thread
/// only). A benchmark pins its two ends apart so the scheduler cannot move them onto one
/// CPU mid-run, one source of run-to-run spread on a small machine.
pub fn pin_thread(cpu: usize) -> io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).map_err(io::Error::from)
}

/// The CPUs the calling thread may run on (`sched_getaffinity(2)`), in order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None).map_err(io::Error::from)?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schedstat reading of a thread is the same clock as its own thread CPU clock: read
    /// between two readings of the latter, it lies between them; and it grows with work.
    #[cfg_attr(
        not(zcnet_has_schedstat),
        ignore = "needs per-thread schedstat (CONFIG_SCHED_INFO)"
    )]
    #[test]
    fn another_threads_clock_reads_as_its_own_does() {
        let pid = std::process::id();
        let tid = thread_id();
        assert_eq!(tid, thread_id(), "cached");
        assert!(tid > 0);
        let a = thread_cpu_ns();
        let s = thread_cpu_ns_of(pid, tid).expect("schedstat of this thread");
        let mut x = 0u64;
        for i in 0..4_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let b = thread_cpu_ns();
        let s2 = thread_cpu_ns_of(pid, tid).expect("schedstat again");
        // schedstat is brought up to date only at scheduler events, so it may lag the
        // thread's own clock by the running slice, never lead it.
        assert!(s <= b, "schedstat {s} ahead of the clock read after it {b}");
        assert!(s2 >= s, "a thread's run time went back: {s} then {s2}");
        assert!(a <= b);
        // Another thread's: it ran work, so its run time is more than zero.
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            let mut y = 0u64;
            for i in 0..4_000_000u64 {
                y = std::hint::black_box(y.wrapping_mul(31).wrapping_add(i));
            }
            tx.send(thread_id()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            y
        });
        let other = rx.recv().unwrap();
        assert_ne!(other, tid);
        let ns = thread_cpu_ns_of(pid, other).expect("schedstat of a live thread");
        assert!(ns > 0, "a thread that ran reads {ns} ns");
        h.join().unwrap();
        assert_eq!(
            thread_cpu_ns_of(pid, other),
            None,
            "a thread gone reads as gone"
        );
        assert_eq!(thread_cpu_ns_of(pid, -1), None);
    }

    /// Without the clock read in `thread()`, the slice since the last scheduler event is
    /// missing from the second reading: a few million multiply-adds between two readings
    /// read as 0 up to their cost (CONFIG_TICK_CPU_ACCOUNTING, HZ=250). With it, the second
    /// reading holds every nanosecond the thread CPU clock saw of that work. Both sides are
    /// the thread's own CPU clocks; no wall clock is read.
    #[test]
    fn thread_time_includes_the_slice_running_now() {
        for _ in 0..20 {
            let a = thread().unwrap();
            let c0 = thread_cpu_ns();
            // A fixed amount of work without a syscall, so nothing but a tick or a
            // preemption makes the scheduler record it.
            let mut x = 0u64;
            for i in 0..4_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            let b = thread().unwrap();
            let c1 = thread_cpu_ns();
            let by_rusage = (b.user + b.sys).saturating_sub(a.user + a.sys);
            let by_clock = Duration::from_nanos(c1 - c0);
            // `b` was read before `c1`, `a` before `c0`: the clock's span can exceed the
            // readings' only by `getrusage`'s microsecond rounding and the one call between
            // `b`'s clock read and `c1` — never by the work's own slice.
            assert!(
                by_rusage + Duration::from_micros(100) >= by_clock,
                "getrusage saw {by_rusage:?} of the {by_clock:?} the thread clock saw"
            );
        }
    }

    #[test]
    fn a_pinned_thread_may_run_on_that_cpu_only() {
        let first = allowed_cpus().unwrap()[0];
        let (allowed, now) = std::thread::spawn(move || {
            pin_thread(first).unwrap();
            (allowed_cpus().unwrap(), rustix::thread::sched_getcpu())
        })
        .join()
        .unwrap();
        assert_eq!(allowed, vec![first]);
        assert_eq!(now, first);
        // Only that thread: this one keeps its own set.
        assert!(allowed_cpus().unwrap().contains(&first));
    }
}
