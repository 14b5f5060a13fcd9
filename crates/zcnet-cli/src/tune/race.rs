//! `tune`'s second pass: a race among the pairs the first pass could not order.
//!
//! Why: where pairs lie within a few per cent of each other, three 0.25-s runs cannot order
//! them, and `auto → auto` aims both ends at the cheapest *median* of the table
//! (`zcnet::tuning::aimed`). Over veth at 16 KiB a first pass put `zerocopy → uring`
//! cheapest (1.969 s/GiB over three runs); measured side by side it was the dearest of six
//! (2.953, against `copy → mmap` 2.205), and `auto → auto` aimed at it ran 13.7 % over
//! `copy → mmap` in a 15-run sitting. The same profile aimed at `copy → mmap` instead put
//! `auto → auto` 4.0 % over it (`git show 758b630:docs/measurements/auto.md`). The aim, not the ends'
//! run-time checks, was the error. The earlier re-check ran three more runs of the choice,
//! the runner-up and `copy → copy` only, merged with the first pass's: the median `auto`
//! aimed at could still be that of three short runs of a pair no re-check had seen.
//!
//! How: at each re-check point the contenders are `copy → copy` (the bar), the first pass's
//! choice, and the [`CONTENDERS`] cheapest other pairs by median. Each *round* runs every
//! contender still in, at every point, once, for `--recheck-time`, in an order rotated from
//! round to round. From round [`PRUNE_AFTER`] on, a contender whose *paired* excess over
//! the leader — the median over rounds of its cost over the leader's in the same round —
//! passes [`PRUNE_ABOVE`] leaves the race: its further runs would only confirm it, and each
//! costs a second. `copy → copy` never leaves (the chooser measures every pair against it).
//! The raced pairs' rows at a point are then made from the race's runs alone
//! ([`Race::superseded`] drops their first-pass runs), so the medians `auto` compares there
//! are of runs of one length, taken side by side.

use zcnet::tuning::{self, median, AutoPath, PairMeasurement, PathPair};
use zcnet_bench::measure::{run_cost, tabled};
use zcnet_bench::report::Run;
use zcnet_bench::sizes::ByteSize;

/// Pairs raced at a point besides `copy → copy` and the first pass's choice: the cheapest
/// others by median. Four, because over veth at 16 KiB the pair cheapest side by side in
/// every sitting (`copy → mmap`) came third and fourth by first-pass median in two
/// profiles, behind pairs side by side 10–40 % dearer.
pub const CONTENDERS: usize = 4;
/// Rounds before a contender can leave: two paired ratios are one noisy window from a
/// wrong verdict; three give a median.
pub const PRUNE_AFTER: usize = 3;
/// Paired excess over the leader that ends a contender's race: twice the 5 % `auto → auto`
/// is held to, and above the ±3–10 % spread of single 1-s runs over veth.
pub const PRUNE_ABOVE: f64 = 0.10;

/// The pairs to race at one point: the chosen pair, `copy → copy`, and the [`CONTENDERS`]
/// cheapest others by first-pass median; sorted by name, without repeats.
pub fn contenders(pairs: &[PairMeasurement], size: u64, touch: bool) -> Vec<PathPair> {
    let chosen = tuning::pair_chooser(pairs, touch).choose(size, true).path;
    let mut at: Vec<&PairMeasurement> = pairs
        .iter()
        .filter(|p| p.size == size && p.touch == touch)
        .collect();
    at.sort_by(|a, b| a.cpu_s_per_gib.median.total_cmp(&b.cpu_s_per_gib.median));
    let mut out = vec![chosen, PathPair::DEFAULT];
    out.extend(
        at.iter()
            .map(|p| p.pair())
            .filter(|p| *p != chosen && *p != PathPair::DEFAULT)
            .take(CONTENDERS),
    );
    out.sort_by_key(|p| (p.tx.name(), p.rx.name()));
    out.dedup();
    out
}

/// One measured run as the race reads it: pair, size, touch, worker CPU-s/GiB of both ends.
pub type Sample = (PathPair, u64, bool, f64);

/// The runs that measured a pair `auto` can take, as the race reads them (a run that moved
/// nothing or ran as another path is no result; [`tabled`]).
pub fn results(runs: &[Run]) -> Vec<Sample> {
    runs.iter()
        .filter(|r| tabled(r))
        .filter_map(|r| {
            let (pair, size, touch) = key(r)?;
            Some((pair, size, touch, run_cost(r)))
        })
        .collect()
}

