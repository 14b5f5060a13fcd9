//! Parallel streams (protocol version 5): one session carried by several connections.
//!
//! One TCP connection is paced by one congestion window and, at the receiver, by one thread
//! that splices, hashes and finishes files in turn; with several connections those costs run
//! side by side on as many cores. The first connection sends `Open{streams}` and gets the
//! session's random id back in `Session`; the others present it in `Join`, so the receiver
//! serves them as one session (one `--max-bytes` cap, one `--once`). A tree is spread over
//! the streams by file ([`spread`]); each stream is an ordinary session body (pipelined
//! `Put`s, `File`s by `sendfile`) on its own thread. A receiver older than version 5 gets
//! the whole tree on the first connection.
//!
//! From version 6 a file of at least [`RANGE_THRESHOLD`] bytes (without holes) is itself
//! split into ranges that are spread like files ([`split_large`]; the receiver side is
//! [`super::ranges`]). A file with holes goes whole on one stream, so it stays sparse.

use super::handshake::StreamRequest;
use super::ranges::{split, MIN_RANGE, RANGE_THRESHOLD};
use super::session::{
    send_entries, send_handshake, FileOutcome, Progress, SendOptions, SessionReport, Source,
    TransferError,
};
use super::wire::{Features, MAX_STREAMS};
use std::collections::HashMap;
use std::sync::Mutex;
use zcnet::stats::StatsSnapshot;
use zcnet::stream::Sender;

/// What a file costs a stream besides its bytes, in bytes: a header, a trailer, an answer
/// and a rename at the receiver — so a tree of empty files is spread too.
const PER_FILE_COST: u64 = 4096;

/// Splits `sources` over `n` streams (at least one). Directories, symlinks and a stdin
/// stream go on the first (each is created once, and a `Dir`/`Link` costs no data); files
/// are placed largest first, each on the stream with the fewest bytes so far
/// (`PER_FILE_COST` added per file), the classic greedy "longest processing time"
/// schedule, within 4/3 of the best balance (Graham, "Bounds on multiprocessing timing
/// anomalies", 1969). Each stream keeps the walk's order, so a directory's files stay
/// together on a stream.
pub fn spread(sources: Vec<Source>, n: usize) -> Vec<Vec<Source>> {
    if n <= 1 {
        // One stream takes everything in walk order: no need to `lstat` every file again.
        return vec![sources];
    }
    let sizes = sizes(&sources);
    spread_sized(sources, &sizes, n)
}

/// The bytes of each source that carries data: a file's length (`lstat`; 0 if it cannot be
/// had — its send reports why), a range's; `None` for the rest. Taken once per file for
/// the split and the spread together: with thousands of small files every `lstat` shows in
/// the sender's CPU.
fn sizes(sources: &[Source]) -> Vec<Option<u64>> {
    sources
        .iter()
        .map(|s| match s {
            Source::File { path, .. } => {
                Some(std::fs::symlink_metadata(path).map_or(0, |m| m.len()))
            }
            Source::Range { len, .. } => Some(*len),
            _ => None,
        })
        .collect()
}

/// [`spread`] with each source's size already taken ([`sizes`], one per source).
fn spread_sized(sources: Vec<Source>, sizes: &[Option<u64>], n: usize) -> Vec<Vec<Source>> {
    if n <= 1 {
        return vec![sources];
    }
    let mut weight: Vec<(usize, Option<u64>)> = sizes
        .iter()
        .map(|s| s.map(|len| len.saturating_add(PER_FILE_COST)))
        .enumerate()
        .collect();
    // Largest first; equal sizes in walk order (a stable sort).
    weight.sort_by_key(|&(_, w)| std::cmp::Reverse(w.unwrap_or(0)));
    let mut load = vec![0u64; n];
    let mut home = vec![0usize; sources.len()];
    for (i, w) in weight {
        if let Some(w) = w {
            let k = (0..n).min_by_key(|&k| (load[k], k)).expect("n >= 1");
            load[k] = load[k].saturating_add(w);
            home[i] = k;
        }
    }
    let mut out: Vec<Vec<Source>> = (0..n).map(|_| Vec::new()).collect();
    for (s, k) in sources.into_iter().zip(home) {
        out[k].push(s);
    }
    out
}

