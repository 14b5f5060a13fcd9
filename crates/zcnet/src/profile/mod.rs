//! The host profile `zcnet tune` writes and `auto` reads: the file's layout, its checks and
//! refusals, where it lives, and how it is found and loaded for a connection ([`load`]).
//!
//! Why apart from [`crate::auto`]: `auto` is the decider — pure state machines fed sizes,
//! completions and clock readings, testable without a file or a socket. This module is the
//! file: it reads the environment ([`Profile::default_path_from_env`]), the file system and
//! the host's interfaces ([`load`]) and writes files ([`write_atomically`]). `auto` takes the
//! parsed tables ([`Measurement`], [`PairMeasurement`], ...) from here; nothing here uses
//! `auto`, so the decider can be read without the file code.
//!
//! Versioned JSON (`"schema": 1`), keyed by kernel release, interface and MTU: the costs it
//! records are properties of this kernel and this NIC, so a profile from another host, another
//! kernel or another interface is refused with a message naming what differs rather than
//! applied silently. Every number is checked (finite, non-negative, `lo ≤ median ≤ hi`) so a
//! hand-edited or truncated profile cannot steer the choice with NaN.
//!
//! Layout:
//!
//! ```json
//! {"schema": 1, "zcnet": "0.1.0", "kernel": "6.18.0", "interface": "lo", "mtu": 65536,
//!  "topology": "loopback", "created": "2025-01-01T00:00:00Z",
//!  "tx": [{"path": "copy", "size": 65536, "touch": false,
//!          "cpu_s_per_gib": {"median": 0.30, "lo": 0.28, "hi": 0.33}}],
//!  "rx": [{"path": "mmap", "size": 65536, "touch": true,
//!          "cpu_s_per_gib": {"median": 0.41, "lo": 0.39, "hi": 0.45}}],
//!  "pairs": [{"tx": "uring", "rx": "uring", "size": 65536, "touch": false,
//!             "cpu_s_per_gib": {"median": 0.40, "lo": 0.38, "hi": 0.42},
//!             "zc_fraction_tx": 0.0, "zc_fraction_rx": 0.0}]}
//! ```
//!
//! `pairs` (optional) holds transmit × receive pairs measured with both ends on this host
//! (loopback, netns); `auto` prefers it to the single-end tables when both ends of a
//! connection are `auto` (`crate::auto::pair`). The single-end tables stay for peers elsewhere.
//!
//! `file` (optional) holds what sending a caller's file costs, `sendfile`/`splice`/
//! `read_send` into each receive path, in the layout of a `pairs` row with the mode in `tx`
//! (`{"tx": "sendfile", "rx": "copy", …}`); `crate::auto::file` picks `Sender::send_file`'s mode
//! from it.
//!
//! `created` is an RFC 3339 string or Unix seconds; it is informational.

pub(crate) mod load;

use crate::path::TxPath;
use crate::path::{FileTxMode, RxPath};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::hash::Hash;
use std::path::{Path, PathBuf};

/// A path `auto` can choose among: [`TxPath`] for transmit, [`RxPath`] for receive, and the
/// pairs and file modes of the profile's other tables.
///
/// The decision logic is the same in both directions; only the names and the conservative
/// default differ. It lives with the profile because its names and tables are the file's:
/// the profile's rows are checked by them (a known name, a row for the default).
pub trait AutoPath: Copy + Eq + Hash + fmt::Debug + fmt::Display + serde::Serialize {
    /// The conservative built-in choice when nothing measured says otherwise: `copy`, which
    /// works on every socket and every buffer and is never much worse than the best path for
    /// memory-to-memory transfers.
    const DEFAULT: Self;
    /// Which table of the profile holds this path ("tx", "rx", "pairs" or "file").
    const DIRECTION: &'static str;
    /// The path for a profile name (`"copy"`, `"zerocopy"`, …), `None` if unknown.
    fn from_name(name: &str) -> Option<Self>;
}

impl AutoPath for TxPath {
    const DEFAULT: Self = TxPath::Copy;
    const DIRECTION: &'static str = "tx";
    fn from_name(name: &str) -> Option<Self> {
        // `auto` is a chooser, not a path with a cost of its own.
        name.parse().ok().filter(|p| *p != TxPath::Auto)
    }
}

impl AutoPath for RxPath {
    const DEFAULT: Self = RxPath::Copy;
    const DIRECTION: &'static str = "rx";
    fn from_name(name: &str) -> Option<Self> {
        name.parse().ok().filter(|p| *p != RxPath::Auto)
    }
}

/// The profile layout this build reads and writes.
pub const SCHEMA: u32 = 1;

/// What a profile must match to be applied on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKey {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Network interface the connection uses (`lo`, `veth…`, `eth0`).
    pub interface: String,
    /// That interface's MTU.
    pub mtu: u32,
}

/// How `zcnet tune` connected its two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Both ends on loopback in one namespace.
    Loopback,
    /// Two network namespaces joined by a veth pair.
    Netns,
}