/// A run's pair and point, if its pair is one `auto` can take.
pub fn key(r: &Run) -> Option<(PathPair, u64, bool)> {
    let pair = PathPair::from_name(&format!("{}/{}", r.tx, r.rx))?;
    Some((pair, r.size, r.touch))
}

/// One contender's costs so far: (round, worker CPU-s/GiB of both ends).
type Costs = Vec<(u32, f64)>;

/// A contender that left the race: the pair, its paired excess over the leader, and the
/// number of rounds it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Left {
    pub pair: PathPair,
    pub excess: f64,
    pub rounds: usize,
}

/// The race at one (size, touch) point.
#[derive(Debug, Clone)]
struct Point {
    size: u64,
    touch: bool,
    /// Every pair that entered, with its costs by round.
    entered: Vec<(PathPair, Costs)>,
    /// The pairs still running.
    alive: Vec<PathPair>,
    left: Vec<Left>,
}

impl Point {
    fn costs(&self, p: PathPair) -> &Costs {
        &self
            .entered
            .iter()
            .find(|(q, _)| *q == p)
            .expect("a contender entered")
            .1
    }

    /// The running pair with the cheapest median so far.
    fn leader(&self) -> Option<PathPair> {
        self.alive
            .iter()
            .filter_map(|&p| median(&values(self.costs(p))).map(|m| (p, m)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, _)| p)
    }
}

fn values(c: &Costs) -> Vec<f64> {
    c.iter().map(|&(_, v)| v).collect()
}

/// Median over the rounds both ran of `a / b − 1`.
pub fn paired_excess(a: &Costs, b: &Costs) -> Option<f64> {
    let ratios: Vec<f64> = a
        .iter()
        .filter_map(|&(r, x)| {
            b.iter()
                .find(|&&(q, y)| q == r && y > 0.0)
                .map(|&(_, y)| x / y - 1.0)
        })
        .collect();
    median(&ratios)
}

/// The race over every re-check point.
#[derive(Debug, Clone)]
pub struct Race {
    points: Vec<Point>,
    rounds: usize,
}

impl Race {
    /// A race at each of `points` among its [`contenders`] in the first pass's table.
    pub fn new(first: &[PairMeasurement], points: &[(u64, bool)]) -> Race {
        let points = points
            .iter()
            .map(|&(size, touch)| {
                let alive = contenders(first, size, touch);
                Point {
                    size,
                    touch,
                    entered: alive.iter().map(|&p| (p, Vec::new())).collect(),
                    alive,
                    left: Vec::new(),
                }
            })
            .collect();
        Race { points, rounds: 0 }
    }

    /// Whether a point's race is over: [`PRUNE_AFTER`] rounds run and nothing but
    /// `copy → copy` and the leader left in it (more rounds could reorder those two only by
    /// noise; the chooser's rule against `copy → copy`'s range decides between them).
    fn settled(&self, p: &Point) -> bool {
        self.rounds >= PRUNE_AFTER && p.alive.len() <= 2
    }

    /// Whether any point's race goes on.
    pub fn running(&self) -> bool {
        self.points.iter().any(|p| !self.settled(p))
    }

    /// The runs of the next round: every running contender at every point whose race goes
    /// on, the order rotated by the round so no pair always runs first or after the same
    /// one.
    pub fn round(&self) -> Vec<(PathPair, u64, bool)> {
        let mut out = Vec::new();
        for p in self.points.iter().filter(|p| !self.settled(p)) {
            let n = p.alive.len();
            for i in 0..n {
                out.push((p.alive[(i + self.rounds) % n], p.size, p.touch));
            }
        }
        out
    }

    /// Rounds run so far.
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// Takes the next round's results ([`results`]), then, from [`PRUNE_AFTER`] rounds on,
    /// lets the contenders too far over their point's leader go.
    pub fn record(&mut self, results: &[Sample]) {
        let round = self.rounds as u32;
        for &(pair, size, touch, cost) in results {
            if let Some(p) = self
                .points
                .iter_mut()
                .find(|p| p.size == size && p.touch == touch)
            {
                if let Some((_, c)) = p.entered.iter_mut().find(|(q, _)| *q == pair) {
                    c.push((round, cost));
                }
            }
        }
        self.rounds += 1;
        if self.rounds >= PRUNE_AFTER {
            let rounds = self.rounds;
            for p in &mut self.points {
                prune(p, rounds);
            }
        }
    }

