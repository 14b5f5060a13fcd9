//! iperf3's JSON framing on the control connection (`JSON_write` / `JSON_read` in
//! `iperf_api.c`): a 4-byte big-endian length, then that many bytes of unformatted JSON,
//! no terminator.

use super::error::Iperf3Error;
use serde_json::Value;
use std::io::{Read, Write};

/// The longest frame we accept. iperf3 allocates whatever the length says; we do not, so a
/// garbled length cannot make us allocate gigabytes. A results object with a server's
/// full `-J` output inside (`--get-server-output`) of a long test with intervals is the
/// largest legitimate message: a few hundred KiB.
pub const MAX_FRAME: u32 = 16 << 20;

/// The bytes of one frame holding `v`.
pub fn encode(v: &Value) -> Vec<u8> {
    let body = v.to_string();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body.as_bytes());
    out
}

/// Writes one frame.
pub fn write<W: Write>(w: &mut W, v: &Value) -> Result<(), Iperf3Error> {
    w.write_all(&encode(v))
        .map_err(Iperf3Error::io("writing a JSON frame"))
}

/// Reads one frame holding a JSON object.
pub fn read<R: Read>(r: &mut R) -> Result<Value, Iperf3Error> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .map_err(Iperf3Error::io("reading a JSON frame's length"))?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(Iperf3Error::FrameTooLong(len, MAX_FRAME));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)
        .map_err(Iperf3Error::io("reading a JSON frame"))?;
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| Iperf3Error::BadJson(e.to_string()))?;
    if !v.is_object() {
        return Err(Iperf3Error::BadJson("not a JSON object".into()));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Cursor;

    #[test]
    fn frames_round_trip_with_a_big_endian_length() {
        let v = json!({"tcp": true, "time": 1, "parallel": 4});
        let bytes = encode(&v);
        let body = v.to_string();
        assert_eq!(&bytes[..4], &(body.len() as u32).to_be_bytes());
        assert_eq!(&bytes[4..], body.as_bytes());
        assert_eq!(read(&mut Cursor::new(bytes)).unwrap(), v);
    }

    #[test]
    fn a_frame_from_iperf3_parses() {
        // What iperf3 3.12's send_parameters wrote for `-c ... -t 1 -P 2 --bidir`.
        let body = br#"{"tcp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":2,"bidirectional":true,"len":131072,"pacing_timer":1000,"client_version":"3.12"}"#;
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body);
        let v = read(&mut Cursor::new(bytes)).unwrap();
        assert_eq!(v["parallel"], 2);
    }

    #[test]
    fn bad_frames_are_errors_not_panics_or_huge_allocations() {
        let too_long = (MAX_FRAME + 1).to_be_bytes().to_vec();
        assert!(matches!(
            read(&mut Cursor::new(too_long)),
            Err(Iperf3Error::FrameTooLong(..))
        ));
        let mut short = 10u32.to_be_bytes().to_vec();
        short.extend_from_slice(b"{\"a\"");
        assert!(matches!(
            read(&mut Cursor::new(short)),
            Err(Iperf3Error::Io { .. })
        ));
        let mut garbage = 3u32.to_be_bytes().to_vec();
        garbage.extend_from_slice(b"{{{");
        assert!(matches!(
            read(&mut Cursor::new(garbage)),
            Err(Iperf3Error::BadJson(_))
        ));
        let mut array = 2u32.to_be_bytes().to_vec();
        array.extend_from_slice(b"[]");
        assert!(matches!(
            read(&mut Cursor::new(array)),
            Err(Iperf3Error::BadJson(_))
        ));
    }
}
