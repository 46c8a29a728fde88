//! The continuation manager: continuable children that live on between turns of their parent.
//!
//! [`Continuation`] owns the manager's state: the resident activations, the activations being
//! made resident, the admission state drains set, and one lock per child. It holds the handles
//! its operations need of the runtime (the registry, the lifecycle listeners, the mailbox); what
//! else an operation needs (the setup contributions, a provider) its caller passes. Each module
//! is one concern, its operations on the type whose state they change:
//!
//! | module | operations |
//! |---|---|
//! | [`entry`] | the runtime's public continuation methods, each delegating to the manager |
//! | [`admission`] | who may do what ([`admission::Admission`]: draining, closing scopes), the exact live parent, fresh ids, the child locks |
//! | [`activation`] | `start_continuable`, and making a child resident (created or resumed) or rolling it back ([`Activation`]) |
//! | [`delivery`] | follow-ups (one route: resident here, kept by another host, or cold resume), interrupts, reports |
//! | [`teardown`] | an [`Activation`]'s settlement watcher, its teardown children first, its settlement notice |
//! | [`drain`] | `drain`, `drain_descendants`, `drain_children` |
//! | [`mail`] | the [`mail::Mailbox`]: delivery to agents another host keeps, through a shared store |
//!
//! # Residency
//!
//! A child is *resident* while it has an [`Activation`]: at most one per child session, holding
//! the live agent. A resident child moves one way through these states:
//!
//! - *running* while its agent runs or a waking message it accepted is not yet claimed,
//! - *waiting* while it is quiescent but owns resident children of its own,
//! - *settled* otherwise, and then it is *torn down*, children first: cancel, wait, capture what
//!   the epoch produced, dispose of the agent (its final flush included), forget the activation,
//!   send the parent the settlement notice, release the parent's ownership, emit `subagent/end`.
//!
//! A waiting child that accepts a follow-up is running again in the same activation; once its
//! teardown has opened (the admission cutoff) nothing is accepted, and a later follow-up resumes
//! the child from its log alone ("cold resume"): its descriptor, depth and policy are folded from
//! its own events and no provider is consulted.
//!
//! # Locks
//!
//! Taken in this order, never the other way round:
//!
//! 1. the per-child lock (a `tokio` mutex from `Continuation::locks`, held across awaits by one
//!    operation on one child: a start, each follow-up, each settlement decision, in the order
//!    they asked for it); different children never wait for each other, and only recovery
//!    holds two: a child resumed under its lock recovers its own torn children, taking each
//!    one's lock while holding its own, parent before child. That cannot cycle: the stored
//!    lineage is a tree, and nothing takes a parent's lock while holding its child's;
//! 2. `Continuation::state` (a std mutex, short sections, never across an `.await`);
//! 3. an activation's `st` (a std mutex, short sections, never across an `.await`); `state` is
//!    released before several activations' `st` are taken one after another;
//! 4. the agent layer's own locks (the registry, an agent's state), which its calls take inside
//!    2 or 3 (a liveness check, a status); the agent layer never calls back into the manager.
//!
//! A teardown that fails (a child's teardown, or the agent's disposal: a failed final flush)
//! still runs to its end; the epoch then counts as failed (`error`, the "failed" notice) and the
//! teardown reports `ACTIVATION_TEARDOWN_FAILED`. Failures of best-effort work (a teardown, an
//! undelivered notice, a failed cancel) are also reported to the registry's watchers as
//! diagnostics. The notice goes out before ownership is released, so a parent waiting on its
//! children can never be judged settled with a notice still to come.

mod activation;
mod admission;
mod delivery;
mod drain;
mod entry;
mod mail;
mod recovery;
mod request;
mod teardown;

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use lineage_agent::{Agent, AgentStatus, Agents};
use lineage_log::{MessageId, SessionId};
use tokio::sync::{OwnedMutexGuard, watch};

pub(crate) use admission::is_live_agent;
pub use mail::{MAIL_DISCARDED_EVENT, MAIL_POLL};
pub use request::{
    Authority, ContinuableRequest, ContinuableStarted, FollowupRequest, ReportDelivery,
};

