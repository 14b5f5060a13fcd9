//! The sending thread's CPU clock, shown to a receiver on the same host, so that a receive
//! trial without a profile judges what the *pair* costs, not only its own end.
//!
//! Why: a receive path's saving can lie on the sender. Over veth at 16 KiB the mapping
//! receiver left its own thread's cost level with copy's (0.78–0.86 s/GiB) while the copy
//! sender feeding it cost 1.21–1.29 s/GiB against 1.47–1.54 into a copy receiver, sitting
//! after sitting (`git show 758b630:docs/measurements/auto.md`): the copy receiver reads one send per call in
//! lockstep, the mapping one lets about two queue per wake-up. `tune` sees that because it
//! measures pairs; a connection without a profile had only its receiving thread's clock,
//! kept copy, and its pair ran about 11 % over `copy → mmap`.
//!
//! How: a [`crate::Sender`] leaves a *card* — its process id, the id of the thread that
//! sends, and the bytes it has sent — in a directory only its user may write
//! (`/dev/shm/zcnet-EUID/`), named by the connection's two addresses. The card is a page the
//! sender keeps mapped, so counting a send is an atomic add, and following the sends to
//! another thread one store. An `auto` receiver with no profile looks for the card its peer
//! left (the same two addresses seen from its side) once bytes have arrived — the sender
//! writes it before its first send — and from then on, at each end of every window, reads
//! the sending thread's run time (`/proc/PID/task/TID/schedstat`: the count the thread's own
//! `CLOCK_THREAD_CPUTIME_ID` reads) and bytes sent. Between two readings the sender's CPU
//! time is scaled to the bytes the *receiver* took (sender ns × received / sent): over one
//! window the sender may have filled or drained the socket buffers by megabytes, and
//! unscaled, an arm that lets the buffers drain would look cheaper for the sends it never
//! waited for. So each window costs both ends' CPU per byte, and paired rounds and medians
//! ([`crate::auto::trial`]) judge the pair as `tune` would.
//!
//! Where it cannot work it is simply absent, and the receiver judges on its own clock as
//! before: peers on another host, containers with a /dev/shm of their own, address
//! translation between the ends, another user's sender, a sender that is not zcnet's. A card
//! is best effort: no step of it can fail a connection. The sender removes its card when it
//! is dropped; a card left by a process that died names a thread that no longer exists,
//! which reads as no clock, and is removed by the next sender to publish one (each process
//! sweeps the directory at most once a minute).
//!
//! Off unless asked: the card directory is the only state zcnet shares between processes,
//! and a library writes such files only when its caller says so —
//! [`crate::SenderConfig::peer_clock`] publishes, [`crate::ReceiverConfig::peer_clock`]
//! looks. The `zcnet` CLI turns both on (`ZCNET_PEER_CLOCK=off` there turns them off, to
//! measure a trial on the receiver's clock alone).
//!
//! What the receiver reads is the sending *thread*: work the sender hands to other threads
//! (softirq run on another core, `ksoftirqd`) is in neither clock, as it is in neither
//! end's clock of [`crate::auto::cost`].
//!
//! Why apart from [`crate::auto`]: the cards are files shared between processes, and
//! `auto` is the decider, which reads no file. The receiver's clock that adds a card's
//! reading to its own (`crate::rx::auto::RxClock`) feeds the decider numbers, like any clock.

use std::cell::Cell;
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use zcnet_sys::mem::SharedWords;
use zcnet_sys::raw::{cpu, socket};

/// Where cards live when nothing else is said: a tmpfs every process on the host shares.
const SHARED: &str = "/dev/shm";

/// A card's words: a tag written last (a card without it is not yet, or not, a card), the
/// process id, the sending thread's id, the bytes sent, the send calls that sent them, and
/// the sender's transmit path ([`path_code`]).
const MAGIC: u64 = u64::from_le_bytes(*b"zcnclk03");
const W_MAGIC: usize = 0;
const W_PID: usize = 1;
const W_TID: usize = 2;
const W_BYTES: usize = 3;
const W_SENDS: usize = 4;
const W_PATH: usize = 5;
const WORDS: usize = 6;

/// The number a card gives a sender's transmit path (0: not said): its place in
/// [`crate::TxPath::ALL`], from 1 — what a receiver's trial memory tells senders apart by
/// ([`crate::auto::memory`]).
pub(crate) fn path_code(path: crate::TxPath) -> u64 {
    crate::TxPath::ALL
        .iter()
        .position(|&p| p == path)
        .map_or(0, |i| i as u64 + 1)
}

