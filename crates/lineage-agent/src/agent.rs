//! [`Agent`]: the inbox, the phase (idle or running), the in-memory log mirrored to the store, and
//! the event bus. The turn loop that drives an agent lives in `turn`.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use lineage_log::{
    AbortCause, BudgetReached, Event, EventBody, Header, InboxSpliced, InboxTarget, Log, Message,
    MessageId, Role, SessionId, Text, TurnNo, TurnStart, check_append, fold_delegation_depth,
    own_suffix,
};
use lineage_store::{SessionOwner, Store, StoreError};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};

use crate::budget::{Budget, BudgetUse, Meter};
use crate::inbox::Inbox;
use crate::registry::Registry;
use crate::turn::{self, Opened};
use crate::{
    AgentError, Cancellation, Diagnostic, DiagnosticKind, Hooks, Model, Prompt, RegistryEvent,
    Toolset,
};

/// What a shared disposal ended with: a failed final flush, if any.
type DisposalOutcome = Result<(), Arc<StoreError>>;

/// Makes the error an injected final-flush failure reports (see `Agent::fail_final_flush`).
#[doc(hidden)]
pub type FlushFault = Box<dyn Fn() -> StoreError + Send + Sync>;

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

/// What [`Agent::cancel`] does with the messages queued in the inbox and not yet claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Discard them durably: the agent forgets the work it was asked to do next.
    Discard,
    /// Keep them parked until the next waking send: the agent stops only what it is doing now.
    Keep,
}

/// Whether an agent is working. `Running` covers a whole drive: back-to-back turns and their
/// closing writes, so it does not prove that a turn is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentStatus {
    /// Nothing is running.
    Idle,
    /// A driver is running turns.
    Running,
}

/// What an agent's observers see, in the order it happened.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentEvent {
    /// The status changed (published only on change).
    Status {
        /// The agent.
        agent: SessionId,
        /// The new status.
        status: AgentStatus,
    },
    /// A message entered the inbox.
    InboxInserted {
        /// The agent.
        agent: SessionId,
        /// The list it entered.
        target: InboxTarget,
        /// The message.
        message: Message,
    },
    /// A pending message was claimed into a turn.
    InboxClaimed {
        /// The agent.
        agent: SessionId,
        /// The turn that claimed it.
        turn: TurnNo,
        /// The message.
        message: Message,
    },
    /// A pending message was cancelled without running.
    InboxDiscarded {
        /// The agent.
        agent: SessionId,
        /// The message.
        message: Message,
    },
    /// An event was appended to the agent's session.
    Appended {
        /// The agent.
        agent: SessionId,
        /// The event.
        event: Event,
    },
    /// The agent's work was cancelled (see [`Agent::cancel`]): published once the pending input
    /// was discarded (unless kept, [`Queued::Keep`]) and before the current turn, if any, is
    /// cancelled.
    Cancelled {
        /// The agent.
        agent: SessionId,
        /// The cause given.
        cause: AbortCause,
        /// What became of the pending input.
        queued: Queued,
    },
    /// Best-effort work of the agent failed (also sent to its registry's watchers).
    Diagnostic(Diagnostic),
}

/// The input claimed for a step, by the list it came from.
#[derive(Clone, Debug, Default)]
pub(crate) struct Claimed {
    /// All of `next-step`.
    pub step_input: Vec<Message>,
    /// The turn's prompt from `next-turn` (a turn's first step only).
    pub prompts: Vec<Message>,
}

impl Claimed {
    /// The step's input in order: step input first, then the prompt.
    pub(crate) fn messages(&self) -> Vec<Message> {
        self.step_input
            .iter()
            .chain(&self.prompts)
            .cloned()
            .collect()
    }
}

/// What the agent is doing.
#[derive(Debug)]
enum Phase {
    Idle { last_turn: TurnNo },
    Running(Running),
}

#[derive(Debug)]
struct Running {
    /// The cancellation of the current turn (a fresh one per turn).
    cancel: Cancellation,
    /// The last turn opened.
    turn: TurnNo,
    /// A waking send arrived after the current turn was cancelled: replay it once the driver has
    /// closed that turn.
    wake_requested: bool,
}

