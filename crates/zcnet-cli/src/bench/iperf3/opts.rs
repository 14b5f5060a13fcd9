//! What an iperf3-mode run was asked to do, from the command line: a leaf every part of
//! the iperf3 runner names.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use zcnet::{RxPath, TxPath};
use zcnet_bench::iperf3::TestParams;

/// How the report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// iperf3's human-readable lines.
    Text,
    /// `-J`: one JSON document per test.
    Json,
    /// `--json-stream`: one `{"event","data"}` line per start, interval and end.
    JsonStream,
}

/// The options both roles share.
#[derive(Debug, Clone)]
pub(crate) struct Common {
    /// zcnet's transmit path on this end.
    pub tx: TxPath,
    /// `--tx file` / `-Z`: sending streams send from a page-cache file with
    /// `Sender::send_file` (`tx` is then unused).
    pub file: bool,
    /// zcnet's receive path on this end.
    pub rx: RxPath,
    /// `--rx file`: receiving streams splice into a page-cache file with
    /// `Receiver::recv_to_file` (`rx` is then unused).
    pub rx_file: bool,
    /// `-i`: seconds between interval reports; 0 for none.
    pub interval: f64,
    /// `-J` / `--json-stream` / text.
    pub format: Format,
    /// `--logfile`: append the report here instead of stdout.
    pub logfile: Option<PathBuf>,
}

impl Common {
    /// The receive path's name as reports show it (`file` for `--rx file`).
    pub(crate) fn rx_name(&self) -> &'static str {
        if self.rx_file {
            crate::bench::files::FILE
        } else {
            self.rx.name()
        }
    }
}

/// `zcnet bench -s`.
#[derive(Debug, Clone)]
pub(crate) struct ServerOpts {
    /// `-1`: serve one test, then exit.
    pub once: bool,
    /// `--max-memory`: bytes all running tests' buffers may hold together.
    pub max_memory: u64,
    /// Shared options.
    pub common: Common,
}

/// `zcnet bench -c HOST`.
#[derive(Debug, Clone)]
pub(crate) struct ClientOpts {
    /// The host as given (shown in `connecting_to`).
    pub host: String,
    /// The server's port.
    pub port: u16,
    /// The test to ask for.
    pub params: TestParams,
    /// `-u` without `-l`: the block is the control connection's MSS, as iperf3's client
    /// sets it (`params.len` until then).
    pub udp_len_from_mss: bool,
    /// Shared options.
    pub common: Common,
}

/// Bound on waiting for a peer's next control message or data connection outside the
/// running phase: a silent peer fails the test rather than hang it.
pub(crate) const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// After the test ends, how long a receiving stream may take to drain what its peer says
/// it sent (or to see end of stream) before the test reports the shortfall.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where reports go: stdout or `--logfile`, one writer at a time (the server runs many
/// tests at once; their lines must not interleave mid-line).
#[derive(Debug)]
pub(crate) struct Out {
    file: Option<Mutex<std::fs::File>>,
    stdout: Mutex<()>,
}

impl Out {
    /// Opens `--logfile` for appending, or stdout.
    pub(crate) fn open(logfile: Option<&std::path::Path>) -> std::io::Result<Out> {
        let file = match logfile {
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            )),
            None => None,
        };
        Ok(Out {
            file,
            stdout: Mutex::new(()),
        })
    }

    /// Writes `text` (whole lines) in one piece.
    pub(crate) fn write(&self, text: &str) {
        use std::io::Write as _;
        match &self.file {
            Some(f) => {
                let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
                let _ = f.write_all(text.as_bytes());
                let _ = f.flush();
            }
            None => {
                let _g = self.stdout.lock().unwrap_or_else(|e| e.into_inner());
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(text.as_bytes());
                let _ = o.flush();
            }
        }
    }
}
