//! Every transfer-protocol parser fed 100,000 random and 100,000 mutated inputs: no panic, no
//! allocation beyond the input (a header's length claim never allocates by itself), a frame
//! limit that holds from the header alone, and a typed error for every rejection. The
//! receiver's handshake machine is fed the same way and never asks for more than a
//! handshake frame.

use proptest::prelude::*;
use zcnet_sys::peak_alloc::PeakAlloc;
use zcnet_transfer::handshake::ReceiverHandshake;
use zcnet_transfer::wire::{Code, Frame, WireError, HELLO_LEN, MAX_CONTROL, MAX_DATA, VERSION};

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

const CASES: u32 = 100_000;

fn samples() -> Vec<Vec<u8>> {
    [
        Frame::Hello {
            version: VERSION,
            auth: true,
            nonce: [7; 32],
        },
        Frame::Auth { mac: [1; 32] },
        Frame::File {
            name: "dir/ä b.txt".into(),
            size: 12345,
            mode: 0o644,
            mtime_s: -5,
            mtime_ns: 999,
            verify: true,
        },
        Frame::Ready {
            offset: 4096,
            prefix: Some([9; 32]),
        },
        Frame::Refuse {
            code: Code::Busy,
            message: "busy".into(),
        },
        Frame::Start { offset: 77 },
        Frame::StartSparse {
            offset: 0,
            extents: vec![(0, 4096), (1 << 20, 8192)],
        },
        Frame::Data(vec![1, 2, 3, 4, 5]),
        Frame::EndData,
        Frame::Trailer {
            hash: Some([3; 32]),
        },
        Frame::Ack {
            code: Code::Ok,
            bytes: 5,
            message: "fine".into(),
        },
        Frame::Bye,
        Frame::Abort {
            message: "file shrank".into(),
        },
    ]
    .iter()
    .map(Frame::to_bytes)
    .collect()
}

/// Parses `b`, checking the properties every outcome must have.
fn check(b: &[u8]) -> Result<(), TestCaseError> {
    PeakAlloc::reset();
    let r = Frame::parse(b);
    let peak = PeakAlloc::peak();
    prop_assert!(
        peak <= b.len(),
        "allocated {peak} for {} input bytes",
        b.len()
    );
    match r {
        Ok(None) => {
            let short = b.len() < 5
                || b.len() < 5 + u32::from_be_bytes(b[1..5].try_into().unwrap()) as usize;
            prop_assert!(short, "more bytes wanted only when they are missing");
        }
        Ok(Some((f, used))) => {
            prop_assert!(used <= b.len());
            prop_assert_eq!(f.to_bytes(), b[..used].to_vec(), "re-encodes exactly");
        }
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            if let WireError::TooLong { len, max, .. } = e {
                prop_assert!(len > max);
            }
        }
    }
    if b.len() >= 5 {
        if let Ok((ty, len)) = Frame::check_header(b[..5].try_into().unwrap()) {
            let max = if ty == 6 { MAX_DATA } else { MAX_CONTROL };
            prop_assert!(len <= max, "header accepted {} > {}", len, max);
        }
    }
    Ok(())
}

fn mutate(mut b: Vec<u8>, edits: &[(usize, u8, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(pos, val, op) in edits {
        let n = b.len().max(1);
        match op % 4 {
            0 => {
                if !b.is_empty() {
                    b[pos % n] = val;
                }
            }
            1 => b.insert(pos % (b.len() + 1), val),
            2 => {
                if !b.is_empty() {
                    b.remove(pos % n);
                }
            }
            _ => {
                // A hostile length in the header.
                if b.len() >= 5 {
                    b[1 + pos % 4] = val;
                }
            }
        }
    }
    if let Some(c) = cut {
        b.truncate(c % (b.len() + 1));
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn random_bytes_never_panic_or_overallocate(
        ty in 0u8..16,
        len in prop_oneof![0u32..300, any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut b = vec![ty];
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&body);
        check(&b)?;
        check(&body)?;
    }

    #[test]
    fn mutated_frames_never_panic_or_overallocate(
        which in 0usize..12,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let b = mutate(samples()[which].clone(), &edits, cut);
        check(&b)?;
    }

    #[test]
    fn the_handshake_machine_never_reads_past_a_handshake_frame(
        token in proptest::option::of(proptest::collection::vec(any::<u8>(), 1..16)),
        input in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            (0usize..12, proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6))
                .prop_map(|(w, e)| {
                    let mut v = samples()[0].clone();
                    v.extend(samples()[w].clone());
                    mutate(v, &e, None)
                }),
        ],
    ) {
        let mut hs = ReceiverHandshake::new(token).unwrap();
        let mut rest = &input[..];
        PeakAlloc::reset();
        loop {
            let want = hs.want();
            prop_assert!(!want.is_empty() && want.len() <= 5 + HELLO_LEN);
            let n = want.len().min(rest.len());
            if n == 0 {
                break;
            }
            want[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            match hs.advance(n) {
                Ok(Some(_)) => {
                    prop_assert!(hs.is_done());
                    break;
                }
                Ok(None) => {}
                Err(e) => {
                    prop_assert!(!e.to_string().is_empty());
                    break;
                }
            }
        }
        // Decoding a Hello and answering an Auth need a few dozen bytes, never the input's.
        prop_assert!(PeakAlloc::peak() <= 256, "{}", PeakAlloc::peak());
    }
}