/// How far the scaling of an interval's sender time to the receiver's bytes may go either
/// way: the buffers between two ends hold a few MiB, a window 16, so a ratio past this is an
/// interval too short to say anything, not a measurement.
const MAX_SCALE: f64 = 4.0;

/// This user's card directory under [`SHARED`], made if missing; `None` if it cannot be
/// made, or is not a directory this user owns that no one else may write (another user's
/// card there could point a receiver at any thread, or be truncated under a sender's
/// mapping).
pub(crate) fn default_dir() -> Option<PathBuf> {
    let euid = socket::euid();
    let dir = Path::new(SHARED).join(format!("zcnet-{euid}"));
    if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return None;
        }
    }
    let m = std::fs::symlink_metadata(&dir).ok()?;
    (m.is_dir() && m.uid() == euid && m.mode() & 0o077 == 0).then_some(dir)
}

/// The card's file name for the connection from `sender` to `receiver` (either end can name
/// it: each sees the other's address as its peer's).
fn card_name(sender: SocketAddr, receiver: SocketAddr) -> String {
    format!(
        "tcp-{}_{}-{}_{}",
        sender.ip(),
        sender.port(),
        receiver.ip(),
        receiver.port()
    )
}

/// What a card says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Card {
    pid: u32,
    tid: i32,
    bytes: u64,
    sends: u64,
    path: u64,
}

/// A card's words as a reader sees them (`None` without the tag, or with ids out of range).
fn parse_card(w: [u64; WORDS]) -> Option<Card> {
    let pid = u32::try_from(w[W_PID]).ok().filter(|&p| p > 0)?;
    let tid = i32::try_from(w[W_TID]).ok().filter(|&t| t > 0)?;
    (w[W_MAGIC] == MAGIC).then_some(Card {
        pid,
        tid,
        bytes: w[W_BYTES],
        sends: w[W_SENDS],
        path: w[W_PATH],
    })
}

/// The sender's card (module docs): removed when dropped.
pub(crate) struct ClockCard {
    path: PathBuf,
    words: SharedWords,
    /// The thread the card names.
    tid: i32,
}

impl std::fmt::Debug for ClockCard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClockCard")
            .field("path", &self.path)
            .field("tid", &self.tid)
            .finish()
    }
}

impl ClockCard {
    /// Writes the card for `sender → receiver` in `dir`, naming the calling thread and the
    /// sender's transmit path (`tx_path`: [`path_code`]); `None` if it could not be written.
    /// Made aside and renamed into place complete, so a reader never meets half a card.
    pub(crate) fn publish(
        dir: &Path,
        sender: SocketAddr,
        receiver: SocketAddr,
        tx_path: u64,
    ) -> Option<Self> {
        sweep_now_and_then(dir);
        let path = dir.join(card_name(sender, receiver));
        let tid = cpu::thread_id();
        let mut tmp = path.clone().into_os_string();
        tmp.push(format!(".{}.{tid}.tmp", std::process::id()));
        let made = (|| {
            let f = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .ok()?;
            let words = SharedWords::map(&f, WORDS).ok()?;
            words
                .word(W_PID)
                .store(u64::from(std::process::id()), Ordering::Relaxed);
            words.word(W_TID).store(tid as u64, Ordering::Relaxed);
            words.word(W_PATH).store(tx_path, Ordering::Relaxed);
            words.word(W_MAGIC).store(MAGIC, Ordering::Release);
            std::fs::rename(&tmp, &path).ok()?;
            Some(words)
        })();
        match made {
            Some(words) => Some(ClockCard { path, words, tid }),
            None => {
                let _ = std::fs::remove_file(&tmp);
                None
            }
        }
    }

    /// Called on each send: if the sends moved to another thread, the card names that one.
    /// A thread-local read when nothing moved.
    pub(crate) fn follow(&mut self) {
        let tid = cpu::thread_id();
        if tid != self.tid {
            self.words.word(W_TID).store(tid as u64, Ordering::Release);
            self.tid = tid;
        }
    }

