//! The bench control protocol's parsers fed 100,000 random, 100,000 mutated and 100,000
//! structurally plausible inputs each: no panic, no allocation beyond the frame limit
//! (`MAX_FRAME`, whatever the length prefix claims), and a typed [`ProtocolError`] for every
//! rejection.

use proptest::prelude::*;
use zcnet_bench::protocol::{self, Limit, Message, Params, ProtocolError, UdpParams, MAX_FRAME};
use zcnet_bench::report::{Mode, SideReport};
use zcnet_sys::peak_alloc::PeakAlloc;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

const CASES: u32 = 100_000;

fn params() -> Params {
    Params {
        mode: Mode::Stream,
        tx: "copy".into(),
        rx: "mmap".into(),
        size: 65536,
        streams: 2,
        ring: 8,
        touch: true,
        limit: Limit::Bytes(1 << 20),
        read: Some(65536),
    }
}

fn samples() -> Vec<Vec<u8>> {
    [
        Message::Hello { params: params() },
        Message::HelloUdp {
            params: params(),
            udp: UdpParams::default(),
        },
        Message::Accept { data_port: 4242 },
        Message::Reject {
            reason: "busy".into(),
        },
        Message::Done {
            report: SideReport::default(),
        },
        Message::Error { reason: "x".into() },
    ]
    .iter()
    .map(protocol::encode)
    .collect()
}

fn check_decode(body: &[u8]) -> Result<(), TestCaseError> {
    PeakAlloc::reset();
    let r = protocol::decode(body);
    let peak = PeakAlloc::peak();
    prop_assert!(peak <= MAX_FRAME, "allocated {}", peak);
    if let Err(e) = r {
        prop_assert!(!e.to_string().is_empty());
    }
    Ok(())
}

fn check_frame(stream: &[u8]) -> Result<(), TestCaseError> {
    PeakAlloc::reset();
    let r = protocol::read_message(&mut &stream[..]);
    let peak = PeakAlloc::peak();
    prop_assert!(peak <= MAX_FRAME, "allocated {}", peak);
    match r {
        Err(ProtocolError::FrameTooLarge(n)) => prop_assert!(n as usize > MAX_FRAME),
        Err(e) => prop_assert!(!e.to_string().is_empty()),
        Ok(_) => prop_assert!(stream.len() >= 4),
    }
    Ok(())
}

fn mutate(mut b: Vec<u8>, edits: &[(usize, u8, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(pos, val, op) in edits {
        let n = b.len().max(1);
        match op % 3 {
            0 if !b.is_empty() => b[pos % n] = val,
            1 => b.insert(pos % (b.len() + 1), val),
            _ if !b.is_empty() => {
                b.remove(pos % n);
            }
            _ => {}
        }
    }
    if let Some(c) = cut {
        b.truncate(c % (b.len() + 1));
    }
    b
}

/// A JSON object with the version key and a known message type, and random fields: the
/// inputs that reach serde's typed decoding rather than failing as "not JSON".
fn plausible() -> impl Strategy<Value = Vec<u8>> {
    let ty = prop_oneof![
        Just("hello"),
        Just("hello_udp"),
        Just("accept"),
        Just("reject"),
        Just("done"),
        Just("result"),
        Just("error"),
        Just("ack"),
        Just("nonsense")
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| if v.is_finite() {
            v.to_string()
        } else {
            "1e999".into()
        }),
        "[a-z]{0,8}".prop_map(|s| format!("{s:?}")),
        Just("null".to_string()),
        Just("{}".to_string()),
        Just("[1,2,3]".to_string()),
    ];
    let key = prop_oneof![
        Just("params"),
        Just("data_port"),
        Just("reason"),
        Just("report"),
        Just("mode"),
        Just("size"),
        Just("limit"),
        Just("udp"),
    ];
    (
        ty,
        proptest::collection::vec((key, value), 0..5),
        prop_oneof![Just(1u64), any::<u64>()],
    )
        .prop_map(|(ty, fields, version)| {
            let mut s = format!("{{\"type\":\"{ty}\",\"zcnet_bench\":{version}");
            for (k, v) in fields {
                s += &format!(",\"{k}\":{v}");
            }
            s += "}";
            s.into_bytes()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn random_bytes_never_panic(
        len in prop_oneof![0u32..200, any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        check_decode(&body)?;
        let mut stream = len.to_be_bytes().to_vec();
        stream.extend_from_slice(&body);
        check_frame(&stream)?;
    }

    #[test]
    fn mutated_messages_never_panic(
        which in 0usize..6,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let framed = mutate(samples()[which].clone(), &edits, cut);
        check_frame(&framed)?;
        if framed.len() > 4 {
            check_decode(&framed[4..])?;
        }
    }

    #[test]
    fn plausible_json_never_panics(body in plausible()) {
        check_decode(&body)?;
    }
}

#[test]
fn the_samples_decode() {
    for s in samples() {
        protocol::decode(&s[4..]).unwrap();
    }
}
