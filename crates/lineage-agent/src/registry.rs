//! [`Agents`]: the registry of live agents. It creates agents (writing their first events in a
//! window where nothing is published), resumes them from the store, hands out the exact live
//! `Arc`, and forgets them when they are disposed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lineage_log::{
    Custom, Event, EventBody, ForkSpec, Header, Log, SessionId, Text, ToolFilter, setup_events,
};
use lineage_store::{SessionOwner, Store, StoreError};
use tokio::runtime::Handle;

use crate::agent::{Config, lock};
use crate::budget::{self, Budget, BudgetUse, Meter};
use crate::inbox::Inbox;
use crate::{
    Agent, AgentError, AgentOptions, Diagnostic, Hooks, Model, NoHooks, Prompt, RegistryEvent,
    Tool, Toolset,
};

/// How many tool calls of one step may run at once, unless an agent says otherwise.
pub const DEFAULT_MAX_PARALLEL_TOOLS: usize = 10;

/// What an agent runs with, besides its log: given at creation and again at each resume.
#[derive(Clone)]
pub struct AgentSpec {
    /// Model options.
    pub options: AgentOptions,
    /// The agent's tools.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Which of them the model may use.
    pub tool_filter: Option<ToolFilter>,
    /// A persona that shadows the host prompt's default persona.
    pub persona: Option<Text>,
    /// Runtime-context statements that close the system prompt.
    pub context: Vec<Text>,
    /// Turn-loop hooks (none by default).
    pub hooks: Option<Arc<dyn Hooks>>,
    /// A model for this agent instead of the registry's.
    pub model: Option<Arc<dyn Model>>,
    /// How many tool calls of one step may run at once (at least 1).
    pub max_parallel_tools: usize,
    /// A budget for the agent (and, for a [`Budget::tree`], every agent it delegates to).
    /// Recorded in the log when the agent is created; on a resume, a budget other than the
    /// recorded one is recorded anew (counting starts again from there), and `None` keeps the
    /// recorded one in force.
    pub budget: Option<Budget>,
}

impl Default for AgentSpec {
    fn default() -> Self {
        AgentSpec {
            options: AgentOptions::default(),
            tools: Vec::new(),
            tool_filter: None,
            persona: None,
            context: Vec::new(),
            hooks: None,
            model: None,
            max_parallel_tools: DEFAULT_MAX_PARALLEL_TOOLS,
            budget: None,
        }
    }
}

impl AgentSpec {
    /// A spec whose requests name `endpoint` and `model` (which configured model service
    /// answers, and which of its models), with the defaults for everything else.
    pub fn new(endpoint: impl Into<Text>, model: impl Into<Text>) -> Self {
        AgentSpec {
            options: AgentOptions {
                endpoint: Some(endpoint.into()),
                model: Some(model.into()),
                ..AgentOptions::default()
            },
            ..AgentSpec::default()
        }
    }
}

impl std::fmt::Debug for AgentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSpec")
            .field("options", &self.options)
            .field(
                "tools",
                &self.tools.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .field("tool_filter", &self.tool_filter)
            .field("persona", &self.persona)
            .field("context", &self.context)
            .field("max_parallel_tools", &self.max_parallel_tools)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// Where a new agent's history comes from.
#[derive(Clone, Debug)]
pub enum Seed {
    /// Nothing: a fresh session.
    Fresh,
    /// These events, which must keep the seed contract (seqs from 0, a valid log).
    Events(Vec<Event>),
    /// A stored session's completed prefix, copied in the store (see `Store::fork_with_setup`):
    /// the new session's `session/lineage` records `parent`, the seed length and digest, and
    /// `delegation_depth`.
    Fork {
        /// The session to fork.
        parent: SessionId,
        /// The inclusive seq to fork at; `None` forks the whole log, which must be balanced.
        boundary: Option<u64>,
        /// The new session's delegation depth.
        delegation_depth: u32,
    },
}

/// Everything `create` needs.
#[derive(Clone, Debug)]
pub struct CreateAgent {
    /// The new session's header. For a fork only its id, creation time and agent preset are
    /// used: `cwd` is the parent's and the rest is folded from the fork's lineage.
    pub header: Header,
    /// The history it starts from.
    pub seed: Seed,
    /// Events written after the seed in the same transaction: a child's `session/lineage` (for
    /// a fresh or events seed), its `subagent/descriptor`, delegated policy overrides.
    pub setup: Vec<EventBody>,
    /// What it runs with.
    pub spec: AgentSpec,
}

impl CreateAgent {
    /// A fresh top-level agent with `spec`.
    pub fn fresh(spec: AgentSpec) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        CreateAgent {
            header: Header::new(SessionId::new(), now),
            seed: Seed::Fresh,
            setup: Vec::new(),
            spec,
        }
    }
}

