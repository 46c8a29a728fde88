//! A seeded stress test of continuable children.
//!
//! Each case builds a tree of continuable children under two top-level parents and throws a
//! random sequence of operations at it: starts (spawn or fork, under a root or under a live
//! child), follow-ups to running, waiting and settled children (cold resume), interrupts with
//! user and ancestor authority, selected-child drains, gate openings and plain yields. Some
//! operations are awaited at once, others run on their own tasks and race the rest. Children's
//! scripts are random too: text answers, `report` calls, truncated answers and failures, some
//! held by gates the test opens later.
//!
//! Once every gate is open and everything has settled (children left parked by an interrupt or
//! a failed turn are nudged with one more follow-up), the case checks:
//!
//! 1. every message a child accepted (each id `start_continuable` and `followup` returned) and
//!    every report its parent accepted (each id the `report` tool returned) entered its inbox
//!    and then either a turn's history (`user/message`) or a cancelling splice: nothing accepted
//!    is lost. The one other outcome the agent contract allows is a claim by a turn that was
//!    cancelled or failed before its first step (its `turn/end` accounts for it); a claim by a
//!    turn that completed without it fails. More strongly, once every agent is disposed, every
//!    message any inbox of the store ever held is accounted for that way;
//! 2. every child's parent received exactly one settlement notice per announced activation
//!    epoch (an epoch in which the child accepted a message), and none for the others;
//! 3. every stored log is valid and balanced, and the store verifies;
//! 4. every run has exactly one `subagent/start` followed by exactly one `subagent/end`, and a
//!    child's epochs never overlap.
//!
//! The operation sequence and the scripts are fixed by the seed; the interleaving with the
//! store's blocking work is not, so a failure prints its seed and the operations it ran.
//! `LINEAGE_STRESS_SEED=<n>` runs that one seed, `LINEAGE_STRESS_SEED=<n>..<m>` a range, and
//! `LINEAGE_STRESS_OPS=<n>` sets the operations per case.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lineage_agent::{Agent, AgentStatus, Cancellation, Gate, Inbox, Response};
use lineage_log::{
    ContentBlock, Event, EventBody, Message, MessageId, MessageSource, RunId, SessionId,
    TurnEndReason, own_suffix,
};
use lineage_subagent::tools::ReportSetup;
use lineage_subagent::{
    Authority, ChildOptions, ContinuableRequest, ContinuableStarted, ErrorCode, Lifecycle,
    ReportDelivery, SubagentError,
};
use lineage_testkit::SplitMix64;
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::task::JoinHandle;

/// How many cases the test runs, seeds `1..=CASES`.
const CASES: u64 = 12;
/// Operations per case, before the final settling.
const OPS: usize = 80;
/// At most this many children are started per case.
const MAX_CHILDREN: usize = 16;
/// Children this deep do not start children of their own.
const MAX_DEPTH: u32 = 3;
/// Closed gates kept available for new scripts.
const GATES: usize = 4;

#[tokio::test(start_paused = true)]
async fn continuable_children_account_for_every_message_notice_and_run_under_random_operations() {
    let seeds: Vec<u64> = match std::env::var("LINEAGE_STRESS_SEED") {
        Ok(seeds) => match seeds.split_once("..") {
            Some((first, end)) => {
                let first: u64 = first.parse().expect("LINEAGE_STRESS_SEED is n or n..m");
                let end: u64 = end.parse().expect("LINEAGE_STRESS_SEED is n or n..m");
                (first..end).collect()
            }
            None => vec![seeds.parse().expect("LINEAGE_STRESS_SEED is n or n..m")],
        },
        Err(_) => (1..=CASES).collect(),
    };
    let ops = std::env::var("LINEAGE_STRESS_OPS")
        .map(|n| n.parse().expect("LINEAGE_STRESS_OPS is a number"))
        .unwrap_or(OPS);
    for seed in seeds {
        let case = Case::new(seed, ops).await;
        case.run().await;
    }
}

// ----- one case ---------------------------------------------------------------------------------

/// A child the test knows: its start was accepted.
#[derive(Clone, Copy, Debug)]
struct Child {
    id: SessionId,
    parent: SessionId,
    depth: u32,
}

/// One activation epoch, as the lifecycle listener saw it start.
struct Epoch {
    run: RunId,
    child: SessionId,
    /// The epoch's live agent and how many events it had when the epoch began.
    agent: Option<(Arc<Agent>, usize)>,
}