use crate::lifecycle::{Listeners, RunInfo};
use crate::{ErrorCode, SubagentError, lock};
use admission::Admission;
use mail::Mailbox;

/// A teardown's outcome, once it has one.
type Disposal = watch::Receiver<Option<Result<(), SubagentError>>>;

/// The continuation manager: its state and the handles its operations need. One per runtime,
/// shared with the tasks it runs (settlement watchers, teardowns, posts).
pub(crate) struct Continuation {
    /// The registry every parent and child lives in.
    agents: Agents,
    /// The shared store's mailbox, for agents another host keeps.
    mailbox: Mailbox,
    /// The runtime's lifecycle listeners, told of every epoch's start and end.
    listeners: Arc<Listeners>,
    state: Mutex<State>,
    /// One lock per child with operations in flight (removed when nobody holds or waits on it).
    locks: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
    /// The runtime this manager serves. A task the manager starts (a settlement watcher, a
    /// teardown) holds it while it runs, so the runtime's other parts (its providers, its
    /// background jobs and their watcher) outlive a teardown under way even when the host has
    /// dropped every handle to the runtime. Weak here: the runtime owns the manager.
    runtime: Weak<dyn Any + Send + Sync>,
}

#[derive(Default)]
struct State {
    activations: HashMap<SessionId, Arc<Activation>>,
    /// Creations and resumes under way, with the live lineage of their parent, until the
    /// activation is resident or rolled back.
    pending: HashMap<u64, PendingActivation>,
    next_pending: u64,
    admission: Admission,
}

struct PendingActivation {
    lineage: Vec<Arc<Agent>>,
    settled: watch::Receiver<bool>,
}

/// One residency epoch of a continuable child.
pub(crate) struct Activation {
    agent: Arc<Agent>,
    /// The child and the live lineage of its parent when it became resident: who may interrupt.
    ancestry: Vec<Weak<Agent>>,
    /// This epoch's identity in lifecycle events; its `parent` is the durable direct parent.
    run: RunInfo,
    /// Where this epoch's own events start.
    boundary: usize,
    /// The child's delegation depth: deeper than every ancestor's, so teardowns opened in this
    /// order cancel parents before children.
    depth: u32,
    st: Mutex<ActivationState>,
    /// Bumped on every change the settlement watcher must look at.
    poke: watch::Sender<u64>,
}

#[derive(Default)]
struct ActivationState {
    /// Resident children this one owns; while any remain, it cannot settle.
    owned: HashSet<SessionId>,
    /// Waking messages accepted and not yet claimed or discarded.
    accepted: HashSet<MessageId>,
    /// Whether a delivery was ever accepted (the caller was told the child exists).
    announced: bool,
    /// Set once teardown begins: the admission cutoff.
    disposal: Option<Disposal>,
}

impl Activation {
    fn child(&self) -> SessionId {
        self.run.child
    }

    fn poke(&self) {
        self.poke.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn is_closing(&self) -> bool {
        lock(&self.st).disposal.is_some()
    }

    fn in_ancestry(&self, agent: &Arc<Agent>) -> bool {
        self.ancestry
            .iter()
            .any(|w| w.upgrade().is_some_and(|a| Arc::ptr_eq(&a, agent)))
    }

    /// Accepted input an idle child holds (parked by an interrupt) keeps it resident for its
    /// next wake, unless a budget in force refuses every request: then nothing can run it, and
    /// the child settles with the input parked in its durable inbox. So does a child whose agent
    /// stopped for good (its lease lost, or its log not the store's): it runs nothing more here,
    /// and its accepted input, durable in its log, is run by whoever resumes it next.
    fn residency(&self) -> Residency {
        if self.agent.is_stopped() && self.agent.status() != AgentStatus::Running {
            return Residency::Settled;
        }
        let mut st = lock(&self.st);
        st.accepted.retain(|id| self.agent.is_pending(*id));
        let parked_work = !st.accepted.is_empty() && self.agent.budget_reached().is_none();
        if self.agent.status() == AgentStatus::Running || parked_work {
            Residency::Running
        } else if !st.owned.is_empty() {
            Residency::Waiting
        } else {
            Residency::Settled
        }
    }
}

/// Where a resident child stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Residency {
    Running,
    Waiting,
    Settled,
}

