//! `zcnet probe [--json]`: runs [`crate::probe::run`] and prints the report — an aligned
//! `check  result  detail` table, or exactly one JSON object with `--json`.
//!
//! A check that says "no" is a finding, not a failure: the command fails only when the
//! report cannot be written.

use std::io::Write;

/// Probes this host and prints the report to stdout.
pub fn run(json: bool) -> Result<(), String> {
    let report = crate::probe::run();
    let text = render(&report, json)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the probe report: {e}"))
}

/// The report as printed: the table, or one pretty-printed JSON object; newline-terminated.
fn render(report: &crate::probe::Report, json: bool) -> Result<String, String> {
    if json {
        serde_json::to_string_pretty(report)
            .map(|s| s + "\n")
            .map_err(|e| format!("serialising the probe report: {e}"))
    } else {
        Ok(report.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_one_object_with_every_check() {
        let report = crate::probe::run();
        let text = render(&report, true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).expect("one JSON value");
        assert_eq!(v["kernel"].as_str(), Some(report.kernel.as_str()));
        let checks = v["checks"].as_array().expect("checks array");
        let names: Vec<&str> = checks.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, crate::probe::CHECKS);
        for c in checks {
            let status = c["status"].as_str().unwrap_or("");
            assert!(["yes", "no", "partial"].contains(&status), "{c}");
            assert!(!c["detail"].as_str().unwrap_or("").is_empty(), "{c}");
        }
        assert_eq!(
            v["checks"][0],
            serde_json::json!({"name": "so_zerocopy_tcp", "status": "yes",
                "detail": "setsockopt(SO_ZEROCOPY, 1) accepted on a fresh socket, reads back 1"})
        );
    }

    #[test]
    fn table_has_a_row_per_check() {
        let report = crate::probe::run();
        let text = render(&report, false).unwrap();
        assert!(text.starts_with(&format!("kernel {}\n", report.kernel)));
        assert!(text.contains("\ncheck "));
        assert_eq!(text.lines().count(), 3 + crate::probe::CHECKS.len());
    }
}
