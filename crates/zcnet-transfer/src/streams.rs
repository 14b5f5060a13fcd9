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

use super::handshake::StreamRequest;
use super::session::{
    send_entries, send_handshake, Progress, SendOptions, SessionReport, Source, TransferError,
};
use super::wire::MAX_STREAMS;
use std::sync::Mutex;
use zcnet::stats::StatsSnapshot;
use zcnet::stream::Sender;

/// What a file costs a stream besides its bytes, in bytes: a header, a trailer, an answer
/// and a rename at the receiver — so a tree of empty files is spread too.
const PER_FILE_COST: u64 = 4096;

/// Splits `sources` over `n` streams (at least one). Directories, symlinks and a stdin
/// stream go on the first (each is created once, and a `Dir`/`Link` costs no data); files
/// are placed largest first, each on the stream with the fewest bytes so far
/// ([`PER_FILE_COST`] added per file), the classic greedy "longest processing time"
/// schedule, within 4/3 of the best balance (Graham, "Bounds on multiprocessing timing
/// anomalies", 1969). Each stream keeps the walk's order, so a directory's files stay
/// together on a stream.
pub fn spread(sources: Vec<Source>, n: usize) -> Vec<Vec<Source>> {
    if n <= 1 {
        // One stream takes everything in walk order: no need to `lstat` every file again.
        return vec![sources];
    }
    let mut weight: Vec<(usize, Option<u64>)> = sources
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            Source::File { path, .. } => (
                i,
                Some(
                    std::fs::symlink_metadata(path)
                        .map(|m| m.len())
                        .unwrap_or(0)
                        .saturating_add(PER_FILE_COST),
                ),
            ),
            _ => (i, None),
        })
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

/// A session over several streams.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct StreamsReport {
    /// Every entry of every stream.
    pub report: SessionReport,
    /// The connections' counters, one per stream that connected.
    pub stats: Vec<StatsSnapshot>,
    /// Streams used: the number asked for, or 1 with a receiver older than version 5.
    pub streams: usize,
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
            t.fallbacks.extend(s.fallbacks.iter().cloned());
        }
        t
    }
}

/// Sends `sources` as one session over `streams` connections made by `connect` (1 to
/// [`MAX_STREAMS`]; 1 is [`super::session::send_session`]'s session). Each stream ends with
/// its own `Bye`; a stream whose connection fails ends the whole call with that error once
/// the others are done (their files are delivered all the same).
pub fn send_streams(
    connect: &(dyn Fn() -> Result<Sender, TransferError> + Sync),
    streams: usize,
    sources: Vec<Source>,
    opts: &SendOptions,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<StreamsReport, TransferError> {
    let asked = streams.clamp(1, MAX_STREAMS as usize);
    let mut first = connect()?;
    let (version, id) = send_handshake(&mut first, opts, StreamRequest::Open(asked as u16))?;
    let (n, id) = match id {
        Some(id) if version >= 5 => (asked, id),
        // An older receiver: everything on the one connection it understands.
        _ => (1, [0; 16]),
    };
    let mut parts = spread(sources, n).into_iter();
    let part0 = parts.next().unwrap_or_default();
    let progress = Mutex::new(progress);
    let progress = &progress;
    let emit = move |p: Progress<'_>| (*progress.lock().unwrap_or_else(|e| e.into_inner()))(p);
    // The joins' handshakes one after the other (a round trip each), so a receiver's cap on
    // handshakes at once from one address never turns a stream away; then all send at once.
    let joined: Vec<_> = parts
        .map(|part| {
            let tx = connect().and_then(|mut tx| {
                send_handshake(&mut tx, opts, StreamRequest::Join(id)).map(|(v, _)| (tx, v))
            });
            (tx, part)
        })
        .collect();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = joined
            .into_iter()
            .map(|(tx, part)| {
                s.spawn(
                    move || -> Result<(SessionReport, StatsSnapshot), TransferError> {
                        let (mut tx, v) = tx?;
                        let r = send_entries(&mut tx, v, part, opts, &mut { emit })?;
                        Ok((r, tx.stats().snapshot()))
                    },
                )
            })
            .collect();
        let r0 = send_entries(&mut first, version, part0, opts, &mut { emit })
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
        ..Default::default()
    };
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
                        Source::Stream { name, .. } => name.clone(),
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
