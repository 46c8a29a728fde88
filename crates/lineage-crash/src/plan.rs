//! When a writer is killed: moments chosen from the cycle's seed, the report line that triggers
//! each, and what the writer was doing when the kill landed.

use std::fmt;
use std::time::Duration;

use lineage_testkit::SplitMix64;

use crate::report::{Phase, Report, Write};

/// The moment a kill aims at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Moment {
    /// While the store file is created: the cycle starts from no file, and the kill lands a
    /// fraction (up to 1.2) of a creation's measured duration after the writer starts creating it.
    Creating,
    /// Right after the store opened, before anything was written: the writer is told to hold there.
    AfterOpen,
    /// During the n-th load with repair.
    Repair,
    /// During the n-th append (admit and flush of one batch).
    Append,
    /// During the n-th flush of admitted batches (a group commit).
    Flush,
    /// During the n-th fork.
    Fork,
    /// After the n-th report line of any kind.
    Random,
}

impl Moment {
    /// Every moment, with its weight among the cycles.
    pub const WEIGHTED: [(Moment, u32); 7] = [
        (Moment::Creating, 10),
        (Moment::AfterOpen, 8),
        (Moment::Repair, 10),
        (Moment::Append, 22),
        (Moment::Flush, 15),
        (Moment::Fork, 15),
        (Moment::Random, 20),
    ];

    /// The moment's name in summaries.
    pub fn name(self) -> &'static str {
        match self {
            Moment::Creating => "creating",
            Moment::AfterOpen => "after-open",
            Moment::Repair => "mid-repair",
            Moment::Append => "mid-append",
            Moment::Flush => "mid-flush",
            Moment::Fork => "mid-fork",
            Moment::Random => "random",
        }
    }
}

impl fmt::Display for Moment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One cycle's kill: the moment, which occurrence of its trigger line, and the delay after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The moment aimed at.
    pub moment: Moment,
    /// Which occurrence of the moment's trigger line starts the delay (from 1).
    pub nth: u32,
    /// The delay after the trigger: microseconds, or for [`Moment::Creating`] thousandths of the
    /// measured creation time.
    pub delay: u32,
    /// Whether the cycle starts from no store file.
    pub fresh: bool,
}

impl Plan {
    /// The plan of a cycle, drawn from its generator.
    pub fn choose(rng: &mut SplitMix64) -> Plan {
        let weights: Vec<u32> = Moment::WEIGHTED.iter().map(|(_, w)| *w).collect();
        let moment = rng
            .weighted(&weights)
            .map_or(Moment::Random, |i| Moment::WEIGHTED[i].0);
        let (nth, delay) = match moment {
            // Up to 1.2 times a creation, so some kills land just after it too.
            Moment::Creating => (1, rng.below(1200)),
            Moment::AfterOpen => (1, rng.below(1000)),
            // About one step of the writer (a durable append takes a millisecond or less on a
            // fast disk), so the kill lands in the step or just after it.
            Moment::Repair => (rng.between(1, 3), rng.below(1500)),
            Moment::Append => (rng.between(1, 30), rng.below(1500)),
            Moment::Flush => (rng.between(1, 8), rng.below(1500)),
            Moment::Fork => (rng.between(1, 4), rng.below(1500)),
            Moment::Random => (rng.between(1, 300), rng.below(4000)),
        };
        let fresh = match moment {
            Moment::Creating => true,
            Moment::AfterOpen => rng.percent(50),
            _ => false,
        };
        Plan {
            moment,
            nth: nth as u32,
            delay: delay as u32,
            fresh,
        }
    }

    /// Whether the writer must hold after opening (it is killed there).
    pub fn holds_after_open(&self) -> bool {
        self.moment == Moment::AfterOpen
    }

    /// How long to wait after the trigger line, given how long a creation takes here.
    pub fn delay(&self, creation: Duration) -> Duration {
        match self.moment {
            Moment::Creating => creation * self.delay / 1000,
            _ => Duration::from_micros(u64::from(self.delay)),
        }
    }

    /// Whether `report` is one of the lines this plan counts.
    fn counts(&self, report: &Report) -> bool {
        match self.moment {
            Moment::Creating => *report == Report::Phase(Phase::Creating),
            Moment::AfterOpen => *report == Report::Phase(Phase::Opened),
            Moment::Repair => matches!(
                report,
                Report::Events {
                    write: Write::Repair,
                    ..
                }
            ),
            Moment::Append => matches!(
                report,
                Report::Events {
                    write: Write::Append,
                    ..
                }
            ),
            Moment::Flush => *report == Report::Phase(Phase::Flush),
            Moment::Fork => matches!(report, Report::ForkStart { .. }),
            Moment::Random => true,
        }
    }
}

/// Counts report lines until the plan's trigger.
#[derive(Clone, Debug)]
pub struct Trigger {
    plan: Plan,
    seen: u32,
}

