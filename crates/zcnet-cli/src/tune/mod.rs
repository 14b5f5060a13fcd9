//! `zcnet tune`: measure what every transmit and receive path costs on this host, find the
//! crossovers, and write the profile the `auto` path reads.
//!
//! The measurements are `zcnet bench` runs ([`crate::bench::execute`]). Both ends are on this
//! host (loopback, or two namespaces), so `tune` measures transmit × receive *pairs* — every
//! one of `copy`, `zerocopy`, `uring` into every one of `copy`, `mmap`, `uring` — because the
//! two ends' costs do not add up (`zcnet::auto::pair`); and `cow` into `copy`, `copy` into
//! `zcrx`, so the single-end tables (each path against a `copy` peer, what a connection to a
//! peer elsewhere reads) are complete; and a caller's file, by `sendfile` (`file`) and by
//! `pread` + `send` (`read_send`), into `copy`, `mmap` and `uring`, for the profile's `file`
//! table (`zcnet::auto::file`: how `Sender::send_file` goes on `auto`). Sizes are swept, with and without touching the data,
//! repeated and interleaved. Each row is the median and range of the worker CPU-seconds per
//! GiB of both ends ([`zcnet_bench::measure`]).
//!
//! Then a second pass re-checks the choices a noisy run could have made: at every size where
//! the cheapest pair is not `copy → copy`, on both sides of every crossover, and wherever
//! the cheapest other pair's range overlaps `copy → copy`'s (the first pass could not tell
//! them apart, whichever median came out lower). There the chosen pair, `copy → copy` and
//! the four cheapest others by median run a *race* ([`race`]): rounds of one run each of
//! `--recheck-time` (1 s by default), interleaved, a pair more than 10 % over the leader,
//! paired round by round, leaving from the third round on, up to `--recheck-rounds` (5).
//! Over veth at 16 KiB, 0.25-s runs of `copy → copy` and `copy → mmap` spread ±12–24 %,
//! 1-s runs ±3–10 % (`git show 758b630:docs/measurements/auto.md`). The raced pairs' rows at a point are made
//! from the race's runs alone, and a choice the race changed is printed with what left the
//! race and why. A pair is chosen outright only if all its runs beat all of
//! `copy → copy`'s (its range lies below), so one noisy run can keep `copy` but cannot make
//! another pair win; where the ranges overlap, `auto` aims both ends at the pair with the
//! cheapest median and the receiver tries it on the connection (`zcnet::auto::trial`).
//!
//! Wall time, bounded by the plan: 17 configurations × sizes × touch variants × repeats ×
//! `--time`, plus at most 6 × sizes × touch variants × `--recheck-rounds` race runs of
//! `--recheck-time`, plus about 0.1 s of set-up per run. The defaults (6 sizes, both touch
//! variants, 3 repeats, 0.25 s, 5 rounds of 1 s) plan 612 runs + at most 360: about four
//! minutes of measuring and at most seven more of racing (about two: pairs leave).
//!
//! A configuration none of whose runs moved a byte (a loaded host: the run's time went by
//! before data flowed) has no row — a run of no bytes is no measurement — and without the
//! `copy` rows the profile is unusable. So such a configuration is said on stderr and
//! measured again, up to three times, each run twice as long as the last; one still not
//! measured then fails `tune` with its name.
//!
//! One profile per interface measured, keyed by kernel release, interface and MTU, in the
//! directory `auto` looks in.

mod race;

use crate::bench::{self, BenchError, Env, RunSpec, Topology};
use std::path::{Path, PathBuf};
use zcnet::tuning::{self, host_key_for, PairMeasurement, PathPair};
use zcnet::tuning::{
    AutoPath, Chooser, Created, FilePair, HostKey, Measurement, Profile,
    Topology as ProfileTopology, SCHEMA,
};
use zcnet::{RxPath, TxPath};
use zcnet_bench::measure::{file_rows, measured, pair_rows, profile_rows};
use zcnet_bench::protocol::{Limit, Params};
use zcnet_bench::report::{Mode, Run};
use zcnet_bench::sizes::{parse_sizes, ByteSize};

/// Options of `zcnet tune`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    zcnet tune                                   loopback, profile for `lo`\n  \
    zcnet tune --topology netns --mtu 9000       two namespaces joined by veth (root)\n  \
    zcnet tune --size 4K..4M --repeat 5          finer and steadier, slower\n\n\
    Profiles go to $ZCNET_PROFILE_DIR, else $XDG_CONFIG_HOME/zcnet, else ~/.config/zcnet,\n\
    as profile-INTERFACE-mtuMTU.json; `auto` reads the one for the interface a connection uses\n\
    ($ZCNET_PROFILE names one file for every connection instead).")]
