//! `lineage-crash faults`: the store under I/O faults, in-process.
//!
//! Each plan opens a new store file through [`backend::FaultyFile`] and runs the workload
//! (threads appending to sessions of their own, sharing group commits); after a warm-up it arms a
//! fault (the n-th write, fsync, resize, torn write or any operation fails, once or until cleared),
//! clears it (at once in once mode, a few steps later in sticky mode), and then `flush_all` must
//! succeed. Every error returned meanwhile is judged against the contract of a failed commit (see
//! [`workload`]). Then the file is reopened plainly and checked: it verifies, holds every
//! acknowledged event byte for byte and nothing that was not admitted.
//!
//! A sweep first runs each workload shape fault-free, counting operations per kind, and then
//! faults the operations of each kind, one plan per chosen n, in both modes.

mod backend;
mod plan;
mod verdict;
mod workload;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use lineage_store::Store;
use lineage_testkit::SplitMix64;

use backend::{FaultyFile, OpCounts, Switch};
pub use backend::{Kind, Mode};
pub use plan::FaultPlan;
use plan::{FULL, QUICK, STEPS, STICKY_STEPS, Shape, Sweep, THREADS, WARMUP_STEPS};
use workload::{Calls, Ledger, Worker, create_sessions};

/// The store file's name in a plan's directory.
const STORE_FILE: &str = "sessions.lineage";
/// The copy of the store file a sticky fault left (see [`Frozen`]).
const FROZEN_FILE: &str = "frozen.lineage";
/// A store call that has not returned after this long is hung.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A plan that has not finished after this long is hung, wherever it is stuck.
const PLAN_TIMEOUT: Duration = Duration::from_secs(120);
/// After storage recovers, `flush_all` may report the earlier failure this many times at most.
const RECOVERY_ATTEMPTS: u32 = 5;
/// At most this many failing plans' directories are kept.
const KEEP_FAILED: usize = 20;

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The bounded sweep CI runs, instead of the full one.
    pub quick: bool,
    /// The seed of the workload shapes and of the operations swept.
    pub seed: u64,
    /// The work directory: one subdirectory per plan, kept when it fails.
    pub dir: PathBuf,
    /// Runs only this plan.
    pub only: Option<FaultPlan>,
}

/// The figures of one kind and mode.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// Plans run.
    pub plans: u32,
    /// Plans whose fault was injected (the n-th operation came before the workload ended).
    pub injected: u32,
    /// Operations failed.
    pub failed_ops: u64,
    /// Errors the store returned to the workload.
    pub errors: u64,
    /// Acknowledged events compared byte for byte after the plan.
    pub compared: u64,
    /// Acknowledged events missing or different.
    pub lost: u64,
    /// Plans with a failure other than lost events (a broken contract, verify, a hang, ...).
    pub failures: u32,
}

/// A plan that failed.
#[derive(Clone, Debug)]
pub struct Failed {
    /// `None` for a fault-free run.
    pub plan: Option<FaultPlan>,
    pub shape: u64,
    pub problems: Vec<String>,
    /// Its work directory, if kept.
    pub kept: Option<PathBuf>,
}

/// The totals of a sweep.
#[derive(Debug, Default)]
pub struct Totals {
    /// By kind and mode.
    pub rows: BTreeMap<(Kind, Mode), Row>,
    /// The fault-free runs that counted operations (each is checked too).
    pub fault_free: Row,
    /// Operations the fault-free runs counted, by kind (summed over the shapes).
    pub counted: BTreeMap<Kind, u64>,
    pub failed: Vec<Failed>,
}

impl Totals {
    pub fn lost(&self) -> u64 {
        self.fault_free.lost + self.rows.values().map(|r| r.lost).sum::<u64>()
    }

    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }
}

/// What one plan did and found.
#[derive(Debug, Default)]
struct Outcome {
    counts: OpCounts,
    injected: bool,
    failed_ops: u64,
    errors: u64,
    compared: u64,
    lost: u64,
    problems: Vec<String>,
}

