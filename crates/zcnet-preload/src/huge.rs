//! Whether a buffer lies in transparent huge pages: there, write-protecting 2 MiB changes
//! one page-table entry (a PMD) instead of 512, and protection costs less than the copy it
//! saves (`bench: protect_cost`, `engine thp`). Read from /proc/self/smaps (the mapping's
//! `AnonHugePages`), once per buffer address: programs send from the same buffers again
//! and again.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

/// A transparent huge page.
pub const HUGE: usize = 2 << 20;

/// Buffer addresses looked up, kept until this many.
const CACHED_MAX: usize = 256;

static SEEN: LazyLock<Mutex<HashMap<usize, bool>>> = LazyLock::new(Mutex::default);

/// Whether `start..start+len` (2 MiB aligned) is backed by huge pages: its mapping is
/// private and anonymous, and every whole 2 MiB block of it is a huge page.
pub fn backed(start: usize, len: usize) -> bool {
    if !start.is_multiple_of(HUGE) || len < HUGE {
        return false;
    }
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&b) = seen.get(&start) {
        return b;
    }
    let b = std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .is_some_and(|s| in_smaps(&s, start, len));
    if seen.len() >= CACHED_MAX {
        seen.clear();
    }
    seen.insert(start, b);
    b
}

/// Whether smaps text `s` shows `start..start+len` inside one private anonymous mapping
/// whose whole 2 MiB blocks are all huge pages.
pub fn in_smaps(s: &str, start: usize, len: usize) -> bool {
    let mut vma: Option<(usize, usize, bool)> = None;
    for l in s.lines() {
        let mut f = l.split_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                let perms = f.next().unwrap_or("");
                let inode = f.nth(2).unwrap_or("1");
                let anon_private = perms.ends_with('p') && inode == "0";
                vma = (a <= start && start + len <= b).then_some((a, b, anon_private));
                continue;
            }
        }
        if let (Some((a, b, true)), Some(v)) = (vma, l.strip_prefix("AnonHugePages:")) {
            let kib: usize = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            let blocks = (b / HUGE).saturating_sub(a.div_ceil(HUGE));
            return blocks > 0 && kib * 1024 >= blocks * HUGE;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000800000 rw-p 00000000 00:00 0 \n\
Size:               8192 kB\n\
AnonHugePages:      8192 kB\n\
7f0000800000-7f0001000000 rw-p 00000000 00:00 0 \n\
Size:               8192 kB\n\
AnonHugePages:      4096 kB\n\
7f0001000000-7f0001400000 rw-p 00000000 08:01 1234 /tmp/f\n\
AnonHugePages:      4096 kB\n";

    #[test]
    fn only_wholly_huge_private_anonymous_mappings_count() {
        assert!(in_smaps(SMAPS, 0x7f00_0000_0000, HUGE * 2));
        assert!(!in_smaps(SMAPS, 0x7f00_0080_0000, HUGE), "half huge");
        assert!(!in_smaps(SMAPS, 0x7f00_0100_0000, HUGE), "a file mapping");
        assert!(
            !in_smaps(SMAPS, 0x7f00_0060_0000, HUGE * 2),
            "across two mappings"
        );
        assert!(!backed(4096, HUGE), "unaligned");
    }
}