/// What the lifecycle listener records.
#[derive(Default)]
struct Recorded {
    events: Vec<Lifecycle>,
    epochs: Vec<Epoch>,
    /// For each ended run: how many notices from its child its live parent had received by
    /// then (`None` when the parent was not live).
    notices_at_end: HashMap<RunId, Option<usize>>,
}

/// What an operation came back with.
enum Done {
    Started {
        parent: Arc<Agent>,
        depth: u32,
        cancel: Cancellation,
        result: Result<ContinuableStarted, SubagentError>,
    },
    Sent {
        parent: Arc<Agent>,
        child: SessionId,
        cancel: Cancellation,
        result: Result<MessageId, SubagentError>,
    },
    Drained {
        parent: Arc<Agent>,
        result: Result<(), SubagentError>,
    },
}

/// Counters for the case's summary line.
#[derive(Default, Debug)]
struct Stats {
    starts: usize,
    followups: usize,
    nudges: usize,
    interrupts: usize,
    drains: usize,
    refusals: BTreeMap<&'static str, usize>,
    report_refusals: BTreeMap<String, usize>,
}

struct Case {
    seed: u64,
    ops: usize,
    rng: SplitMix64,
    h: Harness,
    roots: Vec<Arc<Agent>>,
    children: Vec<Child>,
    /// Gates scripts may wait on; opened ones stay in the list.
    gates: Vec<(Gate, bool)>,
    /// Every message id a child accepted, per child.
    accepted: HashMap<SessionId, Vec<MessageId>>,
    pending: Vec<JoinHandle<Done>>,
    recorded: Arc<Mutex<Recorded>>,
    /// One unit per lifecycle event, to wait on.
    ticks: UnboundedReceiver<()>,
    trace: Vec<String>,
    next: usize,
    stats: Stats,
}

impl Drop for Case {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "stress case with seed {} failed after these operations:\n  {}",
                self.seed,
                self.trace.join("\n  ")
            );
        }
    }
}

impl Case {
    async fn new(seed: u64, ops: usize) -> Self {
        let mut rng = SplitMix64::new(seed);
        let h = Harness::new();
        let delivery = if rng.percent(50) {
            ReportDelivery::NextStep
        } else {
            ReportDelivery::Quiet
        };
        h.runtime
            .register_continuable_setup(ReportSetup::new(delivery));
        h.parent_model()
            .push((0..2000).map(|i| Response::text(&format!("parent ok {i}"))));
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let (tx, ticks) = mpsc::unbounded_channel();
        {
            let recorded = recorded.clone();
            let agents = h.agents.clone();
            h.runtime.on_lifecycle(move |event| {
                let mut recorded = lock(&recorded);
                recorded.events.push(event.clone());
                match event {
                    Lifecycle::Start(info) => {
                        let agent = agents
                            .get(info.child)
                            .map(|a| (a.clone(), a.with_events(<[Event]>::len)));
                        recorded.epochs.push(Epoch {
                            run: info.run,
                            child: info.child,
                            agent,
                        });
                    }
                    Lifecycle::End { info, .. } => {
                        let notices = agents
                            .get(info.parent)
                            .map(|p| p.with_events(|events| notices_from(events, info.child)));
                        recorded.notices_at_end.insert(info.run, notices);
                    }
                }
                let _ = tx.send(());
                Ok(())
            });
        }
        let roots = vec![h.parent().await, h.parent().await];
        let gates = (0..GATES).map(|_| (Gate::new(), false)).collect();
        let mut case = Case {
            seed,
            ops,
            rng,
            h,
            roots,
            children: Vec::new(),
            gates,
            accepted: HashMap::new(),
            pending: Vec::new(),
            recorded,
            ticks,
            trace: Vec::new(),
            next: 0,
            stats: Stats::default(),
        };
        case.note(format!("report delivery {delivery:?}"));
        case
    }

    fn note(&mut self, line: String) {
        self.trace.push(line);
    }

    async fn run(mut self) {
        for _ in 0..self.ops {
            match self.rng.weighted(&[18, 30, 12, 10, 12, 4, 8, 5]) {
                Some(0) => self.start().await,
                Some(1) => self.followup().await,
                Some(2) => self.interrupt(),
                Some(3) => self.open_gate(),
                Some(4) => {
                    let n = self.rng.between(1, 30);
                    self.note(format!("yield {n}"));
                    for _ in 0..n {
                        tokio::task::yield_now().await;
                    }
                }
                Some(5) => {
                    self.note("join".into());
                    self.join().await;
                }
                Some(6) => {
                    self.note("run until blocked".into());
                    self.quiesce().await;
                }
                _ => self.drain_one().await,
            }
        }
        self.settle().await;
        self.check().await;
    }

