//! The UDP message header (`zcnet_msg::wire`) fed 100,000 random and 100,000 mutated datagrams: no
//! panic, no allocation at all (it parses in place), a typed error for every rejection, and
//! whatever passes — including the fragment range a receiver then takes from the peer's
//! numbers — stays in range. (The Lightweight Messages header has the same test in
//! zcnet-afxdp.)

use proptest::prelude::*;
use zcnet_msg::wire::{Header, HeaderFault, WireError, HEADER_LEN};
use zcnet_sys::peak_alloc::PeakAlloc;
use zcnet_testbed::mutate::mutate;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

const CASES: u32 = 100_000;

fn check_msg(d: &[u8], max_message: usize) -> Result<(), TestCaseError> {
    PeakAlloc::reset();
    let r = Header::decode(d);
    let checked = r.as_ref().ok().map(|(h, _)| h.check(max_message));
    prop_assert_eq!(PeakAlloc::peak(), 0, "the msg header parses in place");
    match r {
        Ok((h, payload)) => {
            prop_assert_eq!(payload.len(), usize::from(h.len));
            prop_assert_eq!(Header::decode_prefix(d), Ok(h));
            match checked.unwrap() {
                Ok(()) => {
                    let range = h.range();
                    prop_assert!(range.end <= h.total as usize && h.total as usize <= max_message);
                    prop_assert_eq!(range.len(), payload.len());
                }
                Err(f) => prop_assert!(matches!(f, HeaderFault::BadRange | HeaderFault::TooLarge)),
            }
        }
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            if d.len() < HEADER_LEN {
                prop_assert_eq!(e, WireError::Short);
            }
        }
    }
    Ok(())
}

fn msg_sample(len: u16) -> Vec<u8> {
    let h = Header {
        session: 7,
        id: 42,
        total: 10_000,
        offset: 1000,
        len,
    };
    let mut v = h.encode().to_vec();
    v.extend(std::iter::repeat_n(0xAB, len as usize));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn random_datagrams_never_panic(
        d in proptest::collection::vec(any::<u8>(), 0..120),
        max in prop_oneof![Just(0usize), 1usize..100_000, Just(usize::MAX)],
    ) {
        check_msg(&d, max)?;
    }

    #[test]
    fn mutated_datagrams_never_panic(
        len in 0u16..64,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<usize>()),
        max in prop_oneof![Just(10_000usize), 1usize..100_000],
    ) {
        check_msg(&mutate(msg_sample(len), &edits, cut), max)?;
    }
}
