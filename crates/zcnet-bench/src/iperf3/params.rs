//! The test parameters the client sends after `PARAM_EXCHANGE` (`send_parameters` /
//! `get_parameters` in iperf3's `iperf_api.c`). Keys are present only when set, as
//! iperf3 writes them; unknown keys are ignored, as iperf3 ignores them. What zcnet does
//! not run — SCTP, pacing TCP to a bit rate, UDP bursts or `--bidir`, `--omit`, block
//! counts, MSS, window and congestion-control choices, authentication — is refused by name
//! rather than run differently from what the user asked. UDP (`-u`, with `-b` per stream
//! and `--udp-counters-64bit`) runs: [`super::udp`].

use super::error::Iperf3Error;
use serde_json::{json, Map, Value};

/// Which way data flows, from the client's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The client sends (iperf3's default).
    Forward,
    /// The server sends (`-R`).
    Reverse,
    /// Both send, on separate connections (`--bidir`).
    Bidir,
}

impl Direction {
    /// Whether the client has sending streams.
    pub fn client_sends(self) -> bool {
        matches!(self, Direction::Forward | Direction::Bidir)
    }

    /// Whether the server has sending streams.
    pub fn server_sends(self) -> bool {
        matches!(self, Direction::Reverse | Direction::Bidir)
    }
}

/// The parameters of one test.
#[derive(Debug, Clone, PartialEq)]
pub struct TestParams {
    /// `-t`: seconds (iperf3 sends an integer). Used when `bytes` is 0.
    pub time: u32,
    /// `-n`: bytes to move, 0 for a timed test.
    pub bytes: u64,
    /// `-P`: streams per direction.
    pub parallel: u32,
    /// `-l`: bytes per write.
    pub len: u64,
    /// `-R` / `--bidir`.
    pub direction: Direction,
    /// `-N`: `TCP_NODELAY`.
    pub nodelay: bool,
    /// `-Z`: the client sends with `sendfile(2)` (iperf3's "zerocopy").
    pub zerocopy: bool,
    /// `--get-server-output`: the server puts its own report into its results.
    pub get_server_output: bool,
    /// `-T`: a title iperf3 prefixes its lines with.
    pub title: Option<String>,
    /// `--extra-data`.
    pub extra_data: Option<String>,
    /// The client's version string (3.x writes it; older ones do not).
    pub client_version: Option<String>,
    /// `-u`: a UDP test.
    pub udp: bool,
    /// `-b`: bits per second each stream sends at, 0 for unlimited (UDP only here).
    pub bandwidth: u64,
    /// `--udp-counters-64bit`: 64-bit packet numbers in each datagram.
    pub udp_counters_64bit: bool,
}

/// Largest block we accept: iperf3's `MAX_TCP_BUFFER` (512 MiB). Each stream allocates a
/// pool of blocks, so a garbled length must not become a huge allocation.
pub const MAX_LEN: u64 = 512 << 20;
/// Most streams per direction (iperf3: `MAX_STREAMS` = 128).
pub const MAX_PARALLEL: u32 = 128;
/// Longest test (iperf3: `MAX_TIME` = 86400 s).
pub const MAX_TIME: u32 = 86_400;

impl Default for TestParams {
    fn default() -> Self {
        TestParams {
            time: super::DEFAULT_SECONDS,
            bytes: 0,
            parallel: 1,
            len: super::DEFAULT_BLKSIZE,
            direction: Direction::Forward,
            nodelay: false,
            zerocopy: false,
            get_server_output: false,
            title: None,
            extra_data: None,
            client_version: None,
            udp: false,
            bandwidth: 0,
            udp_counters_64bit: false,
        }
    }
}