/// Replaces each file of at least [`RANGE_THRESHOLD`] bytes that has no holes, and that is
/// larger than a stream's fair share of the whole (all files' bytes over `streams`), by its
/// ranges for `streams` streams: up to two per stream, so the greedy spread can even out the
/// unequal halves of a size that is not a power of two, none under [`MIN_RANGE`]. Returns
/// the split files' names.
///
/// A file within its share goes whole: the spread by file already keeps every stream busy,
/// and ranges cost round trips and receiver CPU (one 1 GiB file over 2 streams cost the
/// receiver 1.29 CPU-s against 1.12 over one, `bench/transfer.sh 1024 5`, loopback, idle
/// 2-core machine). On a 300-file tree of 0 B to 256 MiB over 2 streams
/// (`bench/transfer.sh mixed 300 1024 5`), splitting its 64–256 MiB files or not made no
/// difference beyond the noise (wall 0.87 s against 0.90 s).
pub fn split_large(sources: Vec<Source>, streams: usize) -> (Vec<Source>, Vec<String>) {
    let sizes = sizes(&sources);
    let (out, _, names) = split_sized(sources, &sizes, streams);
    (out, names)
}

/// [`split_large`] with each source's size already taken ([`sizes`]); returns the sizes of
/// what it returns, too. Only a file that the sizes say is large enough to split is opened.
fn split_sized(
    sources: Vec<Source>,
    sizes: &[Option<u64>],
    streams: usize,
) -> (Vec<Source>, Vec<Option<u64>>, Vec<String>) {
    let total: u64 = sources
        .iter()
        .zip(sizes)
        .filter_map(|(s, len)| matches!(s, Source::File { .. }).then_some(len.unwrap_or(0)))
        .fold(0u64, u64::saturating_add);
    let share = total / streams.max(1) as u64;
    let mut out = Vec::with_capacity(sources.len());
    let mut out_sizes = Vec::with_capacity(sources.len());
    let mut names = Vec::new();
    for (src, &len) in sources.into_iter().zip(sizes) {
        let Source::File { path, name } = &src else {
            out.push(src);
            out_sizes.push(len);
            continue;
        };
        if len.is_none_or(|l| l < RANGE_THRESHOLD || l <= share) {
            out.push(src);
            out_sizes.push(len);
            continue;
        }
        let size = match std::fs::File::open(path).and_then(|f| {
            let size = f.metadata()?.len();
            let holes =
                size >= RANGE_THRESHOLD && super::sparse::data_extents(&f, 0, size)?.is_some();
            Ok((!holes).then_some(size))
        }) {
            Ok(Some(size)) if size >= RANGE_THRESHOLD && size > share => size,
            // Small, within its share, sparse, or unreadable (the send reports why): whole.
            _ => {
                out.push(src);
                out_sizes.push(len);
                continue;
            }
        };
        let ranges = split(size, 2 * streams, MIN_RANGE);
        if ranges.len() < 2 {
            out.push(src);
            out_sizes.push(len);
            continue;
        }
        names.push(name.clone());
        for (offset, len) in ranges {
            out_sizes.push(Some(len));
            out.push(Source::Range {
                path: path.clone(),
                name: name.clone(),
                offset,
                len,
                size,
            });
        }
    }
    (out, out_sizes, names)
}

/// A file at least this large makes [`default_streams`] consider one stream per two CPUs.
pub const DEFAULT_SPLIT_ABOVE: u64 = 256 << 20;

/// A tree of at least this many files makes [`default_streams`] open 2 streams.
pub const DEFAULT_MANY_FILES: usize = 1000;

/// A tree with at least this many files that go by `sendfile` (over the session's `Put`
/// size) makes [`default_streams`] open 2 streams.
pub const DEFAULT_SENDFILE_FILES: usize = 2;

