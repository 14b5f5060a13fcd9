//! A wire parser's fuzz input made from a valid one: what the parsers' property tests feed
//! (`wire_parsers_never_panic.rs` in zcnet-msg and zcnet-afxdp), so a mutation is described
//! the same way wherever a header is tested.

/// `b` with each `(position, value)` of `edits` written at `position` modulo its length (an
/// empty buffer takes none), then cut to `cut` modulo its length + 1 bytes, if given.
pub fn mutate(mut b: Vec<u8>, edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(pos, val) in edits {
        if !b.is_empty() {
            let n = b.len();
            b[pos % n] = val;
        }
    }
    if let Some(c) = cut {
        b.truncate(c % (b.len() + 1));
    }
    b
}

#[cfg(test)]
mod tests {
    use super::mutate;

    #[test]
    fn edits_wrap_around_and_the_cut_keeps_at_most_the_whole() {
        assert_eq!(mutate(vec![1, 2, 3], &[(4, 9)], None), vec![1, 9, 3]);
        assert_eq!(mutate(vec![1, 2, 3], &[(0, 7)], Some(5)), vec![7]);
        assert_eq!(mutate(vec![1, 2, 3], &[(0, 7)], Some(6)), vec![7, 2]);
        assert_eq!(mutate(vec![1, 2, 3], &[], Some(3)), vec![1, 2, 3]);
        assert_eq!(mutate(Vec::new(), &[(1, 1)], Some(2)), Vec::<u8>::new());
    }
}