fn number(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn uint(
    o: &Map<String, Value>,
    field: &'static str,
    what: &'static str,
) -> Result<Option<u64>, Iperf3Error> {
    match o.get(field) {
        None => Ok(None),
        Some(v) => match number(v) {
            Some(n) if n >= 0.0 && n.fract() == 0.0 && n < 1.8e19 => Ok(Some(n as u64)),
            _ => Err(Iperf3Error::BadField {
                what,
                field,
                problem: "is not a non-negative integer",
            }),
        },
    }
}

fn text(o: &Map<String, Value>, field: &'static str) -> Result<Option<String>, Iperf3Error> {
    match o.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Iperf3Error::BadField {
            what: "parameters",
            field,
            problem: "is not a string",
        }),
    }
}

impl TestParams {
    /// The direction a `reverse` and a `bidirectional` flag make.
    pub fn direction_of(reverse: bool, bidir: bool) -> Direction {
        match (reverse, bidir) {
            (_, true) => Direction::Bidir,
            (true, false) => Direction::Reverse,
            (false, false) => Direction::Forward,
        }
    }

    /// Data connections the client opens: `parallel`, twice that with `--bidir`.
    pub fn connections(&self) -> u32 {
        match self.direction {
            Direction::Bidir => 2 * self.parallel,
            _ => self.parallel,
        }
    }

    /// The JSON object iperf3's `send_parameters` writes for these parameters.
    pub fn to_json(&self) -> Value {
        let mut o = json!({
            "omit": 0,
            "time": self.time,
            "num": self.bytes,
            "blockcount": 0,
            "parallel": self.parallel,
            "len": self.len,
        });
        let m = o.as_object_mut().expect("an object");
        m.insert(if self.udp { "udp" } else { "tcp" }.into(), json!(true));
        if self.bandwidth > 0 {
            m.insert("bandwidth".into(), json!(self.bandwidth));
        }
        if self.udp_counters_64bit {
            m.insert("udp_counters_64bit".into(), json!(1));
        }
        match self.direction {
            Direction::Forward => {}
            Direction::Reverse => {
                m.insert("reverse".into(), json!(true));
            }
            Direction::Bidir => {
                m.insert("bidirectional".into(), json!(true));
            }
        }
        if self.nodelay {
            m.insert("nodelay".into(), json!(true));
        }
        if self.zerocopy {
            m.insert("zerocopy".into(), json!(1));
        }
        if self.get_server_output {
            m.insert("get_server_output".into(), json!(1));
        }
        if let Some(t) = &self.title {
            m.insert("title".into(), json!(t));
        }
        if let Some(t) = &self.extra_data {
            m.insert("extra_data".into(), json!(t));
        }
        m.insert(
            "client_version".into(),
            json!(self.client_version.clone().unwrap_or_else(|| "3.12".into())),
        );
        o
    }

