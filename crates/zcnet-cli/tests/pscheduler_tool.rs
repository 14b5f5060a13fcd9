//! `packaging/pscheduler-tool-zcnet`, perfSONAR pScheduler's tool plugin for zcnet, driven
//! as pScheduler drives a tool: each executable given the JSON pScheduler sends on its
//! standard input, its output checked against the plugin API — the tool enumeration
//! (`PluginEnumeration/Tool` in pScheduler's `jsonval.py`: its fields, their types, no
//! others), `can-run`'s verdict and reasons, `duration`'s ISO 8601 slot, and the throughput
//! test's result schema (`pscheduler-test-throughput`'s `RESULT_SCHEMA`: `succeeded`,
//! `diags`, `intervals`, `summary`, each stream and summary record of the fields and types it
//! admits, nothing else) — and one real loopback run (TCP, and UDP) through `run`, with the
//! built `zcnet`.
//!
//! The plugin's executables are Python 3 (standard library only); without `python3` every
//! test here skips and says so.

use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn plugin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/pscheduler-tool-zcnet/zcnet")
}

/// Asserts `python3` runs here (the plugin's interpreter), for a test marked ignored
/// without `zcnet_has_python3`.
fn require_python3() {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "python3, which the build found, does not run");
}

/// The plugin's configuration, pointing at the `zcnet` under test.
fn conf(dir: &Path) -> PathBuf {
    let p = dir.join("zcnet.conf");
    std::fs::write(
        &p,
        format!(
            "[zcnet]\nzcnet_cmd = {}\nserver_port = 5201\n",
            env!("CARGO_BIN_EXE_zcnet")
        ),
    )
    .unwrap();
    p
}

/// Runs executable `name` with `input` on stdin; returns its exit success and parsed stdout.
fn call(name: &str, conf: &Path, input: &Value) -> (bool, Value, String) {
    let mut child = Command::new(plugin_dir().join(name))
        .env("ZCNET_PSCHEDULER_CONF", conf)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    // Both pipes drained as they fill; the child bounded in time.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            String::from_utf8_lossy(&b).into_owned()
        })
    };
    let so = drain(Box::new(child.stdout.take().unwrap()));
    let se = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (so.join().unwrap(), se.join().unwrap());
    let v = if status.success() {
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {stdout}"))
    } else {
        Value::Null
    };
    (status.success(), v, stderr)
}

/// `v` is an object whose keys are all in `allowed` and include every one of `required`.
fn object<'a>(
    v: &'a Value,
    allowed: &[&str],
    required: &[&str],
    what: &str,
) -> &'a Map<String, Value> {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("{what} is not an object: {v}"));
    for k in o.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "{what}: field {k:?} is not in the schema"
        );
    }
    for k in required {
        assert!(o.contains_key(*k), "{what}: {k:?} is required");
    }
    o
}

