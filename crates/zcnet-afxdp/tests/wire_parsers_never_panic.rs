//! The Lightweight Messages header (`wire::lm`) fed 100,000 random and 100,000 mutated
//! datagrams: no panic, no allocation at all (it parses in place), a typed error for every
//! rejection, and whatever passes — including the fragment arithmetic a receiver then does
//! with the peer's numbers — stays in range. (zcnet's UDP message header has the same test.)

use proptest::prelude::*;
use zcnet_afxdp::wire::lm::{Header, HeaderError, Kind, Layout, LM_HLEN};
use zcnet_sys::peak_alloc::PeakAlloc;
use zcnet_testbed::mutate::mutate;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

const CASES: u32 = 100_000;

fn check_lm(d: &[u8]) -> Result<(), TestCaseError> {
    PeakAlloc::reset();
    let r = Header::decode(d);
    let mac = Header::trailer_mac(d);
    // What a receiver computes from a peer's request: the layout and its fragments' ranges.
    let arith = r.ok().and_then(|h| {
        let l = Layout::new(h.total as usize, h.index as usize)?;
        let n = l.count();
        Some((n, l.range(n - 1), l.range(h.count as usize)))
    });
    prop_assert_eq!(PeakAlloc::peak(), 0, "the LM header parses in place");
    prop_assert_eq!(Header::parse(d), r.ok());
    match r {
        Ok(h) => {
            prop_assert!(d.len() >= LM_HLEN);
            let mut again = [0u8; LM_HLEN];
            h.write(&mut again);
            prop_assert_eq!(&again[..], &d[..LM_HLEN], "re-encodes exactly");
            if let Some((n, last, any)) = arith {
                prop_assert!(n >= 1);
                prop_assert!(last.end <= h.total as usize && any.end <= h.total as usize);
            }
        }
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            if d.len() < LM_HLEN {
                prop_assert_eq!(e, HeaderError::Short);
            }
        }
    }
    prop_assert_eq!(mac.is_some(), d.len() >= LM_HLEN + 6);
    Ok(())
}

fn lm_sample(kind: Kind) -> Vec<u8> {
    Header {
        kind,
        token: 1,
        msg_id: 2,
        index: 1400,
        count: 8,
        total: 10_000,
    }
    .control(Some([1, 2, 3, 4, 5, 6]))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn random_datagrams_never_panic(
        d in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        check_lm(&d)?;
    }

    #[test]
    fn mutated_datagrams_never_panic(
        kind in prop_oneof![Just(Kind::Data), Just(Kind::Req), Just(Kind::AcqOk), Just(Kind::EndMe)],
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        check_lm(&mutate(lm_sample(kind), &edits, cut))?;
    }
}