    /// Reads and checks what a client sent.
    pub fn from_json(v: &Value) -> Result<TestParams, Iperf3Error> {
        const W: &str = "parameters";
        let o = v
            .as_object()
            .ok_or_else(|| Iperf3Error::BadJson("parameters: not an object".into()))?;
        for (key, what) in [
            ("sctp", "SCTP tests (--sctp)"),
            ("dont_fragment", "don't-fragment (--dont-fragment)"),
            ("authtoken", "authentication (--username)"),
            ("MSS", "a maximum segment size (-M)"),
            ("window", "a socket buffer size (-w)"),
            ("congestion", "a congestion-control choice (-C)"),
            ("fqrate", "fair-queue pacing (--fq-rate)"),
            ("server_affinity", "server CPU affinity (-A n,m)"),
            ("flowlabel", "IPv6 flow labels (-L)"),
            ("TOS", "a type of service (-S)"),
        ] {
            if o.contains_key(key) {
                return Err(Iperf3Error::Unsupported(what.into()));
            }
        }
        let udp = o
            .get("udp")
            .is_some_and(|v| !matches!(v, Value::Bool(false)));
        let bandwidth = uint(o, "bandwidth", W)?.unwrap_or(0);
        if bandwidth != 0 && !udp {
            return Err(Iperf3Error::Unsupported(
                "a target bit rate (-b) for TCP".into(),
            ));
        }
        if uint(o, "burst", W)?.unwrap_or(0) != 0 {
            return Err(Iperf3Error::Unsupported("bursts (-b RATE/COUNT)".into()));
        }
        if uint(o, "omit", W)?.unwrap_or(0) != 0 {
            return Err(Iperf3Error::Unsupported("omitting seconds (-O)".into()));
        }
        if uint(o, "blockcount", W)?.unwrap_or(0) != 0 {
            return Err(Iperf3Error::Unsupported("a block count (-k)".into()));
        }
        let bad = |field, problem| Iperf3Error::BadField {
            what: W,
            field,
            problem,
        };
        let time = uint(o, "time", W)?.unwrap_or(u64::from(super::DEFAULT_SECONDS));
        if time > u64::from(MAX_TIME) {
            return Err(bad("time", "is over 86400 seconds"));
        }
        let bytes = uint(o, "num", W)?.unwrap_or(0);
        if time == 0 && bytes == 0 {
            return Err(bad("time", "is 0 and no byte count (num) is given"));
        }
        let parallel = uint(o, "parallel", W)?.unwrap_or(1);
        if parallel == 0 || parallel > u64::from(MAX_PARALLEL) {
            return Err(bad("parallel", "is outside 1..=128"));
        }
        let udp_counters_64bit = uint(o, "udp_counters_64bit", W)?.unwrap_or(0) != 0;
        let len = uint(o, "len", W)?.unwrap_or(if udp {
            super::udp::DEFAULT_UDP_BLKSIZE
        } else {
            super::DEFAULT_BLKSIZE
        });
        if len == 0 || len > MAX_LEN {
            return Err(bad("len", "is outside 1 byte ..= 512 MiB"));
        }
        if udp
            && (len > super::udp::MAX_UDP_BLOCKSIZE
                || len < super::udp::Header::len(udp_counters_64bit) as u64)
        {
            return Err(bad(
                "len",
                "is outside one UDP header (12 or 16 bytes) ..= 65507 bytes",
            ));
        }
        let flag = |k: &str| o.get(k).is_some_and(|v| !matches!(v, Value::Bool(false)));
        let direction = Self::direction_of(flag("reverse"), flag("bidirectional"));
        if udp && direction == Direction::Bidir {
            return Err(Iperf3Error::Unsupported("UDP tests with --bidir".into()));
        }
        Ok(TestParams {
            time: time as u32,
            bytes,
            parallel: parallel as u32,
            len,
            direction,
            nodelay: flag("nodelay"),
            zerocopy: uint(o, "zerocopy", W)?.unwrap_or(0) != 0,
            get_server_output: uint(o, "get_server_output", W)?.unwrap_or(0) != 0,
            title: text(o, "title")?,
            extra_data: text(o, "extra_data")?,
            client_version: text(o, "client_version")?,
            udp,
            bandwidth,
            udp_counters_64bit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_iperf3_3_12_sends_parses() {
        // Captured from `iperf3 -c 127.0.0.1 -t 1 -P 2 --bidir -d` (send_parameters).
        let v: Value = serde_json::from_str(
            r#"{"tcp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":2,
                "bidirectional":true,"len":131072,"pacing_timer":1000,"client_version":"3.12"}"#,
        )
        .unwrap();
        let p = TestParams::from_json(&v).unwrap();
        assert_eq!(p.time, 1);
        assert_eq!(p.parallel, 2);
        assert_eq!(p.direction, Direction::Bidir);
        assert_eq!(p.connections(), 4);
        assert_eq!(p.len, 131072);
        assert_eq!(p.client_version.as_deref(), Some("3.12"));
    }

    #[test]
    fn our_parameters_round_trip() {
        let p = TestParams {
            time: 0,
            bytes: 10 << 20,
            parallel: 4,
            len: 65536,
            direction: Direction::Reverse,
            nodelay: true,
            zerocopy: true,
            get_server_output: false,
            title: Some("t".into()),
            extra_data: None,
            client_version: Some("3.12".into()),
            ..TestParams::default()
        };
        let v = p.to_json();
        assert_eq!(v["reverse"], true);
        assert!(v.get("bidirectional").is_none());
        assert_eq!(TestParams::from_json(&v).unwrap(), p);
    }

    #[test]
    fn what_we_do_not_run_is_refused_by_name() {
        for (extra, needle) in [
            (r#""sctp":true"#, "SCTP"),
            (r#""bandwidth":1000000"#, "bit rate"),
            (r#""udp":true,"burst":10"#, "bursts"),
            (r#""udp":true,"bidirectional":true"#, "--bidir"),
            (r#""omit":2"#, "omitting"),
            (r#""MSS":1400"#, "segment"),
            (r#""window":65536"#, "buffer"),
        ] {
            let v: Value =
                serde_json::from_str(&format!(r#"{{"tcp":true,"time":1,{extra}}}"#)).unwrap();
            let e = TestParams::from_json(&v).unwrap_err();
            assert!(
                matches!(&e, Iperf3Error::Unsupported(s) if s.contains(needle)),
                "{extra}: {e}"
            );
        }
        // bandwidth 0 and omit 0 are what a default client sends for UDP-less TCP: fine.
        let v: Value =
            serde_json::from_str(r#"{"tcp":true,"time":1,"omit":0,"bandwidth":0}"#).unwrap();
        assert!(TestParams::from_json(&v).is_ok());
    }

    #[test]
    fn out_of_range_numbers_are_named() {
        for (body, field) in [
            (r#"{"time":1,"parallel":0}"#, "parallel"),
            (r#"{"time":1,"parallel":129}"#, "parallel"),
            (r#"{"time":1,"len":0}"#, "len"),
            (r#"{"time":100000}"#, "time"),
            (r#"{"time":0,"num":0}"#, "time"),
            (r#"{"time":-1}"#, "time"),
            (r#"{"time":"ten"}"#, "time"),
            (r#"{"time":1,"title":5}"#, "title"),
        ] {
            let v: Value = serde_json::from_str(body).unwrap();
            match TestParams::from_json(&v) {
                Err(Iperf3Error::BadField { field: f, .. }) => assert_eq!(f, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[test]
    fn what_iperf3_3_12_sends_for_udp_parses() {
        // `iperf3 -c … -u -b 10M -l 1400 -P 2 --udp-counters-64bit -R` (send_parameters).
        let v: Value = serde_json::from_str(
            r#"{"udp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":2,"reverse":true,
                "len":1400,"bandwidth":10000000,"pacing_timer":1000,"udp_counters_64bit":1,
                "client_version":"3.12"}"#,
        )
        .unwrap();
        let p = TestParams::from_json(&v).unwrap();
        assert!(p.udp && p.udp_counters_64bit);
        assert_eq!(p.bandwidth, 10_000_000);
        assert_eq!((p.len, p.parallel), (1400, 2));
        assert_eq!(p.direction, Direction::Reverse);
        assert_eq!(TestParams::from_json(&p.to_json()).unwrap(), p);
        assert!(p.to_json().get("tcp").is_none());
        // -b 0 (unlimited) sends no bandwidth; no -l means iperf3's UDP default.
        let v: Value = serde_json::from_str(r#"{"udp":true,"time":1}"#).unwrap();
        let p = TestParams::from_json(&v).unwrap();
        assert_eq!((p.bandwidth, p.len), (0, 1460));
        for len in [11, 65508] {
            let v: Value =
                serde_json::from_str(&format!(r#"{{"udp":true,"time":1,"len":{len}}}"#)).unwrap();
            assert!(matches!(
                TestParams::from_json(&v),
                Err(Iperf3Error::BadField { field: "len", .. })
            ));
        }
    }
}