    // ----- operations -------------------------------------------------------------------------

    /// The exact live agent of `id`: a root, or a live child.
    fn live(&self, id: SessionId) -> Option<Arc<Agent>> {
        self.roots
            .iter()
            .find(|r| r.id() == id)
            .cloned()
            .or_else(|| self.h.agents.get(id))
    }

    fn is_root(&self, agent: &Arc<Agent>) -> bool {
        self.roots.iter().any(|r| Arc::ptr_eq(r, agent))
    }

    fn pick_child(&mut self) -> Option<Child> {
        self.rng.pick(&self.children).copied()
    }

    /// Runs `op` now or on its own task, as the seed says.
    async fn dispatch(&mut self, op: impl Future<Output = Done> + Send + 'static) {
        if self.rng.percent(50) {
            let done = within(op).await;
            self.absorb(done);
        } else {
            self.note("  (on its own task)".into());
            self.pending.push(tokio::spawn(op));
        }
    }

    /// Waits for every operation running on its own task.
    async fn join(&mut self) {
        for handle in std::mem::take(&mut self.pending) {
            let done = within(handle).await.expect("an operation task panicked");
            self.absorb(done);
        }
    }

    fn absorb(&mut self, done: Done) {
        match done {
            Done::Started {
                parent,
                depth,
                cancel,
                result,
            } => match result {
                Ok(started) => {
                    self.note(format!("  started {}", started.child));
                    self.children.push(Child {
                        id: started.child,
                        parent: parent.id(),
                        depth,
                    });
                    self.accepted
                        .entry(started.child)
                        .or_default()
                        .push(started.message);
                }
                Err(error) if cancelled(&cancel, &error) => self.count_refusal(&error),
                Err(error) => self.expect_race(&parent, &error, "start"),
            },
            Done::Sent {
                parent,
                child,
                cancel,
                result,
            } => match result {
                Ok(id) => self.accepted.entry(child).or_default().push(id),
                Err(error) if cancelled(&cancel, &error) => self.count_refusal(&error),
                Err(error) => self.expect_race(&parent, &error, "follow-up"),
            },
            Done::Drained { parent, result } => {
                if let Err(error) = result {
                    self.expect_race(&parent, &error, "drain");
                }
            }
        }
    }

    /// A refusal is expected only when the parent was a continuable child that settled (or is
    /// settling) meanwhile, and only with the codes that say so.
    fn expect_race(&mut self, parent: &Arc<Agent>, error: &SubagentError, what: &str) {
        let code = error.code();
        self.note(format!("  {what} from {} refused: {code}", parent.id()));
        let gone = !self.h.agents.is_live(parent) || !self.h.runtime.is_resident(parent.id());
        assert!(
            !self.is_root(parent)
                && gone
                && matches!(
                    code,
                    ErrorCode::ActivationClosing
                        | ErrorCode::Unauthorized
                        | ErrorCode::ParentUnavailable
                ),
            "seed {}: a {what} from {} (root: {}, still resident: {}) was refused: {error} ({code})",
            self.seed,
            parent.id(),
            self.is_root(parent),
            !gone,
        );
        self.count_refusal(error);
    }

    fn count_refusal(&mut self, error: &SubagentError) {
        *self
            .stats
            .refusals
            .entry(error.code().as_str())
            .or_default() += 1;
    }

    /// A cancellation for an operation: sometimes cancelled right after the operation is
    /// dispatched, racing its acceptance.
    fn cancellation(&mut self) -> (Cancellation, bool) {
        (Cancellation::new(), self.rng.percent(15))
    }

    /// Cancels `cancel` after `yields` yields, on its own task.
    fn cancel_later(&mut self, cancel: Cancellation) {
        let yields = self.rng.below(4);
        self.note(format!("  cancelled by its caller after {yields} yield(s)"));
        tokio::spawn(async move {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            cancel.cancel(lineage_log::AbortCause::User);
        });
    }

    /// Runs every task until everything is blocked (waiting on a gate, a parked inbox or
    /// nothing at all): time is paused, so the timeout fires only then.
    async fn quiesce(&mut self) {
        while tokio::time::timeout(Duration::from_secs(1), self.ticks.recv())
            .await
            .is_ok()
        {}
    }