impl Trigger {
    /// Watches for `plan`'s trigger.
    pub fn new(plan: Plan) -> Trigger {
        Trigger { plan, seen: 0 }
    }

    /// Takes the next report line; true when it is the trigger.
    pub fn see(&mut self, report: &Report) -> bool {
        if self.plan.counts(report) {
            self.seen += 1;
            return self.seen == self.plan.nth;
        }
        false
    }
}

/// What the writer was doing when it died, from the last complete line it printed (each line
/// announces a step before the writer takes it).
pub fn hit(last: Option<&Report>) -> &'static str {
    match last {
        None => "before-open",
        Some(Report::Phase(Phase::Creating)) => "creating",
        Some(Report::Phase(Phase::Opening)) => "opening",
        Some(Report::Phase(Phase::Opened)) => "after-open",
        Some(Report::Phase(Phase::Flush)) => "mid-flush",
        Some(Report::Phase(Phase::Done)) => "idle",
        Some(Report::Events { write, .. }) => match write {
            Write::Append => "mid-append",
            Write::Admit => "in-commit-window",
            Write::Repair => "mid-repair",
        },
        Some(Report::ForkStart { .. }) => "mid-fork",
        Some(Report::Create(_) | Report::Durable { .. } | Report::Fork { .. }) => "between-steps",
        Some(Report::Error(_)) => "after-an-error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lineage_log::SessionId;

    #[test]
    fn the_same_seed_plans_the_same_kills_and_every_moment_comes_up() {
        let plans = |seed| {
            let mut rng = SplitMix64::new(seed);
            (0..500).map(|_| Plan::choose(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(plans(42), plans(42));
        assert_ne!(plans(42), plans(43));
        let drawn = plans(42);
        for (moment, _) in Moment::WEIGHTED {
            assert!(
                drawn.iter().any(|p| p.moment == moment),
                "{moment} is never chosen"
            );
        }
        assert!(drawn.iter().all(|p| p.nth >= 1));
        assert!(
            drawn
                .iter()
                .filter(|p| p.moment == Moment::Creating)
                .all(|p| p.fresh),
            "a creation kill starts from no file"
        );
        assert!(
            drawn
                .iter()
                .any(|p| p.moment == Moment::AfterOpen && p.fresh)
        );
        assert!(
            drawn
                .iter()
                .any(|p| p.moment == Moment::AfterOpen && !p.fresh)
        );
    }

    #[test]
    fn the_trigger_is_the_nth_line_of_the_moment_and_no_other() {
        let s = SessionId::new();
        let events = |write| Report::Events {
            write,
            session: s,
            first: 0,
            digests: Vec::new(),
        };
        let (append, admit) = (events(Write::Append), events(Write::Admit));
        let plan = Plan {
            moment: Moment::Append,
            nth: 2,
            delay: 0,
            fresh: false,
        };
        let mut trigger = Trigger::new(plan);
        let lines = [
            Report::Phase(Phase::Opened),
            append.clone(),
            admit.clone(),
            Report::Phase(Phase::Flush),
            append.clone(),
            append.clone(),
        ];
        let fired: Vec<bool> = lines.iter().map(|l| trigger.see(l)).collect();
        assert_eq!(fired, [false, false, false, false, true, false]);

        let mut any = Trigger::new(Plan {
            moment: Moment::Random,
            nth: 3,
            ..plan
        });
        let fired: Vec<bool> = lines.iter().map(|l| any.see(l)).collect();
        assert_eq!(fired, [false, false, true, false, false, false]);
    }

    #[test]
    fn delays_are_microseconds_or_a_share_of_a_creation() {
        let plan = Plan {
            moment: Moment::Creating,
            nth: 1,
            delay: 500,
            fresh: true,
        };
        assert_eq!(
            plan.delay(Duration::from_millis(10)),
            Duration::from_millis(5)
        );
        let plan = Plan {
            moment: Moment::Fork,
            delay: 1500,
            ..plan
        };
        assert_eq!(
            plan.delay(Duration::from_millis(10)),
            Duration::from_micros(1500)
        );
    }

    #[test]
    fn the_moment_hit_is_named_by_the_last_line_printed() {
        let s = SessionId::new();
        assert_eq!(hit(None), "before-open");
        assert_eq!(hit(Some(&Report::Phase(Phase::Creating))), "creating");
        assert_eq!(hit(Some(&Report::Phase(Phase::Flush))), "mid-flush");
        assert_eq!(
            hit(Some(&Report::Durable {
                session: s,
                through: 3
            })),
            "between-steps"
        );
        assert_eq!(
            hit(Some(&Report::ForkStart {
                child: s,
                parent: s,
                boundary: None,
                time_ms: 0
            })),
            "mid-fork"
        );
    }
}
