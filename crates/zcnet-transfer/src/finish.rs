//! Finishing small files (`Put`s), and from version 7 files sent by `sendfile` (`File`s), in
//! batches, on a thread of their own, while the session's thread reads the next ones.
//!
//! The promise is the one every file keeps: a final name appears only after the length and
//! the BLAKE3 hash are verified and the data is durable, and the `Ack` for a file means
//! exactly that. What is batched is the waiting: the finishing thread takes every file
//! waiting for it (up to [`MAX_BATCH`]), checks each and sets its mode and mtime, `fsync`s
//! them all (side by side on a few threads when the file system makes an `fsync` wait for
//! the disk, since ext4's journal (jbd2) commits concurrent `fsync`s together), renames them
//! in order, `fsync`s each directory they went into once, and only then writes their
//! `Ack`s, in order, in one `send`. A crash at any point leaves each file as nothing, its
//! partial file, or its verified final file (`docs/transfer-protocol.md`, "What a crash
//! leaves").

use super::store::{Checked, Incoming, Published, Refusal};
use super::wire::{Code, Frame};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `Put`s written to their partial files and waiting for the finishing thread. Each holds
/// one descriptor (its directory's is shared through the store's cache). The session's
/// thread waits when the queue is full; the finishing thread never waits on the sender (the
/// answers fit in the socket buffers: the session's `MAX_WINDOW`), so the wait always ends.
pub(crate) const FINISH_QUEUE: usize = 64;

/// Most files finished together: a sender's largest window.
const MAX_BATCH: usize = 128;

/// Threads that `fsync` side by side when one `fsync` is slow.
const SYNC_THREADS: usize = 8;

/// An `fsync` that takes longer than this on average is waiting for a disk: then a batch's
/// are issued from [`SYNC_THREADS`] threads at once. Below it (tmpfs, a fast disk) they run
/// one after the other on the finishing thread, cheaper than waking threads.
const PARALLEL_ABOVE: Duration = Duration::from_micros(100);

/// A `Put` read whole and written to its partial file, or a `File` whose data has landed
/// (or either refused), waiting for its checks, fsync and rename.
pub(crate) struct Staged {
    pub name: String,
    pub size: u64,
    pub mode: u32,
    pub mtime: (i64, u32),
    pub hash: Option<[u8; 32]>,
    pub began: Result<Incoming, Refusal>,
}

/// What became of one [`Staged`] file; its `Ack` has been sent.
pub(crate) struct Finished {
    pub name: String,
    pub size: u64,
    /// Its hash was checked (the sender sent one) and it is final.
    pub verified: bool,
    pub result: Result<u64, Refusal>,
}

/// The finishing thread's end of a session.
pub(crate) struct Finisher {
    jobs: SyncSender<Staged>,
    done: Receiver<io::Result<Vec<Finished>>>,
    /// Held while either thread writes on the session's socket: a batch of `Ack`s and the
    /// session thread's `Ready` for the next `File` (version 7) never interleave, even when
    /// a write waits for room.
    writing: Arc<Mutex<()>>,
}