/// `--streams` when not given, from what is sent and the host's CPUs (`cpus`):
///
/// * a tree of at least [`DEFAULT_MANY_FILES`] files: 2 streams — measured with
///   `bench/ranges.sh` (5000 files of 4-5 KiB, release build, loopback, on a shared 2-core
///   machine): 1.29x faster than 1 stream onto the real disk (each stream's fsyncs and
///   renames overlap the other's), and no difference beyond the noise on tmpfs;
/// * a file of at least [`DEFAULT_SPLIT_ABOVE`] bytes (split into ranges): one stream per
///   two CPUs, 1 to 4 — one stream already keeps about two cores busy (the sender's
///   `sendfile` and hash, the receiver's `splice` and hash), so on the 2-core machine it was
///   measured on, 2 or 4 streams for one 1 GiB file were within the noise of 1 (0.8x to
///   1.3x between sittings); more cores give the ranges their own;
/// * a tree with at least [`DEFAULT_SENDFILE_FILES`] files larger than a `Put`: 2 streams —
///   each such file waits for its `Ready` (the receiver reserving its space), and up to
///   protocol 6 for its `Ack` (the file checked, synced and renamed), before the next starts
///   on the same stream, and a second stream carries data through those waits (measured
///   before protocol 7, which no longer waits for the `Ack`). Measured with
///   `bench/transfer.sh mixed 300 1024 5` (300 files of 0 B to 256 MiB, 1 GiB, loopback,
///   idle 2-core machine, `SEND_ARGS="--streams 2"` against the same build with 1): wall
///   0.92 s against 1.11 s on tmpfs, 1.29 s against 1.49 s on the disk;
/// * else 1.
///
/// The largest applies.
pub fn default_streams(sources: &[Source], cpus: usize) -> usize {
    let mut files = 0usize;
    let mut sendfiles = 0usize;
    let mut large = false;
    for s in sources {
        if let Source::File { path, .. } = s {
            files += 1;
            let len = std::fs::metadata(path).map_or(0, |m| m.len());
            sendfiles += usize::from(len > super::session::PUT_THRESHOLD);
            large = large || len >= DEFAULT_SPLIT_ABOVE;
        }
    }
    let mut n = 1;
    if files >= DEFAULT_MANY_FILES || sendfiles >= DEFAULT_SENDFILE_FILES {
        n = 2;
    }
    if large {
        n = n.max((cpus / 2).clamp(1, 4));
    }
    n
}

/// Folds the outcomes of a split file's ranges into one for the file: delivered when every
/// range was (the last one's `Ack` says the file is final), else the first failure.
fn merge_ranges(files: Vec<FileOutcome>, split: &[String]) -> Vec<FileOutcome> {
    let mut out: Vec<FileOutcome> = Vec::with_capacity(files.len());
    let mut at: HashMap<String, usize> = HashMap::new();
    for o in files {
        if !split.contains(&o.name) {
            out.push(o);
            continue;
        }
        match at.get(&o.name) {
            None => {
                at.insert(o.name.clone(), out.len());
                out.push(o);
            }
            Some(&i) => {
                let m = &mut out[i];
                m.bytes += o.bytes;
                m.verified &= o.verified;
                if m.result.is_ok() {
                    m.result = o.result;
                }
            }
        }
    }
    out
}

/// A session over several streams.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct StreamsReport {
    /// Every entry of every stream.
    pub report: SessionReport,
    /// The connections' counters, one per stream that connected.
    pub stats: Vec<StatsSnapshot>,
    /// Streams used: the number asked for, or 1 with a receiver older than version 5, less
    /// those in [`Self::refused`].
    pub streams: usize,
    /// Why each stream that did not join was left out (the receiver's refusal, say its limit
    /// of sessions per address); their files went on the other streams.
    pub refused: Vec<String>,
}

impl StreamsReport {
    /// The streams' counters added up (the byte counts by path, and the fallbacks).
    pub fn total_stats(&self) -> StatsSnapshot {
        let mut t = StatsSnapshot::default();
        for s in &self.stats {
            t.tx_bytes_file += s.tx_bytes_file;
            t.tx_bytes_zerocopy += s.tx_bytes_zerocopy;
            t.tx_bytes_copy += s.tx_bytes_copy;
            t.rx_bytes_file += s.rx_bytes_file;
            t.rx_bytes_mapped += s.rx_bytes_mapped;
            t.rx_bytes_copied += s.rx_bytes_copied;
            for &(reason, ops, bytes) in &s.fallbacks {
                match t.fallbacks.iter_mut().find(|f| f.0 == reason) {
                    Some(f) => {
                        f.1 += ops;
                        f.2 += bytes;
                    }
                    None => t.fallbacks.push((reason, ops, bytes)),
                }
            }
        }
        t
    }
}