/// When the profile was written: RFC 3339 text or Unix seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Created {
    /// Unix seconds.
    Unix(u64),
    /// RFC 3339 text (not interpreted).
    Text(String),
}

/// A measured cost with its spread: CPU-seconds per GiB (both ends, softirq included).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Median over the repetitions.
    pub median: f64,
    /// Low end of the spread (e.g. the minimum or a lower quantile).
    pub lo: f64,
    /// High end of the spread.
    pub hi: f64,
}

impl Spread {
    /// Whether the two spreads overlap: if they do, the runs behind them cannot order the
    /// two medians (as the bench's `Summary::overlaps` says of its runs).
    pub fn overlaps(&self, other: &Spread) -> bool {
        self.lo <= other.hi && other.lo <= self.hi
    }
}

#[cfg(test)]
impl Spread {
    /// `median` ± `w` (a fraction of it): a scripted measurement for tests.
    pub(crate) fn around(median: f64, w: f64) -> Spread {
        Spread {
            median,
            lo: median * (1.0 - w),
            hi: median * (1.0 + w),
        }
    }
}

/// One row of a direction's table: a path's cost at one operation size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measurement<P> {
    /// The path measured.
    pub path: P,
    /// Operation size in bytes.
    pub size: u64,
    /// Whether the application touched the data (wrote before sending / read after receiving).
    pub touch: bool,
    /// What it cost.
    pub cpu_s_per_gib: Spread,
    /// Share of the bytes that really went without a copy while this was measured (transmit:
    /// zero-copy bytes whose completions were not `COPIED`; receive: mapped bytes), if
    /// recorded. A listener advertises the mapping receiver's page-multiple MSS only where
    /// `mmap` was measured mapping (the MSS is fixed before any kernel evidence exists);
    /// online demotion does not consult it — what the kernel reports on the connection
    /// overrides the profile. Optional so older schema-1 profiles still read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zc_fraction: Option<f64>,
}

/// One transmit path and one receive path, the two ends of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PathPair {
    /// The sender's path.
    pub tx: TxPath,
    /// The receiver's path.
    pub rx: RxPath,
}

impl fmt::Display for PathPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tx, self.rx)
    }
}

impl AutoPath for PathPair {
    const DEFAULT: Self = PathPair {
        tx: TxPath::Copy,
        rx: RxPath::Copy,
    };
    const DIRECTION: &'static str = "pairs";
    /// `"uring/mmap"`: the two names, transmit first.
    fn from_name(name: &str) -> Option<Self> {
        let (tx, rx) = name.split_once('/')?;
        Some(PathPair {
            tx: TxPath::from_name(tx)?,
            rx: RxPath::from_name(rx)?,
        })
    }
}

/// One row of the pair table: what a transmit × receive pair cost at one operation size.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PairMeasurement {
    /// The sender's path.
    pub tx: TxPath,
    /// The receiver's path.
    pub rx: RxPath,
    /// Operation size in bytes (both ends).
    pub size: u64,
    /// Whether both ends touched the data.
    pub touch: bool,
    /// What it cost: worker CPU-seconds per GiB of both ends, median and range.
    pub cpu_s_per_gib: Spread,
    /// Share of the bytes the sender really sent without a copy while this was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zc_fraction_tx: Option<f64>,
    /// Share of the bytes the receiver really mapped while this was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zc_fraction_rx: Option<f64>,
    /// The receiver's share of the pair's cost (median over the runs of its CPU over both
    /// ends'): what lets a receiver, which sees only its own clock, tell how much dearer it
    /// may run on a path whose saving lies on the sender (`crate::auto::pair::rx_tolerance`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_share: Option<f64>,
}

impl PairMeasurement {
    /// The pair.
    pub fn pair(&self) -> PathPair {
        PathPair {
            tx: self.tx,
            rx: self.rx,
        }
    }
}

/// A file transmit mode and the receive path it was measured into: one row of the `file`
/// table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct FilePair {
    /// How the sender moved the file.
    pub mode: FileTxMode,
    /// The receiver's path.
    pub rx: RxPath,
}

impl fmt::Display for FilePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.mode, self.rx)
    }
}

impl AutoPath for FilePair {
    const DEFAULT: Self = FilePair {
        mode: FileTxMode::ReadSend,
        rx: RxPath::Copy,
    };
    const DIRECTION: &'static str = "file";
    fn from_name(name: &str) -> Option<Self> {
        let (m, r) = name.split_once('/')?;
        Some(FilePair {
            mode: m.parse().ok()?,
            rx: <RxPath as AutoPath>::from_name(r)?,
        })
    }
}

impl AutoPath for FileTxMode {
    /// `pread` + `send`: the copy, which works for every file.
    const DEFAULT: Self = FileTxMode::ReadSend;
    const DIRECTION: &'static str = "file";
    fn from_name(name: &str) -> Option<Self> {
        name.parse().ok()
    }
}