struct State {
    log: Log,
    inbox: Inbox,
    phase: Phase,
    disposing: bool,
    /// Disposed without having written anything: the store forgot the session and its id is free,
    /// so nothing more may be appended under it.
    released: bool,
    /// The store refused a write because another host took the session over (its lease's
    /// fencing token moved on): the agent writes nothing more and disposes of itself.
    fenced: Option<Arc<StoreError>>,
    subscribers: Vec<mpsc::UnboundedSender<AgentEvent>>,
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
    disposal: Mutex<Option<watch::Receiver<Option<DisposalOutcome>>>>,
    /// While set, the final flush of disposal fails with the error it makes (a fault-injection
    /// seam for tests).
    flush_fault: Mutex<Option<FlushFault>>,
    registry: Weak<Registry>,
    /// The agent's ownership of its session in the store, held until disposal ends: while it is
    /// held, `Store::load` never repairs the session underneath the agent.
    owner: Mutex<Option<SessionOwner>>,
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
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
                fenced: None,
                subscribers: Vec::new(),
            }),
            idle: watch::Sender::new(true),
            changes: watch::Sender::new(0),
            disposal: Mutex::new(None),
            flush_fault: Mutex::new(None),
            registry,
            owner: Mutex::new(Some(owner)),
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

    /// The delegation depth in force: the larger of the session's own lineage depth and the
    /// runtime option.
    pub fn delegation_depth(&self) -> u32 {
        fold_delegation_depth(lock(&self.state).log.events(), self.options.subagent_depth)
    }

    /// The store the agent writes to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The current status.
    pub fn status(&self) -> AgentStatus {
        match lock(&self.state).phase {
            Phase::Idle { .. } => AgentStatus::Idle,
            Phase::Running(_) => AgentStatus::Running,
        }
    }

    /// A copy of the session's events so far.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.state).log.events().to_vec()
    }

    /// Runs `f` over the session's events without copying them.
    pub fn with_events<R>(&self, f: impl FnOnce(&[Event]) -> R) -> R {
        f(lock(&self.state).log.events())
    }

    /// The messages pending in `target`, in order.
    pub fn pending(&self, target: InboxTarget) -> Vec<Message> {
        lock(&self.state)
            .inbox
            .list(target)
            .iter()
            .cloned()
            .collect()
    }

    /// Whether the message `id` is pending in either list: accepted, not yet claimed or
    /// discarded.
    pub fn is_pending(&self, id: MessageId) -> bool {
        lock(&self.state).inbox.position(id).is_some()
    }

    /// Whether anything is pending in the inbox.
    pub fn has_pending(&self) -> bool {
        lock(&self.state).inbox.has_pending()
    }

    /// The agent's tools, as the turn loop sees them now (empty once the agent is disposed).
    pub fn toolset(&self) -> Arc<Toolset> {
        lock(&self.tools).clone()
    }

    /// A stream of everything that happens to the agent from now on, in order. Nothing is
    /// dropped; the stream ends when the agent is disposed.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<AgentEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.state).subscribers.push(tx);
        rx
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    // ----- sending -----------------------------------------------------------------------------

    /// Queues `message` as a prompt for its own turn and wakes the agent.
    pub fn followup(self: &Arc<Self>, message: Message) -> Result<(), AgentError> {
        self.send(message, InboxTarget::NextTurn, true)
    }

    /// Queues `message` for the next step and wakes the agent: on an idle agent it starts a turn,
    /// on a running one it joins the turn at its next step.
    pub fn steer(self: &Arc<Self>, message: Message) -> Result<(), AgentError> {
        self.send(message, InboxTarget::NextStep, true)
    }

    /// Queues `message` for the next step without waking the agent.
    pub fn inject(self: &Arc<Self>, message: Message) -> Result<(), AgentError> {
        self.send(message, InboxTarget::NextStep, false)
    }

    /// Queues `message` in `target` and, with `wake`, makes sure a driver will claim it.
    ///
    /// The splice is durable in the log (admitted to the store) before the inbox changes; if it
    /// is refused nothing changes and no wake happens. A waking send to an idle agent opens the
    /// turn and claims its input before returning. A waking send that arrives while the current
    /// turn is being cancelled goes to `next-turn` (it cannot join a cancelled turn) and is
    /// replayed once that turn has closed.
    pub fn send(
        self: &Arc<Self>,
        message: Message,
        target: InboxTarget,
        wake: bool,
    ) -> Result<(), AgentError> {
        if message.role != Role::User {
            return Err(AgentError::InvalidMessage {
                agent: self.id,
                message: message.id,
                reason: "only user-role messages enter an inbox".into(),
            });
        }
        let opened = {
            let mut st = lock(&self.state);
            if st.inbox.position(message.id).is_some() {
                return Err(AgentError::AlreadyPending {
                    agent: self.id,
                    message: message.id,
                });
            }
            // Classified before the insert, so nothing the insert triggers can reclassify it.
            let after_abort =
                wake && matches!(&st.phase, Phase::Running(r) if r.cancel.is_cancelled());
            let target = if after_abort {
                InboxTarget::NextTurn
            } else {
                target
            };
            let splice = st.inbox.append_splice(target, message);
            self.splice(&mut st, splice, true)?;
            if wake {
                self.wake(&mut st, after_abort)
            } else {
                None
            }
        };
        if let Some(opened) = opened {
            self.spawn_driver(opened);
        }
        Ok(())
    }

    /// Removes the pending message `id`, cancelling it durably. Returns whether it was pending.
    pub fn remove_pending(&self, id: MessageId) -> Result<bool, AgentError> {
        let mut st = lock(&self.state);
        match st.inbox.remove_splice(id) {
            Some(splice) => self.splice(&mut st, splice, true).map(|_| true),
            None => Ok(false),
        }
    }

    /// Cancels the agent's work with `cause`.
    ///
    /// With [`Queued::Discard`] every pending message is discarded durably (a cancelled splice
    /// per list) and a pending wake replay is dropped. With [`Queued::Keep`] pending work stays
    /// parked until the next waking send. Either way the current turn, if any, is cancelled; the first cause of a
    /// turn is the one its `turn/end` records. Claimed input is never requeued. On an idle agent
    /// only the inbox is affected.
    pub fn cancel(&self, cause: AbortCause, queued: Queued) -> Result<(), AgentError> {
        let mut st = lock(&self.state);
        if queued == Queued::Discard {
            for splice in st.inbox.clear_splices() {
                self.splice(&mut st, splice, true)?;
            }
            if let Phase::Running(r) = &mut st.phase {
                r.wake_requested = false;
            }
        }
        publish(
            &mut st,
            AgentEvent::Cancelled {
                agent: self.id,
                cause: cause.clone(),
                queued,
            },
        );
        if let Phase::Running(r) = &st.phase {
            r.cancel.cancel(cause);
        }
        Ok(())
    }

    /// Resolves when the whole agent is quiescent: no driver runs, including drivers started to
    /// replace one that was winding down. Never fails.
    ///
    /// Cancel safety: safe to drop at any point; it only waits.
    pub async fn when_idle(&self) {
        let mut rx = self.idle.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = rx.wait_for(|idle| *idle).await;
    }

    /// Disposes of the agent: cancels its work with cause `disposed` (discarding pending input),
    /// waits until it is idle, flushes its log, drops its tools and leaves the registry. Every
    /// caller shares one disposal; later calls wait for the first. The session stays stored and
    /// can be resumed; an agent that never wrote anything leaves no session, and its id is free
    /// for a new one (this handle then refuses every write with [`AgentError::NotLive`]).
    ///
    /// Disposal is best effort: a failure (a failed final flush) does not stop it, and is
    /// published as a [`Diagnostic`] on the agent's events and to the registry's watchers; use
    /// [`Agent::try_dispose`] to get it back.
    ///
    /// Must not be awaited from inside one of the agent's own turns (a tool of this agent): the
    /// disposal waits for that turn to end.
    ///
    /// Cancel safety: the disposal runs on its own task once started; dropping this future stops
    /// only the wait, and a later call waits for the same disposal.
    pub async fn dispose(self: &Arc<Self>) {
        // The failure is already published as a diagnostic.
        let _ = self.try_dispose().await;
    }

    /// [`Agent::dispose`], returning how the shared disposal ended: every caller sees the same
    /// outcome, [`AgentError::FinalFlushFailed`] when the final flush failed. The agent is
    /// disposed either way.
    pub async fn try_dispose(self: &Arc<Self>) -> Result<(), AgentError> {
        self.dispose_with(Queued::Discard).await
    }

    /// Disposes of the agent as a host shutting down does: as [`Agent::try_dispose`], except
    /// that pending input stays queued in the log, so the agent resumed after a restart finds
    /// it there: a settlement notice that reached an idle parent is not lost to a shutdown.
    /// Input a running turn has claimed is not requeued (that turn ends `aborted`). If a
    /// disposal is already under way, this waits for it and keeps its choice.
    pub async fn shut_down(self: &Arc<Self>) -> Result<(), AgentError> {
        self.dispose_with(Queued::Keep).await
    }

    async fn dispose_with(self: &Arc<Self>, queued: Queued) -> Result<(), AgentError> {
        let mut done = {
            let mut disposal = lock(&self.disposal);
            match &*disposal {
                Some(done) => done.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    *disposal = Some(rx.clone());
                    let agent = self.clone();
                    self.runtime.spawn(async move {
                        let outcome = agent.dispose_now(queued).await;
                        tx.send_replace(Some(outcome));
                    });
                    rx
                }
            }
        };
        let outcome = match done.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone().unwrap_or(Ok(())),
            // The disposing task ended without an outcome: only a panic in the store does that.
            Err(_) => Err(Arc::new(StoreError::Damaged {
                reason: "the disposal ended without finishing".into(),
            })),
        };
        outcome.map_err(|source| AgentError::FinalFlushFailed {
            agent: self.id,
            source,
        })
    }

    /// While `fault` is set, the final flush of this agent's disposal fails with the error it
    /// makes (and flushes nothing). Turn flushes and [`Agent::flush`] are not affected.
    #[doc(hidden)]
    pub fn fail_final_flush(&self, fault: Option<FlushFault>) {
        *lock(&self.flush_fault) = fault;
    }

    /// Publishes a failure of best-effort work: on the agent's events, to its registry's
    /// watchers and to `tracing`.
    pub(crate) fn diagnose(&self, kind: DiagnosticKind, reason: String) {
        tracing::warn!(agent = %self.id, ?kind, %reason, "best-effort work failed");
        let diagnostic = Diagnostic {
            agent: self.id,
            kind,
            reason,
        };
        publish(
            &mut lock(&self.state),
            AgentEvent::Diagnostic(diagnostic.clone()),
        );
        if let Some(registry) = self.registry.upgrade() {
            registry.broadcast(RegistryEvent::Diagnostic(diagnostic));
        }
    }

    /// Whether disposal has begun.
    pub fn is_disposing(&self) -> bool {
        lock(&self.state).disposing
    }

    async fn dispose_now(self: Arc<Self>, queued: Queued) -> DisposalOutcome {
        lock(&self.state).disposing = true;
        if let Err(error) = self.cancel(AbortCause::Disposed, queued) {
            self.diagnose(
                DiagnosticKind::DiscardFailed,
                format!("disposal could not discard pending input: {error}"),
            );
        }
        self.when_idle().await;
        let fault = lock(&self.flush_fault).as_ref().map(|fault| fault());
        let fenced = lock(&self.state).fenced.clone();
        let outcome = match (fault, fenced) {
            // Nothing more is the agent's to write: its final flush would only be refused.
            (_, Some(fenced)) => Err(fenced),
            (Some(error), None) => Err(Arc::new(error)),
            (None, None) => self.flush_store().await.map_err(Arc::new),
        };
        if let Err(error) = &outcome
            && !self.is_fenced()
        {
            self.diagnose(
                DiagnosticKind::FinalFlushFailed,
                format!("the final flush of disposal failed: {error}"),
            );
        }
        *lock(&self.tools) = Arc::new(Toolset::default());
        {
            // A session nothing was written to holds nothing durable: its id is freed (under the
            // state lock, so no append can slip in between).
            let mut st = lock(&self.state);
            st.released = self.store.forget_unwritten(self.id);
        }
        if let Some(registry) = self.registry.upgrade() {
            registry.remove(&self);
            registry.broadcast(RegistryEvent::Disposed {
                agent: self.id,
                failed: outcome.is_err(),
            });
        }
        lock(&self.state).subscribers.clear();
        // Last: the session is the store's to repair again once nothing more will be appended.
        drop(lock(&self.owner).take());
        outcome
    }

    // ----- the log -------------------------------------------------------------------------------

    /// Appends one event: checked against the log, admitted to the store, then applied in memory
    /// and published. Returns its seq.
    pub(crate) fn append(&self, body: impl Into<EventBody>) -> Result<u64, AgentError> {
        self.append_locked(&mut lock(&self.state), body.into())
    }

    fn append_locked(&self, st: &mut State, body: EventBody) -> Result<u64, AgentError> {
        if st.released {
            return Err(AgentError::NotLive { agent: self.id });
        }
        if let Some(fenced) = &st.fenced {
            return Err(AgentError::Fenced {
                agent: self.id,
                reason: fenced.to_string(),
            });
        }
        let event = Event::new(st.log.next_seq(), now_ms(), body);
        let batch = std::slice::from_ref(&event);
        let log_error = |source| AgentError::Log {
            agent: self.id,
            source,
        };
        check_append(st.log.structure(), batch).map_err(log_error)?;
        if let Err(source) = self.store.admit(self.id, batch) {
            return Err(self.store_failed(st, source));
        }
        let seq = event.seq;
        let published = (!st.subscribers.is_empty()).then(|| event.clone());
        st.log.append(vec![event]).map_err(log_error)?;
        if let Some(appended) = st.log.events().last() {
            for meter in &self.meters {
                meter.charge(&appended.body);
            }
        }
        if let Some(event) = published {
            publish(
                st,
                AgentEvent::Appended {
                    agent: self.id,
                    event,
                },
            );
        }
        Ok(seq)
    }

    /// Records a host event in the agent's session: an `approval/policy` or `sandbox/mode` switch,
    /// or a `custom` event. Durable at the next flush, like every event. Other kinds belong to the
    /// runtime (they would desynchronise the inbox or the turn structure) and are refused.
    pub fn record(&self, body: impl Into<EventBody>) -> Result<u64, AgentError> {
        let body = body.into();
        match body {
            EventBody::ApprovalPolicy(_) | EventBody::SandboxMode(_) | EventBody::Custom(_) => {
                self.append(body)
            }
            other => Err(AgentError::NotRecordable {
                agent: self.id,
                kind: other.kind().name(),
            }),
        }
    }

    /// A counter bumped whenever the status or the inbox changes (a message inserted, claimed or
    /// discarded): for a waiter that only needs to know when to look again. Unlike
    /// [`Agent::subscribe`] it copies no events, so it costs the turn loop nothing per append.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Waits until everything the agent has appended is durable.
    ///
    /// Cancel safety: dropping the future stops only the wait; the flush completes in the store's
    /// writer, and a later flush covers everything this one did.
    pub async fn flush(&self) -> Result<(), AgentError> {
        match self.flush_store().await {
            Ok(()) => Ok(()),
            Err(source) => Err(self.store_failed(&mut lock(&self.state), source)),
        }
    }

    /// The fencing token of the lease the agent runs under, on a shared store (`None` on an
    /// embedded file, or once its disposal ended).
    pub fn lease_fence(&self) -> Option<u64> {
        lock(&self.owner).as_ref().and_then(SessionOwner::fence)
    }

    /// Whether another host took the agent's session over: it writes nothing more, and disposes
    /// of itself (see [`DiagnosticKind::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        lock(&self.state).fenced.is_some()
    }

    /// The error for a failed store operation. A write refused because another host took the
    /// session over stops the agent: its turn is cancelled, nothing more is written (not even
    /// the turn's closing events: the session is the new holder's to repair), the host is told
    /// with a [`DiagnosticKind::Fenced`] diagnostic, and the agent disposes of itself.
    fn store_failed(&self, st: &mut State, source: StoreError) -> AgentError {
        if !matches!(source, StoreError::Fenced { .. }) || st.fenced.is_some() {
            return AgentError::Store {
                agent: self.id,
                source,
            };
        }
        let reason = source.to_string();
        tracing::warn!(agent = %self.id, %reason, "another host took the session over; the agent stops");
        st.fenced = Some(Arc::new(source));
        if let Phase::Running(r) = &st.phase {
            r.cancel.cancel(AbortCause::Disposed);
        }
        let diagnostic = Diagnostic {
            agent: self.id,
            kind: DiagnosticKind::Fenced,
            reason: reason.clone(),
        };
        publish(st, AgentEvent::Diagnostic(diagnostic.clone()));
        if let Some(registry) = self.registry.upgrade() {
            registry.broadcast(RegistryEvent::Diagnostic(diagnostic));
            if let Some(me) = registry.live(self) {
                self.runtime
                    .spawn(async move { me.dispose_with(Queued::Keep).await });
            }
        }
        AgentError::Fenced {
            agent: self.id,
            reason,
        }
    }

    async fn flush_store(&self) -> Result<(), StoreError> {
        let store = self.store.clone();
        let id = self.id;
        match tokio::task::spawn_blocking(move || store.flush(id)).await {
            Ok(result) => result,
            // The closure only calls into the store; a panic there is the storage engine's and is
            // reported as a damaged store.
            Err(join) => Err(StoreError::Damaged {
                reason: join.to_string(),
            }),
        }
    }

    /// Logs `splice`, then applies it and publishes its effects. With `discard`, removed
    /// messages are published as discarded (a claim removes without discarding).
    fn splice(
        &self,
        st: &mut State,
        splice: InboxSpliced,
        discard: bool,
    ) -> Result<Vec<Message>, AgentError> {
        st.inbox
            .check(&splice)
            .map_err(|reason| AgentError::InvalidMessage {
                agent: self.id,
                message: splice
                    .inserted
                    .first()
                    .map_or_else(MessageId::new, |m| m.id),
                reason,
            })?;
        self.append_locked(st, splice.clone().into())?;
        let removed = st.inbox.apply(&splice);
        self.changed();
        if discard {
            for message in &removed {
                publish(
                    st,
                    AgentEvent::InboxDiscarded {
                        agent: self.id,
                        message: message.clone(),
                    },
                );
            }
        }
        for message in splice.inserted {
            publish(
                st,
                AgentEvent::InboxInserted {
                    agent: self.id,
                    target: splice.target,
                    message,
                },
            );
        }
        Ok(removed)
    }

    /// Claims the input of a step (see [`Inbox::claim_splices`]) and publishes the claims.
    pub(crate) fn claim(&self, target: InboxTarget, turn: TurnNo) -> Claimed {
        self.claim_locked(&mut lock(&self.state), target, turn)
    }

    fn claim_locked(&self, st: &mut State, target: InboxTarget, turn: TurnNo) -> Claimed {
        let mut claimed = Claimed::default();
        for splice in st.inbox.claim_splices(target) {
            let from = splice.target;
            match self.splice(st, splice, false) {
                Ok(messages) => {
                    for message in &messages {
                        publish(
                            st,
                            AgentEvent::InboxClaimed {
                                agent: self.id,
                                turn,
                                message: message.clone(),
                            },
                        );
                    }
                    match from {
                        InboxTarget::NextStep => claimed.step_input.extend(messages),
                        InboxTarget::NextTurn => claimed.prompts.extend(messages),
                    }
                }
                Err(error) => {
                    // The splice was refused before the inbox changed: the input stays pending.
                    tracing::warn!(agent = %self.id, turn, %error, "claiming inbox input failed");
                    break;
                }
            }
        }
        claimed
    }

    /// Puts input claimed for a step back at the front of the lists it came from, without waking:
    /// it is parked for the next wake. Nothing is requeued once `cancel` has fired (checked under
    /// the lock that cancellation takes, so a cancel cannot slip in between): like every claimed
    /// input of a cancelled turn, it is dropped. Returns whether it was requeued.
    pub(crate) fn requeue(
        &self,
        claimed: Claimed,
        cancel: &Cancellation,
    ) -> Result<bool, AgentError> {
        let mut st = lock(&self.state);
        if cancel.is_cancelled() || st.disposing {
            return Ok(false);
        }
        for (target, inserted) in [
            (InboxTarget::NextStep, claimed.step_input),
            (InboxTarget::NextTurn, claimed.prompts),
        ] {
            if inserted.is_empty() {
                continue;
            }
            let splice = InboxSpliced {
                target,
                start: 0,
                removed: 0,
                inserted,
                canceled: false,
            };
            self.splice(&mut st, splice, true)?;
        }
        Ok(true)
    }

    /// Whether input is waiting for the next step.
    pub(crate) fn has_step_input(&self) -> bool {
        !lock(&self.state)
            .inbox
            .list(InboxTarget::NextStep)
            .is_empty()
    }

    /// Adds `message` to the end of `next-step`, without waking (a tool result's context).
    pub(crate) fn push_step_input(&self, message: Message) -> Result<(), AgentError> {
        let mut st = lock(&self.state);
        let splice = st.inbox.append_splice(InboxTarget::NextStep, message);
        self.splice(&mut st, splice, true).map(|_| ())
    }

    /// The model's history now: what the next request carries.
    pub(crate) fn history(&self) -> Vec<Message> {
        lock(&self.state)
            .log
            .events()
            .iter()
            .filter_map(|e| e.body.history_message().cloned())
            .collect()
    }

    // ----- the driver ------------------------------------------------------------------------------

    /// Makes sure a driver will claim pending input. On an idle agent this starts one: status
    /// `running`, `turn/start` and the claim happen here, under the lock; the caller spawns the
    /// rest. On a running agent the live driver claims the input itself, unless its turn is being
    /// cancelled, in which case the wake is latched (never for a disposal).
    fn wake(&self, st: &mut State, after_abort: bool) -> Option<Opened> {
        if st.disposing {
            return None;
        }
        match &mut st.phase {
            Phase::Running(running) => {
                if after_abort && running.cancel.cause() != Some(AbortCause::Disposed) {
                    running.wake_requested = true;
                }
                None
            }
            Phase::Idle { last_turn } => {
                let turn = *last_turn;
                st.phase = Phase::Running(Running {
                    cancel: Cancellation::new(),
                    turn,
                    wake_requested: false,
                });
                self.idle.send_replace(false);
                self.publish_status(st, AgentStatus::Running);
                match self.open_turn(st) {
                    Some(opened) => Some(opened),
                    None => {
                        self.go_idle(st);
                        self.idle.send_replace(true);
                        None
                    }
                }
            }
        }
    }

    /// Opens the next turn of the running driver: `turn/start`, then the claim.
    fn open_turn(&self, st: &mut State) -> Option<Opened> {
        let Phase::Running(running) = &st.phase else {
            return None;
        };
        if running.cancel.is_cancelled() {
            return None;
        }
        let (turn, cancel) = (running.turn + 1, running.cancel.clone());
        if let Err(error) = self.append_locked(st, TurnStart { turn }.into()) {
            tracing::warn!(agent = %self.id, turn, %error, "could not open a turn");
            return None;
        }
        if let Phase::Running(running) = &mut st.phase {
            running.turn = turn;
        }
        let claimed = self.claim_locked(st, InboxTarget::NextTurn, turn);
        Some(Opened {
            turn,
            cancel,
            claimed,
        })
    }

    fn go_idle(&self, st: &mut State) -> bool {
        let (turn, wake_requested) = match &st.phase {
            Phase::Running(r) => (r.turn, r.wake_requested),
            Phase::Idle { .. } => return false,
        };
        st.phase = Phase::Idle { last_turn: turn };
        self.publish_status(st, AgentStatus::Idle);
        wake_requested
    }

    /// Called by the driver after each turn: opens the next turn when the last one completed and
    /// work is pending, otherwise goes idle (replaying a latched wake). `None` ends the driver.
    pub(crate) fn after_turn(&self, run_more: bool) -> Option<Opened> {
        let mut st = lock(&self.state);
        if run_more && st.inbox.has_pending() && !st.disposing {
            if let Phase::Running(running) = &mut st.phase {
                running.cancel = Cancellation::new();
                running.wake_requested = false;
            }
            if let Some(opened) = self.open_turn(&mut st) {
                return Some(opened);
            }
        }
        let wake_requested = self.go_idle(&mut st);
        if wake_requested
            && st.inbox.has_pending()
            && let Some(opened) = self.wake(&mut st, false)
        {
            return Some(opened);
        }
        self.idle.send_replace(true);
        None
    }

    fn spawn_driver(self: &Arc<Self>, opened: Opened) {
        let agent = self.clone();
        self.runtime.spawn(turn::drive(agent, opened));
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn publish_status(&self, st: &mut State, status: AgentStatus) {
        self.changed();
        publish(
            st,
            AgentEvent::Status {
                agent: self.id,
                status,
            },
        );
    }
}

fn publish(st: &mut State, event: AgentEvent) {
    match st.subscribers.as_slice() {
        [] => {}
        [only] => {
            if only.send(event).is_err() {
                st.subscribers.clear();
            }
        }
        _ => st.subscribers.retain(|s| s.send(event.clone()).is_ok()),
    }
}