    /// Whether a first-pass result is superseded by the race: its pair was raced at its
    /// point.
    pub fn superseded(&self, (pair, size, touch): (PathPair, u64, bool)) -> bool {
        self.points.iter().any(|p| {
            p.size == size && p.touch == touch && p.entered.iter().any(|(q, _)| *q == pair)
        })
    }

    /// What the race did, one line per point: the leader, who left when and by how much.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for p in &self.points {
            let lead = p
                .leader()
                .map_or_else(|| "none".to_string(), |l| l.to_string());
            s += &format!(
                "re-check race at {} (data {}): {} rounds, leader {lead}",
                ByteSize(p.size),
                if p.touch { "touched" } else { "untouched" },
                self.rounds
            );
            for l in &p.left {
                s += &format!(
                    "; {} left after {} rounds ({:+.1} %)",
                    l.pair,
                    l.rounds,
                    100.0 * l.excess
                );
            }
            s += "\n";
        }
        s
    }

    /// The pairs still running at a point.
    #[cfg(test)]
    fn alive(&self, size: u64, touch: bool) -> Vec<PathPair> {
        self.points
            .iter()
            .find(|p| p.size == size && p.touch == touch)
            .map(|p| p.alive.clone())
            .unwrap_or_default()
    }
}

/// Lets go every running contender of `p` (never `copy → copy`, never the leader) whose
/// paired excess over the leader passes [`PRUNE_ABOVE`].
fn prune(p: &mut Point, rounds: usize) {
    let Some(lead) = p.leader() else {
        return;
    };
    let lead_costs = p.costs(lead).clone();
    let mut keep = Vec::new();
    for &q in &p.alive {
        if q == lead || q == PathPair::DEFAULT {
            keep.push(q);
            continue;
        }
        match paired_excess(p.costs(q), &lead_costs) {
            Some(e) if e > PRUNE_ABOVE => p.left.push(Left {
                pair: q,
                excess: e,
                rounds,
            }),
            _ => keep.push(q),
        }
    }
    p.alive = keep;
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcnet::tuning::Spread;
    use zcnet::{RxPath as R, TxPath as T};

    const K16: u64 = 16 * 1024;

    fn pp(tx: T, rx: R) -> PathPair {
        PathPair { tx, rx }
    }

    fn pm(tx: T, rx: R, median: f64) -> PairMeasurement {
        PairMeasurement {
            tx,
            rx,
            size: K16,
            touch: false,
            cpu_s_per_gib: Spread {
                median,
                lo: median * 0.8,
                hi: median * 1.2,
            },
            zc_fraction_tx: Some(0.0),
            zc_fraction_rx: Some(0.0),
            rx_share: None,
        }
    }

    /// The 16 KiB veth first pass that aimed `auto` at `zerocopy → uring` (medians of three
    /// 0.25-s runs, ranges overlapping `copy → copy`'s).
    fn first_pass() -> Vec<PairMeasurement> {
        vec![
            pm(T::Copy, R::Copy, 2.403),
            pm(T::Copy, R::Mmap, 2.285),
            pm(T::Copy, R::Uring, 2.619),
            pm(T::Uring, R::Copy, 2.281),
            pm(T::Uring, R::Mmap, 2.500),
            pm(T::Uring, R::Uring, 2.793),
            pm(T::Zerocopy, R::Copy, 2.523),
            pm(T::Zerocopy, R::Mmap, 2.174),
            pm(T::Zerocopy, R::Uring, 1.969),
        ]
    }

    /// One round: each running pair at 16 KiB costs what `cost` says in this round.
    fn play(race: &mut Race, cost: impl Fn(PathPair) -> f64) {
        let results: Vec<Sample> = race
            .round()
            .into_iter()
            .map(|(p, size, touch)| (p, size, touch, cost(p)))
            .collect();
        race.record(&results);
    }

    #[test]
    fn contenders_are_the_choice_copy_and_the_four_cheapest_others() {
        let t = first_pass();
        // Nothing clears copy's range: the choice is copy → copy; with it race the four
        // cheapest others, copy → mmap (fourth by median) among them.
        assert_eq!(
            contenders(&t, K16, false),
            vec![
                pp(T::Copy, R::Copy),
                pp(T::Copy, R::Mmap),
                pp(T::Uring, R::Copy),
                pp(T::Zerocopy, R::Mmap),
                pp(T::Zerocopy, R::Uring),
            ]
        );
        // Nothing measured at a point: only the bar.
        assert_eq!(contenders(&t, 4096, false), vec![pp(T::Copy, R::Copy)]);
    }

    #[test]
    fn a_pair_well_over_the_leader_leaves_from_the_third_round_copy_never_does() {
        let mut race = Race::new(&first_pass(), &[(K16, false)]);
        let raced = vec![
            pp(T::Copy, R::Copy),
            pp(T::Copy, R::Mmap),
            pp(T::Uring, R::Copy),
            pp(T::Zerocopy, R::Mmap),
            pp(T::Zerocopy, R::Uring),
        ];
        assert_eq!(race.alive(K16, false), raced);
        // Side by side: copy → mmap leads, zerocopy → uring 45 % over it, copy → copy
        // 30 %, zerocopy → mmap 25 %, uring → copy 5 %.
        let cost = |p: PathPair| match (p.tx, p.rx) {
            (T::Copy, R::Mmap) => 2.0,
            (T::Zerocopy, R::Uring) => 2.9,
            (T::Copy, R::Copy) => 2.6,
            (T::Zerocopy, R::Mmap) => 2.5,
            _ => 2.1,
        };
        let mut firsts = Vec::new();
        for _ in 0..PRUNE_AFTER - 1 {
            firsts.push(race.round()[0].0);
            play(&mut race, cost);
            assert_eq!(race.alive(K16, false), raced, "no verdict before round 3");
        }
        // Each round starts on a different pair.
        assert_ne!(firsts[0], firsts[1]);
        play(&mut race, cost);
        assert_eq!(
            race.alive(K16, false),
            vec![
                pp(T::Copy, R::Copy),
                pp(T::Copy, R::Mmap),
                pp(T::Uring, R::Copy)
            ]
        );
        let report = race.report();
        assert!(report.contains("leader copy/mmap"), "{report}");
        assert!(
            report.contains("zerocopy/uring left after 3 rounds (+45.0 %)"),
            "{report}"
        );
        // Three still in: the race goes on with them.
        assert!(race.running());
        let mut next: Vec<PathPair> = race.round().into_iter().map(|r| r.0).collect();
        next.sort_by_key(|p| (p.tx.name(), p.rx.name()));
        assert_eq!(next, race.alive(K16, false));
        // Every raced pair's first-pass runs give way to the race's; the others stay.
        assert!(race.superseded((pp(T::Zerocopy, R::Uring), K16, false)));
        assert!(race.superseded((pp(T::Copy, R::Copy), K16, false)));
        assert!(!race.superseded((pp(T::Uring, R::Uring), K16, false)));
        assert!(!race.superseded((pp(T::Copy, R::Mmap), 4096, false)));
        assert!(!race.superseded((pp(T::Copy, R::Mmap), K16, true)));
    }

    #[test]
    fn with_only_copy_and_the_leader_left_the_point_is_settled() {
        let mut race = Race::new(&first_pass(), &[(K16, false)]);
        let cost = |p: PathPair| if p == PathPair::DEFAULT { 2.2 } else { 2.0 }
            + if p == pp(T::Uring, R::Copy) { 0.0 } else { 0.5 };
        for _ in 0..PRUNE_AFTER {
            play(&mut race, cost);
        }
        // uring → copy leads at 2.0; copy → copy (2.7) stays as the bar; the others go.
        assert_eq!(
            race.alive(K16, false),
            vec![pp(T::Copy, R::Copy), pp(T::Uring, R::Copy)]
        );
        assert!(!race.running());
        assert!(race.round().is_empty());
    }

    #[test]
    fn one_disturbed_round_does_not_end_a_pair_s_race() {
        let mut race = Race::new(&first_pass(), &[(K16, false)]);
        for r in 0..PRUNE_AFTER {
            // zerocopy → mmap 5 % over uring → copy, but 60 % over in the second round.
            play(&mut race, |p| match (p.tx, p.rx) {
                (T::Uring, R::Copy) => 2.0,
                (T::Zerocopy, R::Mmap) if r == 1 => 3.2,
                (T::Zerocopy, R::Mmap) => 2.1,
                _ => 2.05,
            });
        }
        assert!(race.alive(K16, false).contains(&pp(T::Zerocopy, R::Mmap)));
        let a = vec![(0, 2.1), (1, 3.2), (2, 2.1), (3, 9.0)];
        let b = vec![(0, 2.0), (1, 2.0), (2, 2.0)];
        // Round 3 has no partner: three ratios, median 5 %.
        assert!((paired_excess(&a, &b).unwrap() - 0.05).abs() < 1e-9);
    }
}