/// A validated profile for this host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// Layout version ([`SCHEMA`]).
    pub schema: u32,
    /// Version of the zcnet that wrote it (informational).
    pub zcnet: String,
    /// Kernel release it was measured on.
    pub kernel: String,
    /// Interface it was measured on.
    pub interface: String,
    /// That interface's MTU.
    pub mtu: u32,
    /// How the two ends were connected.
    pub topology: Topology,
    /// When it was written.
    pub created: Created,
    /// Transmit costs.
    pub tx: Vec<Measurement<TxPath>>,
    /// Receive costs.
    pub rx: Vec<Measurement<RxPath>>,
    /// Costs of transmit × receive pairs, where `tune` had both ends on this host
    /// (`crate::auto::pair`); empty for profiles without them. Optional in the layout, so schema
    /// 1 stays one layout: a profile without `pairs` reads as before, and an older build
    /// reading a profile with them ignores the field (it reads top-level fields by name and
    /// skips unknown ones) and keeps choosing from the single-end tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<PairMeasurement>,
    /// Costs of sending a file (`sendfile`, `splice`, `read_send`) into each receive path
    /// (`crate::auto::file`); optional like `pairs`, with rows named `mode`/`rx` in the `tx`/`rx`
    /// fields. Empty: a file sender keeps its configured mode.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "file_rows_out"
    )]
    pub file: Vec<Measurement<FilePair>>,
}

/// The `file` table as `tune` writes it: the layout of a `pairs` row.
fn file_rows_out<S: serde::Serializer>(
    rows: &[Measurement<FilePair>],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq as _;
    let mut seq = s.serialize_seq(Some(rows.len()))?;
    for m in rows {
        seq.serialize_element(&serde_json::json!({
            "tx": m.path.mode.name(),
            "rx": m.path.rx.name(),
            "size": m.size,
            "touch": m.touch,
            "cpu_s_per_gib": m.cpu_s_per_gib,
            "zc_fraction_tx": m.zc_fraction,
        }))?;
    }
    seq.end()
}

/// Why a profile was refused (or could not be located): its message says which field,
/// key or schema, and what to do about it (re-run `zcnet tune`, upgrade zcnet).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ProfileError(#[from] pub(crate) Refusal);