fn is_integer(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

/// One record of the throughput result (`#/local/throughput-data`): only its fields, each
/// of its type.
fn check_throughput_data(v: &Value, what: &str) {
    let o = object(
        v,
        &[
            "throughput-bits",
            "throughput-bytes",
            "receiver-throughput-bits",
            "sent",
            "lost",
            "jitter",
            "stream-id",
            "start",
            "end",
            "rtt",
            "tcp-window-size",
            "retransmits",
            "omitted",
        ],
        &[],
        what,
    );
    for (k, x) in o {
        let ok = match k.as_str() {
            "throughput-bits"
            | "throughput-bytes"
            | "receiver-throughput-bits"
            | "start"
            | "end" => x.is_number(),
            "sent" | "lost" | "tcp-window-size" | "retransmits" => is_integer(x) || x.is_null(),
            "jitter" | "rtt" => x.is_number() || x.is_null(),
            "stream-id" => x.is_string() || is_integer(x),
            "omitted" => x.is_boolean(),
            _ => unreachable!(),
        };
        assert!(ok, "{what}.{k} = {x}: not of the schema's type");
    }
}

/// A throughput result, as the throughput test's result schema admits it.
fn check_result(v: &Value) {
    let o = object(
        v,
        &[
            "schema",
            "succeeded",
            "error",
            "diags",
            "mss",
            "mtu",
            "tcp-window-size",
            "requested-tcp-window-size",
            "intervals",
            "summary",
        ],
        &["succeeded", "diags", "intervals", "summary"],
        "result",
    );
    assert!(o["succeeded"].is_boolean());
    assert!(o["diags"].is_string());
    if let Some(e) = o.get("error") {
        assert!(e.is_string());
    }
    for (i, iv) in o["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .enumerate()
    {
        let io = object(iv, &["streams", "summary"], &[], "interval");
        for s in io
            .get("streams")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            check_throughput_data(s, &format!("intervals[{i}].streams[]"));
        }
        if let Some(s) = io.get("summary") {
            check_throughput_data(s, &format!("intervals[{i}].summary"));
        }
    }
    let so = object(&o["summary"], &["streams", "summary"], &[], "summary");
    for s in so
        .get("streams")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        check_throughput_data(s, "summary.streams[]");
    }
    if let Some(s) = so.get("summary") {
        check_throughput_data(s, "summary.summary");
    }
}

fn now_iso() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[cfg_attr(not(zcnet_has_python3), ignore = "needs python3")]
#[test]
fn enumerate_can_run_duration_and_participant_data_speak_the_plugin_api() {
    require_python3();
    let dir = tempfile::tempdir().unwrap();
    let conf = conf(dir.path());
    let (ok, e, err) = call("enumerate", &conf, &json!({}));
    assert!(ok, "{err}");
    let o = object(
        &e,
        &[
            "schema",
            "name",
            "description",
            "version",
            "tests",
            "preference",
            "maintainer",
            "scheduling-class",
        ],
        &[
            "name",
            "description",
            "version",
            "tests",
            "preference",
            "maintainer",
        ],
        "enumerate",
    );
    assert_eq!(o["name"], "zcnet");
    assert!(o["description"].is_string());
    let version = o["version"].as_str().unwrap();
    assert!(
        version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "{version}"
    );
    assert_eq!(o["tests"], json!(["throughput"]));
    assert!(is_integer(&o["preference"]));
    object(
        &o["maintainer"],
        &["name", "email", "href"],
        &["name"],
        "maintainer",
    );
    assert!(["background", "background-multi", "exclusive", "normal"]
        .contains(&o["scheduling-class"].as_str().unwrap()));

    let spec = json!({"schema": 1, "dest": "127.0.0.1", "duration": "PT10S", "parallel": 2});
    let (ok, r, err) = call(
        "can-run",
        &conf,
        &json!({"type": "throughput", "spec": spec}),
    );
    assert!(ok, "{err}");
    assert_eq!(r, json!({"can-run": true}));
    for (input, reason) in [
        (
            json!({"type": "latency", "spec": spec}),
            "Unsupported test type",
        ),
        (
            json!({"type": "throughput", "spec": {"schema": 1, "dest": "h", "mss": 1400}}),
            "mss",
        ),
        (
            json!({"type": "throughput", "spec": {"schema": 1, "dest": "h", "bandwidth": 10}}),
            "UDP",
        ),
        (
            json!({"type": "throughput", "spec": {"schema": 1, "dest": "h", "duration": "ten"}}),
            "ISO 8601",
        ),
    ] {
        let (ok, r, err) = call("can-run", &conf, &input);
        assert!(ok, "{err}");
        let o = object(
            &r,
            &["can-run", "reasons"],
            &["can-run", "reasons"],
            "can-run",
        );
        assert_eq!(o["can-run"], false, "{input}");
        let reasons = o["reasons"].as_array().unwrap();
        assert!(
            reasons.iter().any(|x| x.as_str().unwrap().contains(reason)),
            "{input}: {reasons:?}"
        );
    }

    // 10 s of test, 4 s of set-up (at the default 200 ms round trip), 3 s waiting for the
    // server, 2 s for it to wind down.
    let (ok, d, err) = call("duration", &conf, &json!({"spec": spec}));
    assert!(ok, "{err}");
    assert_eq!(d, json!({"duration": "PT19S"}));
    let (ok, d, _) = call(
        "duration",
        &conf,
        &json!({"spec": {"dest": "h", "duration": "PT1M", "link-rtt": "PT0.5S"}}),
    );
    assert!(ok);
    assert_eq!(d, json!({"duration": "PT75S"}), "10 s of set-up for 500 ms");

    let (ok, p0, err) = call("participant-data", &conf, &json!({"participant": 0}));
    assert!(ok, "{err}");
    assert_eq!(p0["zcnet-version"], env!("CARGO_PKG_VERSION"));
    assert!(p0.get("server_port").is_none());
    let (ok, p1, _) = call("participant-data", &conf, &json!({"participant": 1}));
    assert!(ok);
    assert_eq!(p1["server_port"], 5201);
    let (ok, _, _) = call("participant-data", &conf, &json!({"participant": 2}));
    assert!(!ok, "a throughput test has two participants");
}