/// Sends `sources` as one session over `streams` connections made by `connect` (1 to
/// [`MAX_STREAMS`]; 1 is [`super::session::send_session`]'s session). A further stream the
/// receiver refuses (or that cannot connect) is left out before any file is placed, so the
/// streams that joined carry every file ([`StreamsReport::refused`] says why). Each stream
/// ends with its own `Bye`; a stream whose connection fails once files flow ends the whole
/// call with that error once the others are done (their files are delivered all the same).
pub fn send_streams(
    connect: &(dyn Fn() -> Result<Sender, TransferError> + Sync),
    streams: usize,
    sources: Vec<Source>,
    opts: &SendOptions,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<StreamsReport, TransferError> {
    let asked = streams.clamp(1, MAX_STREAMS as usize);
    let mut first = connect()?;
    let opened = send_handshake(&mut first, opts, StreamRequest::Open(asked as u16))?;
    let version = opened.version;
    let (n, id) = match opened.session {
        Some(id) if Features::of(version).streams => (asked, id),
        // An older receiver: everything on the one connection it understands.
        _ => (1, [0; 16]),
    };
    // The joins' handshakes first, one after the other (a round trip each, so a receiver's
    // cap on handshakes at once from one address never turns a stream away), and only then
    // the plan: a stream the receiver refuses (its limit of sessions per address counts
    // joins) or that cannot connect gets no files, and the streams it has carry them all.
    let mut joined = Vec::new();
    let mut refused = Vec::new();
    for _ in 1..n {
        let tx = connect().and_then(|mut tx| {
            send_handshake(&mut tx, opts, StreamRequest::Join(id)).map(|o| (tx, o))
        });
        match tx {
            Ok(t) => joined.push(t),
            Err(e) => {
                // The next would most likely be turned away for the same reason.
                refused.push(e.to_string());
                break;
            }
        }
    }
    let n = 1 + joined.len();
    // Each file's size once, for the split and the spread (one stream needs neither).
    let sizes = match n > 1 {
        true => sizes(&sources),
        false => Vec::new(),
    };
    let (sources, sizes, split_names) = match Features::of(version).ranges && n > 1 {
        true => split_sized(sources, &sizes, n),
        false => (sources, sizes, Vec::new()),
    };
    let mut parts = spread_sized(sources, &sizes, n).into_iter();
    let part0 = parts.next().unwrap_or_default();
    let progress = Mutex::new(progress);
    let progress = &progress;
    let emit = move |p: Progress<'_>| (*progress.lock().unwrap_or_else(|e| e.into_inner()))(p);
    let joined: Vec<_> = joined.into_iter().zip(parts).collect();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = joined
            .into_iter()
            .map(|(tx, part)| {
                s.spawn(
                    move || -> Result<(SessionReport, StatsSnapshot), TransferError> {
                        let (mut tx, o) = tx;
                        let r = send_entries(&mut tx, &o, part, opts, &mut { emit })?;
                        Ok((r, tx.stats().snapshot()))
                    },
                )
            })
            .collect();
        let r0 = send_entries(&mut first, &opened, part0, opts, &mut { emit })
            .map(|r| (r, first.stats().snapshot()));
        let mut all = vec![r0];
        for h in handles {
            all.push(h.join().unwrap_or_else(|_| {
                Err(TransferError::Io {
                    what: "a stream's thread".into(),
                    source: std::io::Error::other("it panicked"),
                })
            }));
        }
        all
    });
    let mut out = StreamsReport {
        streams: n,
        refused,
        ..Default::default()
    };
    out.report.trust = opened.trust.clone();
    super::session::note_carrier(opened.carrier.as_ref(), &mut out.report);
    let mut first_err = None;
    for (k, r) in results.into_iter().enumerate() {
        match r {
            Ok((rep, st)) => {
                out.report.files.extend(rep.files);
                out.stats.push(st);
            }
            Err(e) if first_err.is_none() => first_err = Some((k, e)),
            Err(_) => {}
        }
    }
    if !split_names.is_empty() {
        out.report.files = merge_ranges(std::mem::take(&mut out.report.files), &split_names);
        for o in out
            .report
            .files
            .iter()
            .filter(|o| split_names.contains(&o.name))
        {
            emit(Progress::Done(o));
        }
    }
    match first_err {
        None => Ok(out),
        Some((0, e)) => Err(e),
        Some((k, e)) => Err(TransferError::Stream {
            stream: k,
            source: Box::new(e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_follows_file_count_size_and_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"x").unwrap();
        let big = dir.path().join("big");
        // Sparse: the size is what counts, and no disk is used.
        std::fs::File::create(&big)
            .unwrap()
            .set_len(DEFAULT_SPLIT_ABOVE)
            .unwrap();
        let f = |p: &std::path::Path| Source::File {
            path: p.into(),
            name: "n".into(),
        };
        assert_eq!(default_streams(&[], 4), 1);
        assert_eq!(default_streams(&[f(&small)], 8), 1);
        // One large file: a stream per two CPUs, 1 to 4.
        assert_eq!(default_streams(&[f(&small), f(&big)], 2), 1);
        // Two files that go by sendfile: 2, so each one's waits carry the other's data.
        assert_eq!(default_streams(&[f(&big), f(&small), f(&big)], 2), 2);
        assert_eq!(default_streams(&[f(&big)], 4), 2);
        assert_eq!(default_streams(&[f(&big)], 64), 4);
        // Many files: 2, whatever the CPUs; with a large one, the larger.
        let mut many: Vec<Source> = (0..DEFAULT_MANY_FILES).map(|_| f(&small)).collect();
        assert_eq!(default_streams(&many, 1), 2);
        many.push(f(&big));
        assert_eq!(default_streams(&many, 16), 4);
        assert_eq!(default_streams(&many, 2), 2);
    }

    #[test]
    fn a_large_file_is_split_only_when_it_is_more_than_a_streams_share() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        // Written, not sized: a file with holes is never split.
        for (name, len) in [
            ("a", RANGE_THRESHOLD),
            ("b", RANGE_THRESHOLD),
            ("small", 10),
        ] {
            let mut f = std::fs::File::create(dir.path().join(name)).unwrap();
            std::io::copy(&mut std::io::repeat(7).take(len), &mut f).unwrap();
        }
        let f = |name: &str| Source::File {
            path: dir.path().join(name),
            name: name.into(),
        };
        let ranges = |v: &[Source]| {
            v.iter()
                .filter(|s| matches!(s, Source::Range { .. }))
                .count()
        };
        // Beside a small file it is more than half of the whole: split for 2 streams.
        let (out, names) = split_large(vec![f("a"), f("small")], 2);
        assert_eq!(names, vec!["a".to_string()]);
        assert!(ranges(&out) >= 2);
        assert_eq!(out.len(), ranges(&out) + 1);
        // Two equal ones over 2 streams: each is its stream's share, both go whole.
        let (out, names) = split_large(vec![f("a"), f("b"), f("small")], 2);
        assert!(names.is_empty());
        assert_eq!(ranges(&out), 0);
        // Over 4 streams each is more than a share again.
        let (out, names) = split_large(vec![f("a"), f("b"), f("small")], 4);
        assert_eq!(names.len(), 2);
        assert!(ranges(&out) >= 4);
    }

    #[test]
    fn files_are_balanced_by_bytes_and_the_rest_stays_on_the_first_stream() {
        let dir = tempfile::tempdir().unwrap();
        let mut srcs = vec![Source::Dir {
            path: dir.path().into(),
            name: "empty".into(),
        }];
        for (i, len) in [1_000_000_u64, 10, 10, 500_000, 500_000, 0, 0, 0]
            .iter()
            .enumerate()
        {
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, vec![1u8; *len as usize]).unwrap();
            srcs.push(Source::File {
                path: p,
                name: format!("f{i}"),
            });
        }
        srcs.push(Source::Link {
            name: "l".into(),
            target: "f0".into(),
        });
        let parts = spread(srcs, 3);
        assert_eq!(parts.len(), 3);
        let names: Vec<Vec<String>> = parts
            .iter()
            .map(|p| {
                p.iter()
                    .map(|s| match s {
                        Source::File { name, .. } | Source::Dir { name, .. } => name.clone(),
                        Source::Link { name, .. } => name.clone(),
                        Source::Stream { name, .. } | Source::Range { name, .. } => name.clone(),
                    })
                    .collect()
            })
            .collect();
        // The big file alone; the two halves together elsewhere; small ones fill in; the
        // directory and the link on the first stream; walk order kept within each.
        assert!(names[0].contains(&"empty".to_string()) && names[0].contains(&"l".into()));
        let of = |f: &str| {
            names
                .iter()
                .position(|v| v.contains(&f.to_string()))
                .unwrap()
        };
        assert_ne!(of("f0"), of("f3"));
        assert_ne!(of("f0"), of("f4"));
        assert_ne!(of("f3"), of("f4"));
        assert_eq!(names.iter().map(Vec::len).sum::<usize>(), 10);
        for v in &names {
            let files: Vec<&String> = v.iter().filter(|n| n.starts_with('f')).collect();
            let mut sorted = files.clone();
            sorted.sort();
            assert_eq!(files, sorted, "walk order kept");
        }
        // One stream: everything, in order.
        let d = tempfile::tempdir().unwrap();
        let one = spread(
            vec![Source::Dir {
                path: d.path().into(),
                name: "x".into(),
            }],
            0,
        );
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].len(), 1);
    }
}