impl Finisher {
    /// Starts the thread; it answers on `sock` (the session's socket), cutting each `Ack`'s
    /// message to `ack_message` bytes.
    pub(crate) fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        sock: AnswerSink,
        ack_message: usize,
    ) -> io::Result<Finisher> {
        let (jobs, queue) = mpsc::sync_channel::<Staged>(FINISH_QUEUE);
        let (tell, done) = mpsc::channel();
        let writing = Arc::new(Mutex::new(()));
        let lock = writing.clone();
        std::thread::Builder::new()
            .name("zcnet finish".into())
            .spawn_scoped(scope, move || {
                let mut plan = SyncPlan::default();
                // The session (or its socket) is gone: what is queued is whole and checked,
                // so it is still finished as promised (its answers would find no one), and
                // none is left behind as a partial file.
                let mut gone = false;
                while let Ok(first) = queue.recv() {
                    let mut batch = vec![first];
                    while batch.len() < MAX_BATCH {
                        match queue.try_recv() {
                            Ok(s) => batch.push(s),
                            Err(_) => break,
                        }
                    }
                    let finished = finish_batch(batch, &mut plan);
                    if gone {
                        continue;
                    }
                    let r = {
                        let _alone = lock.lock().unwrap_or_else(|e| e.into_inner());
                        answer(&sock, &finished, ack_message).map(|()| finished)
                    };
                    let failed = r.is_err();
                    gone = tell.send(r).is_err() || failed;
                }
            })?;
        Ok(Finisher {
            jobs,
            done,
            writing,
        })
    }

    /// Held while the session's thread writes on the socket, so that no batch of `Ack`s is
    /// written in the middle of its frame.
    pub(crate) fn writing(&self) -> MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues one file (waits while the queue is full).
    pub(crate) fn hand_over(&mut self, staged: Staged) -> io::Result<()> {
        if self.jobs.send(staged).is_ok() {
            return Ok(());
        }
        // The thread stopped on an error, which waits in `done` behind earlier batches.
        for r in self.done.iter() {
            r?;
        }
        Err(io::Error::other("the finishing thread ended"))
    }

    /// The files finished (and answered) so far, in order.
    pub(crate) fn collect(&mut self) -> io::Result<Vec<Finished>> {
        let mut out = Vec::new();
        while let Ok(r) = self.done.try_recv() {
            out.extend(r?);
        }
        Ok(out)
    }

    /// Waits until every handed-over file is finished and answered.
    pub(crate) fn settle(self) -> io::Result<Vec<Finished>> {
        drop(self.jobs);
        let mut out = Vec::new();
        for r in self.done {
            out.extend(r?);
        }
        Ok(out)
    }
}

/// Where the finishing thread writes its `Ack`s.
pub(crate) enum AnswerSink {
    /// A duplicate of the session's socket.
    Socket(OwnedFd),
    /// The session's TLS connection, shared with its thread: every byte of an encrypted
    /// session goes through the one TLS connection.
    Tls(Arc<crate::tls::TlsLink>),
}

impl AnswerSink {
    fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        match self {
            AnswerSink::Socket(sock) => (&*socket2::SockRef::from(sock)).write_all(bytes),
            AnswerSink::Tls(link) => link.write_all(bytes).map_err(io::Error::other),
        }
    }
}

/// One write with every `Ack` of a batch, in order.
fn answer(sock: &AnswerSink, finished: &[Finished], ack_message: usize) -> io::Result<()> {
    let mut bytes = Vec::new();
    for f in finished {
        let (code, len, mut message) = match &f.result {
            Ok(len) => (Code::Ok, *len, String::new()),
            Err(r) => (r.code, f.size, r.message.clone()),
        };
        if message.len() > ack_message {
            let mut cut = ack_message;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        bytes.extend_from_slice(
            &Frame::Ack {
                code,
                bytes: len,
                message,
            }
            .to_bytes(),
        );
    }
    sock.write_all(&bytes)
}

/// Checks, syncs, renames in order and syncs the directories of one batch.
fn finish_batch(batch: Vec<Staged>, plan: &mut SyncPlan) -> Vec<Finished> {
    struct Meta {
        name: String,
        size: u64,
        hashed: bool,
    }
    let checked: Vec<(Meta, Result<Checked, Refusal>)> = batch
        .into_iter()
        .map(|s| {
            let r = s.began.and_then(|inc| inc.check(s.hash, s.mode, s.mtime));
            let meta = Meta {
                name: s.name,
                size: s.size,
                hashed: s.hash.is_some(),
            };
            (meta, r)
        })
        .collect();
    let synced = {
        let fds: Vec<BorrowedFd<'_>> = checked
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().map(|c| c.file().as_fd()))
            .collect();
        plan.sync(&fds)
    };
    let mut synced = synced.into_iter();
    let published: Vec<(Meta, Result<Published, Refusal>)> = checked
        .into_iter()
        .map(|(meta, r)| {
            let r = r.and_then(|c| match synced.next().expect("one result per file") {
                Ok(()) => c.publish(),
                Err(e) => {
                    let refusal = c.sync_failed(e);
                    c.discard();
                    Err(refusal)
                }
            });
            (meta, r)
        })
        .collect();
    // Each directory once: the files of one directory share its descriptor.
    let mut dirs: Vec<&Arc<OwnedFd>> = Vec::new();
    for (_, r) in &published {
        if let Ok(p) = r {
            if !dirs.iter().any(|d| Arc::ptr_eq(d, p.parent())) {
                dirs.push(p.parent());
            }
        }
    }
    let dir_results = {
        let fds: Vec<BorrowedFd<'_>> = dirs.iter().map(|d| d.as_fd()).collect();
        plan.sync_dirs(&fds)
    };
    let dir_error = |p: &Published| -> Option<&io::Error> {
        let i = dirs.iter().position(|d| Arc::ptr_eq(d, p.parent()))?;
        dir_results[i].as_ref().err()
    };
    published
        .iter()
        .map(|(meta, r)| {
            let result = match r {
                Ok(p) => match dir_error(p) {
                    None => Ok(p.bytes()),
                    Some(e) => Err(Refusal::io(
                        "syncing the directory of",
                        &meta.name,
                        io::Error::new(e.kind(), e.to_string()),
                    )),
                },
                Err(r) => Err(r.clone()),
            };
            Finished {
                name: meta.name.clone(),
                size: meta.size,
                verified: meta.hashed && result.is_ok(),
                result,
            }
        })
        .collect()
}