    /// Counts `n` bytes handed to the kernel by one send call.
    pub(crate) fn sent(&self, n: u64) {
        self.words.word(W_BYTES).fetch_add(n, Ordering::Relaxed);
        self.words.word(W_SENDS).fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for ClockCard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A receiver's reading of its peer's card (module docs): the sender's CPU time since the
/// card was found, scaled interval by interval to the bytes the receiver took.
#[derive(Debug)]
pub(crate) struct PeerClock {
    file: File,
    last: Cell<Reading>,
}

/// A [`PeerClock`]'s last reading.
#[derive(Debug, Clone, Copy)]
struct Reading {
    card: Card,
    /// The sending thread's run time (ns).
    ns: u64,
    /// The receiver's bytes taken.
    received: u64,
    /// The scaled sender time so far (ns).
    sum: u64,
}

impl PeerClock {
    /// The clock of the thread sending `sender → receiver`, if a card for that connection is
    /// in `dir` and the thread it names can be read; `received` is the receiver's count of
    /// bytes taken so far, from which [`PeerClock::now`]'s counts go on.
    pub(crate) fn find(
        dir: &Path,
        sender: SocketAddr,
        receiver: SocketAddr,
        received: u64,
    ) -> Option<Self> {
        let file = File::open(dir.join(card_name(sender, receiver))).ok()?;
        let card = read_card(&file)?;
        let ns = cpu::thread_cpu_ns_of(card.pid, card.tid)?;
        Some(PeerClock {
            file,
            last: Cell::new(Reading {
                card,
                ns,
                received,
                sum: 0,
            }),
        })
    }

    /// The sender's bytes per send call so far, read from its card now (`None` before its
    /// first send has been counted — a receiver may see the bytes a moment before the
    /// sender counts them): what a receiver's trial memory is keyed by
    /// ([`crate::auto::memory`]), since which receive path pays depends on it.
    pub(crate) fn op_size(&self) -> Option<u64> {
        let c = read_card(&self.file)?;
        (c.sends > 0).then(|| c.bytes / c.sends)
    }

    /// The sender's transmit path as its card says ([`path_code`]; 0 if it does not).
    pub(crate) fn sender_path(&self) -> u64 {
        read_card(&self.file).map_or(0, |c| c.path)
    }

    /// The sending thread's CPU time (ns) since the card was found, each interval between
    /// two readings scaled by the bytes the receiver took in it (`received`, its running
    /// count) over those the sender sent. Read only at the ends of windows. A sender that
    /// moved to another thread is followed; one gone reads as no more time.
    pub(crate) fn now(&self, received: u64) -> u64 {
        let last = self.last.get();
        let Some((card, ns)) = read_card(&self.file)
            .and_then(|c| cpu::thread_cpu_ns_of(c.pid, c.tid).map(|ns| (c, ns)))
        else {
            return last.sum;
        };
        // Another thread since the last reading: its run time is not a continuation.
        let ran = if card.tid == last.card.tid {
            ns.saturating_sub(last.ns)
        } else {
            0
        };
        let sum = last.sum
            + scaled(
                ran,
                card.bytes.saturating_sub(last.card.bytes),
                received.saturating_sub(last.received),
            );
        self.last.set(Reading {
            card,
            ns,
            received,
            sum,
        });
        sum
    }
}

/// `ns` of sender time over an interval in which it sent `sent` bytes and the receiver took
/// `received`, restated per received byte (module docs), the ratio bounded by
/// [`MAX_SCALE`]; unscaled where either side moved nothing.
fn scaled(ns: u64, sent: u64, received: u64) -> u64 {
    if sent == 0 || received == 0 {
        return ns;
    }
    let r = (received as f64 / sent as f64).clamp(1.0 / MAX_SCALE, MAX_SCALE);
    (ns as f64 * r).round() as u64
}

/// Seconds between sweeps of the card directory by one process.
const SWEEP_EVERY_S: u64 = 60;

/// [`sweep`], at most once every [`SWEEP_EVERY_S`] per process: a process that ended
/// without dropping its senders (killed, or exiting with sender threads still running)
/// leaves its cards behind, a page of tmpfs each, which nobody else would remove.
fn sweep_now_and_then(dir: &Path) {
    use std::sync::atomic::AtomicU64;
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if (last != 0 && now < last + SWEEP_EVERY_S)
        || LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    sweep(dir);
}

/// Removes from `dir` the cards whose process is gone, and what is not a card (a
/// half-made one, or anything else under a card's name) once it is a minute old.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let old = |e: &std::fs::DirEntry| {
        e.metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() >= SWEEP_EVERY_S)
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with("tcp-") {
            continue;
        }
        let card = File::open(e.path()).ok().as_ref().and_then(read_card);
        let stale = match card {
            Some(c) => !Path::new(&format!("/proc/{}", c.pid)).exists(),
            None => old(&e),
        };
        if stale {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The card in `file`, read with one `pread` (`None` if it is short or not a card).
fn read_card(file: &File) -> Option<Card> {
    let mut b = [0u8; WORDS * 8];
    file.read_exact_at(&mut b, 0).ok()?;
    let w: [u64; WORDS] =
        std::array::from_fn(|i| u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()));
    parse_card(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TxPath;
    use std::sync::mpsc;

    fn addrs() -> (SocketAddr, SocketAddr) {
        (
            "10.7.0.1:40000".parse().unwrap(),
            "10.7.0.2:5201".parse().unwrap(),
        )
    }

    fn spin(n: u64) -> u64 {
        let mut x = 0u64;
        for i in 0..n {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        x
    }

    #[test]
    fn cards_parse_strictly_and_name_both_addresses() {
        let ok = [MAGIC, 12, 34, 56, 7, 3];
        assert_eq!(
            parse_card(ok),
            Some(Card {
                pid: 12,
                tid: 34,
                bytes: 56,
                sends: 7,
                path: 3,
            })
        );
        assert_eq!(parse_card([0, 12, 34, 56, 7, 3]), None, "not tagged (yet)");
        for old in [*b"zcnclk01", *b"zcnclk02"] {
            let old = u64::from_le_bytes(old);
            assert_eq!(parse_card([old, 12, 34, 56, 7, 3]), None, "another layout");
        }
        assert_eq!(parse_card([MAGIC, 0, 34, 0, 0, 0]), None);
        assert_eq!(parse_card([MAGIC, 12, 0, 0, 0, 0]), None);
        assert_eq!(parse_card([MAGIC, 1 << 40, 34, 0, 0, 0]), None);
        assert_eq!(parse_card([MAGIC, 12, u64::MAX, 0, 0, 0]), None);
        assert_eq!(
            [
                TxPath::Copy,
                TxPath::Zerocopy,
                TxPath::Uring,
                TxPath::Cow,
                TxPath::Auto
            ]
            .map(path_code),
            [1, 2, 3, 4, 5],
            "distinct, and none is 0 (not said)"
        );
        let (s, r) = addrs();
        assert_eq!(card_name(s, r), "tcp-10.7.0.1_40000-10.7.0.2_5201");
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(card_name(v6, r), "tcp-::1_9-10.7.0.2_5201");
    }

    #[test]
    fn sender_time_is_restated_per_received_byte_within_bounds() {
        assert_eq!(scaled(1000, 100, 100), 1000);
        // The sender sent twice what the receiver took: half its time is this window's.
        assert_eq!(scaled(1000, 200, 100), 500);
        assert_eq!(scaled(1000, 100, 150), 1500);
        // Bounded either way; unscaled where a side moved nothing.
        assert_eq!(scaled(1000, 100, 10_000), 4000);
        assert_eq!(scaled(1000, 10_000, 100), 250);
        assert_eq!(scaled(1000, 0, 100), 1000);
        assert_eq!(scaled(1000, 100, 0), 1000);
    }

    /// A receiver finds the card its sender published, reads that thread's clock as it
    /// works, scaled to its own bytes, follows the sends to another thread, and finds
    /// nothing once the sender is dropped — nor for the other direction's addresses.
    #[cfg_attr(
        not(zcnet_has_schedstat),
        ignore = "needs per-thread schedstat (/proc/thread-self/schedstat, CONFIG_SCHED_INFO)"
    )]
    #[test]
    fn a_receiver_reads_the_sending_threads_clock_and_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        let (s, r) = addrs();
        let (go, wait) = mpsc::channel::<u64>();
        let (card_tx, card_rx) = mpsc::channel();
        let (tid_tx, tid_rx) = mpsc::channel();
        let path = dir.path().to_path_buf();
        let worker = std::thread::spawn(move || {
            let card =
                ClockCard::publish(&path, s, r, path_code(TxPath::Uring)).expect("card written");
            tid_tx.send(cpu::thread_id()).unwrap();
            card_tx.send(card).unwrap();
            // Work and "send" 1 MiB per step, as told.
            while let Ok(n) = wait.recv() {
                if n == 0 {
                    break;
                }
                let x = spin(n);
                // A sleep is a scheduler event: it records the slice in the thread's
                // schedstat before the reader is told to read it.
                std::thread::sleep(std::time::Duration::from_millis(1));
                tid_tx.send(x as i32 | 1).unwrap();
            }
        });
        let worker_tid = tid_rx.recv().unwrap();
        let mut card = card_rx.recv().unwrap();
        assert!(
            PeerClock::find(dir.path(), r, s, 0).is_none(),
            "the other way round"
        );
        let clock = PeerClock::find(dir.path(), s, r, 0).expect("the card is found");
        assert_eq!(clock.now(0), 0, "counted from when it was found");
        assert_eq!(
            clock.sender_path(),
            path_code(TxPath::Uring),
            "the sender's path"
        );
        // The worker runs 20M multiply-adds; 1 MiB went each way.
        go.send(20_000_000).unwrap();
        tid_rx.recv().unwrap();
        card.sent(1 << 20);
        let one = clock.now(1 << 20);
        assert!(one > 1_000_000, "the work read {one} ns");
        // The same work again, but the sender sent twice what the receiver took: half of
        // it is this receiver's.
        go.send(20_000_000).unwrap();
        tid_rx.recv().unwrap();
        card.sent(2 << 20);
        let two = clock.now(2 << 20) - one;
        assert!(
            two < one,
            "scaled to the received bytes: {two} ns after {one} ns"
        );
        // The sends move to this thread: the card follows; the next interval starts anew
        // on this thread's clock (nothing of the move's interval is counted).
        card.follow();
        assert_ne!(cpu::thread_id(), worker_tid);
        let at_move = clock.now(2 << 20);
        assert_eq!(
            at_move,
            one + two,
            "a moved sender's interval counts nothing"
        );
        spin(20_000_000);
        card.sent(1 << 20);
        // Make the scheduler record this thread's slice: a sleep is a scheduler event.
        std::thread::sleep(std::time::Duration::from_millis(1));
        let here = clock.now(3 << 20) - at_move;
        assert!(here > 1_000_000, "this thread's work read {here} ns");
        go.send(0).unwrap();
        worker.join().unwrap();
        drop(card);
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "the dropped card is removed, no temporary left"
        );
        assert!(PeerClock::find(dir.path(), s, r, 0).is_none());
    }

    /// A card naming a thread that does not exist (its process died) gives no clock; nor
    /// does a file that is not a card.
    #[test]
    fn a_card_left_by_a_dead_thread_gives_no_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (s, r) = addrs();
        let h = std::thread::spawn(move || {
            let dir = tempfile::tempdir().unwrap();
            let c = ClockCard::publish(dir.path(), s, r, 1).unwrap();
            // Keep the file: copy it out before the card is dropped.
            let bytes = std::fs::read(&c.path).unwrap();
            (bytes, cpu::thread_id())
        });
        let (bytes, gone) = h.join().unwrap();
        assert_eq!(bytes.len(), zcnet_sys::mem::page_size());
        let name = dir.path().join(card_name(s, r));
        std::fs::write(&name, &bytes).unwrap();
        assert!(
            cpu::thread_cpu_ns_of(std::process::id(), gone).is_none(),
            "the thread is gone"
        );
        assert!(PeerClock::find(dir.path(), s, r, 0).is_none());
        std::fs::write(&name, "garbage").unwrap();
        assert!(PeerClock::find(dir.path(), s, r, 0).is_none());
        std::fs::write(&name, [0u8; 4096]).unwrap();
        assert!(PeerClock::find(dir.path(), s, r, 0).is_none());
    }

    /// A card whose process is gone is swept; a live process's card and a fresh half-made
    /// one stay, and so does anything not named as a card.
    #[test]
    fn cards_of_processes_gone_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let (s, r) = addrs();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert!(!Path::new(&format!("/proc/{dead}")).exists());
        let live = ClockCard::publish(dir.path(), s, r, 1).unwrap();
        // A copy of a card with the dead process's pid.
        let mut page = std::fs::read(&live.path).unwrap();
        page[8..16].copy_from_slice(&u64::from(dead).to_ne_bytes());
        let gone = dir.path().join("tcp-10.7.0.9_1-10.7.0.2_5201");
        std::fs::write(&gone, &page).unwrap();
        let half = dir.path().join("tcp-10.7.0.9_2-10.7.0.2_5201.1.2.tmp");
        std::fs::write(&half, [0u8; 64]).unwrap();
        let other = dir.path().join("notes");
        std::fs::write(&other, &page).unwrap();
        sweep(dir.path());
        assert!(!gone.exists(), "the dead process's card is swept");
        assert!(live.path.exists(), "a live card stays");
        assert!(half.exists(), "a half-made card is left its minute");
        assert!(other.exists(), "not a card's name: not ours to remove");
    }

    #[cfg_attr(not(zcnet_has_dev_shm), ignore = "needs a writable /dev/shm")]
    #[test]
    fn the_default_directory_is_this_users_alone() {
        let dir = default_dir().expect("a card directory under the writable /dev/shm");
        let m = std::fs::metadata(&dir).unwrap();
        assert_eq!(m.uid(), socket::euid());
        assert_eq!(m.mode() & 0o077, 0, "{:o}", m.mode());
    }
}
