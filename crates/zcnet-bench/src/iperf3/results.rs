//! The results each side sends after `EXCHANGE_RESULTS` (`send_results` / `get_results`
//! in iperf3's `iperf_api.c`): CPU utilisation, whether the sender counted retransmits, and
//! one record per stream. The client sends first, then the server.
//!
//! iperf3's `get_results` looks its fields up by name and ignores the rest, so zcnet adds
//! its own measurements under the key `zcnet` (CPU seconds per side, zero-copy shares,
//! fallbacks): an iperf3 peer never sees a changed field, and a zcnet peer reads them.

use super::error::Iperf3Error;
use serde_json::{json, Map, Value};

/// One stream's figures as its side measured them.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamResult {
    /// The stream id both sides agree on: 1, 3, 4, 5, … in connection order (iperf3's
    /// `iperf_add_stream` skips 2, and keeps doing so for compatibility).
    pub id: u32,
    /// Bytes this side sent (on its sending streams) or received (on its receiving ones).
    pub bytes: u64,
    /// TCP retransmits (`tcpi_total_retrans`) on a sending stream, -1 where not counted.
    pub retransmits: i64,
    /// Seconds from the test's start to this stream's start (iperf3 writes 0).
    pub start_time: f64,
    /// Seconds from the test's start to this stream's end.
    pub end_time: f64,
    /// UDP, a receiving stream: smoothed jitter in seconds (0 otherwise).
    pub jitter: f64,
    /// UDP, a receiving stream: datagrams lost (`cnt_error`; 0 otherwise).
    pub errors: u64,
    /// UDP: datagrams sent (a sending stream) or the highest packet number received (a
    /// receiving stream), as iperf3's `packet_count`; 0 for TCP.
    pub packets: u64,
}

/// One side's results.
#[derive(Debug, Clone, PartialEq)]
pub struct Results {
    /// Percent of one CPU this process used over the test (user + system; iperf3's
    /// `cpu_util`: process CPU time / wall time).
    pub cpu_util_total: f64,
    /// User part.
    pub cpu_util_user: f64,
    /// System part.
    pub cpu_util_system: f64,
    /// 1 if the sending side counted retransmits, 0 if it could not, -1 from a side that
    /// only received.
    pub sender_has_retransmits: i64,
    /// `TCP_CONGESTION` of the data connections, where known.
    pub congestion_used: Option<String>,
    /// Per stream.
    pub streams: Vec<StreamResult>,
    /// The server's own `-J` report (`--get-server-output`), if asked for.
    pub server_output_json: Option<Value>,
    /// zcnet's measurements (absent from an iperf3 peer).
    pub zcnet: Option<Value>,
}

/// The stream id of the `i`-th data connection (0-based), as iperf3 numbers them.
pub fn stream_id(i: usize) -> u32 {
    if i == 0 {
        1
    } else {
        i as u32 + 2
    }
}

fn req_number(o: &Map<String, Value>, field: &'static str) -> Result<f64, Iperf3Error> {
    o.get(field)
        .and_then(Value::as_f64)
        .ok_or(Iperf3Error::BadField {
            what: "results",
            field,
            problem: "is missing or not a number",
        })
}