/// How a batch's `fsync`s are issued: learns what one costs on this file system and goes
/// side by side only when it waits for a disk (see [`PARALLEL_ABOVE`]).
#[derive(Default)]
struct SyncPlan {
    /// Recent cost of one `fsync`, averaged.
    cost: Duration,
}

impl SyncPlan {
    /// `fsync`s each of `fds`: one result per descriptor, in order.
    fn sync(&mut self, fds: &[BorrowedFd<'_>]) -> Vec<io::Result<()>> {
        let mut out = Vec::with_capacity(fds.len());
        let mut rest = fds;
        // The first one alone, timed: what the file system costs now.
        while let Some((fd, tail)) = rest.split_first() {
            let t = Instant::now();
            out.push(fsync(*fd));
            self.cost = (self.cost * 3 + t.elapsed()) / 4;
            rest = tail;
            if self.cost >= PARALLEL_ABOVE && rest.len() >= 2 {
                out.extend(sync_side_by_side(rest));
                break;
            }
        }
        out
    }

    /// The same for directories.
    fn sync_dirs(&mut self, fds: &[BorrowedFd<'_>]) -> Vec<io::Result<()>> {
        self.sync(fds)
    }
}

fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::fsync(fd).map_err(io::Error::from)
}

/// `fsync`s `fds` from up to [`SYNC_THREADS`] threads; one that cannot start leaves its
/// share to this thread.
fn sync_side_by_side(fds: &[BorrowedFd<'_>]) -> Vec<io::Result<()>> {
    let chunk = fds.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|s| {
        let started: Vec<_> = fds
            .chunks(chunk)
            .map(|c| {
                let h = std::thread::Builder::new()
                    .name("zcnet fsync".into())
                    .spawn_scoped(s, move || c.iter().map(|fd| fsync(*fd)).collect::<Vec<_>>());
                (c, h)
            })
            .collect();
        let mut out = Vec::with_capacity(fds.len());
        for (c, h) in started {
            match h {
                Ok(h) => match h.join() {
                    Ok(r) => out.extend(r),
                    Err(_) => out.extend(
                        c.iter()
                            .map(|_| Err(io::Error::other("an fsync thread panicked"))),
                    ),
                },
                Err(_) => out.extend(c.iter().map(|fd| fsync(*fd))),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_syncs_go_side_by_side_and_keep_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<std::fs::File> = (0..20)
            .map(|i| std::fs::File::create(dir.path().join(format!("f{i}"))).unwrap())
            .collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let mut plan = SyncPlan {
            cost: Duration::from_secs(1),
        };
        let r = plan.sync(&fds);
        assert_eq!(r.len(), fds.len());
        assert!(r.iter().all(|r| r.is_ok()));
        // A descriptor that cannot be synced fails alone, in its place.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut mixed = fds.clone();
        mixed.insert(7, a.as_fd());
        let r = sync_side_by_side(&mixed);
        assert_eq!(r.len(), mixed.len());
        for (i, r) in r.iter().enumerate() {
            assert_eq!(r.is_err(), i == 7, "result {i}: {r:?}");
        }
        drop(b);
    }
}
