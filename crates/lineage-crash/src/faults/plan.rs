//! What a fault run does: the workload's shape (chosen from a seed), the fault of each plan, and
//! which operations a sweep faults.

use std::fmt;
use std::time::Duration;

use lineage_store::StoreOptions;
use lineage_testkit::SplitMix64;

use super::backend::{Kind, Mode};

/// Threads writing at once, each to sessions of its own.
pub const THREADS: usize = 4;
/// Steps each thread takes before the fault is armed, so the store holds acknowledged events of
/// every session when storage starts failing.
pub const WARMUP_STEPS: u32 = 3;
/// Steps each thread takes once the fault is armed.
pub const STEPS: u32 = 14;
/// In sticky mode, the steps (per thread) the workload keeps going while storage fails before the
/// fault is cleared.
pub const STICKY_STEPS: u64 = 3;

/// How the workload runs: the same for the fault-free run that counts operations and for every
/// plan swept over those counts.
#[derive(Clone, Debug)]
pub struct Shape {
    /// The seed it was chosen from (and each thread's choices are derived from).
    pub seed: u64,
    /// Sessions per thread (1 to 3).
    pub sessions: Vec<usize>,
    /// The store's options: a commit window of 1 to 5 ms, and blocks from tiny (cut and rewritten
    /// every few commits) to the default.
    pub options: StoreOptions,
}

impl Shape {
    pub fn of(seed: u64) -> Shape {
        let mut rng = SplitMix64::new(seed);
        let sessions = (0..THREADS).map(|_| rng.between(1, 3) as usize).collect();
        let window_ms = [1u64, 2, 5][rng.below(3) as usize];
        let defaults = StoreOptions::default();
        let (block_events, block_bytes) = [
            (4, 1024),
            (16, 4096),
            (defaults.block_events, defaults.block_bytes),
        ][rng.below(3) as usize];
        Shape {
            seed,
            sessions,
            options: StoreOptions {
                commit_window: Duration::from_millis(window_ms),
                block_events,
                block_bytes,
                ..defaults
            },
        }
    }

    /// A thread's own seed.
    pub fn thread_seed(&self, thread: usize) -> u64 {
        let mut rng = SplitMix64::new(self.seed ^ (thread as u64 + 1).wrapping_mul(0x9e37_79b9));
        rng.next_u64()
    }
}

/// One fault run: the workload's shape, and which operation fails how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPlan {
    pub kind: Kind,
    pub mode: Mode,
    /// The operation of `kind`, counted from arming (from 1), that fails first.
    pub nth: u64,
    /// The seed of the workload's [`Shape`].
    pub shape: u64,
}

impl fmt::Display for FaultPlan {
    /// `kind:mode:nth:shape`, what `--plan` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{:#x}",
            self.kind, self.mode, self.nth, self.shape
        )
    }
}

impl FaultPlan {
    /// Parses what [`FaultPlan`]'s `Display` prints.
    pub fn parse(text: &str) -> Result<FaultPlan, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let [kind, mode, nth, shape] = parts[..] else {
            return Err(format!("a plan is kind:mode:n:shape, not {text:?}"));
        };
        let kind = Kind::parse(kind).ok_or_else(|| format!("no fault kind {kind:?}"))?;
        let mode = Mode::parse(mode).ok_or_else(|| format!("no fault mode {mode:?}"))?;
        let nth = nth
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("n must be a number from 1, not {nth:?}"))?;
        let shape = match shape.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => shape.parse(),
        }
        .map_err(|_| format!("the shape seed must be a number, not {shape:?}"))?;
        Ok(FaultPlan {
            kind,
            mode,
            nth,
            shape,
        })
    }
}

/// How much a sweep runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sweep {
    /// Workload shapes, each counted fault-free once.
    pub shapes: u32,
    /// At most this many plans per shape, kind and mode.
    pub points: u64,
}

/// What CI runs: a few hundred faults.
pub const QUICK: Sweep = Sweep {
    shapes: 3,
    points: 20,
};
/// The full sweep.
pub const FULL: Sweep = Sweep {
    shapes: 6,
    points: 60,
};

/// The operations (from 1) to fault among `count`: every one when there are at most `points`,
/// else `points` of them evenly spaced, shifted by an offset `rng` chooses within one spacing.
pub fn points(count: u64, points: u64, rng: &mut SplitMix64) -> Vec<u64> {
    if count <= points {
        return (1..=count).collect();
    }
    let offset = rng.below(count);
    // The i-th point is at i * count / points, plus offset / points (less than one spacing).
    (0..points)
        .map(|i| 1 + (u128::from(i) * u128::from(count) + u128::from(offset)) as u64 / points)
        .collect()
}