/// One real run through `run` on loopback (pScheduler's `loopback` spec: both ends on this
/// host), its result checked against the throughput result schema, then `merged-results`.
fn loopback_run(extra: Value) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let conf = conf(dir.path());
    let mut spec = json!({"schema": 1, "dest": "127.0.0.1", "duration": "PT1S", "loopback": true});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let test = json!({"type": "throughput", "spec": spec});
    let input = json!({
        "participant": 0,
        "participant-data": [{"schema": 1}],
        "schedule": {"start": now_iso(), "duration": "PT10S"},
        "test": test,
    });
    let (ok, r, err) = call("run", &conf, &input);
    assert!(ok, "run: {err}");
    check_result(&r);
    assert_eq!(r["succeeded"], true, "{r}");
    let sum = &r["summary"]["summary"];
    assert!(sum["throughput-bits"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        sum["receiver-throughput-bits"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    assert!(!r["summary"]["streams"].as_array().unwrap().is_empty());
    // zcnet's figures, where the schema leaves room for them.
    let diags = r["diags"].as_str().unwrap();
    assert!(diags.contains("cpu_s_per_gib"), "{diags}");
    assert!(diags.contains("zero_copy_share"), "{diags}");
    assert!(diags.contains("zcnet remote (server)"), "{diags}");

    let (ok, m, err) = call(
        "merged-results",
        &conf,
        &json!({"test": test, "results": [r]}),
    );
    assert!(ok, "{err}");
    check_result(&m);
    assert_eq!(m["summary"], r["summary"]);
    assert_eq!(m["succeeded"], true);
    let failed_server =
        json!({"succeeded": false, "error": "x", "diags": "d", "intervals": [], "summary": {}});
    let (ok, m, _) = call(
        "merged-results",
        &conf,
        &json!({"test": test, "results": [r, failed_server]}),
    );
    assert!(ok);
    check_result(&m);
    assert_eq!(m["succeeded"], false, "a failed server fails the run");
    r
}

#[cfg_attr(not(zcnet_has_python3), ignore = "needs python3")]
#[test]
fn a_tcp_run_on_loopback_through_run_and_merged_results() {
    require_python3();
    let r = loopback_run(json!({"parallel": 2}));
    assert_eq!(r["summary"]["streams"].as_array().unwrap().len(), 2);
    assert!(r["summary"]["summary"]["retransmits"].is_i64());
}

#[cfg_attr(not(zcnet_has_python3), ignore = "needs python3")]
#[test]
fn a_udp_run_on_loopback_through_run() {
    require_python3();
    let r = loopback_run(json!({"udp": true, "bandwidth": 20_000_000, "buffer-length": 1400}));
    let sum = &r["summary"]["summary"];
    assert!(sum["sent"].as_u64().unwrap() > 0, "{sum}");
    assert!(sum["lost"].is_u64(), "{sum}");
    assert!(sum["jitter"].is_number(), "{sum}");
}