pub struct Args {
    /// Where the two ends live.
    #[arg(long, value_enum, default_value = "loopback")]
    topology: TuneTopology,
    /// Link MTU for --topology netns (default 1500).
    #[arg(long, value_name = "N")]
    mtu: Option<u32>,
    /// Write the profile to this file (loopback only; netns measures two interfaces and
    /// writes one profile for each into --dir).
    #[arg(long, value_name = "PROFILE")]
    out: Option<PathBuf>,
    /// Directory for the profiles (default: where `auto` looks).
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    dir: Option<PathBuf>,
    /// Operation sizes: a list `4K,64K` or a sweep `4K..4M` (powers of two).
    #[arg(long, value_name = "SIZES", default_value = "4K,16K,64K,256K,1M,4M")]
    size: String,
    /// Runs per configuration (median and range go into the profile).
    #[arg(long, default_value_t = 3, value_name = "N")]
    repeat: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 0.25, value_name = "S")]
    time: f64,
    /// Seconds per re-check run (at least --time): the choices re-checked are the close
    /// ones, which short runs cannot order.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    recheck_time: f64,
    /// Rounds of the re-check race (0: no re-check). Each round runs every pair still in
    /// the race once; from the third on, a pair over 10 % dearer than the leader, paired
    /// round by round, leaves.
    #[arg(long, default_value_t = 5, value_name = "N")]
    recheck_rounds: u32,
    /// Measure only untouched data (halves the time; `auto` then has no touch variant and
    /// falls back to its defaults for applications that touch their data).
    #[arg(long)]
    no_touch: bool,
    /// SVG plot of CPU-s/GiB against size (default: beside the profile, `.svg`).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

/// The topologies a profile can be measured on (the sink has no receiver).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum TuneTopology {
    Loopback,
    Netns,
}

/// Transmit × receive paths measured as pairs: both ends are on this host (loopback, netns),
/// and their costs do not add up (`zcnet::auto::pair`).
const PAIR_TX: [TxPath; 3] = [TxPath::Copy, TxPath::Zerocopy, TxPath::Uring];
const PAIR_RX: [RxPath; 3] = [RxPath::Copy, RxPath::Mmap, RxPath::Uring];
/// Measured against a `copy` peer only: `cow` serves `send_slice`, whose chooser reads the
/// single-end table, and `zcrx` needs a NIC with header split (refused, and left out, on
/// loopback and veth).
const SINGLE: [(TxPath, RxPath); 2] = [(TxPath::Cow, RxPath::Copy), (TxPath::Copy, RxPath::Zcrx)];

/// A caller's file (`Sender::send_file`), sent by `sendfile` (the bench's `file`) or by
/// `pread` + `send` (`read_send`), into each receive path of the pairs: the profile's `file`
/// table, from which an `auto` sender picks the mode (`zcnet::auto::file`).
const FILE_TX: [&str; 2] = ["file", "read_send"];

/// Entry point from `main`.
pub fn run(args: &Args) -> Result<(), String> {
    run_inner(args).map_err(|e| e.to_string())
}

/// Every configuration the first pass measures: each pair, then the single-end extras.
fn configs() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&str, &str)> = PAIR_TX
        .iter()
        .flat_map(|&t| PAIR_RX.iter().map(move |&r| (t.name(), r.name())))
        .collect();
    v.extend(SINGLE.iter().map(|(t, r)| (t.name(), r.name())));
    v.extend(
        FILE_TX
            .iter()
            .flat_map(|&t| PAIR_RX.iter().map(move |&r| (t, r.name()))),
    );
    v
}

fn spec(
    env: &Env,
    (tx, rx): (&str, &str),
    size: u64,
    touch: bool,
    time: f64,
    repeat: u32,
) -> RunSpec {
    RunSpec {
        params: Params {
            mode: Mode::Stream,
            tx: tx.to_string(),
            rx: rx.to_string(),
            size,
            streams: 1,
            ring: bench::default_ring(size, Mode::Stream),
            touch,
            limit: Limit::Seconds(time),
            read: None,
        },
        label: String::new(),
        repeat,
        topology: env.info(),
    }
}