    async fn start(&mut self) {
        if self.children.len() >= MAX_CHILDREN {
            return self.followup().await;
        }
        let mut parents: Vec<(Arc<Agent>, u32)> =
            self.roots.iter().map(|r| (r.clone(), 0)).collect();
        for child in &self.children {
            if child.depth < MAX_DEPTH
                && let Some(agent) = self.h.agents.get(child.id)
            {
                parents.push((agent, child.depth));
            }
        }
        let (parent, depth) = self.rng.pick(&parents).cloned().expect("a root");
        self.next += 1;
        let name = format!("m{}", self.next);
        let closed: Vec<Gate> = self
            .gates
            .iter()
            .filter(|(_, open)| !open)
            .map(|(g, _)| g.clone())
            .collect();
        let script = child_script(&mut self.rng, &closed, &name);
        self.h.model(&name).push(script);
        let provider = if self.rng.percent(30) {
            "fork"
        } else {
            "spawn"
        };
        self.note(format!(
            "start {name} ({provider}) under {} at depth {}",
            parent.id(),
            depth + 1
        ));
        self.stats.starts += 1;
        let (cancel, cancel_it) = self.cancellation();
        let request = ContinuableRequest {
            cancel: cancel.clone(),
            agent_options: ChildOptions {
                model: Some(name.clone().into()),
                ..ChildOptions::default()
            },
            ..ContinuableRequest::new(
                parent.clone(),
                format!("{name} job"),
                format!("{name} task"),
            )
        };
        let started = self.h.runtime.start_continuable(provider, request);
        if cancel_it {
            self.cancel_later(cancel.clone());
        }
        self.dispatch(async move {
            Done::Started {
                parent,
                depth: depth + 1,
                result: started.await,
                cancel,
            }
        })
        .await;
    }

    async fn followup(&mut self) {
        let Some(child) = self.pick_child() else {
            return;
        };
        let Some(parent) = self.live(child.parent) else {
            self.note(format!("follow-up to {}: its parent is gone", child.id));
            return;
        };
        self.next += 1;
        let text = format!("follow-up {}", self.next);
        self.note(format!("{text} to {}", child.id));
        self.stats.followups += 1;
        let (cancel, cancel_it) = self.cancellation();
        if cancel_it {
            self.cancel_later(cancel.clone());
        }
        let runtime = self.h.runtime.clone();
        self.dispatch(async move {
            let result = runtime
                .followup(
                    &parent,
                    child.id,
                    vec![ContentBlock::text(text)],
                    MessageSource::Coordinator {
                        sender: parent.id(),
                    },
                    &cancel,
                )
                .await;
            Done::Sent {
                parent,
                child: child.id,
                cancel,
                result,
            }
        })
        .await;
    }

    /// The live agents above `child`, nearest first.
    fn live_ancestors(&self, child: &Child) -> Vec<Arc<Agent>> {
        let mut out = Vec::new();
        let mut next = Some(child.parent);
        while let Some(id) = next {
            match self.live(id) {
                Some(agent) => out.push(agent),
                None => break,
            }
            next = self.children.iter().find(|c| c.id == id).map(|c| c.parent);
        }
        out
    }

    fn interrupt(&mut self) {
        let Some(child) = self.pick_child() else {
            return;
        };
        let ancestors = self.live_ancestors(&child);
        let authority = match self.rng.pick(&ancestors) {
            Some(agent) if self.rng.percent(50) => Authority::Ancestor(agent.clone()),
            _ => Authority::User {
                parent: child.parent,
            },
        };
        self.note(format!(
            "interrupt {} as {}",
            child.id,
            match &authority {
                Authority::User { .. } => "its user".to_owned(),
                Authority::Ancestor(a) => format!("ancestor {}", a.id()),
            }
        ));
        self.stats.interrupts += 1;
        if let Err(error) = self.h.runtime.interrupt(child.id, &authority) {
            panic!(
                "seed {}: interrupting {} was refused: {error} ({})",
                self.seed,
                child.id,
                error.code()
            );
        }
    }

    fn open_gate(&mut self) {
        let closed: Vec<usize> = (0..self.gates.len())
            .filter(|&i| !self.gates[i].1)
            .collect();
        if let Some(&i) = self.rng.pick(&closed) {
            self.note(format!("open gate {i}"));
            self.gates[i].0.open();
            self.gates[i].1 = true;
            self.gates.push((Gate::new(), false));
        }
    }