impl Results {
    /// The JSON object to send.
    pub fn to_json(&self) -> Value {
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|s| {
                json!({
                    "id": s.id,
                    "bytes": s.bytes,
                    "retransmits": s.retransmits,
                    "jitter": s.jitter,
                    "errors": s.errors,
                    "packets": s.packets,
                    "start_time": s.start_time,
                    "end_time": s.end_time,
                })
            })
            .collect();
        let mut v = json!({
            "cpu_util_total": self.cpu_util_total,
            "cpu_util_user": self.cpu_util_user,
            "cpu_util_system": self.cpu_util_system,
            "sender_has_retransmits": self.sender_has_retransmits,
            "streams": streams,
        });
        let m = v.as_object_mut().expect("an object");
        if let Some(c) = &self.congestion_used {
            m.insert("congestion_used".into(), json!(c));
        }
        if let Some(j) = &self.server_output_json {
            m.insert("server_output_json".into(), j.clone());
        }
        if let Some(z) = &self.zcnet {
            m.insert("zcnet".into(), z.clone());
        }
        v
    }

    /// Reads a peer's results, requiring what iperf3's `get_results` requires.
    pub fn from_json(v: &Value) -> Result<Results, Iperf3Error> {
        let o = v
            .as_object()
            .ok_or_else(|| Iperf3Error::BadJson("results: not an object".into()))?;
        let streams = o
            .get("streams")
            .and_then(Value::as_array)
            .ok_or(Iperf3Error::BadField {
                what: "results",
                field: "streams",
                problem: "is missing or not an array",
            })?;
        let mut out = Vec::with_capacity(streams.len());
        for s in streams {
            let so = s.as_object().ok_or(Iperf3Error::BadField {
                what: "results",
                field: "streams",
                problem: "holds something that is not an object",
            })?;
            for f in ["jitter", "errors", "packets"] {
                if so.get(f).and_then(Value::as_f64).is_none() {
                    return Err(Iperf3Error::BadField {
                        what: "results",
                        field: "streams[].jitter/errors/packets",
                        problem: "is missing or not a number",
                    });
                }
            }
            let id = req_number(so, "id")?;
            let bytes = req_number(so, "bytes")?;
            if id < 0.0 || id > f64::from(u32::MAX) || bytes < 0.0 {
                return Err(Iperf3Error::BadField {
                    what: "results",
                    field: "streams[].id/bytes",
                    problem: "is negative or out of range",
                });
            }
            out.push(StreamResult {
                id: id as u32,
                bytes: bytes as u64,
                retransmits: req_number(so, "retransmits")? as i64,
                start_time: so.get("start_time").and_then(Value::as_f64).unwrap_or(0.0),
                end_time: so.get("end_time").and_then(Value::as_f64).unwrap_or(0.0),
                jitter: req_number(so, "jitter")?.max(0.0),
                errors: req_number(so, "errors")?.max(0.0) as u64,
                packets: req_number(so, "packets")?.max(0.0) as u64,
            });
        }
        Ok(Results {
            cpu_util_total: req_number(o, "cpu_util_total")?,
            cpu_util_user: req_number(o, "cpu_util_user")?,
            cpu_util_system: req_number(o, "cpu_util_system")?,
            sender_has_retransmits: req_number(o, "sender_has_retransmits")? as i64,
            congestion_used: o
                .get("congestion_used")
                .and_then(Value::as_str)
                .map(str::to_string),
            streams: out,
            server_output_json: o.get("server_output_json").cloned(),
            zcnet: o.get("zcnet").cloned(),
        })
    }

    /// The peer's record of stream `id`.
    pub fn stream(&self, id: u32) -> Option<&StreamResult> {
        self.streams.iter().find(|s| s.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_skip_two_as_iperf3s_do() {
        let ids: Vec<u32> = (0..5).map(stream_id).collect();
        assert_eq!(ids, [1, 3, 4, 5, 6]);
    }

    #[test]
    fn what_iperf3_3_12_sends_parses() {
        // A server's send_results after a 1-second, 2-stream forward test (iperf3 -d).
        let v: Value = serde_json::from_str(
            r#"{"cpu_util_total":60.8,"cpu_util_user":2.7,"cpu_util_system":58.1,
                "sender_has_retransmits":-1,"congestion_used":"cubic","streams":[
                {"id":1,"bytes":848035840,"retransmits":-1,"jitter":0,"errors":0,"packets":0,
                 "start_time":0,"end_time":1.000909},
                {"id":3,"bytes":12000000000,"retransmits":-1,"jitter":0,"errors":0,"packets":0,
                 "start_time":0,"end_time":1.000909}]}"#,
        )
        .unwrap();
        let r = Results::from_json(&v).unwrap();
        assert_eq!(r.streams.len(), 2);
        assert_eq!(r.stream(3).unwrap().bytes, 12_000_000_000);
        assert_eq!(r.sender_has_retransmits, -1);
        assert_eq!(r.congestion_used.as_deref(), Some("cubic"));
        assert!(r.zcnet.is_none());
    }

    #[test]
    fn ours_round_trip_with_the_extension() {
        let r = Results {
            cpu_util_total: 12.5,
            cpu_util_user: 2.5,
            cpu_util_system: 10.0,
            sender_has_retransmits: 1,
            congestion_used: None,
            streams: vec![StreamResult {
                id: 1,
                bytes: 5 << 30,
                retransmits: 0,
                start_time: 0.0,
                end_time: 1.5,
                jitter: 0.000125,
                errors: 3,
                packets: 1000,
            }],
            server_output_json: None,
            zcnet: Some(json!({"cpu_s": {"user": 0.1, "sys": 0.4}})),
        };
        assert_eq!(Results::from_json(&r.to_json()).unwrap(), r);
    }

    #[test]
    fn missing_fields_are_named() {
        for (body, field) in [
            (
                r#"{"cpu_util_user":1,"cpu_util_system":1,"sender_has_retransmits":0,"streams":[]}"#,
                "cpu_util_total",
            ),
            (
                r#"{"cpu_util_total":1,"cpu_util_user":1,"cpu_util_system":1,"sender_has_retransmits":0}"#,
                "streams",
            ),
            (
                r#"{"cpu_util_total":1,"cpu_util_user":1,"cpu_util_system":1,"sender_has_retransmits":0,
                 "streams":[{"id":1,"retransmits":0,"jitter":0,"errors":0,"packets":0}]}"#,
                "bytes",
            ),
            (
                r#"{"cpu_util_total":1,"cpu_util_user":1,"cpu_util_system":1,"sender_has_retransmits":0,
                 "streams":[{"id":1,"bytes":-5,"retransmits":0,"jitter":0,"errors":0,"packets":0}]}"#,
                "streams[].id/bytes",
            ),
        ] {
            let v: Value = serde_json::from_str(body).unwrap();
            match Results::from_json(&v) {
                Err(Iperf3Error::BadField { field: f, .. }) => assert_eq!(f, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }
}