/// Runs the sweep (or the one plan `config.only`); `progress` gets a line now and then and one
/// per failure.
pub fn run(config: &Config, mut progress: impl FnMut(&str)) -> Result<Totals, String> {
    std::fs::create_dir_all(&config.dir)
        .map_err(|e| format!("cannot create {}: {e}", config.dir.display()))?;
    let mut totals = Totals::default();
    let mut runs = 0usize;
    // One run: its outcome tallied, its operation counts returned.
    let mut run = |plan: Option<FaultPlan>,
                   shape: &Shape,
                   totals: &mut Totals,
                   progress: &mut dyn FnMut(&str)| {
        let outcome = supervised(plan, shape, &config.dir, &mut runs)?;
        let counts = outcome.counts;
        tally(totals, plan, shape, outcome, config, &mut &mut *progress);
        Ok::<_, String>(counts)
    };
    if let Some(plan) = config.only {
        run(
            Some(plan),
            &Shape::of(plan.shape),
            &mut totals,
            &mut progress,
        )?;
        return Ok(totals);
    }
    let sweep: Sweep = if config.quick { QUICK } else { FULL };
    let mut master = SplitMix64::new(config.seed);
    for round in 1..=sweep.shapes {
        let shape = Shape::of(master.next_u64());
        // The fault-free run: what a plan's n counts among, and a check of its own.
        let counts = run(None, &shape, &mut totals, &mut progress)?;
        for kind in Kind::ALL {
            *totals.counted.entry(kind).or_default() += kind.count(&counts);
        }
        let plans = plan::plans_of(shape.seed, |k| k.count(&counts), sweep, &mut master);
        progress(&format!(
            "shape {round}/{} ({:#x}: sessions {:?}, window {:?}, blocks of {} events or {} \
             bytes): {} writes, {} syncs, {} resizes, {} operations in all; {} plans",
            sweep.shapes,
            shape.seed,
            shape.sessions,
            shape.options.commit_window,
            shape.options.block_events,
            shape.options.block_bytes,
            Kind::Write.count(&counts),
            Kind::Sync.count(&counts),
            Kind::SetLen.count(&counts),
            Kind::Everything.count(&counts),
            plans.len()
        ));
        for plan in plans {
            run(Some(plan), &shape, &mut totals, &mut progress)?;
        }
    }
    Ok(totals)
}

/// Adds a plan's outcome to the totals; a failing plan's directory is kept (up to a limit).
fn tally(
    totals: &mut Totals,
    plan: Option<FaultPlan>,
    shape: &Shape,
    outcome: Outcome,
    config: &Config,
    progress: &mut impl FnMut(&str),
) {
    let row = match plan {
        Some(plan) => totals.rows.entry((plan.kind, plan.mode)).or_default(),
        None => &mut totals.fault_free,
    };
    row.plans += 1;
    row.injected += u32::from(outcome.injected);
    row.failed_ops += outcome.failed_ops;
    row.errors += outcome.errors;
    row.compared += outcome.compared;
    row.lost += outcome.lost;
    let dir = plan_dir(&config.dir);
    if outcome.lost == 0 && outcome.problems.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    if !outcome.problems.is_empty() {
        row.failures += 1;
    }
    let kept = if totals.failed.len() < KEEP_FAILED {
        let to = config
            .dir
            .join(format!("failed-{}", totals.failed.len() + 1));
        std::fs::rename(&dir, &to).ok().map(|()| to)
    } else {
        let _ = std::fs::remove_dir_all(&dir);
        None
    };
    let name = describe(plan, shape);
    progress(&format!(
        "FAILED {name}: lost {} acknowledged events; {}",
        outcome.lost,
        outcome.problems.first().map_or("", String::as_str)
    ));
    for problem in outcome.problems.iter().skip(1).take(4) {
        progress(&format!("    {problem}"));
    }
    if outcome.problems.len() > 5 {
        progress(&format!(
            "    … and {} more problems",
            outcome.problems.len() - 5
        ));
    }
    if let Some(kept) = &kept {
        progress(&format!("    kept: {}", kept.display()));
    }
    totals.failed.push(Failed {
        plan,
        shape: shape.seed,
        problems: outcome.problems,
        kept,
    });
}