/// The reasons behind a [`ProfileError`], one per check; callers read the message, this
/// crate's tests the reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// Not JSON, or not the layout of its schema.
    #[error("profile is malformed: {0}")]
    Malformed(#[from] serde_json::Error),
    /// No `schema` number at the top level.
    #[error("profile has no numeric \"schema\" field; it was not written by `zcnet tune`")]
    MissingSchema,
    /// Written by an older zcnet in a layout this one no longer reads.
    #[error("profile schema {found} is older than the schema {supported} this zcnet reads; re-run `zcnet tune`")]
    OldSchema {
        /// The profile's schema.
        found: u64,
        /// This build's schema.
        supported: u32,
    },
    /// Written by a newer zcnet.
    #[error("profile schema {found} is newer than the schema {supported} this zcnet reads; upgrade zcnet or re-run `zcnet tune`")]
    NewerSchema {
        /// The profile's schema.
        found: u64,
        /// This build's schema.
        supported: u32,
    },
    /// Measured on another kernel, interface or MTU.
    #[error("profile was measured elsewhere: {differences}; re-run `zcnet tune` on this host")]
    Foreign {
        /// Each differing key, e.g. `kernel release "6.1.0" (this host: "6.18.0")`.
        differences: String,
    },
    /// A direction's table has no rows.
    #[error("profile's {direction} table is empty")]
    EmptyTable {
        /// "tx" or "rx".
        direction: &'static str,
    },
    /// A path name this build does not know.
    #[error("profile's {direction} table names unknown path {name:?}")]
    UnknownPath {
        /// "tx" or "rx".
        direction: &'static str,
        /// The name found.
        name: String,
    },
    /// A row with size 0.
    #[error("profile's {direction} row for {path} has size 0")]
    ZeroSize {
        /// "tx" or "rx".
        direction: &'static str,
        /// The path.
        path: String,
    },
    /// NaN, infinity, a negative cost, or `lo ≤ median ≤ hi` violated.
    #[error("profile's {direction} row for {path} at {size} bytes has a bad cost: {what}")]
    BadCost {
        /// "tx" or "rx".
        direction: &'static str,
        /// The path.
        path: String,
        /// The row's size.
        size: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// Two rows for the same path, size and touch.
    #[error("profile's {direction} table has two rows for {path} at {size} bytes (touch={touch})")]
    Duplicate {
        /// "tx" or "rx".
        direction: &'static str,
        /// The path.
        path: String,
        /// The size.
        size: u64,
        /// The touch variant.
        touch: bool,
    },
    /// No `copy` rows, so nothing to compare the other paths against.
    #[error("profile's {direction} table has no rows for the baseline path {baseline}")]
    NoBaseline {
        /// "tx" or "rx".
        direction: &'static str,
        /// The baseline path's name.
        baseline: String,
    },
    /// The interface name cannot be part of a file name.
    #[error("interface name {0:?} cannot name a profile file")]
    BadInterface(String),
    /// Neither `$ZCNET_PROFILE`, `$XDG_CONFIG_HOME` nor `$HOME` is set.
    #[error("no profile location: set $ZCNET_PROFILE, $XDG_CONFIG_HOME or $HOME")]
    NoLocation,
}

#[derive(Deserialize)]
struct RawProfile {
    zcnet: String,
    kernel: String,
    interface: String,
    mtu: u32,
    topology: Topology,
    created: Created,
    tx: Vec<RawRow>,
    rx: Vec<RawRow>,
    #[serde(default)]
    pairs: Vec<RawPairRow>,
    #[serde(default)]
    file: Vec<RawPairRow>,
}

#[derive(Deserialize)]
struct RawPairRow {
    tx: String,
    rx: String,
    size: u64,
    touch: bool,
    cpu_s_per_gib: Spread,
    #[serde(default)]
    zc_fraction_tx: Option<f64>,
    #[serde(default)]
    zc_fraction_rx: Option<f64>,
    #[serde(default)]
    rx_share: Option<f64>,
}

#[derive(Deserialize)]
struct RawRow {
    path: String,
    size: u64,
    touch: bool,
    cpu_s_per_gib: Spread,
    #[serde(default)]
    zc_fraction: Option<f64>,
}

impl Profile {
    /// A loopback profile holding just these rows, scripted rather than measured: for tests
    /// (and tools) that need a profile saying something particular.
    pub fn scripted(tx: Vec<Measurement<TxPath>>, rx: Vec<Measurement<RxPath>>) -> Profile {
        Profile {
            schema: SCHEMA,
            zcnet: "test".into(),
            kernel: "test".into(),
            interface: "lo".into(),
            mtu: 65536,
            topology: Topology::Loopback,
            created: Created::Unix(0),
            tx,
            rx,
            pairs: Vec::new(),
            file: Vec::new(),
        }
    }

    /// Parses and validates `json`, refusing a profile of another schema or another host.
    ///
    /// The schema is checked before the layout so an old or newer profile gets a message
    /// about its version, not about a missing field.
    pub fn parse(json: &str, expect: &HostKey) -> Result<Profile, ProfileError> {
        Ok(Self::parse_refusing(json, expect)?)
    }

    fn parse_refusing(json: &str, expect: &HostKey) -> Result<Profile, Refusal> {
        let value: serde_json::Value = serde_json::from_str(json)?;
        let schema = value
            .get("schema")
            .and_then(serde_json::Value::as_u64)
            .ok_or(Refusal::MissingSchema)?;
        if schema < u64::from(SCHEMA) {
            return Err(Refusal::OldSchema {
                found: schema,
                supported: SCHEMA,
            });
        }
        if schema > u64::from(SCHEMA) {
            return Err(Refusal::NewerSchema {
                found: schema,
                supported: SCHEMA,
            });
        }
        let raw: RawProfile = serde_json::from_value(value)?;
        Self::from_raw(raw, expect)
    }

    fn from_raw(raw: RawProfile, expect: &HostKey) -> Result<Profile, Refusal> {
        let mut differences = Vec::new();
        if raw.kernel != expect.kernel {
            differences.push(format!(
                "kernel release {:?} (this host: {:?})",
                raw.kernel, expect.kernel
            ));
        }
        if raw.interface != expect.interface {
            differences.push(format!(
                "interface {:?} (this connection: {:?})",
                raw.interface, expect.interface
            ));
        }
        if raw.mtu != expect.mtu {
            differences.push(format!("MTU {} (this interface: {})", raw.mtu, expect.mtu));
        }
        if !differences.is_empty() {
            return Err(Refusal::Foreign {
                differences: differences.join(", "),
            });
        }
        Ok(Profile {
            schema: SCHEMA,
            zcnet: raw.zcnet,
            kernel: raw.kernel,
            interface: raw.interface,
            mtu: raw.mtu,
            topology: raw.topology,
            created: raw.created,
            tx: rows(raw.tx)?,
            rx: rows(raw.rx)?,
            pairs: pair_rows(raw.pairs)?,
            file: file_rows(raw.file)?,
        })
    }

    /// The profile as JSON, as `zcnet tune` writes it (it parses back with [`Profile::parse`]).
    pub fn to_json(&self) -> String {
        // Serialising plain structs of strings, integers, finite floats and enums cannot fail.
        serde_json::to_string_pretty(self).expect("a profile always serialises")
    }

    /// The key this profile applies to.
    pub fn host_key(&self) -> HostKey {
        HostKey {
            kernel: self.kernel.clone(),
            interface: self.interface.clone(),
            mtu: self.mtu,
        }
    }

    /// The file name of the profile for `interface` at `mtu`: `profile-<if>-mtu<N>.json`.
    /// The MTU is part of a profile's key, so profiles of one interface at two MTUs (a netns
    /// topology tuned at 1500 and at 9000) must not overwrite each other.
    pub fn file_name(interface: &str, mtu: u32) -> String {
        format!("profile-{interface}-mtu{mtu}.json")
    }

    /// Where the profile for `interface` at `mtu` lives: `$ZCNET_PROFILE` if set, else
    /// `$XDG_CONFIG_HOME/zcnet/` + [`Profile::file_name`], else `$HOME/.config/zcnet/` + it.
    ///
    /// Pure: the environment's values are parameters. Empty values count as unset, and a
    /// relative `$XDG_CONFIG_HOME` is ignored, as the XDG Base Directory specification says.
    pub fn default_path(
        interface: &str,
        mtu: u32,
        zcnet_profile: Option<&OsStr>,
        xdg_config_home: Option<&OsStr>,
        home: Option<&OsStr>,
    ) -> Result<PathBuf, ProfileError> {
        fn set(v: Option<&OsStr>) -> Option<&OsStr> {
            v.filter(|v| !v.is_empty())
        }
        if let Some(path) = set(zcnet_profile) {
            return Ok(PathBuf::from(path));
        }
        if interface.is_empty() || interface.contains('/') || interface.starts_with('.') {
            return Err(Refusal::BadInterface(interface.to_owned()).into());
        }
        let file = Self::file_name(interface, mtu);
        if let Some(xdg) = set(xdg_config_home).filter(|v| Path::new(v).is_absolute()) {
            return Ok(Path::new(xdg).join("zcnet").join(file));
        }
        if let Some(home) = set(home) {
            return Ok(Path::new(home).join(".config").join("zcnet").join(file));
        }
        Err(Refusal::NoLocation.into())
    }

    /// [`Profile::default_path`] with this process's environment.
    pub fn default_path_from_env(interface: &str, mtu: u32) -> Result<PathBuf, ProfileError> {
        Self::default_path(
            interface,
            mtu,
            std::env::var_os("ZCNET_PROFILE").as_deref(),
            std::env::var_os("XDG_CONFIG_HOME").as_deref(),
            std::env::var_os("HOME").as_deref(),
        )
    }
}

/// Writes `text` to `path` whole or not at all, for the files in the profiles' directory
/// (`zcnet tune`'s profiles, the preload library's per-boot facts): to a temporary file of
/// this process's own beside it, then renamed over `path`, so a reader — another process
/// reading the same file — never sees half of it, and two writers never share a temporary.
/// Makes the directory if needed.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn rows<P: AutoPath>(raw: Vec<RawRow>) -> Result<Vec<Measurement<P>>, Refusal> {
    let direction = P::DIRECTION;
    if raw.is_empty() {
        return Err(Refusal::EmptyTable { direction });
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for row in raw {
        let path = P::from_name(&row.path).ok_or_else(|| Refusal::UnknownPath {
            direction,
            name: row.path.clone(),
        })?;
        if row.size == 0 {
            return Err(Refusal::ZeroSize {
                direction,
                path: row.path,
            });
        }
        let bad = |what| Refusal::BadCost {
            direction,
            path: row.path.clone(),
            size: row.size,
            what,
        };
        let c = row.cpu_s_per_gib;
        if ![c.median, c.lo, c.hi].iter().all(|v| v.is_finite()) {
            return Err(bad("not a finite number"));
        }
        if c.lo < 0.0 {
            return Err(bad("negative"));
        }
        if !(c.lo <= c.median && c.median <= c.hi) {
            return Err(bad("not lo <= median <= hi"));
        }
        if row
            .zc_fraction
            .is_some_and(|f| !(f.is_finite() && (0.0..=1.0).contains(&f)))
        {
            return Err(bad("zc_fraction not within 0..=1"));
        }
        if !seen.insert((path, row.size, row.touch)) {
            return Err(Refusal::Duplicate {
                direction,
                path: row.path,
                size: row.size,
                touch: row.touch,
            });
        }
        out.push(Measurement {
            path,
            size: row.size,
            touch: row.touch,
            cpu_s_per_gib: c,
            zc_fraction: row.zc_fraction,
        });
    }
    if !out.iter().any(|m| m.path == P::DEFAULT) {
        return Err(Refusal::NoBaseline {
            direction,
            baseline: P::DEFAULT.to_string(),
        });
    }
    Ok(out)
}

/// The `file` table: rows named `mode/rx`, checked as every table is, with a
/// `read_send/copy` baseline if any rows.
fn file_rows(raw: Vec<RawPairRow>) -> Result<Vec<Measurement<FilePair>>, Refusal> {
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    rows(
        raw.into_iter()
            .map(|r| RawRow {
                path: format!("{}/{}", r.tx, r.rx),
                size: r.size,
                touch: r.touch,
                cpu_s_per_gib: r.cpu_s_per_gib,
                zc_fraction: r.zc_fraction_tx,
            })
            .collect(),
    )
}

/// The pair table: each row's two names known, its cost and shares checked as in the
/// single-end tables, no pair twice at one size, and a `copy/copy` baseline if any rows.
fn pair_rows(raw: Vec<RawPairRow>) -> Result<Vec<PairMeasurement>, Refusal> {
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    // The same checks as a direction's table, on rows named "tx/rx".
    let named: Vec<RawRow> = raw
        .iter()
        .map(|r| RawRow {
            path: format!("{}/{}", r.tx, r.rx),
            size: r.size,
            touch: r.touch,
            cpu_s_per_gib: r.cpu_s_per_gib,
            zc_fraction: None,
        })
        .collect();
    let checked = rows::<PathPair>(named)?;
    let mut out = Vec::with_capacity(raw.len());
    for (m, r) in checked.into_iter().zip(raw) {
        for (f, what) in [
            (r.zc_fraction_tx, "zc_fraction not within 0..=1"),
            (r.zc_fraction_rx, "zc_fraction not within 0..=1"),
            (r.rx_share, "rx_share not within 0..=1"),
        ] {
            if f.is_some_and(|f| !(f.is_finite() && (0.0..=1.0).contains(&f))) {
                return Err(Refusal::BadCost {
                    direction: PathPair::DIRECTION,
                    path: m.path.to_string(),
                    size: m.size,
                    what,
                });
            }
        }
        out.push(PairMeasurement {
            tx: m.path.tx,
            rx: m.path.rx,
            size: m.size,
            touch: m.touch,
            cpu_s_per_gib: m.cpu_s_per_gib,
            zc_fraction_tx: r.zc_fraction_tx,
            zc_fraction_rx: r.zc_fraction_rx,
            rx_share: r.rx_share,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_makes_the_directory_replaces_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a").join("f.json");
        write_atomically(&path, "first").unwrap();
        write_atomically(&path, "second").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("a"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.json")]);
        // Into a path that is a directory: the error comes back, and the temporary goes.
        std::fs::create_dir(dir.path().join("d")).unwrap();
        assert!(write_atomically(&dir.path().join("d"), "x").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    fn host() -> HostKey {
        HostKey {
            kernel: "6.18.0".into(),
            interface: "lo".into(),
            mtu: 65536,
        }
    }

    fn json_with(schema: &str, kernel: &str, mtu: u32, tx: &str) -> String {
        format!(
            r#"{{"schema": {schema}, "zcnet": "0.1.0", "kernel": "{kernel}", "interface": "lo",
               "mtu": {mtu}, "topology": "loopback", "created": 1700000000,
               "tx": {tx},
               "rx": [{{"path": "copy", "size": 4096, "touch": false,
                        "cpu_s_per_gib": {{"median": 0.5, "lo": 0.4, "hi": 0.6}}}},
                      {{"path": "mmap", "size": 4096, "touch": false,
                        "cpu_s_per_gib": {{"median": 0.7, "lo": 0.6, "hi": 0.8}}}}]}}"#
        )
    }

    const TX: &str = r#"[{"path": "copy", "size": 4096, "touch": false,
                          "cpu_s_per_gib": {"median": 0.3, "lo": 0.25, "hi": 0.35}},
                         {"path": "zerocopy", "size": 4096, "touch": false,
                          "cpu_s_per_gib": {"median": 0.2, "lo": 0.1, "hi": 0.22}}]"#;

    fn good() -> String {
        json_with("1", "6.18.0", 65536, TX)
    }

    #[test]
    fn parses_a_good_profile_and_round_trips() {
        let p = Profile::parse(&good(), &host()).unwrap();
        assert_eq!(p.tx.len(), 2);
        assert_eq!(p.tx[1].path, TxPath::Zerocopy);
        assert_eq!(p.rx[1].path, RxPath::Mmap);
        assert_eq!(p.topology, Topology::Loopback);
        assert_eq!(p.created, Created::Unix(1_700_000_000));
        assert_eq!(p.host_key(), host());
        let again = Profile::parse(&p.to_json(), &host()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn old_and_newer_schemas_are_refused_by_version() {
        let old = Profile::parse(&json_with("0", "6.18.0", 65536, TX), &host()).unwrap_err();
        assert!(
            matches!(old.0, Refusal::OldSchema { found: 0, .. }),
            "{old}"
        );
        assert!(old.to_string().contains("older"), "{old}");
        // A newer layout with fields this build does not know still gets the version message.
        let newer = r#"{"schema": 2, "tables": {}}"#;
        let err = Profile::parse(newer, &host()).unwrap_err();
        assert!(
            matches!(err.0, Refusal::NewerSchema { found: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("newer"), "{err}");
        let none = Profile::parse(r#"{"kernel": "6.18.0"}"#, &host()).unwrap_err();
        assert!(matches!(none.0, Refusal::MissingSchema), "{none}");
        let text = Profile::parse(r#"{"schema": "1"}"#, &host()).unwrap_err();
        assert!(matches!(text.0, Refusal::MissingSchema), "{text}");
    }

    #[test]
    fn foreign_profiles_are_refused_naming_what_differs() {
        let err = Profile::parse(&json_with("1", "6.1.0", 1500, TX), &host()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err.0, Refusal::Foreign { .. }), "{msg}");
        assert!(
            msg.contains("kernel release \"6.1.0\" (this host: \"6.18.0\")"),
            "{msg}"
        );
        assert!(msg.contains("MTU 1500 (this interface: 65536)"), "{msg}");
        assert!(!msg.contains("interface \""), "{msg}");
        let eth = HostKey {
            interface: "eth0".into(),
            ..host()
        };
        let msg = Profile::parse(&good(), &eth).unwrap_err().to_string();
        assert!(
            msg.contains("interface \"lo\" (this connection: \"eth0\")"),
            "{msg}"
        );
    }

    #[test]
    fn malformed_json_and_layout_are_refused() {
        for bad in ["", "{", "[1, 2]", "{\"schema\": 1, \"kernel\": 5}"] {
            let err = Profile::parse(bad, &host()).unwrap_err();
            assert!(
                matches!(err.0, Refusal::Malformed(_) | Refusal::MissingSchema),
                "{bad}: {err}"
            );
        }
        let topo = good().replace("\"loopback\"", "\"wifi\"");
        let err = Profile::parse(&topo, &host()).unwrap_err();
        assert!(matches!(err.0, Refusal::Malformed(_)), "{err}");
        // Out-of-range numbers (which would be infinite) are refused by the JSON parser.
        let huge = good().replace("0.22", "1e999");
        assert!(Profile::parse(&huge, &host()).is_err());
    }

    #[test]
    fn bad_tables_are_refused() {
        let cases = [
            ("[]", "empty"),
            (
                r#"[{"path": "teleport", "size": 1, "touch": false,
                     "cpu_s_per_gib": {"median": 1, "lo": 1, "hi": 1}}]"#,
                "unknown path \"teleport\"",
            ),
            (
                r#"[{"path": "copy", "size": 0, "touch": false,
                     "cpu_s_per_gib": {"median": 1, "lo": 1, "hi": 1}}]"#,
                "size 0",
            ),
            (
                r#"[{"path": "copy", "size": 4096, "touch": false,
                     "cpu_s_per_gib": {"median": 1, "lo": 2, "hi": 3}}]"#,
                "not lo <= median <= hi",
            ),
            (
                r#"[{"path": "copy", "size": 4096, "touch": false,
                     "cpu_s_per_gib": {"median": -1, "lo": -2, "hi": 3}}]"#,
                "negative",
            ),
            (
                r#"[{"path": "copy", "size": 4096, "touch": false,
                     "cpu_s_per_gib": {"median": 1, "lo": 1, "hi": 1}},
                    {"path": "copy", "size": 4096, "touch": false,
                     "cpu_s_per_gib": {"median": 2, "lo": 2, "hi": 2}}]"#,
                "two rows",
            ),
            (
                r#"[{"path": "zerocopy", "size": 4096, "touch": false,
                     "cpu_s_per_gib": {"median": 1, "lo": 1, "hi": 1}}]"#,
                "baseline path copy",
            ),
        ];
        for (tx, want) in cases {
            let err = Profile::parse(&json_with("1", "6.18.0", 65536, tx), &host()).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(want), "{want}: {msg}");
            assert!(msg.contains("tx"), "{msg}");
        }
    }

    #[test]
    fn non_finite_costs_are_refused() {
        // JSON cannot spell NaN, but a profile built in memory (or a future parser) can.
        for v in [f64::NAN, f64::INFINITY] {
            let raw = vec![RawRow {
                path: "copy".into(),
                size: 4096,
                touch: false,
                cpu_s_per_gib: Spread {
                    median: 1.0,
                    lo: 0.5,
                    hi: v,
                },
                zc_fraction: None,
            }];
            let err = rows::<TxPath>(raw).unwrap_err();
            assert!(err.to_string().contains("not a finite number"), "{err}");
        }
    }

    #[test]
    fn zero_copy_shares_are_read_checked_and_optional() {
        let with = |f: &str| {
            json_with(
                "1",
                "6.18.0",
                65536,
                &format!(
                    r#"[{{"path": "copy", "size": 4096, "touch": false,
                         "cpu_s_per_gib": {{"median": 0.3, "lo": 0.25, "hi": 0.35}}}},
                        {{"path": "zerocopy", "size": 4096, "touch": false, "zc_fraction": {f},
                         "cpu_s_per_gib": {{"median": 0.2, "lo": 0.1, "hi": 0.22}}}}]"#
                ),
            )
        };
        let p = Profile::parse(&with("0.25"), &host()).unwrap();
        assert_eq!(p.tx[1].zc_fraction, Some(0.25));
        assert_eq!(p.tx[0].zc_fraction, None);
        assert_eq!(Profile::parse(&p.to_json(), &host()).unwrap(), p);
        let err = Profile::parse(&with("1.5"), &host()).unwrap_err();
        assert!(err.to_string().contains("zc_fraction"), "{err}");
        // `auto` is a chooser, not a measured path.
        let auto = good().replace(r#""path": "zerocopy""#, r#""path": "auto""#);
        let err = Profile::parse(&auto, &host()).unwrap_err();
        assert!(matches!(err.0, Refusal::UnknownPath { .. }), "{err}");
    }

    const PAIRS: &str = r#"[{"tx": "copy", "rx": "copy", "size": 4096, "touch": false,
                             "cpu_s_per_gib": {"median": 0.5, "lo": 0.45, "hi": 0.55}},
                            {"tx": "uring", "rx": "uring", "size": 4096, "touch": false,
                             "zc_fraction_tx": 0.0, "zc_fraction_rx": 0.0, "rx_share": 0.4,
                             "cpu_s_per_gib": {"median": 0.3, "lo": 0.28, "hi": 0.33}}]"#;

    fn with_pairs(pairs: &str) -> String {
        good().replacen("\"tx\":", &format!("\"pairs\": {pairs}, \"tx\":"), 1)
    }

    #[test]
    fn pairs_are_optional_read_checked_and_round_trip() {
        // Without the field (every profile written before pairs existed): no pairs.
        assert!(Profile::parse(&good(), &host()).unwrap().pairs.is_empty());
        let p = Profile::parse(&with_pairs(PAIRS), &host()).unwrap();
        assert_eq!(p.pairs.len(), 2);
        assert_eq!(
            (p.pairs[1].tx, p.pairs[1].rx, p.pairs[1].zc_fraction_rx),
            (TxPath::Uring, RxPath::Uring, Some(0.0))
        );
        // The receiver's share of the cost, where recorded (a profile before it: none).
        assert_eq!(
            (p.pairs[0].rx_share, p.pairs[1].rx_share),
            (None, Some(0.4))
        );
        let again = Profile::parse(&p.to_json(), &host()).unwrap();
        assert_eq!(again, p);
        // The single-end tables are untouched by a pair table.
        assert_eq!(p.tx, Profile::parse(&good(), &host()).unwrap().tx);
        // An empty table is the same as none, and is not written.
        let empty = Profile::parse(&with_pairs("[]"), &host()).unwrap();
        assert!(empty.pairs.is_empty());
        assert!(!empty.to_json().contains("pairs"));
    }

    #[test]
    fn unknown_fields_are_skipped_so_older_builds_read_newer_schema_1_profiles() {
        // What an older build does with `pairs` is what this one does with any field it does
        // not know: it reads the rest. The layout stays schema 1.
        let extra = good().replacen("\"tx\":", "\"something_later\": {\"x\": [1]}, \"tx\":", 1);
        let p = Profile::parse(&extra, &host()).unwrap();
        assert_eq!(p, Profile::parse(&good(), &host()).unwrap());
    }

    #[test]
    fn bad_pair_tables_are_refused_by_name() {
        let cases = [
            (
                PAIRS.replace("\"uring\", \"rx\"", "\"teleport\", \"rx\""),
                "unknown path \"teleport/uring\"",
            ),
            (
                PAIRS.replace("\"rx\": \"uring\"", "\"rx\": \"auto\""),
                "unknown path \"uring/auto\"",
            ),
            (
                PAIRS
                    .replace("\"tx\": \"copy\"", "\"tx\": \"uring\"")
                    .replace("\"rx\": \"copy\"", "\"rx\": \"uring\""),
                "two rows",
            ),
            (
                PAIRS.replace("\"tx\": \"copy\"", "\"tx\": \"zerocopy\""),
                "baseline path copy/copy",
            ),
            (
                PAIRS.replace("\"zc_fraction_rx\": 0.0", "\"zc_fraction_rx\": 2.0"),
                "zc_fraction",
            ),
            (
                PAIRS.replace("\"rx_share\": 0.4", "\"rx_share\": -0.1"),
                "rx_share not within 0..=1",
            ),
            (
                PAIRS.replace("\"lo\": 0.28", "\"lo\": 0.31"),
                "not lo <= median <= hi",
            ),
        ];
        for (pairs, want) in cases {
            let err = Profile::parse(&with_pairs(&pairs), &host()).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(want), "{want}: {msg}");
            assert!(msg.contains("pairs"), "{msg}");
        }
    }

    #[test]
    fn default_path_follows_the_environment_order() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert_eq!(
            Profile::default_path("lo", 65536, os("/p.json"), os("/x"), os("/h")).unwrap(),
            PathBuf::from("/p.json")
        );
        assert_eq!(
            Profile::default_path("lo", 65536, None, os("/x"), os("/h")).unwrap(),
            PathBuf::from("/x/zcnet/profile-lo-mtu65536.json")
        );
        assert_eq!(
            Profile::default_path("eth0", 1500, os(""), os("rel"), os("/h")).unwrap(),
            PathBuf::from("/h/.config/zcnet/profile-eth0-mtu1500.json")
        );
        // One interface at two MTUs: two files (a netns tuned at 1500 and at 9000).
        assert_ne!(
            Profile::default_path("vza", 1500, None, os("/x"), None).unwrap(),
            Profile::default_path("vza", 9000, None, os("/x"), None).unwrap()
        );
        assert!(matches!(
            Profile::default_path("lo", 65536, None, None, None),
            Err(ProfileError(Refusal::NoLocation))
        ));
        assert!(matches!(
            Profile::default_path("../x", 1500, None, None, os("/h")),
            Err(ProfileError(Refusal::BadInterface(_)))
        ));
    }
}