/// Every plan of one shape: each kind and mode swept over the operations of that kind the
/// fault-free run counted.
pub fn plans_of(
    shape: u64,
    count: impl Fn(Kind) -> u64,
    sweep: Sweep,
    rng: &mut SplitMix64,
) -> Vec<FaultPlan> {
    let mut plans = Vec::new();
    for kind in Kind::ALL {
        for mode in Mode::ALL {
            for nth in points(count(kind), sweep.points, rng) {
                plans.push(FaultPlan {
                    kind,
                    mode,
                    nth,
                    shape,
                });
            }
        }
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_operations_are_each_faulted() {
        let mut rng = SplitMix64::new(1);
        assert_eq!(points(0, 10, &mut rng), Vec::<u64>::new());
        assert_eq!(points(4, 10, &mut rng), vec![1, 2, 3, 4]);
        assert_eq!(points(10, 10, &mut rng), (1..=10).collect::<Vec<_>>());
    }

    #[test]
    fn many_operations_are_faulted_evenly_from_a_seeded_offset() {
        for seed in 0..200 {
            for (count, wanted) in [(11u64, 10u64), (100, 7), (1000, 15), (12_345, 60)] {
                let mut rng = SplitMix64::new(seed);
                let chosen = points(count, wanted, &mut rng);
                assert_eq!(chosen.len() as u64, wanted);
                assert!(chosen.windows(2).all(|w| w[0] < w[1]), "{chosen:?}");
                assert!(chosen[0] >= 1 && *chosen.last().unwrap() <= count);
                // Evenly spaced: neighbours differ by the spacing, rounded either way.
                let spacing = count / wanted;
                assert!(
                    chosen
                        .windows(2)
                        .all(|w| w[1] - w[0] == spacing || w[1] - w[0] == spacing + 1),
                    "count {count}, {wanted} points: {chosen:?}"
                );
                // The first point lies within the first spacing.
                assert!(chosen[0] <= count.div_ceil(wanted));
            }
        }
        let offsets: std::collections::BTreeSet<u64> = (0..50)
            .map(|seed| points(1000, 10, &mut SplitMix64::new(seed))[0])
            .collect();
        assert!(offsets.len() > 10, "the offset depends on the seed");
        assert_eq!(
            points(1000, 10, &mut SplitMix64::new(3)),
            points(1000, 10, &mut SplitMix64::new(3))
        );
    }

    #[test]
    fn a_sweep_covers_every_kind_and_mode_within_its_budget() {
        let mut rng = SplitMix64::new(9);
        let count = |kind: Kind| match kind {
            Kind::Write => 500,
            Kind::Sync => 12,
            Kind::SetLen => 3,
            Kind::Torn => 500,
            Kind::Everything => 900,
        };
        let plans = plans_of(0x77, count, QUICK, &mut rng);
        for kind in Kind::ALL {
            for mode in Mode::ALL {
                let of: Vec<u64> = plans
                    .iter()
                    .filter(|p| p.kind == kind && p.mode == mode)
                    .map(|p| p.nth)
                    .collect();
                assert_eq!(
                    of.len() as u64,
                    count(kind).min(QUICK.points),
                    "{kind} {mode}"
                );
                assert!(of.iter().all(|n| (1..=count(kind)).contains(n)));
            }
        }
        assert!(plans.iter().all(|p| p.shape == 0x77));
    }

    #[test]
    fn a_plan_prints_as_it_parses() {
        let plan = FaultPlan {
            kind: Kind::SetLen,
            mode: Mode::Sticky,
            nth: 7,
            shape: 0xabc,
        };
        assert_eq!(plan.to_string(), "set_len:sticky:7:0xabc");
        assert_eq!(FaultPlan::parse(&plan.to_string()), Ok(plan));
        assert!(FaultPlan::parse("write:once:0:0x1").is_err());
        assert!(FaultPlan::parse("melt:once:1:0x1").is_err());
        assert!(FaultPlan::parse("write:twice:1:0x1").is_err());
        assert!(FaultPlan::parse("write:once:1").is_err());
    }

    #[test]
    fn a_shape_is_fixed_by_its_seed() {
        let (a, b) = (Shape::of(5), Shape::of(5));
        assert_eq!(
            (a.sessions, a.options.commit_window, a.options.block_events),
            (b.sessions, b.options.commit_window, b.options.block_events)
        );
        let shapes: Vec<Shape> = (0..100).map(Shape::of).collect();
        assert!(
            shapes
                .iter()
                .all(|s| s.sessions.len() == THREADS
                    && s.sessions.iter().all(|n| (1..=3).contains(n)))
        );
        assert!(shapes.iter().any(|s| s.options.block_events == 4));
        assert!(
            shapes
                .iter()
                .any(|s| s.options.commit_window == Duration::from_millis(1))
        );
        assert_ne!(shapes[0].thread_seed(0), shapes[0].thread_seed(1));
    }
}