    /// Tears down one child with `drain_children`, from its parent. The child may own resident
    /// children of its own, whose notices then reach it in its teardown.
    async fn drain_one(&mut self) {
        let Some(child) = self.pick_child() else {
            return;
        };
        let Some(parent) = self.live(child.parent) else {
            return;
        };
        self.note(format!("drain {} from its parent", child.id));
        self.stats.drains += 1;
        let runtime = self.h.runtime.clone();
        self.dispatch(async move {
            let result = runtime.drain_children(&parent, &[child.id]).await;
            Done::Drained { parent, result }
        })
        .await;
    }

    // ----- settling -----------------------------------------------------------------------------

    /// Runs whose `subagent/start` has no `subagent/end` yet.
    fn open_runs(&self) -> Vec<(RunId, SessionId)> {
        let recorded = lock(&self.recorded);
        let ended: HashSet<RunId> = recorded
            .events
            .iter()
            .filter_map(|e| match e {
                Lifecycle::End { info, .. } => Some(info.run),
                Lifecycle::Start(_) => None,
            })
            .collect();
        recorded
            .epochs
            .iter()
            .filter(|e| !ended.contains(&e.run))
            .map(|e| (e.run, e.child))
            .collect()
    }

    /// Opens every gate, finishes every operation, and lets every child settle, nudging the ones
    /// an interrupt or a failed turn left parked. Fails if something stays resident with nothing
    /// parked.
    async fn settle(&mut self) {
        self.note("settle".into());
        for round in 0.. {
            assert!(
                round < 100,
                "seed {}: settling does not converge",
                self.seed
            );
            for (gate, open) in &mut self.gates {
                gate.open();
                *open = true;
            }
            self.join().await;
            // Wait for lifecycle progress until every run ended or everything is blocked: time
            // is paused, so the timeout fires only when no task can make progress.
            while !self.open_runs().is_empty() {
                match tokio::time::timeout(Duration::from_secs(600), self.ticks.recv()).await {
                    Ok(Some(())) => {}
                    Ok(None) => panic!("the lifecycle listener went away"),
                    Err(_) => break,
                }
            }
            let open = self.open_runs();
            if open.is_empty() {
                break;
            }
            if self.nudge_parked().await == 0 {
                panic!(
                    "seed {}: everything is blocked with {} run(s) open and nothing parked:\n{}",
                    self.seed,
                    open.len(),
                    self.describe(&open)
                );
            }
        }
        for root in &self.roots {
            within(root.when_idle()).await;
        }
        for child in &self.children {
            assert!(
                !self.h.runtime.is_resident(child.id) && self.h.agents.get(child.id).is_none(),
                "seed {}: child {} is still resident or live after settling",
                self.seed,
                child.id
            );
        }
    }

    /// Sends one more follow-up to every idle resident child with parked input. Returns how
    /// many it sent.
    async fn nudge_parked(&mut self) -> usize {
        let mut nudged = 0;
        for child in self.children.clone() {
            let Some(agent) = self.h.agents.get(child.id) else {
                continue;
            };
            if !self.h.runtime.is_resident(child.id)
                || agent.status() != AgentStatus::Idle
                || !agent.has_pending()
            {
                continue;
            }
            let parent = self.live(child.parent).unwrap_or_else(|| {
                panic!(
                    "seed {}: the parent of resident child {} is not live",
                    self.seed, child.id
                )
            });
            self.note(format!("nudge parked {}", child.id));
            let id = within(self.h.runtime.followup(
                &parent,
                child.id,
                vec![ContentBlock::text("nudge")],
                MessageSource::Coordinator {
                    sender: parent.id(),
                },
                &Cancellation::new(),
            ))
            .await
            .unwrap_or_else(|e| panic!("seed {}: a nudge was refused: {e}", self.seed));
            self.accepted.entry(child.id).or_default().push(id);
            self.stats.nudges += 1;
            nudged += 1;
        }
        nudged
    }