enum Slot {
    /// An id being created or resumed: not visible yet, but taken.
    Reserved,
    Live(Arc<Agent>),
}

/// The registry's shared state; agents hold a weak reference to leave it when disposed.
pub(crate) struct Registry {
    store: Store,
    model: Arc<dyn Model>,
    prompt: Arc<Prompt>,
    slots: Mutex<HashMap<SessionId, Slot>>,
    watchers: Mutex<Vec<tokio::sync::mpsc::UnboundedSender<RegistryEvent>>>,
}

impl Registry {
    /// Sends `event` to every watcher still listening.
    pub(crate) fn broadcast(&self, event: RegistryEvent) {
        lock(&self.watchers).retain(|w| w.send(event.clone()).is_ok());
    }

    /// The live agent that is `agent` (the same allocation), if it still is.
    pub(crate) fn live(&self, agent: &Agent) -> Option<Arc<Agent>> {
        match lock(&self.slots).get(&agent.id()) {
            Some(Slot::Live(live)) if std::ptr::eq(Arc::as_ptr(live), agent) => Some(live.clone()),
            _ => None,
        }
    }

    /// Forgets `agent`, if it is still the live agent under its id.
    pub(crate) fn remove(&self, agent: &Arc<Agent>) {
        let mut slots = lock(&self.slots);
        if matches!(slots.get(&agent.id()), Some(Slot::Live(live)) if Arc::ptr_eq(live, agent)) {
            slots.remove(&agent.id());
        }
    }
}

/// Frees a reserved id unless the reservation was published.
struct Reservation<'a> {
    registry: &'a Arc<Registry>,
    id: SessionId,
    published: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.published {
            let mut slots = lock(&self.registry.slots);
            if matches!(slots.get(&self.id), Some(Slot::Reserved)) {
                slots.remove(&self.id);
            }
        }
    }
}

/// The registry of live agents over one store.
#[derive(Clone)]
pub struct Agents {
    inner: Arc<Registry>,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents")
            .field("store", &self.inner.store)
            .field("live", &self.list().len())
            .finish()
    }
}

impl Agents {
    /// A registry whose agents persist to `store` and ask `model` unless their spec names another.
    pub fn new(store: Store, model: Arc<dyn Model>) -> Self {
        Self::with_prompt(store, model, Prompt::new())
    }

    /// [`Agents::new`] with the host's system prompt.
    pub fn with_prompt(store: Store, model: Arc<dyn Model>, prompt: Prompt) -> Self {
        let inner = Arc::new(Registry {
            store,
            model,
            prompt: Arc::new(prompt),
            slots: Mutex::new(HashMap::new()),
            watchers: Mutex::new(Vec::new()),
        });
        // A live agent whose lease the store lost stops and leaves the registry, also one that
        // is idle and would never write to learn of it.
        let registry = Arc::downgrade(&inner);
        inner.store.watch_leases(move |session, loss| {
            let Some(registry) = registry.upgrade() else {
                return;
            };
            let live = match lock(&registry.slots).get(&session) {
                Some(Slot::Live(agent)) => Some(agent.clone()),
                _ => None,
            };
            if let Some(agent) = live {
                agent.on_lease_lost(loss);
            }
        });
        Agents { inner }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// A stream of what happens to the registry from now on, in order: agents created, resumed
    /// and disposed, and diagnostics (failed best-effort work of its agents, and whatever is
    /// [reported](Agents::report)). Nothing is dropped; the stream never ends while the
    /// registry lives.
    pub fn subscribe(&self) -> tokio::sync::mpsc::UnboundedReceiver<RegistryEvent> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        lock(&self.inner.watchers).push(tx);
        rx
    }

    /// Publishes `diagnostic` to the registry's watchers: for runtimes built over the registry
    /// (such as the subagent runtime) whose best-effort work failed.
    pub fn report(&self, diagnostic: Diagnostic) {
        tracing::warn!(agent = %diagnostic.agent, kind = ?diagnostic.kind, reason = %diagnostic.reason, "best-effort work failed");
        self.inner.broadcast(RegistryEvent::Diagnostic(diagnostic));
    }