fn check_args(args: &Args) -> Result<Vec<u64>, BenchError> {
    if args.repeat == 0 {
        return Err(BenchError::Usage("--repeat must be at least 1".into()));
    }
    if !(args.time.is_finite() && args.time >= 0.05) {
        return Err(BenchError::Usage("--time must be at least 0.05 s".into()));
    }
    if !(args.recheck_time.is_finite() && args.recheck_time >= 0.05) {
        return Err(BenchError::Usage(
            "--recheck-time must be at least 0.05 s".into(),
        ));
    }
    parse_sizes(&args.size).map_err(|e| BenchError::Usage(e.to_string()))
}

/// Seconds per re-check run: `--recheck-time`, never shorter than `--time`.
fn recheck_seconds(args: &Args) -> f64 {
    args.recheck_time.max(args.time)
}

fn touches(args: &Args) -> &'static [bool] {
    if args.no_touch {
        &[false]
    } else {
        &[false, true]
    }
}

fn plan(args: &Args, env: &Env) -> Result<Vec<RunSpec>, BenchError> {
    let sizes = check_args(args)?;
    let mut specs = Vec::new();
    for repeat in 0..args.repeat {
        for &touch in touches(args) {
            for &size in &sizes {
                for c in configs() {
                    specs.push(spec(env, c, size, touch, args.time, repeat));
                }
            }
        }
    }
    Ok(specs)
}

/// The (size, touch) points to measure again before writing: every size where the chosen
/// pair is not `copy → copy`, both sides of every crossover, and every size whose order the
/// first pass could not tell ([`undecided`]) — the choices a noisy run could have made.
fn recheck_points(pairs: &[PairMeasurement], sizes: &[u64], touches: &[bool]) -> Vec<(u64, bool)> {
    let mut out = Vec::new();
    for &touch in touches {
        let c = tuning::pair_chooser(pairs, touch);
        let chosen: Vec<PathPair> = sizes.iter().map(|&s| c.choose(s, true).path).collect();
        for (i, &size) in sizes.iter().enumerate() {
            let crossover = (i > 0 && chosen[i - 1] != chosen[i])
                || (i + 1 < sizes.len() && chosen[i + 1] != chosen[i]);
            if chosen[i] != PathPair::DEFAULT || crossover || undecided(pairs, size, touch) {
                out.push((size, touch));
            }
        }
    }
    out
}

/// Whether the cheapest pair other than `copy → copy` (by median) has a range that overlaps
/// `copy → copy`'s at this point: the runs cannot order the two, whichever median is lower.
fn undecided(pairs: &[PairMeasurement], size: u64, touch: bool) -> bool {
    let at = |p: &&PairMeasurement| p.size == size && p.touch == touch;
    let Some(base) = pairs
        .iter()
        .filter(at)
        .find(|p| p.pair() == PathPair::DEFAULT)
    else {
        return false;
    };
    let runner = pairs
        .iter()
        .filter(at)
        .filter(|p| p.pair() != PathPair::DEFAULT)
        .min_by(|a, b| a.cpu_s_per_gib.median.total_cmp(&b.cpu_s_per_gib.median));
    runner.is_some_and(|r| r.cpu_s_per_gib.overlaps(&base.cpu_s_per_gib))
}

/// The race at the re-check points, or none (`--recheck-rounds 0`: no re-check).
fn race_at(args: &Args, first: &[PairMeasurement], points: &[(u64, bool)]) -> race::Race {
    race::Race::new(first, if args.recheck_rounds > 0 { points } else { &[] })
}

/// The bench runs of the race's next round: each of `--recheck-time` (never shorter than
/// `--time`), numbered after the first pass's repeats.
fn race_specs(args: &Args, env: &Env, race: &race::Race) -> Vec<RunSpec> {
    let repeat = args.repeat + race.rounds() as u32;
    race.round()
        .into_iter()
        .map(|(p, size, touch)| {
            let names = (p.tx.name(), p.rx.name());
            spec(env, names, size, touch, recheck_seconds(args), repeat)
        })
        .collect()
}

/// The interfaces whose connections the measurements describe, with their keys.
fn host_keys(env: &Env, topology: TuneTopology) -> Result<Vec<HostKey>, BenchError> {
    match topology {
        TuneTopology::Loopback => Ok(vec![host_key_for(std::net::Ipv4Addr::LOCALHOST.into())
            .map_err(|e| BenchError::Failed(e.to_string()))?]),
        TuneTopology::Netns => {
            let kernel = bench::host().kernel;
            let mtu = env.info().mtu.unwrap_or(1500);
            Ok(
                [zcnet_testbed::netns::Side::A, zcnet_testbed::netns::Side::B]
                    .into_iter()
                    .map(|side| HostKey {
                        kernel: kernel.clone(),
                        interface: zcnet_testbed::netns::VethPair::ifname_of(side).to_string(),
                        mtu,
                    })
                    .collect(),
            )
        }
    }
}