    fn describe(&self, open: &[(RunId, SessionId)]) -> String {
        open.iter()
            .map(|(run, child)| {
                let agent = self.h.agents.get(*child);
                format!(
                    "  run {run} of {child}: resident {}, status {:?}, pending {:?}",
                    self.h.runtime.is_resident(*child),
                    agent.as_ref().map(|a| a.status()),
                    agent.as_ref().map(|a| {
                        [
                            lineage_log::InboxTarget::NextTurn,
                            lineage_log::InboxTarget::NextStep,
                        ]
                        .map(|t| a.pending(t).iter().map(Message::text).collect::<Vec<_>>())
                    }),
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    // ----- the properties -----------------------------------------------------------------------

    async fn check(mut self) {
        let seed = self.seed;
        let (events, epochs, notices_at_end) = {
            let mut recorded = lock(&self.recorded);
            (
                std::mem::take(&mut recorded.events),
                std::mem::take(&mut recorded.epochs),
                std::mem::take(&mut recorded.notices_at_end),
            )
        };

        // (4) One start, then one end, per run; a child's epochs never overlap.
        let mut per_run: HashMap<RunId, Vec<&'static str>> = HashMap::new();
        let mut per_child: HashMap<SessionId, Vec<&'static str>> = HashMap::new();
        for event in &events {
            per_run
                .entry(event.info().run)
                .or_default()
                .push(event.name());
            per_child
                .entry(event.info().child)
                .or_default()
                .push(event.name());
        }
        for (run, names) in &per_run {
            assert_eq!(
                names,
                &["subagent/start", "subagent/end"],
                "seed {seed}: run {run}"
            );
        }
        for (child, names) in &per_child {
            for pair in names.chunks(2) {
                assert_eq!(
                    pair,
                    ["subagent/start", "subagent/end"],
                    "seed {seed}: the epochs of {child} overlap: {names:?}"
                );
            }
        }

        // Tear everything down: every inbox is then claimed or discarded.
        within(self.h.runtime.drain())
            .await
            .expect("the final drain succeeds");
        within(self.h.agents.dispose_all()).await;
        assert!(self.h.agents.list().is_empty());

        // (3) Every log is valid and balanced, and the store verifies.
        self.h.assert_verified();
        let sessions: Vec<SessionId> = self
            .h
            .store
            .list()
            .expect("the store lists")
            .into_iter()
            .map(|info| info.header.id)
            .collect();
        let mut logs: HashMap<SessionId, Vec<Event>> = HashMap::new();
        for id in sessions {
            let events = self.h.store.read_from(id, 0).expect("the session reads");
            assert_balanced(&events);
            logs.insert(id, events);
        }

        // Every message any inbox ever held entered a turn's history, was claimed by a turn that
        // did not finish, or was discarded by a cancelling splice.
        let fates: HashMap<SessionId, HashMap<MessageId, Inboxed>> = logs
            .iter()
            .map(|(id, events)| (*id, fates(events)))
            .collect();
        let mut tally: BTreeMap<&'static str, usize> = BTreeMap::new();
        for (session, messages) in &fates {
            for (id, inboxed) in messages {
                *tally.entry(inboxed.fate.name()).or_default() += 1;
                assert!(
                    inboxed.fate.accounted(),
                    "seed {seed}: message {id} ({:?}: {:?}) in {session} was {:?}",
                    inboxed.message.source,
                    inboxed.message.text(),
                    inboxed.fate
                );
            }
        }

        // (1) Every message a child accepted is in its inbox's history, and accounted for.
        let mut accepted_total = 0;
        for (child, ids) in &self.accepted {
            for id in ids {
                accepted_total += 1;
                let inboxed = fates[child].get(id).unwrap_or_else(|| {
                    panic!("seed {seed}: message {id} accepted by {child} never entered its inbox")
                });
                assert!(inboxed.fate.accounted());
            }
        }

        // (1) Every report a parent accepted is in that parent's inbox history, and accounted for.
        let mut reports = 0;
        for child in &self.children {
            for answer in tool_results(own_suffix(&logs[&child.id])) {
                if answer.is_error {
                    let code = answer.code.clone().unwrap_or_default();
                    assert!(
                        code != ErrorCode::Unauthorized.as_str()
                            && code != ErrorCode::ParentUnavailable.as_str(),
                        "seed {seed}: a report of {} was refused: {}",
                        child.id,
                        answer.text
                    );
                    *self.stats.report_refusals.entry(code).or_default() += 1;
                    continue;
                }
                let id: MessageId = answer
                    .text
                    .strip_prefix("The agent that started you accepted the report as message ")
                    .and_then(|rest| rest.strip_suffix('.'))
                    .and_then(|id| id.parse().ok())
                    .unwrap_or_else(|| panic!("an unexpected report result: {}", answer.text));
                let inboxed = fates[&child.parent].get(&id).unwrap_or_else(|| {
                    panic!(
                        "seed {seed}: report {id} of {} never entered the inbox of {}",
                        child.id, child.parent
                    )
                });
                assert_eq!(
                    inboxed.message.source,
                    MessageSource::SubagentReport { sender: child.id }
                );
                reports += 1;
            }
        }

        // (2) One notice per announced epoch, none for an unannounced one: at each epoch's end
        // (the notice goes out before it), the parent holds one more notice from the child than
        // at the previous end exactly when the epoch was announced; and the stored logs agree.
        let mut announced: HashMap<SessionId, usize> = HashMap::new();
        for epoch in &epochs {
            let (agent, boundary) = epoch.agent.as_ref().unwrap_or_else(|| {
                panic!(
                    "seed {seed}: {} was not live when its epoch started",
                    epoch.child
                )
            });
            let ids: HashSet<MessageId> = self
                .accepted
                .get(&epoch.child)
                .into_iter()
                .flatten()
                .copied()
                .collect();
            let took_one = agent.with_events(|events| {
                events[*boundary..].iter().any(|e| match &e.body {
                    EventBody::InboxSpliced(s) => s.inserted.iter().any(|m| ids.contains(&m.id)),
                    _ => false,
                })
            });
            let so_far = announced.entry(epoch.child).or_default();
            *so_far += usize::from(took_one);
            // An unannounced epoch may end after its parent is gone (its start or resume lost a
            // race with the parent's settlement); an announced one is owned by a live parent.
            let at_end = notices_at_end.get(&epoch.run).copied().flatten();
            assert!(
                at_end == Some(*so_far) || (at_end.is_none() && !took_one),
                "seed {seed}: run {} of {} (announced: {took_one}) ended with its parent \
                 holding {at_end:?} notice(s) from it, after {so_far} announced epoch(s)",
                epoch.run,
                epoch.child,
            );
        }
        let mut notices_total = 0;
        for child in &self.children {
            let notices = notices_from(&logs[&child.parent], child.id);
            let expected = announced.get(&child.id).copied().unwrap_or(0);
            assert_eq!(
                notices,
                expected,
                "seed {seed}: child {} has {} epoch(s), {expected} announced, but its parent {} \
                 got {notices} notice(s)",
                child.id,
                epochs.iter().filter(|e| e.child == child.id).count(),
                child.parent
            );
            notices_total += notices;
        }
        let stats = std::mem::take(&mut self.stats);
        eprintln!(
            "seed {seed}: {} children, {} epochs, {accepted_total} accepted, {reports} reports, \
             {notices_total} notices; fates {tally:?}; {stats:?}",
            self.children.len(),
            epochs.len(),
        );
    }
}

/// How many settlement notices from `child` the inbox of the session with `events` received.
fn notices_from(events: &[Event], child: SessionId) -> usize {
    own_suffix(events)
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::InboxSpliced(splice) => Some(&splice.inserted),
            _ => None,
        })
        .flatten()
        .filter(|m| matches!(m.source, MessageSource::SubagentSettled { sender, .. } if sender == child))
        .count()
}

// ----- scripts ----------------------------------------------------------------------------------

/// Whether `error` is the refusal of an operation whose caller cancelled it.
fn cancelled(cancel: &Cancellation, error: &SubagentError) -> bool {
    cancel.is_cancelled() && error.code() == ErrorCode::Cancelled
}

/// A random script for the child model `name`: text answers, reports, truncated answers and
/// failures, a quarter of them held by one of `gates`; then plain answers, so it never runs out.
fn child_script(rng: &mut SplitMix64, gates: &[Gate], name: &str) -> Vec<Response> {
    let mut script = Vec::new();
    for i in 0..40 {
        let response = match rng.weighted(&[55, 27, 8, 5]) {
            Some(0) => Response::text(&format!("{name} answer {i}")),
            Some(1) => Response::tool_call(
                &format!("{name}-r{i}"),
                "report",
                &format!(r#"{{"output":"{name} finding {i}"}}"#),
            ),
            Some(2) => Response::max_tokens(&format!("{name} cut short {i}")),
            _ => Response::error("TEST_FAILURE", "a scripted failure"),
        };
        let gate = rng.pick(gates).filter(|_| rng.percent(25));
        script.push(match gate {
            Some(gate) => response.gated(gate),
            None => response,
        });
    }
    script.extend((0..40).map(|i| Response::text(&format!("{name} closing {i}"))));
    script
}

// ----- inbox accounting -------------------------------------------------------------------------

/// What became of a message an inbox held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Still pending.
    Pending,
    /// Claimed into a turn and entered its history (`user/message`).
    Entered,
    /// Claimed by a turn that ended before its history took it (an interrupt between the claim
    /// and the step); the turn's end accounts for it.
    ClaimedByUnfinishedTurn,
    /// Claimed, and the turn that claimed it completed without it: lost.
    ClaimedAndLost,
    /// Removed by a cancelling splice.
    Discarded,
}

impl Fate {
    fn accounted(self) -> bool {
        matches!(
            self,
            Fate::Entered | Fate::ClaimedByUnfinishedTurn | Fate::Discarded
        )
    }

    fn name(self) -> &'static str {
        match self {
            Fate::Pending => "pending",
            Fate::Entered => "entered",
            Fate::ClaimedByUnfinishedTurn => "claimed-unrun",
            Fate::ClaimedAndLost => "lost",
            Fate::Discarded => "discarded",
        }
    }
}

struct Inboxed {
    message: Message,
    fate: Fate,
}

/// Replays the inbox splices of a session's own events and says what became of each message.
fn fates(events: &[Event]) -> HashMap<MessageId, Inboxed> {
    let mut inbox = Inbox::new();
    let mut out: HashMap<MessageId, Inboxed> = HashMap::new();
    let mut claimed: Vec<MessageId> = Vec::new();
    for event in own_suffix(events) {
        match &event.body {
            EventBody::InboxSpliced(splice) => {
                inbox
                    .check(splice)
                    .unwrap_or_else(|e| panic!("seq {}: the splice replays: {e}", event.seq));
                let removed = inbox.apply(splice);
                for message in &splice.inserted {
                    out.insert(
                        message.id,
                        Inboxed {
                            message: message.clone(),
                            fate: Fate::Pending,
                        },
                    );
                }
                for message in removed {
                    let inboxed = out
                        .get_mut(&message.id)
                        .expect("a removed message was inserted");
                    if splice.canceled {
                        inboxed.fate = Fate::Discarded;
                    } else {
                        inboxed.fate = Fate::ClaimedAndLost;
                        claimed.push(message.id);
                    }
                }
            }
            EventBody::UserMessage(message) => {
                if let Some(inboxed) = out.get_mut(&message.id) {
                    inboxed.fate = Fate::Entered;
                }
            }
            EventBody::TurnEnd(end) => {
                for id in claimed.drain(..) {
                    let inboxed = out.get_mut(&id).expect("claimed messages are known");
                    if inboxed.fate == Fate::ClaimedAndLost
                        && end.reason != TurnEndReason::Completed
                    {
                        inboxed.fate = Fate::ClaimedByUnfinishedTurn;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

// ----- regressions the stress test found --------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_drained_child_is_not_woken_into_a_new_turn_by_its_own_childs_notice() {
    let h = Harness::new();
    h.model("a")
        .push([Response::text("a waits for b"), Response::text("a woken")]);
    h.model("b").push([Response::hang()]);
    h.parent_model().push((0..4).map(|_| Response::text("ok")));
    let root = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let a = spawn_continuable(&h.runtime, &root, "a", "start b").await;
    let agent_a = h.agents.get(a.child).unwrap();
    spawn_continuable(&h.runtime, &agent_a, "b", "work").await;
    within(agent_a.when_idle()).await;
    // A is waiting on B; its parent tears it down, B first.
    assert!(h.runtime.is_resident(a.child));
    within(h.runtime.drain_children(&root, &[a.child]))
        .await
        .unwrap();
    // B's notice reached A while A was being torn down. It must not start a turn there: A's
    // teardown would wait for a whole model turn (forever, if that request never answers).
    assert_eq!(
        h.model("a").requests().len(),
        1,
        "A ran a new turn during its own teardown: {:?}",
        user_texts(&agent_a.events())
    );
    let ends: Vec<_> = drain(&mut life)
        .into_iter()
        .filter_map(|e| match e {
            Lifecycle::End {
                info,
                last_assistant_message,
                ..
            } if info.child == a.child => Some(last_assistant_message),
            _ => None,
        })
        .collect();
    assert_eq!(ends, [Some(vec![ContentBlock::text("a waits for b")])]);
}
