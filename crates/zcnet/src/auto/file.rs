//! `auto` for a caller that sends a file ([`crate::Sender::send_file`]): `sendfile` (or
//! splice) straight from the page cache, or `pread` + `send` through user memory. Which is
//! cheaper depends on the host as much as the memory paths do — sendfile saves the read's
//! copy but its pages are referenced until acknowledged, and on loopback the receiver's copy
//! dominates — so `zcnet tune` measures both against the receive paths and the profile
//! carries them in an optional `file` table (rows named `mode/rx`, e.g.
//! `"sendfile/copy"`, like the `pairs` table).
//!
//! A sender assumes its peer is `auto` on the same profile, as [`super::pair`] does: at each
//! measured size it takes the rows into the receive path the pairs table chooses there
//! (`copy` without pairs), and picks the cheapest mode that clears `read_send`'s spread, the
//! copying baseline — the same rule as every other chooser.

use super::choose::Chooser;
use super::pair;
use crate::path::{FileTxMode, RxPath};
use crate::profile::{FilePair, Measurement, PairMeasurement};

/// The chooser a file-sending `auto` sender uses; `None` when the profile has no `file`
/// rows for this touch variant (the sender then keeps its configured mode, `sendfile` by
/// default).
pub fn chooser(
    file: &[Measurement<FilePair>],
    pairs: &[PairMeasurement],
    touch: bool,
) -> Option<Chooser<FileTxMode>> {
    let rows = rows(file, pairs, touch);
    (!rows.is_empty()).then(|| Chooser::from_measurements(&rows, touch))
}

/// At each measured size, each mode's cost into the receive path an `auto` receiver would
/// use there. Sizes without a `read_send` row into that receiver are left out (no baseline).
pub(crate) fn rows(
    file: &[Measurement<FilePair>],
    pairs: &[PairMeasurement],
    touch: bool,
) -> Vec<Measurement<FileTxMode>> {
    let by_pairs = pair::has_pairs(pairs, touch).then(|| pair::chooser(pairs, touch));
    let mut sizes: Vec<u64> = file
        .iter()
        .filter(|m| m.touch == touch)
        .map(|m| m.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = Vec::new();
    for size in sizes {
        let rx = by_pairs
            .as_ref()
            .map_or(RxPath::Copy, |c| c.choose(size, true).path.rx);
        let at: Vec<&Measurement<FilePair>> = file
            .iter()
            .filter(|m| m.touch == touch && m.size == size && m.path.rx == rx)
            .collect();
        if !at.iter().any(|m| m.path.mode == FileTxMode::ReadSend) {
            continue;
        }
        out.extend(at.into_iter().map(|m| Measurement {
            path: m.path.mode,
            size,
            touch,
            cpu_s_per_gib: m.cpu_s_per_gib,
            zc_fraction: m.zc_fraction,
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::ChoiceReason;
    use crate::profile::{HostKey, Profile};

    /// A hand-written profile: sendfile clearly cheaper at 64 KiB, dearer at 1 MiB, into
    /// `copy`; into `mmap` (which the pairs choose from 1 MiB) the other way round.
    const PROFILE: &str = r#"{"schema": 1, "zcnet": "0.1.0", "kernel": "k", "interface": "lo",
      "mtu": 65536, "topology": "loopback", "created": 0,
      "tx": [{"path": "copy", "size": 65536, "touch": false,
              "cpu_s_per_gib": {"median": 1.0, "lo": 0.9, "hi": 1.1}}],
      "rx": [{"path": "copy", "size": 65536, "touch": false,
              "cpu_s_per_gib": {"median": 1.0, "lo": 0.9, "hi": 1.1}}],
      "pairs": [
        {"tx": "copy", "rx": "copy", "size": 65536, "touch": false,
         "cpu_s_per_gib": {"median": 1.0, "lo": 0.9, "hi": 1.1}},
        {"tx": "copy", "rx": "mmap", "size": 65536, "touch": false,
         "cpu_s_per_gib": {"median": 1.5, "lo": 1.4, "hi": 1.6}},
        {"tx": "copy", "rx": "copy", "size": 1048576, "touch": false,
         "cpu_s_per_gib": {"median": 1.0, "lo": 0.9, "hi": 1.1}},
        {"tx": "copy", "rx": "mmap", "size": 1048576, "touch": false,
         "cpu_s_per_gib": {"median": 0.5, "lo": 0.45, "hi": 0.55}}],
      "file": [
        {"tx": "read_send", "rx": "copy", "size": 65536, "touch": false,
         "cpu_s_per_gib": {"median": 1.2, "lo": 1.1, "hi": 1.3}},
        {"tx": "sendfile", "rx": "copy", "size": 65536, "touch": false,
         "cpu_s_per_gib": {"median": 0.6, "lo": 0.5, "hi": 0.7}},
        {"tx": "read_send", "rx": "mmap", "size": 1048576, "touch": false,
         "cpu_s_per_gib": {"median": 0.7, "lo": 0.65, "hi": 0.75}},
        {"tx": "sendfile", "rx": "mmap", "size": 1048576, "touch": false,
         "cpu_s_per_gib": {"median": 0.9, "lo": 0.85, "hi": 0.95}},
        {"tx": "sendfile", "rx": "copy", "size": 1048576, "touch": false,
         "cpu_s_per_gib": {"median": 0.1, "lo": 0.1, "hi": 0.1}}]}"#;

    fn key() -> HostKey {
        HostKey {
            kernel: "k".into(),
            interface: "lo".into(),
            mtu: 65536,
        }
    }

    #[test]
    fn the_file_choice_follows_the_profile_into_the_receiver_auto_would_use() {
        let p = Profile::parse(PROFILE, &key()).unwrap();
        let c = chooser(&p.file, &p.pairs, false).expect("file rows");
        // 64 KiB: the pairs keep copy → copy, and into copy sendfile clears read_send.
        let small = c.choose(65536, true);
        assert_eq!(small.path, FileTxMode::Sendfile);
        assert_eq!(small.reason, ChoiceReason::Profile);
        // 1 MiB: the pairs pick mmap; into mmap read_send is cheaper, so the cheap
        // sendfile → copy row (a receiver auto would not use) must not win.
        let big = c.choose(1 << 20, true);
        assert_eq!(big.path, FileTxMode::ReadSend);
        assert_eq!(big.reason, ChoiceReason::DefaultCheapest);
        // No rows for the touched variant: no file chooser, the configured mode stays.
        assert!(chooser(&p.file, &p.pairs, true).is_none());
    }

    #[test]
    fn file_rows_are_checked_like_every_other_table() {
        let unknown = PROFILE.replace(
            r#""tx": "sendfile", "rx": "copy", "size": 65536"#,
            r#""tx": "mmapfile", "rx": "copy", "size": 65536"#,
        );
        let e = Profile::parse(&unknown, &key()).unwrap_err().to_string();
        assert!(e.contains("mmapfile"), "{e}");
        let nan = PROFILE.replace(
            r#""median": 0.6, "lo": 0.5, "hi": 0.7"#,
            r#""median": 0.6, "lo": 0.8, "hi": 0.7"#,
        );
        let e = Profile::parse(&nan, &key()).unwrap_err().to_string();
        assert!(e.contains("lo <= median"), "{e}");
        // A profile without the table reads as before.
        let (head, _) = PROFILE.split_once(r#""file": ["#).unwrap();
        let head = head.trim_end().strip_suffix(',').unwrap();
        let p = Profile::parse(&(head.to_string() + "}"), &key()).unwrap();
        assert!(p.file.is_empty());
        assert!(chooser(&p.file, &p.pairs, false).is_none());
    }
}