/// A plan as the summary names it, with how to run it again alone.
pub fn describe(plan: Option<FaultPlan>, shape: &Shape) -> String {
    match plan {
        Some(plan) => format!(
            "plan {plan} ({} fault, {}, at operation {}; rerun: lineage-crash faults --plan {plan})",
            plan.kind, plan.mode, plan.nth
        ),
        None => format!("the fault-free run of shape {:#x}", shape.seed),
    }
}

/// The directory the running plan works in.
fn plan_dir(dir: &Path) -> PathBuf {
    dir.join("plan")
}

/// Runs one plan on a thread of its own and watches it: a store call that does not return within
/// [`CALL_TIMEOUT`], or a plan that does not finish within [`PLAN_TIMEOUT`], is a hang (the plan's
/// threads are then left behind, blocked; the sweep goes on with the next plan in a new file).
fn supervised(
    plan: Option<FaultPlan>,
    shape: &Shape,
    dir: &Path,
    runs: &mut usize,
) -> Result<Outcome, String> {
    *runs += 1;
    let dir = plan_dir(dir);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let calls = Arc::new(Calls::new(THREADS + 1));
    let (done, finished) = mpsc::channel();
    let (watched, shape_run) = (calls.clone(), shape.clone());
    std::thread::Builder::new()
        .name(format!("plan-{runs}"))
        .spawn(move || {
            let _ = done.send(run_plan(plan, &shape_run, &dir, &watched));
        })
        .map_err(|e| format!("cannot start a plan's thread: {e}"))?;
    let started = Instant::now();
    loop {
        match finished.recv_timeout(Duration::from_millis(50)) {
            Ok(outcome) => return Ok(outcome),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Ok(Outcome {
                    problems: vec!["the plan's thread panicked".into()],
                    ..Outcome::default()
                });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let hang = if let Some((what, ran)) = calls.overdue(CALL_TIMEOUT) {
            Some(format!(
                "hang: a call to {what} has not returned after {ran:.0?}"
            ))
        } else if started.elapsed() > PLAN_TIMEOUT {
            Some(format!(
                "hang: the plan has not finished after {PLAN_TIMEOUT:?}"
            ))
        } else {
            None
        };
        if let Some(hang) = hang {
            return Ok(Outcome {
                problems: vec![hang],
                ..Outcome::default()
            });
        }
    }
}

/// One plan: a new store file, the workload with the fault armed after its warm-up and cleared in
/// time, storage's recovery (`flush_all` must succeed), then the check of the file reopened
/// plainly. `plan` `None` runs fault-free and counts the operations.
fn run_plan(plan: Option<FaultPlan>, shape: &Shape, dir: &Path, calls: &Calls) -> Outcome {
    let mut out = Outcome::default();
    let path = dir.join(STORE_FILE);
    if let Err(e) = std::fs::File::create(&path) {
        out.problems
            .push(format!("cannot create {}: {e}", path.display()));
        return out;
    }
    let switch = Arc::new(Switch::default());
    let store = {
        let (path, switch) = (path.clone(), switch.clone());
        // The writer calls this again to reopen the file after a failed commit: each handle
        // shares the switch, so a fault outlives the handle that met it.
        let factory = move || {
            FaultyFile::open(&path, switch.clone()).expect("the store file opens for writing")
        };
        match Store::with_backend_factory(factory, shape.options.clone()) {
            Ok(store) => store,
            Err(e) => {
                out.problems.push(format!("the store does not open: {e}"));
                return out;
            }
        }
    };
    let sessions = match create_sessions(&store, &shape.sessions) {
        Ok(sessions) => sessions,
        Err(e) => {
            out.problems.push(e);
            return out;
        }
    };
    let known: HashSet<_> = sessions.iter().flatten().copied().collect();
    let mut workers: Vec<Worker<'_>> = sessions
        .iter()
        .enumerate()
        .map(|(t, own)| Worker::new(t, shape.thread_seed(t), own, &store, &switch, calls, &known))
        .collect();
    let frozen = run_workload(plan, &mut workers, &switch, dir);
    out.counts = switch.counts();
    out.injected = switch.failed() > 0;
    out.failed_ops = switch.failed();
    switch.clear();

    recover(&store, calls, &mut out);
    if out.problems.is_empty() {
        for worker in &mut workers {
            worker.all_durable();
        }
    }
    let mut ledgers: Vec<Ledger> = Vec::new();
    for worker in workers {
        out.errors += worker.found.errors;
        out.problems.extend(worker.found.problems);
        ledgers.extend(worker.ledgers);
    }
    let final_acks: Vec<(&Ledger, u64)> = ledgers.iter().map(|l| (l, l.acked)).collect();
    let closed = calls.during(THREADS, "close", || store.close());
    if let Err(e) = closed {
        out.problems
            .push(format!("close after storage recovered fails: {e}"));
    }
    let verdict = calls.during(THREADS, "the check", || verdict::check(&path, &final_acks));
    out.compared = verdict.compared;
    out.lost = verdict.lost;
    out.problems.extend(verdict.problems);
    if let Some(frozen) = frozen {
        check_frozen(&frozen, &ledgers, calls, &mut out);
    }
    out
}

/// The store file as a sticky fault that lets no write through (`write`, `everything`) left it,
/// copied just before the fault was cleared, with what was acknowledged then: the machine dying
/// before storage recovers. Nothing written since the fault fired reached the file, so every
/// event acknowledged meanwhile must already have been in it.
struct Frozen {
    path: PathBuf,
    acked: HashMap<lineage_log::SessionId, u64>,
}

/// Whether a plan's fault keeps every write from the file while it lasts.
fn freezes(plan: Option<FaultPlan>) -> bool {
    plan.is_some_and(|p| p.mode == Mode::Sticky && matches!(p.kind, Kind::Write | Kind::Everything))
}

fn check_frozen(frozen: &Frozen, ledgers: &[Ledger], calls: &Calls, out: &mut Outcome) {
    let acks: Vec<(&Ledger, u64)> = ledgers
        .iter()
        .map(|l| (l, frozen.acked.get(&l.id).copied().unwrap_or(0)))
        .collect();
    let verdict = calls.during(THREADS, "the check of the frozen file", || {
        verdict::check(&frozen.path, &acks)
    });
    out.compared += verdict.compared;
    out.lost += verdict.lost;
    out.problems.extend(
        verdict
            .problems
            .into_iter()
            .map(|p| format!("the file as the failing storage left it: {p}")),
    );
}

/// Runs every worker on its own thread: the warm-up, then (all threads waiting) the fault armed
/// and the operations counted from there, then the steps; in sticky mode the fault is cleared once
/// every thread took [`STICKY_STEPS`] more steps after it fired (or all of them finished).
///
/// A plan whose fault [`freezes`] the file gets the file copied, with what was acknowledged, just
/// before the fault is cleared (see [`Frozen`]).
fn run_workload(
    plan: Option<FaultPlan>,
    workers: &mut [Worker<'_>],
    switch: &Switch,
    dir: &Path,
) -> Option<Frozen> {
    let threads = workers.len();
    let acks = Mutex::new(HashMap::new());
    let mut frozen = None;
    let armed = Barrier::new(threads + 1);
    let started = Barrier::new(threads + 1);
    let steps = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for worker in workers.iter_mut() {
            let (armed, started, steps, finished, acks) =
                (&armed, &started, &steps, &finished, &acks);
            scope.spawn(move || {
                for _ in 0..WARMUP_STEPS {
                    worker.step();
                    worker.publish(acks);
                }
                armed.wait();
                started.wait();
                for _ in 0..STEPS {
                    let more = worker.step();
                    worker.publish(acks);
                    if !more {
                        break;
                    }
                    steps.fetch_add(1, Ordering::SeqCst);
                }
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        armed.wait();
        switch.reset_counts();
        if let Some(plan) = plan {
            switch.arm(plan.kind, plan.mode, plan.nth);
        }
        started.wait();
        let sticky = plan.is_some_and(|p| p.mode == Mode::Sticky);
        let mut fired_at = None;
        while finished.load(Ordering::SeqCst) < threads {
            if sticky && switch.fired() {
                let at = *fired_at.get_or_insert(steps.load(Ordering::SeqCst));
                if steps.load(Ordering::SeqCst) >= at + STICKY_STEPS * threads as u64 {
                    frozen = frozen.take().or_else(|| freeze(plan, dir, &acks));
                    switch.clear();
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    // A fault that fired late is still on: the file is copied before the caller clears it.
    if switch.fired() {
        frozen = frozen.or_else(|| freeze(plan, dir, &acks));
    }
    frozen
}

/// Copies the store file for [`check_frozen`] if the plan's fault [`freezes`] it.
fn freeze(
    plan: Option<FaultPlan>,
    dir: &Path,
    acks: &Mutex<HashMap<lineage_log::SessionId, u64>>,
) -> Option<Frozen> {
    if !freezes(plan) {
        return None;
    }
    let path = dir.join(FROZEN_FILE);
    std::fs::copy(dir.join(STORE_FILE), &path).ok()?;
    // Taken after the copy: whatever was acknowledged until now was acknowledged while no write
    // reached the file.
    let acked = acks.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Some(Frozen { path, acked })
}

/// Storage works again: `flush_all` must succeed, after at most a few calls that report the
/// earlier failure.
fn recover(store: &Store, calls: &Calls, out: &mut Outcome) {
    let mut errors = Vec::new();
    for _ in 0..RECOVERY_ATTEMPTS {
        match calls.during(THREADS, "flush_all", || store.flush_all()) {
            Ok(()) => return,
            Err(e) => {
                out.errors += 1;
                errors.push(e.to_string());
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    out.problems.push(format!(
        "storage works again, but flush_all failed {RECOVERY_ATTEMPTS} times; the last: {}",
        errors.last().map_or("", String::as_str)
    ));
}

/// The summary: a line per kind and mode, then what failed.
pub fn summary(config: &Config, totals: &Totals, took: Duration) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let plans: u32 = totals.rows.values().map(|r| r.plans).sum();
    let injected: u32 = totals.rows.values().map(|r| r.injected).sum();
    let _ = writeln!(
        s,
        "lineage-crash faults: {plans} plans, {injected} faults injected, in {:.1} s (seed {:#x}, \
         {}, {} cores)",
        took.as_secs_f64(),
        config.seed,
        if config.only.is_some() {
            "one plan"
        } else if config.quick {
            "quick sweep"
        } else {
            "full sweep"
        },
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    let _ = writeln!(
        s,
        "  {:<10} {:<6} {:>6} {:>9} {:>10} {:>7} {:>12} {:>5} {:>9}",
        "kind",
        "mode",
        "plans",
        "injected",
        "failed ops",
        "errors",
        "acked events",
        "lost",
        "failures"
    );
    let mut line = |kind: &str, mode: &str, r: &Row| {
        let _ = writeln!(
            s,
            "  {:<10} {:<6} {:>6} {:>9} {:>10} {:>7} {:>12} {:>5} {:>9}",
            kind, mode, r.plans, r.injected, r.failed_ops, r.errors, r.compared, r.lost, r.failures
        );
    };
    if totals.fault_free.plans > 0 {
        line("none", "-", &totals.fault_free);
    }
    for ((kind, mode), row) in &totals.rows {
        line(kind.name(), mode.name(), row);
    }
    if !totals.counted.is_empty() {
        let counted: Vec<String> = totals
            .counted
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  operations counted by the fault-free runs: {}",
            counted.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "  lost: {}   failing plans: {}",
        totals.lost(),
        totals.failed.len()
    );
    for failed in totals.failed.iter().take(10) {
        let _ = writeln!(
            s,
            "    {}: {}",
            describe(failed.plan, &Shape::of(failed.shape)),
            failed
                .problems
                .first()
                .map_or("lost events", String::as_str)
        );
        if let Some(kept) = &failed.kept {
            let _ = writeln!(s, "      kept: {}", kept.display());
        }
    }
    s
}