    /// The live agent with id `id`: the exact `Arc` the registry holds.
    pub fn get(&self, id: SessionId) -> Option<Arc<Agent>> {
        match lock(&self.inner.slots).get(&id) {
            Some(Slot::Live(agent)) => Some(agent.clone()),
            _ => None,
        }
    }

    /// Whether `agent` is the live agent under its id (not a stale handle with the same id).
    pub fn is_live(&self, agent: &Arc<Agent>) -> bool {
        self.get(agent.id())
            .is_some_and(|live| Arc::ptr_eq(&live, agent))
    }

    /// Every live agent, in no particular order.
    pub fn list(&self) -> Vec<Arc<Agent>> {
        lock(&self.inner.slots)
            .values()
            .filter_map(|slot| match slot {
                Slot::Live(agent) => Some(agent.clone()),
                Slot::Reserved => None,
            })
            .collect()
    }

    fn reserve(&self, id: SessionId) -> Result<Reservation<'_>, AgentError> {
        let mut slots = lock(&self.inner.slots);
        if slots.contains_key(&id) {
            return Err(AgentError::AlreadyLive { agent: id });
        }
        slots.insert(id, Slot::Reserved);
        Ok(Reservation {
            registry: &self.inner,
            id,
            published: false,
        })
    }

    /// Builds the idle agent over `log`, bound by its own budget's meter and its live parent's
    /// tree budgets, and makes it the live agent under its reserved id.
    fn publish(
        &self,
        (mut reservation, owner): (Reservation<'_>, SessionOwner),
        header: Header,
        options: AgentOptions,
        (log, own_meter): (Log, Option<Arc<Meter>>),
        (config, tools): (Config, Toolset),
        resumed: bool,
    ) -> Result<Arc<Agent>, AgentError> {
        let id = header.id;
        // A child is bound by the tree budgets of its live parent, which a child's parent
        // always is when the child is created or resumed through delegation.
        let inherited = header
            .parent
            .and_then(|parent| self.get(parent))
            .map(|parent| parent.tree_meters())
            .unwrap_or_default();
        let meters = own_meter.into_iter().chain(inherited).collect();
        let agent = Agent::new(
            header,
            options,
            log,
            config,
            meters,
            tools,
            self.inner.store.clone(),
            Handle::current(),
            Arc::downgrade(&self.inner),
            owner,
        )?;
        lock(&self.inner.slots).insert(agent.id(), Slot::Live(agent.clone()));
        reservation.published = true;
        self.inner.broadcast(if resumed {
            RegistryEvent::Resumed { agent: id }
        } else {
            RegistryEvent::Created { agent: id }
        });
        Ok(agent)
    }

    fn config(&self, id: SessionId, spec: &AgentSpec) -> Result<(Config, Toolset), AgentError> {
        if spec.options.max_tokens == Some(0) {
            return Err(AgentError::InvalidOption {
                agent: id,
                field: "max_tokens",
                reason: "must be a positive number".into(),
            });
        }
        if spec.max_parallel_tools == 0 {
            return Err(AgentError::InvalidOption {
                agent: id,
                field: "max_parallel_tools",
                reason: "must be at least 1".into(),
            });
        }
        let tools = Toolset::new(id, spec.tools.clone(), spec.tool_filter.clone())?;
        let config = Config {
            model: spec
                .model
                .clone()
                .unwrap_or_else(|| self.inner.model.clone()),
            prompt: self.inner.prompt.clone(),
            persona: spec.persona.clone(),
            context: spec.context.clone(),
            hooks: spec.hooks.clone().unwrap_or_else(|| Arc::new(NoHooks)),
            max_parallel_tools: spec.max_parallel_tools,
        };
        Ok((config, tools))
    }

    /// Creates an agent and publishes it, idle.
    ///
    /// Everything that can be checked is checked before anything is written: the id is not
    /// live, the options and tools are valid, the seed and setup events form a valid log whose
    /// inbox replays. Then the seed and setup are written in one store transaction (a fork copies
    /// its prefix in that transaction), and only then is the agent published. A refusal leaves no
    /// agent and writes nothing; the id stays free.
    ///
    /// Cancel safety: dropping the future before it resolves publishes no agent and frees the id,
    /// but a store write already started completes: the session may then be stored, and
    /// [`Agents::resume`] (or [`lineage_store::Store::info`]) finds it.
    pub async fn create(&self, create: CreateAgent) -> Result<Arc<Agent>, AgentError> {
        let CreateAgent {
            header,
            seed,
            mut setup,
            spec,
        } = create;
        if let Some(budget) = &spec.budget {
            setup.push(budget.event());
        }
        let id = header.id;
        let reservation = self.reserve(id)?;
        let (config, tools) = self.config(id, &spec)?;
        let store_error = |source| AgentError::Store { agent: id, source };
        let (header, log, owner) = match seed {
            Seed::Fresh | Seed::Events(_) => {
                let mut events = match seed {
                    Seed::Events(events) => events,
                    _ => Vec::new(),
                };
                let first = events.len() as u64;
                events.extend(setup_events(first, now_ms(&header), setup));
                header
                    .validate()
                    .map_err(|source| AgentError::Log { agent: id, source })?;
                let log = Log::from_seed(events)
                    .map_err(|source| AgentError::Log { agent: id, source })?;
                replay_check(id, &log)?;
                let store = self.inner.store.clone();
                let (h, written) = (header.clone(), log.events().to_vec());
                // An import even of no events, so the header is checked against the log.
                let owner = blocking(move || {
                    store.import(h, &written)?;
                    store.own(id)
                })
                .await
                .map_err(store_error)?;
                (header, log, owner)
            }
            Seed::Fork {
                parent,
                boundary,
                delegation_depth,
            } => {
                // The own suffix of a fork is `session/lineage` and the setup: its inbox replays
                // from the setup alone.
                let setup_only = setup_events(1, 0, setup.clone());
                Inbox::replay(&setup_only).map_err(|(seq, reason)| {
                    AgentError::InvalidInboxSplice {
                        agent: id,
                        seq,
                        reason,
                    }
                })?;
                let spec = ForkSpec {
                    child: id,
                    boundary,
                    time_ms: header.created_at_ms,
                    delegation_depth,
                    agent_preset: header.agent_preset.clone(),
                };
                let store = self.inner.store.clone();
                let (header, owner, loaded) = blocking(move || {
                    let header = store.fork_with_setup(parent, &spec, setup)?;
                    let (owner, loaded) = store.own_and_load(spec.child)?;
                    Ok((header, owner, loaded))
                })
                .await
                .map_err(store_error)?;
                let log = Log::from_seed(loaded.events)
                    .map_err(|source| AgentError::Log { agent: id, source })?;
                (header, log, owner)
            }
        };
        // A new session has no descendants yet to charge a tree budget.
        let meter = budget::own_meter(id, log.events(), wall_ms(), |_| BudgetUse::default())?;
        let fence = owner.fence();
        let agent = self.publish(
            (reservation, owner),
            header,
            spec.options,
            (log, meter),
            (config, tools),
            false,
        )?;
        self.record_lease(&agent, fence).await?;
        tracing::debug!(agent = %id, "agent created");
        Ok(agent)
    }

    /// Resumes the stored session `id` as a live agent: loads it (a turn torn by a crash is
    /// closed durably first: interrupted, with unanswered calls answered), replays its inbox and
    /// publishes it idle. Restored pending work does not run until a waking send; turn numbers
    /// and seqs continue from the log. A live agent under the id that is on its way out
    /// (disposing, or stopped because its lease was lost) is waited for first.
    ///
    /// Cancel safety: dropping the future publishes no agent and frees the id; a load already
    /// started completes on its blocking thread, crash repair included, so the session is at worst
    /// repaired, never half-repaired.
    pub async fn resume(&self, id: SessionId, spec: AgentSpec) -> Result<Arc<Agent>, AgentError> {
        // An agent on its way out (disposing, or stopped because its lease was lost) is waited
        // for: once its disposal ends, the session is free here.
        while let Some(leaving) = self.get(id).filter(|agent| agent.is_leaving()) {
            let _ = leaving.shut_down().await;
        }
        let reservation = self.reserve(id)?;
        let (config, tools) = self.config(id, &spec)?;
        let store = self.inner.store.clone();
        let store_error = |source| AgentError::Store { agent: id, source };
        // Owned before it is read, so on a shared store no other host writes it from here on,
        // and only this one repairs it.
        let (owner, mut loaded) = blocking(move || store.own_and_load(id))
            .await
            .map_err(store_error)?;
        if let Some(budget) = spec.budget
            && budget::recorded(id, &loaded.events)?.map(|(b, _)| b) != Some(budget)
        {
            let event = Event::new(loaded.events.len() as u64, wall_ms(), budget.event());
            let (store, written) = (self.inner.store.clone(), event.clone());
            blocking(move || store.append(id, &[written]))
                .await
                .map_err(store_error)?;
            loaded.events.push(event);
        }
        let descendants_use = match budget::recorded(id, &loaded.events)? {
            Some((budget, record)) if budget.tree => {
                let (store, since) = (self.inner.store.clone(), record.time_ms);
                blocking(move || descendants_use(&store, id, since))
                    .await
                    .map_err(store_error)?
            }
            _ => BudgetUse::default(),
        };
        let meter = budget::own_meter(id, &loaded.events, wall_ms(), |_| descendants_use)?;
        let log = Log::from_seed(loaded.events)
            .map_err(|source| AgentError::Log { agent: id, source })?;
        let fence = owner.fence();
        let agent = self.publish(
            (reservation, owner),
            loaded.header,
            spec.options,
            (log, meter),
            (config, tools),
            true,
        )?;
        self.record_lease(&agent, fence).await?;
        tracing::debug!(agent = %id, "agent resumed");
        Ok(agent)
    }

    /// On a shared store, records in the agent's log the lease it runs under (the holder and
    /// its fencing token, a `lineage.agent/lease` custom event), so the log shows each host's
    /// tenure with tokens that only grow. An agent whose record fails is disposed of again.
    async fn record_lease(&self, agent: &Arc<Agent>, fence: Option<u64>) -> Result<(), AgentError> {
        let Some(fence) = fence else {
            return Ok(());
        };
        let event = lease_event(self.inner.store.holder(), fence);
        let recorded = match agent.record(event) {
            Ok(_) => agent.flush().await,
            Err(error) => Err(error),
        };
        if recorded.is_err() {
            agent.dispose().await;
        }
        recorded
    }

    /// Disposes of the live agent `id` (see [`Agent::dispose`]). Returns whether one was live.
    ///
    /// Cancel safety: the disposal runs on its own task; dropping this future stops only the wait.
    pub async fn dispose(&self, id: SessionId) -> bool {
        match self.get(id) {
            Some(agent) => {
                agent.dispose().await;
                true
            }
            None => false,
        }
    }

    /// [`Agents::dispose`], reporting a failed disposal (see [`Agent::try_dispose`]).
    pub async fn try_dispose(&self, id: SessionId) -> Result<bool, AgentError> {
        match self.get(id) {
            Some(agent) => agent.try_dispose().await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Disposes of every live agent and waits for each.
    pub async fn dispose_all(&self) {
        for agent in self.list() {
            agent.dispose().await;
        }
    }

    /// Shuts every live agent down ([`Agent::shut_down`]): their work is cancelled, their
    /// pending input stays queued in their logs for the next resume. Best effort, like
    /// disposal: a failure is published as a diagnostic and the others still shut down.
    pub async fn shut_down_all(&self) {
        for agent in self.list() {
            // The failure is already published as a diagnostic.
            let _ = agent.shut_down().await;
        }
    }
}

/// The custom event type recording the lease an agent runs under on a shared store.
pub const LEASE_EVENT: &str = "lineage.agent/lease";

/// The `lineage.agent/lease` event: `{"holder": <the store's holder id>, "fence": <token>}`.
fn lease_event(holder: impl std::fmt::Display, fence: u64) -> Custom {
    Custom {
        type_name: LEASE_EVENT.into(),
        payload: format!(r#"{{"holder":"{holder}","fence":{fence}}}"#).into(),
        ignorable: true,
    }
}

fn now_ms(header: &Header) -> i64 {
    i64::try_from(header.created_at_ms).unwrap_or(i64::MAX)
}

/// The wall clock in milliseconds since the Unix epoch, as events record it.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What every stored descendant of `root` spent from `since_ms` on, its own events only.
fn descendants_use(store: &Store, root: SessionId, since_ms: i64) -> Result<BudgetUse, StoreError> {
    let mut used = BudgetUse::default();
    for descendant in store.descendants(root)? {
        used += budget::use_since(&store.read_from(descendant, 0)?, since_ms);
    }
    Ok(used)
}

fn replay_check(id: SessionId, log: &Log) -> Result<(), AgentError> {
    Inbox::replay(lineage_log::own_suffix(log.events()))
        .map(|_| ())
        .map_err(|(seq, reason)| AgentError::InvalidInboxSplice {
            agent: id,
            seq,
            reason,
        })
}

/// Runs a synchronous store operation off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(join) => Err(StoreError::Damaged {
            reason: join.to_string(),
        }),
    }
}