fn profile_dir(args: &Args) -> Result<PathBuf, BenchError> {
    if let Some(d) = &args.dir {
        return Ok(d.clone());
    }
    if let Some(d) = std::env::var_os("ZCNET_PROFILE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    // The directory of the default location, without $ZCNET_PROFILE (a single-file override
    // for readers, not a place to write every interface's profile).
    Profile::default_path(
        "lo",
        0,
        None,
        std::env::var_os("XDG_CONFIG_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
    .map(|p| p.parent().map(Path::to_path_buf).unwrap_or_default())
    .map_err(|e| BenchError::Usage(e.to_string()))
}

/// Now, in Unix seconds.
fn created_now() -> Created {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Created::Unix(secs)
}

fn run_inner(args: &Args) -> Result<(), BenchError> {
    if args.out.is_some() && args.topology == TuneTopology::Netns {
        return Err(BenchError::Usage(
            "--out names one file, but netns measures two interfaces: use --dir".into(),
        ));
    }
    let topology = match args.topology {
        TuneTopology::Loopback => Topology::Loopback,
        TuneTopology::Netns => Topology::Netns,
    };
    let env = Env::open(topology, args.mtu, None)?;
    let keys = host_keys(&env, args.topology)?;
    let specs = plan(args, &env)?;
    let sizes = check_args(args)?;
    eprintln!(
        "zcnet tune: {} runs on {} ({} sizes, {} repeats, {:.2} s each), then a re-check of \
         each non-copy choice and crossover",
        specs.len(),
        describe_env(&env),
        sizes.len(),
        args.repeat,
        args.time
    );
    let mut runs = bench::execute(&env, &specs, true)?;
    let first = pair_rows(&runs);
    let points = recheck_points(&first, &sizes, touches(args));
    let mut race = race_at(args, &first, &points);
    if race.running() {
        eprintln!(
            "zcnet tune: re-checking {} points (size, touch): a race of up to {} rounds ({:.2} s per run)",
            points.len(),
            args.recheck_rounds,
            recheck_seconds(args)
        );
        let mut raced = Vec::new();
        while race.running() && race.rounds() < args.recheck_rounds as usize {
            let got = bench::execute(&env, &race_specs(args, &env, &race), true)?;
            race.record(&race::results(&got));
            raced.extend(got);
        }
        // The raced pairs' rows come from the race alone: runs of one length, side by side.
        runs.retain(|r| !race::key(r).is_some_and(|k| race.superseded(k)));
        runs.extend(raced);
    }
    // A configuration none of whose runs moved a byte (a loaded host: the run's time went by
    // before data flowed) has no row, and without `copy`'s the profile is unusable: measure
    // it again, longer, or say which one could not be measured.
    fill_unmeasured(&specs, &mut runs, args.time, |again| {
        bench::execute(&env, again, true)
    })?;
    drop(env);
    let pairs = pair_rows(&runs);
    let flipped = flips(&first, &pairs, &points);
    let (tx, rx) = profile_rows(&runs);
    let file = file_rows(&runs);
    let report = bench::make_report(runs);
    let mut written = Vec::new();
    for key in &keys {
        let profile = Profile {
            schema: SCHEMA,
            zcnet: env!("CARGO_PKG_VERSION").to_string(),
            kernel: key.kernel.clone(),
            interface: key.interface.clone(),
            mtu: key.mtu,
            topology: match args.topology {
                TuneTopology::Loopback => ProfileTopology::Loopback,
                TuneTopology::Netns => ProfileTopology::Netns,
            },
            created: created_now(),
            tx: tx.clone(),
            rx: rx.clone(),
            pairs: pairs.clone(),
            file: file.clone(),
        };
        // What `auto` will read must parse: refuse to write a profile it would refuse.
        Profile::parse(&profile.to_json(), key)
            .map_err(|e| BenchError::Failed(format!("the measured profile is unusable: {e}")))?;
        let path = match &args.out {
            Some(p) => p.clone(),
            None => profile_dir(args)?.join(Profile::file_name(&key.interface, key.mtu)),
        };
        zcnet::tuning::write_atomically(&path, &profile.to_json())
            .map_err(|e| BenchError::io_owned(format!("writing {}", path.display()), e))?;
        written.push(path);
    }
    print!("{}", summary(&tx, &rx, args.no_touch));
    print!("{}", pair_summary(&pairs, touches(args), &flipped));
    print!("{}", race.report());
    print!("{}", file_summary(&file, &pairs, touches(args), &sizes));
    let plot = args
        .plot
        .clone()
        .unwrap_or_else(|| written[0].with_extension("svg"));
    crate::bench::plot::sweep(&plot, &report.summary, "zcnet tune: CPU-s/GiB by path")?;
    for p in &written {
        println!("profile: {}", p.display());
    }
    println!("plot: {}", plot.display());
    Ok(())
}

/// What an `auto` sender does with a caller's file at each size: the mode the profile's
/// `file` table picks (into the receive path the pairs choose), and why.
fn file_summary(
    file: &[Measurement<FilePair>],
    pairs: &[PairMeasurement],
    touches: &[bool],
    sizes: &[u64],
) -> String {
    let mut s = String::new();
    for &touch in touches {
        let Some(c) = zcnet::tuning::file_chooser(file, pairs, touch) else {
            continue;
        };
        let picks: Vec<String> = sizes
            .iter()
            .map(|&size| {
                let ch = c.choose(size, true);
                format!("{} {} ({:?})", ByteSize(size), ch.path, ch.reason)
            })
            .collect();
        s += &format!(
            "file sends ({}): {}\n",
            if touch { "touched" } else { "untouched" },
            picks.join(", ")
        );
    }
    s
}

/// Times a configuration whose runs all moved nothing is measured again, each run twice as
/// long as the one before, before `tune` gives up on it.
const UNMEASURED_RETRIES: u32 = 3;

/// A configuration's point: (tx, rx, size, touch), as the tables group runs.
type Cell = (String, String, u64, bool);

fn spec_cell(s: &RunSpec) -> Cell {
    let p = &s.params;
    (p.tx.clone(), p.rx.clone(), p.size, p.touch)
}

fn run_cell(r: &Run) -> Cell {
    (r.tx.clone(), r.rx.clone(), r.size, r.touch)
}

/// One spec for each configuration of `specs` that has no [`measured`] run in `runs` — every
/// run of it moved nothing — leaving out pairs this host refused ([`Run::unsupported`]: no
/// row by design, and `bench::execute` stops running them after the first refusal).
fn unmeasured(specs: &[RunSpec], runs: &[Run]) -> Vec<RunSpec> {
    let mut out: Vec<RunSpec> = Vec::new();
    for s in specs {
        let cell = spec_cell(s);
        let refused = runs
            .iter()
            .any(|r| r.unsupported() && r.tx == cell.0 && r.rx == cell.1);
        let has_row = runs.iter().any(|r| measured(r) && run_cell(r) == cell);
        if !refused && !has_row && !out.iter().any(|o| spec_cell(o) == cell) {
            out.push(s.clone());
        }
    }
    out
}

/// Measures again, up to [`UNMEASURED_RETRIES`] times and each time for twice as long (from
/// `2 × time` s), every configuration of `specs` with no run in `runs` that moved bytes, and
/// adds the new runs. Each such configuration is reported on stderr; one still unmeasured
/// after the last try is an error that names it — never a profile silently missing its row.
fn fill_unmeasured(
    specs: &[RunSpec],
    runs: &mut Vec<Run>,
    time: f64,
    mut execute: impl FnMut(&[RunSpec]) -> Result<Vec<Run>, BenchError>,
) -> Result<(), BenchError> {
    let mut seconds = time;
    for _ in 0..UNMEASURED_RETRIES {
        let mut again = unmeasured(specs, runs);
        if again.is_empty() {
            return Ok(());
        }
        seconds *= 2.0;
        eprintln!(
            "zcnet tune: {} configurations moved no bytes in any run (a loaded host?): {}; \
             measuring them again for {seconds:.2} s",
            again.len(),
            describe_cells(&again)
        );
        for s in &mut again {
            s.params.limit = Limit::Seconds(seconds);
        }
        runs.extend(execute(&again)?);
    }
    let left = unmeasured(specs, runs);
    if left.is_empty() {
        return Ok(());
    }
    Err(BenchError::Failed(format!(
        "no run of {} moved any bytes, the last for {seconds:.2} s: the host is too loaded to \
         measure them (a longer --time may help)",
        describe_cells(&left)
    )))
}

fn describe_cells(specs: &[RunSpec]) -> String {
    specs
        .iter()
        .map(|s| {
            let p = &s.params;
            let touch = if p.touch { " touched" } else { "" };
            format!("{} → {} at {}{touch}", p.tx, p.rx, ByteSize(p.size))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_env(env: &Env) -> String {
    let t = env.info();
    match t.mtu {
        Some(m) => format!("{} (MTU {m})", t.name),
        None => t.name,
    }
}

/// The re-check points whose choice the second pass changed: (size, touch, before, after).
fn flips(
    first: &[PairMeasurement],
    merged: &[PairMeasurement],
    points: &[(u64, bool)],
) -> Vec<(u64, bool, PathPair, PathPair)> {
    points
        .iter()
        .filter_map(|&(size, touch)| {
            let a = tuning::pair_chooser(first, touch).choose(size, true).path;
            let b = tuning::pair_chooser(merged, touch).choose(size, true).path;
            (a != b).then_some((size, touch, a, b))
        })
        .collect()
}

/// Per touch variant: the pairs by size (median [min–max]), the pair `auto → auto` takes,
/// and the choices the re-check changed.
fn pair_summary(
    pairs: &[PairMeasurement],
    touches: &[bool],
    flipped: &[(u64, bool, PathPair, PathPair)],
) -> String {
    let mut out = String::new();
    for &touch in touches {
        let rows: Vec<Measurement<PathPair>> = pairs
            .iter()
            .filter(|p| p.touch == touch)
            .map(|p| Measurement {
                path: p.pair(),
                size: p.size,
                touch,
                cpu_s_per_gib: p.cpu_s_per_gib,
                zc_fraction: None,
            })
            .collect();
        out += &table("pairs (auto → auto takes the cheapest)", &rows, touch);
    }
    for (size, touch, a, b) in flipped {
        out += &format!(
            "re-check changed the choice at {} (touch {touch}): {a} → {b}\n",
            ByteSize(*size)
        );
    }
    out
}

/// Per direction and touch variant: each path's median (and range) by size, the path `auto`
/// will choose there, and the crossovers.
fn summary(tx: &[Measurement<TxPath>], rx: &[Measurement<RxPath>], no_touch: bool) -> String {
    let mut out = String::new();
    let touches: &[bool] = if no_touch { &[false] } else { &[false, true] };
    for &touch in touches {
        out += &table("transmit (into a copy receiver)", tx, touch);
        out += &table("receive (from a copy sender)", rx, touch);
    }
    out
}

fn table<P: AutoPath>(what: &str, rows: &[Measurement<P>], touch: bool) -> String {
    let rows: Vec<&Measurement<P>> = rows.iter().filter(|r| r.touch == touch).collect();
    let mut paths: Vec<P> = Vec::new();
    let mut sizes: Vec<u64> = Vec::new();
    for r in &rows {
        if !paths.contains(&r.path) {
            paths.push(r.path);
        }
        if !sizes.contains(&r.size) {
            sizes.push(r.size);
        }
    }
    sizes.sort_unstable();
    let owned: Vec<Measurement<P>> = rows.iter().map(|r| **r).collect();
    let chooser = Chooser::from_measurements(&owned, touch);
    let mut s = format!(
        "\n{what}, data {}: worker CPU-s/GiB of both ends, median [min–max]\n",
        if touch { "touched" } else { "untouched" }
    );
    s += &format!("{:>8}", "size");
    for p in &paths {
        s += &format!("  {:>20}", p.to_string());
    }
    s += "  auto takes\n";
    for size in &sizes {
        s += &format!("{:>8}", ByteSize(*size).to_string());
        for p in &paths {
            match rows.iter().find(|r| r.path == *p && r.size == *size) {
                Some(r) => {
                    let c = r.cpu_s_per_gib;
                    s += &format!("  {:>6.3} [{:.3}–{:.3}]", c.median, c.lo, c.hi);
                }
                None => s += &format!("  {:>20}", "–"),
            }
        }
        let choice = chooser.choose(*size, true);
        s += &format!("  {} ({:?})\n", choice.path, choice.reason);
    }
    let cross = chooser.crossovers();
    if cross.is_empty() {
        s += "crossovers: none (one path at every size)\n";
    } else {
        for c in cross {
            s += &format!("crossover: {} → {} at {}\n", c.from, c.to, ByteSize(c.size));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcnet::tuning::Spread;
    use zcnet_bench::protocol::Proto;
    use zcnet_bench::report::{Cpu, Fallbacks, Latency, OpsBytes, SideStats};

    /// The first pass's spec of one configuration, as `plan` makes it.
    fn run_spec(tx: &str, rx: &str, size: u64, time: f64) -> RunSpec {
        RunSpec {
            params: Params {
                mode: Mode::Stream,
                tx: tx.into(),
                rx: rx.into(),
                size,
                streams: 1,
                ring: bench::default_ring(size, Mode::Stream),
                touch: false,
                limit: Limit::Seconds(time),
                read: None,
            },
            label: String::new(),
            repeat: 0,
            topology: bench::TopologyInfo {
                name: "loopback".into(),
                mtu: None,
                proto: Proto::Tcp,
            },
        }
    }

    /// What a bench run of `spec` reports: `bytes` moved (0: the run's time went by before
    /// any data flowed), `refused` if the path could not run as itself.
    fn ran(spec: &RunSpec, bytes: u64, refused: bool) -> Run {
        let p = &spec.params;
        let mut sender_stats = SideStats::default();
        if refused {
            sender_stats
                .fallbacks
                .insert("unsupported".into(), OpsBytes::default());
        }
        Run {
            label: String::new(),
            mode: Mode::Stream,
            tx: p.tx.clone(),
            rx: p.rx.clone(),
            topology: "loopback".into(),
            transport: "tcp".into(),
            mtu: None,
            size: p.size,
            streams: 1,
            ring: p.ring,
            touch: p.touch,
            read_size: None,
            repeat: spec.repeat,
            bytes_sent: bytes,
            bytes_received: bytes,
            seconds: 0.05,
            gbit_per_s: 0.0,
            cpu: Cpu::default(),
            cpu_s_per_gib: 0.5,
            sender_cpu_s_per_gib: 0.25,
            receiver_cpu_s_per_gib: 0.25,
            gbit_per_core: 0.0,
            zc_fraction_tx: 0.0,
            zc_fraction_rx: 0.0,
            fallbacks: Fallbacks::default(),
            latency: Latency::default(),
            sender_stats,
            receiver_stats: SideStats::default(),
            rx_in_effect: None,
            messages_sent: None,
            messages_received: None,
            messages_lost: None,
            replies_sent: None,
            replies_received: None,
            replies_lost: None,
        }
    }

    fn seconds(s: &RunSpec) -> f64 {
        match s.params.limit {
            Limit::Seconds(t) => t,
            Limit::Bytes(_) => panic!("tune runs are timed"),
        }
    }

    /// A loaded host: both 64K runs of `copy → copy` (the baseline) moved nothing. Without a
    /// second try the profile had no baseline row and `tune` failed ("no rows for the
    /// baseline path copy"); now that configuration alone is measured again, longer, and
    /// its row comes from the new run. A refused pair is not retried.
    #[test]
    fn a_configuration_that_moved_nothing_is_measured_again_for_longer() {
        let specs = vec![
            run_spec("copy", "copy", 64 * KIB, 0.05),
            run_spec("uring", "copy", 64 * KIB, 0.05),
            run_spec("copy", "zcrx", 64 * KIB, 0.05),
            run_spec("copy", "copy", 64 * KIB, 0.05),
        ];
        let mut runs = vec![
            ran(&specs[0], 0, false),
            ran(&specs[1], 1 << 20, false),
            ran(&specs[2], 0, true),
            ran(&specs[3], 0, false),
        ];
        assert!(profile_rows(&runs).0.iter().all(|m| m.path != TxPath::Copy));
        let mut asked: Vec<Vec<(String, String, f64)>> = Vec::new();
        fill_unmeasured(&specs, &mut runs, 0.05, |again| {
            asked.push(
                again
                    .iter()
                    .map(|s| (s.params.tx.clone(), s.params.rx.clone(), seconds(s)))
                    .collect(),
            );
            // The first retry moves nothing either; the second does.
            let bytes = if asked.len() == 1 { 0 } else { 1 << 20 };
            Ok(again.iter().map(|s| ran(s, bytes, false)).collect())
        })
        .unwrap();
        assert_eq!(
            asked,
            vec![
                vec![("copy".into(), "copy".into(), 0.1)],
                vec![("copy".into(), "copy".into(), 0.2)],
            ],
            "only the unmeasured configuration, once per try, twice as long each time"
        );
        let (tx, _) = profile_rows(&runs);
        assert!(tx.iter().any(|m| m.path == TxPath::Copy), "{tx:?}");
        assert!(unmeasured(&specs, &runs).is_empty());
    }

    /// A configuration that never moves a byte fails `tune` with its name, after the
    /// retries — not a profile without its row.
    #[test]
    fn a_configuration_never_measured_is_an_error_that_names_it() {
        let specs = vec![run_spec("uring", "copy", 256 * KIB, 0.05)];
        let mut runs = vec![ran(&specs[0], 0, false)];
        let mut tries = 0;
        let e = fill_unmeasured(&specs, &mut runs, 0.05, |again| {
            tries += 1;
            Ok(again.iter().map(|s| ran(s, 0, false)).collect())
        })
        .unwrap_err()
        .to_string();
        assert_eq!(tries, UNMEASURED_RETRIES);
        assert!(e.contains("uring → copy at 256K"), "{e}");
        assert!(e.contains("0.40 s"), "{e}");
        // Nothing to do: no retry at all.
        let mut runs = vec![ran(&specs[0], 1 << 20, false)];
        fill_unmeasured(&specs, &mut runs, 0.05, |_| panic!("nothing to measure")).unwrap();
    }

    const KIB: u64 = 1024;

    fn pm(tx: TxPath, rx: RxPath, size: u64, median: f64, w: f64) -> PairMeasurement {
        PairMeasurement {
            tx,
            rx,
            size,
            touch: false,
            cpu_s_per_gib: Spread {
                median,
                lo: median * (1.0 - w),
                hi: median * (1.0 + w),
            },
            zc_fraction_tx: Some(0.0),
            zc_fraction_rx: Some(0.0),
            rx_share: None,
        }
    }

    /// Four sizes, `copy → copy` cheapest by median at each (no crossover, nothing chosen
    /// but copy): at 16K `copy → mmap` 4 % dearer with overlapping ranges, elsewhere the
    /// runner-up clear of copy's range.
    fn table() -> Vec<PairMeasurement> {
        use RxPath as R;
        use TxPath as T;
        let mut v = Vec::new();
        for (size, mmap, w) in [
            (4 * KIB, 1.5, 0.05),
            (16 * KIB, 1.04, 0.15),
            (64 * KIB, 1.5, 0.05),
            (256 * KIB, 1.6, 0.05),
        ] {
            v.push(pm(T::Copy, R::Copy, size, 1.0, w));
            v.push(pm(T::Copy, R::Mmap, size, mmap, w));
            v.push(pm(T::Uring, R::Copy, size, 1.8, w));
        }
        v
    }

    #[test]
    fn a_point_the_first_pass_could_not_order_is_rechecked_though_copy_won_it() {
        let t = table();
        let sizes = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB];
        let c = tuning::pair_chooser(&t, false);
        assert!(sizes
            .iter()
            .all(|&s| c.choose(s, true).path == PathPair::DEFAULT));
        assert!(undecided(&t, 16 * KIB, false));
        assert!(!undecided(&t, 4 * KIB, false));
        assert_eq!(
            recheck_points(&t, &sizes, &[false]),
            vec![(16 * KIB, false)]
        );
        // Its race: copy → copy and the two others measured there.
        let pp = |tx, rx| PathPair { tx, rx };
        assert_eq!(
            race::contenders(&t, 16 * KIB, false),
            vec![
                pp(TxPath::Copy, RxPath::Copy),
                pp(TxPath::Copy, RxPath::Mmap),
                pp(TxPath::Uring, RxPath::Copy)
            ]
        );
        // No measurement at a point: nothing to tell.
        assert!(!undecided(&t, 1 << 20, false));
        assert!(!undecided(&t, 16 * KIB, true));
    }

    #[test]
    fn rechecks_run_for_the_recheck_time_never_shorter_than_the_first_pass() {
        // A remote environment starts nothing: the plan needs only its description.
        let env = Env::open(Topology::Loopback, None, Some("127.0.0.1:9")).expect("an address");
        let mut args = Args {
            topology: TuneTopology::Loopback,
            mtu: None,
            out: None,
            dir: None,
            size: "16K".into(),
            repeat: 2,
            time: 0.25,
            recheck_time: 1.0,
            recheck_rounds: 5,
            no_touch: true,
            plot: None,
        };
        let t = table();
        let race = race::Race::new(&t, &[(16 * KIB, false)]);
        let specs = race_specs(&args, &env, &race);
        // Three contenders, one run each, numbered after the first pass's two repeats.
        assert_eq!(specs.len(), 3);
        assert!(specs
            .iter()
            .all(|s| s.params.limit == Limit::Seconds(1.0) && s.repeat == 2));
        // No rounds asked for: no race, nothing reported.
        args.recheck_rounds = 0;
        let none = race_at(&args, &t, &[(16 * KIB, false)]);
        assert!(!none.running() && none.report().is_empty());
        args.recheck_rounds = 5;
        assert!(race_at(&args, &t, &[(16 * KIB, false)]).running());
        args.time = 2.0;
        let specs = race_specs(&args, &env, &race);
        assert!(specs.iter().all(|s| s.params.limit == Limit::Seconds(2.0)));
        args.recheck_time = f64::NAN;
        assert!(check_args(&args).is_err());
    }
}
