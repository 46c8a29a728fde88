//! [`Agent`]: one session's live agent. This file holds the type, the state behind its lock, its
//! construction, what it was built with and its budgets; each job has a file of its own:
//!
//! | file | job |
//! |---|---|
//! | `log` | appending events (the one path by which events reach memory and the store), flushing, reading the log |
//! | `inbox` | the inbox's live side: sending (admission), claims and requeues, each a logged splice |
//! | `driver` | the phase: waking a driver, the hand-over from turn to turn, cancelling, going idle; [`Driver`], the turn loop's interface to its agent |
//! | `events` | what observers see: [`AgentEvent`]s, the change counter, diagnostics |
//! | `ownership` | the agent's ownership of its session in the store, and being fenced off it |
//! | `dispose` | the one shared disposal and its final flush |
//!
//! The turn loop that a driver runs lives in `turn`, and reaches the agent only through
//! [`Driver`].
//!
//! # Locks
//!
//! The state lock (`Agent::state`) guards everything that must change together: the log, the
//! inbox, the phase and the subscribers. While it is held the agent may take, inside calls it
//! makes, a meter's count, its registry's `slots` and `watchers` locks and the store's own locks;
//! none of those ever waits for an agent's state lock, so they always come after it. The agent's
//! other locks (its tools, its disposal, its injected flush fault, its ownership) are each taken
//! alone, never while another lock of the agent is held, and none is held across an `.await`.

mod dispose;
mod driver;
mod events;
mod inbox;
mod log;
mod ownership;

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use lineage_log::{BudgetReached, Header, Log, SessionId, Text, own_suffix};
use lineage_store::{SessionOwner, Store};
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::budget::{Budget, BudgetUse, Meter};
use crate::inbox::Inbox;
use crate::registry::Registry;
use crate::{AgentError, Hooks, Model, Prompt, Toolset};

pub use dispose::FlushFault;
pub use driver::Queued;
pub(crate) use driver::{Driver, Opened};
pub use events::{AgentEvent, AgentStatus};
pub(crate) use inbox::Claimed;

use dispose::Disposal;
use driver::Phase;
use events::Subscribers;
use ownership::Ownership;

/// An agent's model options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentOptions {
    /// The model endpoint the agent's requests name.
    pub endpoint: Option<Text>,
    /// The model the agent's requests name.
    pub model: Option<Text>,
    /// The most output tokens per request: a positive number, when set.
    pub max_tokens: Option<u32>,
    /// The delegation depth the runtime asks for. The depth in force is the larger of this and
    /// the depth the session's own lineage records, so no option can lower a stored depth.
    pub subagent_depth: u32,
}

/// Everything behind the state lock, by the file whose job changes it.
struct State {
    /// `log`: the session's events, mirrored to the store.
    log: Log,
    /// `inbox`: the pending input, replayed from the log's splices.
    inbox: Inbox,
    /// `driver`: whether a driver runs turns.
    phase: Phase,
    /// `dispose`: disposal has begun; nothing wakes the agent any more.
    disposing: bool,
    /// `dispose`: disposed without having written anything: the store forgot the session and its
    /// id is free, so nothing more may be appended under it.
    released: bool,
    /// `ownership`: why the agent stopped writing for good (its lease was lost, or the store
    /// does not hold its log): it writes nothing more and disposes of itself.
    stopped: Option<ownership::Stopped>,
    /// `events`: who hears the agent's events.
    subscribers: Subscribers,
}

/// What an agent runs with besides its log: fixed at creation or resume.
pub(crate) struct Config {
    pub model: Arc<dyn Model>,
    pub prompt: Arc<Prompt>,
    pub persona: Option<Text>,
    pub context: Vec<Text>,
    pub hooks: Arc<dyn Hooks>,
    pub max_parallel_tools: usize,
}

/// An agent: one session's inbox, turn loop and log. Shared as `Arc<Agent>`; the registry's `Arc`
/// is the live agent, and identity (`Arc::ptr_eq`) is what authority checks compare.
pub struct Agent {
    id: SessionId,
    header: Header,
    options: AgentOptions,
    store: Store,
    runtime: Handle,
    config: Config,
    /// The budgets in force: the agent's own first, if it has one, then those of ancestors
    /// that bind their delegation trees. Each is charged by every event this agent appends.
    meters: Vec<Arc<Meter>>,
    tools: Mutex<Arc<Toolset>>,
    state: Mutex<State>,
    /// `true` while no driver runs. Set `false` synchronously when a wake starts one, and `true`
    /// only when a driver exits with no replacement, so `when_idle` follows replacement drivers.
    idle: watch::Sender<bool>,
    /// Bumped on every status change and inbox change (see [`Agent::changes`]).
    changes: watch::Sender<u64>,
    disposal: Disposal,
    registry: Weak<Registry>,
    /// The agent's ownership of its session in the store, held until disposal ends: while it is
    /// held, `Store::load` never repairs the session underneath the agent.
    ownership: Ownership,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("id", &self.id)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent before anything that could panic (the
    // log is checked before it is changed), so a poisoned lock still guards valid data.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Agent {
    /// Builds an idle agent over `log`, replaying the inbox from its own suffix.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        header: Header,
        options: AgentOptions,
        log: Log,
        config: Config,
        meters: Vec<Arc<Meter>>,
        tools: Toolset,
        store: Store,
        runtime: Handle,
        registry: Weak<Registry>,
        owner: SessionOwner,
    ) -> Result<Arc<Agent>, AgentError> {
        let id = header.id;
        let inbox = Inbox::replay(own_suffix(log.events())).map_err(|(seq, reason)| {
            AgentError::InvalidInboxSplice {
                agent: id,
                seq,
                reason,
            }
        })?;
        let last_turn = log.structure().last_turn();
        Ok(Arc::new(Agent {
            id,
            header,
            options,
            store,
            runtime,
            config,
            meters,
            tools: Mutex::new(Arc::new(tools)),
            state: Mutex::new(State {
                log,
                inbox,
                phase: Phase::Idle { last_turn },
                disposing: false,
                released: false,
                stopped: None,
                subscribers: Subscribers::default(),
            }),
            idle: watch::Sender::new(true),
            changes: watch::Sender::new(0),
            disposal: Disposal::default(),
            registry,
            ownership: Ownership::new(owner),
        }))
    }

    /// The agent's own budget (see [`AgentSpec::budget`](crate::AgentSpec::budget)) and what
    /// it has counted, if it has one.
    pub fn budget(&self) -> Option<(Budget, BudgetUse)> {
        self.meters
            .first()
            .filter(|m| m.owner() == self.id)
            .map(|m| (m.budget(), m.used()))
    }

    /// The first limit reached among the budgets in force (its own and those binding its
    /// delegation tree), if any: the agent's next model request would be refused.
    pub fn budget_reached(&self) -> Option<BudgetReached> {
        self.meters.iter().find_map(|m| m.reached())
    }

    /// The budgets a child of this agent is bound by: its own if it binds the tree, and those
    /// that bind this agent's.
    pub(crate) fn tree_meters(&self) -> Vec<Arc<Meter>> {
        self.meters
            .iter()
            .filter(|m| m.binds_tree())
            .cloned()
            .collect()
    }

    /// The agent's id, which is its session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The session header the agent was created or resumed with.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The agent's options.
    pub fn options(&self) -> &AgentOptions {
        &self.options
    }

    /// The store the agent writes to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The agent's tools, as the turn loop sees them now (empty once the agent is disposed).
    pub fn toolset(&self) -> Arc<Toolset> {
        lock(&self.tools).clone()
    }
}