/// Held while an operation on one child runs.
struct ChildGuard<'a> {
    guard: Option<OwnedMutexGuard<()>>,
    child: SessionId,
    manager: &'a Continuation,
}

impl Drop for ChildGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = lock(&self.manager.locks);
        if locks
            .get(&self.child)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(&self.child);
        }
    }
}

fn unauthorized(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::Unauthorized, message)
}

fn teardown_failed(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::ActivationTeardownFailed, message)
}

impl Continuation {
    /// A manager for the agents of `agents`, with nothing resident, telling `listeners` of its
    /// epochs.
    pub(crate) fn new(
        agents: Agents,
        listeners: Arc<Listeners>,
        runtime: Weak<dyn Any + Send + Sync>,
    ) -> Self {
        Continuation {
            mailbox: Mailbox::new(agents.clone()),
            agents,
            listeners,
            state: Mutex::default(),
            locks: Mutex::default(),
            runtime,
        }
    }

    /// A hold on the runtime for a task about to start (see `runtime`); `None` once it is gone.
    fn hold_runtime(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.runtime.upgrade()
    }

    /// The resident activation of `child`, if any (being torn down included).
    fn activation(&self, child: SessionId) -> Option<Arc<Activation>> {
        lock(&self.state).activations.get(&child).cloned()
    }

    /// Every resident activation.
    fn activations(&self) -> Vec<Arc<Activation>> {
        lock(&self.state).activations.values().cloned().collect()
    }

    /// Makes `activation` the resident one of its child.
    fn publish(&self, activation: Arc<Activation>) {
        lock(&self.state)
            .activations
            .insert(activation.child(), activation);
    }

    /// Forgets `activation`, unless another activation of its child has replaced it.
    fn forget(&self, activation: &Arc<Activation>) {
        let mut st = lock(&self.state);
        if st
            .activations
            .get(&activation.child())
            .is_some_and(|a| Arc::ptr_eq(a, activation))
        {
            st.activations.remove(&activation.child());
        }
    }

    /// Records that `parent` owns `child`, when `parent` is itself resident; refused while the
    /// parent's own teardown is open.
    fn acquire_ownership(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
    ) -> Result<(), SubagentError> {
        if let Some(owner) = self.activation(parent.id()) {
            let mut st = lock(&owner.st);
            if st.disposal.is_some() {
                return Err(SubagentError::new(
                    ErrorCode::ActivationClosing,
                    format!(
                        "subagent parent {} is being disposed; the child was not established",
                        parent.id()
                    ),
                ));
            }
            st.owned.insert(child);
        }
        Ok(())
    }

    /// Releases every resident activation's ownership of `child`, poking the owners.
    fn release_ownership(&self, child: SessionId) {
        for owner in self.activations() {
            if lock(&owner.st).owned.remove(&child) {
                owner.poke();
            }
        }
    }

    /// The activations no other resident activation owns.
    fn roots(&self) -> Vec<Arc<Activation>> {
        let activations = self.activations();
        let owned: HashSet<SessionId> = activations
            .iter()
            .flat_map(|a| lock(&a.st).owned.iter().copied().collect::<Vec<_>>())
            .collect();
        activations
            .into_iter()
            .filter(|a| !owned.contains(&a.child()))
            .collect()
    }

    /// The children resident now (running, waiting, or being torn down).
    fn resident(&self) -> Vec<SessionId> {
        lock(&self.state).activations.keys().copied().collect()
    }

    /// Whether a child in the delegation tree of the exact live agent `ancestor` is resident
    /// (being torn down included) or being made resident.
    fn has_resident_under(&self, ancestor: &Arc<Agent>) -> bool {
        let st = lock(&self.state);
        st.activations
            .values()
            .any(|a| !Arc::ptr_eq(&a.agent, ancestor) && a.in_ancestry(ancestor))
            || st
                .pending
                .values()
                .any(|p| p.lineage.iter().any(|a| Arc::ptr_eq(a, ancestor)))
    }

    /// Whether `child` has a resident activation (running or waiting).
    fn is_resident(&self, child: SessionId) -> bool {
        self.activation(child).is_some_and(|a| !a.is_closing())
    }
}
