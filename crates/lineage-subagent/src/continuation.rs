//! The continuation manager: continuable children that live on between turns of their parent.
//!
//! A child is *resident* while it has an [`Activation`]: at most one per child session, holding
//! the live agent. Operations on one child (start, each follow-up, each settlement decision) run
//! one at a time under that child's lock, in the order they asked for it; different children
//! never wait for each other. A child is
//!
//! - *running* while its agent runs or a waking message it accepted is not yet claimed,
//! - *waiting* while it is quiescent but owns resident children of its own,
//! - *settled* otherwise, and then it is torn down, children first: cancel, wait, capture what
//!   the epoch produced, dispose of the agent (its final flush included), forget the activation,
//!   send the parent the settlement notice, release the parent's ownership, emit `subagent/end`.
//!
//! A teardown that fails (a child's teardown, or the agent's disposal: a failed final flush)
//! still runs to its end; the epoch then counts as failed (`error`, the "failed" notice) and the
//! teardown reports `ACTIVATION_TEARDOWN_FAILED`. Failures of best-effort work (a teardown, an
//! undelivered notice, a failed cancel) are also reported to the registry's watchers as
//! diagnostics.
//!
//! The notice goes out before ownership is released, so a parent waiting on its children can
//! never be judged settled with a notice still to come. A later follow-up to a settled child
//! resumes it from its log alone ("cold resume"): its descriptor, depth and policy are folded from
//! its own events and no provider is consulted.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use lineage_agent::{
    Agent, AgentOptions, AgentSpec, AgentStatus, Cancellation, Diagnostic, DiagnosticKind, Hooks,
    Queued,
};
use lineage_log::{
    AbortCause, ContentBlock, DescriptorMode, Event, EventBody, Message, MessageId, MessageSource,
    Role, RunId, SessionId, SubagentDescriptor, Text, ToolFilter, TurnEndReason, fold_descriptor,
};
use lineage_store::Loaded;
use tokio::sync::{OwnedMutexGuard, watch};

use crate::birth::{self, ChildPlan};
use crate::lifecycle::{Lifecycle, RunInfo};
use crate::oneshot::cancelled_before_publication;
use crate::setup::Installed;
use crate::{
    CancelledBy, ChildOptions, ContinuableCreate, ErrorCode, StopReason, SubagentError,
    SubagentRuntime, lock,
};

type Disposal = watch::Receiver<Option<Result<(), SubagentError>>>;

/// The manager's state, inside the runtime.
#[derive(Default)]
pub(crate) struct Continuation {
    state: Mutex<State>,
    /// One lock per child with operations in flight (removed when nobody holds or waits on it).
    locks: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Default)]
struct State {
    activations: HashMap<SessionId, Arc<Activation>>,
    /// Creations and resumes under way, with the live lineage of their parent, until the
    /// activation is resident or rolled back.
    materializations: HashMap<u64, Materialization>,
    next_materialization: u64,
    /// Subtrees closed by `drain_descendants`: admission is refused below each root until that
    /// exact root is no longer live.
    closing: Vec<ClosingScope>,
    /// Set by `drain`, never cleared.
    draining: bool,
}

struct Materialization {
    lineage: Vec<Arc<Agent>>,
    settled: watch::Receiver<bool>,
}

struct ClosingScope {
    root: Arc<Agent>,
    members: Vec<Arc<Agent>>,
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

    fn residency(&self) -> Residency {
        let mut st = lock(&self.st);
        st.accepted.retain(|id| self.agent.is_pending(*id));
        if self.agent.status() == AgentStatus::Running || !st.accepted.is_empty() {
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

/// What a continuable child's epoch ended with, for the notice and `subagent/end`.
struct Terminal {
    stop_reason: StopReason,
    /// The closing message's blocks (see [`closing_message`]); empty when there is none.
    output: Vec<ContentBlock>,
}

/// A request to start a continuable child.
#[derive(Clone)]
pub struct ContinuableRequest {
    /// The delegating agent: the exact live `Arc`.
    pub parent: Arc<Agent>,
    /// The first task.
    pub prompt: Vec<ContentBlock>,
    /// A label for people and for `list_agents`.
    pub label: Text,
    /// An id the caller reserved for the child; a fresh one when `None`.
    pub child: Option<SessionId>,
    /// Covers only the work before the prompt is accepted.
    pub cancel: Cancellation,
    /// Model options for the child.
    pub agent_options: ChildOptions,
    /// The deepest delegation depth the child may have.
    pub max_depth: Option<u32>,
    /// Which of the parent's tools the child may use.
    pub tool_filter: Option<ToolFilter>,
    /// A persona for the child.
    pub persona: Option<Text>,
    /// Turn-loop hooks for the child (a pre-step that may refuse its turns), applied at every
    /// activation in this process, cold resumes included, before those of setup contributions.
    /// They live in memory: after a restart, a setup contribution gives a resumed child its hooks.
    pub hooks: Option<Arc<dyn Hooks>>,
}

impl ContinuableRequest {
    /// A request from `parent` to start a child labelled `label` on `prompt`.
    pub fn new(parent: Arc<Agent>, label: impl Into<Text>, prompt: impl Into<Text>) -> Self {
        ContinuableRequest {
            parent,
            prompt: vec![ContentBlock::text(prompt)],
            label: label.into(),
            child: None,
            cancel: Cancellation::new(),
            agent_options: ChildOptions::default(),
            max_depth: None,
            tool_filter: None,
            persona: None,
            hooks: None,
        }
    }
}

impl std::fmt::Debug for ContinuableRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContinuableRequest")
            .field("parent", &self.parent.id())
            .field("label", &self.label)
            .field("child", &self.child)
            .field("hooks", &self.hooks.is_some())
            .finish_non_exhaustive()
    }
}

/// A continuable child whose first prompt was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContinuableStarted {
    /// The child's durable id.
    pub child: SessionId,
    /// The id of the accepted prompt.
    pub message: MessageId,
}

/// Who asks for an interrupt.
#[derive(Clone, Debug)]
pub enum Authority {
    /// The user, on behalf of the durable parent session `parent`: allowed for that parent's
    /// direct children.
    User {
        /// The parent session.
        parent: SessionId,
    },
    /// An agent: allowed for its live descendants, when it is the exact live agent.
    Ancestor(Arc<Agent>),
}

/// How a child's report reaches its parent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReportDelivery {
    /// At the parent's next step, waking it when idle (a steer).
    #[default]
    NextStep,
    /// Into the parent's next step without waking it (an inject).
    Quiet,
}

/// Held while an operation on one child runs.
struct ChildGuard {
    guard: Option<OwnedMutexGuard<()>>,
    child: SessionId,
    runtime: SubagentRuntime,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = lock(&self.runtime.continuation().locks);
        if locks
            .get(&self.child)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(&self.child);
        }
    }
}

/// How an activation comes to be: the descriptor (provider name, persona, tool filter) and the
/// options the agent runs with, and for a new child how it is born; without a birth the child
/// is resumed from the store.
struct Materialize {
    descriptor: SubagentDescriptor,
    options: AgentOptions,
    birth: Option<Birth>,
}

/// How a new continuable child is born, fixed when the start is asked for.
struct Birth {
    depth: u32,
    fork_at: Option<u64>,
    policy: crate::DelegatedPolicy,
}

fn unauthorized(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::Unauthorized, message)
}

fn teardown_failed(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::ActivationTeardownFailed, message)
}

impl SubagentRuntime {
    /// Reports a failure of best-effort work about `agent` to the registry's watchers.
    fn diagnose(&self, agent: SessionId, kind: DiagnosticKind, reason: String) {
        self.agents().report(Diagnostic {
            agent,
            kind,
            reason,
        });
    }

    // ----- admission and authority ---------------------------------------------------------------

    /// `agent`, then its parent, grandparent, ... as long as each is live (exact registry
    /// entries), stopping at a repeated id.
    pub(crate) fn live_lineage(&self, agent: &Arc<Agent>) -> Vec<Arc<Agent>> {
        let mut lineage = vec![agent.clone()];
        let mut seen = HashSet::from([agent.id()]);
        let mut next = agent.header().parent;
        while let Some(id) = next {
            if !seen.insert(id) {
                break;
            }
            match self.agents().get(id) {
                Some(ancestor) => {
                    next = ancestor.header().parent;
                    lineage.push(ancestor);
                }
                None => break,
            }
        }
        lineage
    }

    /// Refuses work for `agent` while the runtime drains or `agent` is inside a closing scope.
    fn assert_admitting(&self, agent: &Arc<Agent>) -> Result<(), SubagentError> {
        let mut st = lock(&self.continuation().state);
        if st.draining {
            return Err(SubagentError::new(
                ErrorCode::Draining,
                "continuable subagents are draining; the operation was not admitted",
            ));
        }
        // A scope stays closed until its exact root is no longer live.
        st.closing
            .retain(|scope| self.agents().is_live(&scope.root));
        if st.closing.is_empty() {
            return Ok(());
        }
        let lineage = self.live_lineage(agent);
        for scope in &st.closing {
            let member = scope.members.iter().any(|m| Arc::ptr_eq(m, agent))
                || lineage.iter().any(|a| Arc::ptr_eq(a, &scope.root));
            if member {
                return Err(SubagentError::new(
                    ErrorCode::Draining,
                    format!(
                        "continuable subagents below parent {} are draining; the operation was \
                         not admitted",
                        scope.root.id()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a delivery to `child` (whose durable parent is `parent_session`) unless `parent`
    /// is the exact live agent and that parent.
    fn authorize_lineage(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        parent_session: Option<SessionId>,
    ) -> Result<(), SubagentError> {
        if !self.agents().is_live(parent) {
            return Err(unauthorized(format!(
                "subagent {child}: delivery requires the exact live parent agent"
            )));
        }
        if parent_session != Some(parent.id()) {
            return Err(unauthorized(format!(
                "subagent {child} belongs to another parent session"
            )));
        }
        Ok(())
    }

    async fn child_lock(&self, child: SessionId) -> ChildGuard {
        let mutex = lock(&self.continuation().locks)
            .entry(child)
            .or_default()
            .clone();
        let guard = mutex.lock_owned().await;
        ChildGuard {
            guard: Some(guard),
            child,
            runtime: self.clone(),
        }
    }

    fn activation(&self, child: SessionId) -> Option<Arc<Activation>> {
        lock(&self.continuation().state)
            .activations
            .get(&child)
            .cloned()
    }

    /// Records that `parent` owns `child`, when `parent` is itself resident.
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

    fn release_ownership(&self, child: SessionId) {
        let activations: Vec<_> = lock(&self.continuation().state)
            .activations
            .values()
            .cloned()
            .collect();
        for owner in activations {
            if lock(&owner.st).owned.remove(&child) {
                owner.poke();
            }
        }
    }

    fn child_id_available(&self, child: SessionId) -> Result<(), SubagentError> {
        if self.agents().get(child).is_some() || self.activation(child).is_some() {
            return Err(SubagentError::new(
                ErrorCode::DuplicateChild,
                format!("subagent {child} already exists"),
            ));
        }
        Ok(())
    }

    // ----- starting --------------------------------------------------------------------------------

    /// Starts a continuable child of `request.parent` with the provider `provider` and gives it
    /// its first prompt. Resolves as soon as the child's inbox has accepted the prompt (before
    /// its turn starts), with the child's id and the prompt's id.
    ///
    /// Checked now, before anything awaits: admission (`DRAINING`), the parent is live
    /// (`PARENT_UNAVAILABLE`), the id is free (`DUPLICATE_CHILD`), the depth
    /// (`DEPTH_EXCEEDED`), the tool filter names something (`INVALID_REQUEST`), the provider is
    /// registered (`NO_PROVIDER`) and can prepare continuable children
    /// (`UNSUPPORTED_CAPABILITY`). The parent's policy and the fork point are captured now too.
    /// Every failure before the prompt is accepted leaves no activation, no live child and no
    /// ownership; the cancellation covers only that part.
    pub fn start_continuable(
        &self,
        provider: &str,
        request: ContinuableRequest,
    ) -> impl Future<Output = Result<ContinuableStarted, SubagentError>> + Send + 'static {
        let prepared = self.prepare_continuable(provider, &request);
        let runtime = self.clone();
        async move {
            let (child, how) = prepared?;
            let parent = request.parent.clone();
            let _guard = tokio::select! {
                guard = runtime.child_lock(child) => guard,
                _ = request.cancel.cancelled() => {
                    return Err(cancelled_before_publication(parent.id()));
                }
            };
            if request.cancel.is_cancelled() {
                return Err(cancelled_before_publication(parent.id()));
            }
            runtime.assert_admitting(&parent)?;
            runtime.child_id_available(child)?;
            if request.child.is_some() {
                let store = runtime.agents().store().clone();
                let stored = tokio::task::spawn_blocking(move || store.info(child).is_ok())
                    .await
                    .unwrap_or(true);
                if stored {
                    return Err(SubagentError::new(
                        ErrorCode::DuplicateChild,
                        format!("subagent {child} already exists"),
                    ));
                }
            }
            if let Some(hooks) = &request.hooks {
                runtime.remember_request_hooks(child, hooks.clone());
            }
            let activation = match runtime
                .materialize(&parent, child, how, &request.cancel)
                .await
            {
                Ok(activation) => activation,
                Err(error) => {
                    runtime.forget_request_hooks(child);
                    return Err(error);
                }
            };
            let message = runtime
                .submit_materialized(
                    &activation,
                    request.prompt,
                    MessageSource::User,
                    &parent,
                    &request.cancel,
                )
                .await?;
            Ok(ContinuableStarted { child, message })
        }
    }

    /// The synchronous part of a continuable start.
    fn prepare_continuable(
        &self,
        provider_name: &str,
        request: &ContinuableRequest,
    ) -> Result<(SessionId, Materialize), SubagentError> {
        let parent = &request.parent;
        self.assert_admitting(parent)?;
        birth::check_parent(self.agents(), parent)?;
        let child = request.child.unwrap_or_default();
        self.child_id_available(child)?;
        let depth = birth::child_depth(parent, request.max_depth)?;
        birth::check_tool_filter(request.tool_filter.as_ref(), "a continuable child")?;
        let options = birth::child_options(parent.options(), &request.agent_options, depth);
        let descriptor = SubagentDescriptor {
            label: Some(request.label.clone()),
            endpoint: options.endpoint.clone(),
            model: options.model.clone(),
            persona: request.persona.clone(),
            tool_filter: request.tool_filter.clone(),
            ..SubagentDescriptor::new(DescriptorMode::Continuable, provider_name)
        };
        let policy = birth::capture_policy(parent);
        let provider = self.expect_provider(provider_name)?;
        let Some(prepare) = provider.continuable() else {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!(
                    "subagent provider {provider_name:?} does not support continuable children"
                ),
            ));
        };
        let spec = prepare.prepare(&ContinuableCreate {
            child,
            parent: parent.clone(),
        })?;
        Ok((
            child,
            Materialize {
                descriptor,
                options,
                birth: Some(Birth {
                    depth,
                    fork_at: spec.fork_at,
                    policy,
                }),
            },
        ))
    }

    /// Makes `child` resident: creates or resumes its agent with the setup contributions
    /// installed, then, once nothing can refuse it any more, publishes the activation, takes the
    /// parent's ownership, emits `subagent/start` and starts watching for settlement.
    async fn materialize(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        how: Materialize,
        cancel: &Cancellation,
    ) -> Result<Arc<Activation>, SubagentError> {
        self.assert_admitting(parent)?;
        let lineage = self.live_lineage(parent);
        let (settled_tx, settled_rx) = watch::channel(false);
        let ticket = {
            let mut st = lock(&self.continuation().state);
            let ticket = st.next_materialization;
            st.next_materialization += 1;
            st.materializations.insert(
                ticket,
                Materialization {
                    lineage: lineage.clone(),
                    settled: settled_rx,
                },
            );
            ticket
        };
        let result = self
            .materialize_tracked(parent, child, how, lineage, cancel)
            .await;
        lock(&self.continuation().state)
            .materializations
            .remove(&ticket);
        settled_tx.send_replace(true);
        result
    }

    async fn materialize_tracked(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        how: Materialize,
        lineage: Vec<Arc<Agent>>,
        cancel: &Cancellation,
    ) -> Result<Arc<Activation>, SubagentError> {
        if cancel.is_cancelled() {
            return Err(cancelled_before_publication(parent.id()));
        }
        let Installed {
            tools,
            context,
            hooks,
        } = self.install_setups(child);
        let Materialize {
            descriptor,
            options,
            birth: born,
        } = how;
        let provider = descriptor.provider.clone();
        let spec = AgentSpec {
            hooks,
            ..birth::child_spec(
                parent,
                options,
                descriptor.persona.clone(),
                descriptor.tool_filter.clone(),
                tools,
                context,
            )
        };
        let agent = match born {
            Some(Birth {
                depth,
                fork_at,
                policy,
            }) => {
                let plan = ChildPlan {
                    child,
                    depth,
                    fork_at,
                    descriptor,
                    policy,
                    spec,
                };
                birth::create_child(self.agents(), parent, plan).await?
            }
            None => self.agents().resume(child, spec).await.map_err(|e| {
                SubagentError::new(
                    ErrorCode::NotResumable,
                    format!("subagent {child} is unavailable"),
                )
                .with_source(e)
            })?,
        };
        let mut ancestry = vec![Arc::downgrade(&agent)];
        ancestry.extend(lineage.iter().map(Arc::downgrade));
        let activation = Arc::new(Activation {
            run: RunInfo {
                run: RunId::new(),
                provider,
                child,
                parent: parent.id(),
                local: true,
            },
            boundary: agent.with_events(|events| events.len()),
            depth: agent.delegation_depth(),
            agent,
            ancestry,
            st: Mutex::new(ActivationState::default()),
            poke: watch::Sender::new(0),
        });
        lock(&self.continuation().state)
            .activations
            .insert(child, activation.clone());
        let published = if cancel.is_cancelled() {
            Err(cancelled_before_publication(parent.id()))
        } else {
            self.assert_admitting(parent)
                .and_then(|()| self.acquire_ownership(parent, child))
        };
        if let Err(error) = published {
            self.rollback_unpublished(&activation).await;
            return Err(error);
        }
        self.emit(&Lifecycle::Start(activation.run.clone()));
        tokio::spawn(self.clone().watch_settlement(activation.clone()));
        Ok(activation)
    }

    /// Undoes a materialization that could not be published: no notice, no lifecycle edge.
    async fn rollback_unpublished(&self, activation: &Arc<Activation>) {
        let (tx, rx) = watch::channel(Some(Ok(())));
        lock(&activation.st).disposal = Some(rx);
        activation.agent.dispose().await;
        self.forget(activation);
        self.release_ownership(activation.child());
        drop(tx);
    }

    fn forget(&self, activation: &Arc<Activation>) {
        let mut st = lock(&self.continuation().state);
        if st
            .activations
            .get(&activation.child())
            .is_some_and(|a| Arc::ptr_eq(a, activation))
        {
            st.activations.remove(&activation.child());
        }
    }

    // ----- submission --------------------------------------------------------------------------------

    /// Submits to a freshly resident child; if that fails, tears it down (it was never
    /// announced, so no notice is sent) and reports the failure.
    async fn submit_materialized(
        &self,
        activation: &Arc<Activation>,
        content: Vec<ContentBlock>,
        source: MessageSource,
        parent: &Arc<Agent>,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        match self.submit_admitted(activation, content, source, parent, cancel) {
            Ok(id) => Ok(id),
            Err(error) => {
                let _ = wait(self.open_disposal(activation)).await;
                Err(error)
            }
        }
    }

    /// The synchronous acceptance of a message by a resident child.
    fn submit_admitted(
        &self,
        activation: &Arc<Activation>,
        content: Vec<ContentBlock>,
        source: MessageSource,
        parent: &Arc<Agent>,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        if cancel.is_cancelled() {
            return Err(SubagentError::new(
                ErrorCode::Cancelled,
                format!(
                    "the message to subagent {} was cancelled before it was accepted",
                    activation.child()
                ),
            ));
        }
        self.assert_admitting(parent)?;
        if activation.is_closing() {
            return Err(SubagentError::new(
                ErrorCode::ActivationClosing,
                format!(
                    "subagent {} is being torn down; the message was not accepted",
                    activation.child()
                ),
            ));
        }
        self.authorize_lineage(parent, activation.child(), activation.agent.header().parent)?;
        self.acquire_ownership(parent, activation.child())?;
        let message = Message {
            id: MessageId::new(),
            role: Role::User,
            content,
            source,
        };
        let id = message.id;
        let agent = activation.agent.clone();
        admit_waking(activation, id, || agent.followup(message))?;
        lock(&activation.st).announced = true;
        Ok(id)
    }

    /// Sends `message` to `parent` with `send`; when `parent` is itself resident, the message
    /// counts as accepted work so it is not judged settled before claiming it.
    fn send_waking(
        &self,
        parent: &Arc<Agent>,
        id: MessageId,
        send: impl FnOnce() -> Result<(), lineage_agent::AgentError>,
    ) -> Result<(), SubagentError> {
        match self.activation(parent.id()) {
            Some(owner) if Arc::ptr_eq(&owner.agent, parent) => admit_waking(&owner, id, send),
            _ => send().map_err(|e| SubagentError::agent(parent.id(), e)),
        }
    }

    // ----- follow-ups and cold resume ----------------------------------------------------------------

    /// Delivers `content` to `child` as its next turn, on behalf of its exact live parent
    /// `parent`. A running child queues it in the same activation; a waiting one is woken in the
    /// same activation; a child that is not resident is resumed from its log first. Resolves
    /// once the child's inbox has accepted it; `cancel` covers only the work before that: when it
    /// fires first, at any step of a cold resume included, the follow-up is refused
    /// (`CANCELLED`) with the cancellation's cause ([`SubagentError::cancel_cause`]) and nothing
    /// reaches the child.
    pub async fn followup(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        content: Vec<ContentBlock>,
        source: MessageSource,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        self.assert_admitting(parent)?;
        let not_accepted = || followup_cancelled(child, cancel);
        loop {
            {
                // The caller's cancellation ends the wait for the child's lock and for a
                // teardown in progress: nothing has been accepted yet.
                let _guard = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Err(not_accepted()),
                    guard = self.child_lock(child) => guard,
                };
                match self.activation(child) {
                    None => {
                        let resumed = self
                            .cold_resume(parent, child, content, source, cancel)
                            .await;
                        return as_followup(resumed, child, cancel);
                    }
                    Some(activation) => {
                        let disposal = lock(&activation.st).disposal.clone();
                        match disposal {
                            // Lost the race with the final teardown: wait for it, then resume.
                            Some(disposal) => {
                                tokio::select! {
                                    biased;
                                    _ = cancel.cancelled() => return Err(not_accepted()),
                                    _ = wait(disposal) => {}
                                }
                            }
                            None => {
                                let submitted = self.submit_admitted(
                                    &activation,
                                    content,
                                    source,
                                    parent,
                                    cancel,
                                );
                                return as_followup(submitted, child, cancel);
                            }
                        }
                    }
                }
            }
            self.assert_admitting(parent)?;
            if cancel.is_cancelled() {
                return Err(not_accepted());
            }
        }
    }

    /// Resumes a settled child from its log and submits `content` to it. No provider is asked:
    /// the child's model endpoint, model, persona and tool filter come from its descriptor, its
    /// token limit, depth and policy from its own events.
    async fn cold_resume(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        content: Vec<ContentBlock>,
        source: MessageSource,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        let store = self.agents().store().clone();
        self.cold_resume_from(parent, child, content, source, cancel, move || {
            store.inspect(child).map_err(|e| e.to_string())
        })
        .await
    }

    /// [`Self::cold_resume`] with the store inspection `inspect`, run on a blocking thread. The
    /// caller's cancellation is honoured before the inspection starts, while it runs (the
    /// resume does not wait for it) and once it returns.
    async fn cold_resume_from(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        content: Vec<ContentBlock>,
        source: MessageSource,
        cancel: &Cancellation,
        inspect: impl FnOnce() -> Result<Loaded, String> + Send + 'static,
    ) -> Result<MessageId, SubagentError> {
        if cancel.is_cancelled() {
            return Err(followup_cancelled(child, cancel));
        }
        let read = tokio::task::spawn_blocking(inspect);
        let inspected = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(followup_cancelled(child, cancel)),
            done = read => done.map_err(|e| e.to_string()).and_then(|r| r),
        };
        if cancel.is_cancelled() {
            return Err(followup_cancelled(child, cancel));
        }
        let unavailable = |reason: String| {
            SubagentError::new(
                ErrorCode::NotResumable,
                format!("subagent {child} is unavailable: {reason}"),
            )
        };
        let loaded = inspected.map_err(unavailable)?;
        self.assert_admitting(parent)?;
        self.authorize_lineage(parent, child, loaded.header.parent)?;
        let descriptor = match fold_descriptor(&loaded.events) {
            Some(d) if let Err(problem) = lineage_log::check_descriptor(d) => {
                return Err(SubagentError::new(
                    ErrorCode::NotResumable,
                    format!(
                        "subagent {child} cannot be resumed: its stored subagent descriptor \
                         breaks the descriptor contract ({problem}); do not send it messages again"
                    ),
                ));
            }
            Some(d) if d.mode == DescriptorMode::Continuable => d.clone(),
            _ => {
                return Err(SubagentError::new(
                    ErrorCode::NotResumable,
                    format!(
                        "subagent {child} has no continuation state and cannot be resumed; do not \
                         send it messages again"
                    ),
                ));
            }
        };
        let options = AgentOptions {
            endpoint: descriptor.endpoint.clone(),
            model: descriptor.model.clone(),
            max_tokens: birth::recorded_max_tokens(child, &loaded.events)?,
            // The stored lineage is the floor; the runtime asks for nothing more.
            subagent_depth: 0,
        };
        let activation = self
            .materialize(
                parent,
                child,
                Materialize {
                    descriptor,
                    options,
                    birth: None,
                },
                cancel,
            )
            .await?;
        self.submit_materialized(&activation, content, source, parent, cancel)
            .await
    }

    // ----- interrupt and report ----------------------------------------------------------------------

    /// Cancels the current turn of the resident child `target`, keeping its queued work parked
    /// until the next waking send; its own children keep running. A target that is not resident
    /// (unknown, one-shot, settled, being torn down) is an accepted no-op. Refused
    /// (`UNAUTHORIZED`) for a stale or self-targeting ancestor (before the target is looked up),
    /// and for a caller that is not the target's parent (user) or live ancestor (agent).
    pub fn interrupt(&self, target: SessionId, authority: &Authority) -> Result<(), SubagentError> {
        if let Authority::Ancestor(agent) = authority {
            if !self.agents().is_live(agent) {
                return Err(unauthorized(format!(
                    "interrupting {target} requires the exact live ancestor agent"
                )));
            }
            if agent.id() == target {
                return Err(unauthorized(format!(
                    "agent {target} cannot interrupt itself"
                )));
            }
        }
        let Some(activation) = self.activation(target) else {
            return Ok(());
        };
        let cause = match authority {
            Authority::User { parent } => {
                if activation.agent.header().parent != Some(*parent) {
                    return Err(unauthorized(format!(
                        "subagent {target} belongs to another parent session"
                    )));
                }
                AbortCause::User
            }
            Authority::Ancestor(agent) => {
                if !activation.in_ancestry(agent) {
                    return Err(unauthorized(format!(
                        "subagent {target} is not a live descendant of agent {}",
                        agent.id()
                    )));
                }
                AbortCause::Parent
            }
        };
        if activation.is_closing() {
            return Ok(());
        }
        activation
            .agent
            .cancel(cause, Queued::Keep)
            .map_err(|e| SubagentError::agent(target, e))
    }

    /// Delivers `content` from the continuable child `child` (the exact live agent of a resident
    /// activation) to its direct parent, marked as the child's report. Reporting never ends
    /// the child's turn.
    pub fn report(
        &self,
        child: &Arc<Agent>,
        content: Vec<ContentBlock>,
        delivery: ReportDelivery,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        if cancel.is_cancelled() {
            return Err(SubagentError::new(
                ErrorCode::Cancelled,
                format!("the report of {} was cancelled", child.id()),
            ));
        }
        self.assert_admitting(child)?;
        let activation = self
            .activation(child.id())
            .filter(|a| Arc::ptr_eq(&a.agent, child))
            .ok_or_else(|| {
                unauthorized(format!(
                    "agent {} is not a live continuable subagent and cannot report",
                    child.id()
                ))
            })?;
        if activation.is_closing() {
            return Err(SubagentError::new(
                ErrorCode::ActivationClosing,
                format!(
                    "subagent {} is being torn down; the report was not delivered",
                    child.id()
                ),
            ));
        }
        let parent_unavailable = || {
            SubagentError::new(
                ErrorCode::ParentUnavailable,
                format!(
                    "the direct parent of {} is not live; the report was not delivered",
                    child.id()
                ),
            )
        };
        let parent = child
            .header()
            .parent
            .and_then(|p| self.agents().get(p))
            .ok_or_else(parent_unavailable)?;
        let mut blocks = vec![ContentBlock::text(format!(
            "Background subagent {} reports:",
            child.id()
        ))];
        blocks.extend(content);
        let message = Message {
            id: MessageId::new(),
            role: Role::User,
            content: blocks,
            source: MessageSource::SubagentReport { sender: child.id() },
        };
        let id = message.id;
        let sent = match delivery {
            ReportDelivery::NextStep => {
                let recipient = parent.clone();
                self.send_waking(&parent, id, move || recipient.steer(message))
            }
            ReportDelivery::Quiet => parent
                .inject(message)
                .map_err(|e| SubagentError::agent(parent.id(), e)),
        };
        sent.map_err(|e| parent_unavailable().with_source(e))?;
        Ok(id)
    }

    // ----- settlement and teardown --------------------------------------------------------------------

    /// Waits until the activation settles, then tears it down. It looks again whenever the
    /// agent goes idle, its status or inbox changes (a claim or a discard settles accepted
    /// work), or the manager pokes it (ownership released, work admitted).
    async fn watch_settlement(self, activation: Arc<Activation>) {
        let mut poked = activation.poke.subscribe();
        let mut changed = activation.agent.changes();
        loop {
            poked.borrow_and_update();
            changed.borrow_and_update();
            if activation.is_closing() {
                return;
            }
            tokio::select! {
                () = activation.agent.when_idle() => {}
                _ = poked.changed() => {}
                _ = changed.changed() => {}
            }
            let disposal = {
                let _guard = self.child_lock(activation.child()).await;
                if activation.is_closing() {
                    return;
                }
                match activation.residency() {
                    Residency::Settled => Some(self.open_disposal(&activation)),
                    Residency::Running | Residency::Waiting => None,
                }
            };
            match disposal {
                Some(disposal) => {
                    // A failure is reported by the teardown itself.
                    let _ = wait(disposal).await;
                    return;
                }
                None => {
                    if activation.agent.status() != AgentStatus::Running {
                        tokio::select! {
                            _ = poked.changed() => {}
                            _ = changed.changed() => {}
                        }
                    }
                }
            }
        }
    }

    /// Opens the teardown of `activation` (once; later calls share it): the admission cutoff
    /// and the cancellations happen now, in one synchronous span, this child's before those of
    /// the children it owns; the rest runs on its own task (where children finish first).
    fn open_disposal(&self, activation: &Arc<Activation>) -> Disposal {
        let (tx, rx) = {
            let mut st = lock(&activation.st);
            if let Some(disposal) = &st.disposal {
                return disposal.clone();
            }
            let (tx, rx) = watch::channel(None);
            st.disposal = Some(rx.clone());
            (tx, rx)
        };
        activation.poke();
        if let Err(error) = activation.agent.cancel(AbortCause::Parent, Queued::Discard) {
            self.diagnose(
                activation.child(),
                DiagnosticKind::CancelFailed,
                format!("cancelling the settled child failed: {error}"),
            );
        }
        let owned: Vec<SessionId> = lock(&activation.st).owned.iter().copied().collect();
        let children: Vec<Disposal> = owned
            .into_iter()
            .filter_map(|id| self.activation(id).map(|a| self.open_disposal(&a)))
            .collect();
        let runtime = self.clone();
        let activation = activation.clone();
        tokio::spawn(async move {
            let outcome = runtime.finish_disposal(&activation, children).await;
            tx.send_replace(Some(outcome));
        });
        rx
    }

    /// The rest of a teardown, in order: the children's teardowns, quiescence, the epoch's
    /// terminal facts, disposal of the agent (its final flush included), the activation
    /// forgotten, the notice, ownership released, `subagent/end`. A child's failed teardown or
    /// a failed disposal of the agent fails this one (the epoch then counts as failed), and it is
    /// still carried through to the end, then reported to the registry's watchers.
    async fn finish_disposal(
        &self,
        activation: &Arc<Activation>,
        children: Vec<Disposal>,
    ) -> Result<(), SubagentError> {
        let id = activation.child();
        let mut failures = Vec::new();
        if let Err(error) = aggregate(children, "child activation(s)").await {
            failures.push(format!("child teardown failed: {error}"));
        }
        activation.agent.when_idle().await;
        let terminal = activation.agent.with_events(|events| {
            let own = &events[activation.boundary.min(events.len())..];
            Terminal {
                stop_reason: epoch_stop_reason(own),
                output: closing_message(own),
            }
        });
        if let Err(error) = activation.agent.try_dispose().await {
            failures.push(format!("its agent's disposal failed: {error}"));
        }
        let failure = match failures.as_slice() {
            [] => None,
            [one] => Some(teardown_failed(format!("subagent {id}: {one}"))),
            many => Some(teardown_failed(format!(
                "subagent {id}: teardown failed at {} boundaries: {}",
                many.len(),
                many.join("; ")
            ))),
        };
        self.forget(activation);
        let terminal = match &failure {
            Some(_) => Terminal {
                stop_reason: StopReason::Error,
                output: Vec::new(),
            },
            None => terminal,
        };
        self.notify_settlement(activation, &terminal);
        self.release_ownership(id);
        self.emit(&Lifecycle::End {
            info: activation.run.clone(),
            stop_reason: terminal.stop_reason,
            last_assistant_message: (!terminal.output.is_empty()).then_some(terminal.output),
        });
        match failure {
            Some(error) => {
                self.diagnose(id, DiagnosticKind::TeardownFailed, error.to_string());
                Err(error)
            }
            None => Ok(()),
        }
    }

    /// Tells the parent that the child settled, with its closing message. Sent only when the
    /// child was announced and the parent is live; never fails the teardown.
    fn notify_settlement(&self, activation: &Arc<Activation>, terminal: &Terminal) {
        if !lock(&activation.st).announced {
            return;
        }
        let Some(parent) = self.agents().get(activation.run.parent) else {
            return;
        };
        let child = activation.child();
        let summary = settlement_summary(child, &terminal.stop_reason);
        let mut content = vec![ContentBlock::text(summary.clone())];
        if terminal.output.is_empty() {
            content.push(ContentBlock::text("It left no closing message."));
        } else {
            content.push(ContentBlock::text("Its closing message:"));
            content.extend(terminal.output.iter().cloned());
        }
        let message = Message {
            id: MessageId::new(),
            role: Role::User,
            content,
            source: MessageSource::SubagentSettled {
                sender: child,
                summary: bound_summary(&summary).into(),
            },
        };
        let id = message.id;
        // A parent in teardown (its runtime or subtree draining, its own activation closing, or
        // its agent being disposed) gets the notice quietly: waking it would start a turn its
        // teardown then has to wait for.
        let tearing_down = self.assert_admitting(&parent).is_err()
            || parent.is_disposing()
            || self
                .activation(parent.id())
                .is_some_and(|owner| Arc::ptr_eq(&owner.agent, &parent) && owner.is_closing());
        let sent = if tearing_down {
            parent
                .inject(message)
                .map_err(|e| SubagentError::agent(parent.id(), e))
        } else {
            let recipient = parent.clone();
            self.send_waking(&parent, id, move || {
                if recipient.status() == AgentStatus::Idle {
                    recipient.followup(message)
                } else {
                    recipient.steer(message)
                }
            })
        };
        if let Err(error) = sent {
            self.diagnose(
                parent.id(),
                DiagnosticKind::NoticeUndelivered,
                format!("the settlement notice of subagent {child} was not delivered: {error}"),
            );
        }
    }

    // ----- drains --------------------------------------------------------------------------------------

    /// Closes admission for good and tears every resident child down: every cancellation fires
    /// at once, parents before children; each teardown then waits for its children's.
    /// Creations under way are awaited (they roll back).
    pub async fn drain(&self) -> Result<(), SubagentError> {
        let pending = {
            let mut st = lock(&self.continuation().state);
            st.draining = true;
            settled_of(&st.materializations, |_| true)
        };
        for mut settled in pending {
            let _ = settled.wait_for(|s| *s).await;
        }
        let roots = self.roots();
        self.dispose_all(roots, "activation(s)").await
    }

    /// Tears down every resident descendant of the exact live agents `parents` (every
    /// cancellation at once, parents before children), and keeps admission closed below each
    /// of them until that agent itself is gone. A parent that is not the live agent under its
    /// id is ignored; other trees are untouched.
    pub async fn drain_descendants(&self, parents: &[Arc<Agent>]) -> Result<(), SubagentError> {
        let roots: Vec<Arc<Agent>> = parents
            .iter()
            .filter(|p| self.agents().is_live(p))
            .cloned()
            .collect();
        if roots.is_empty() {
            return Ok(());
        }
        let activations: Vec<Arc<Activation>> = lock(&self.continuation().state)
            .activations
            .values()
            .cloned()
            .collect();
        let targets: Vec<Arc<Activation>> = activations
            .into_iter()
            .filter(|a| {
                roots
                    .iter()
                    .any(|r| !Arc::ptr_eq(&a.agent, r) && a.in_ancestry(r))
            })
            .collect();
        let pending = {
            let mut st = lock(&self.continuation().state);
            for root in &roots {
                let mut members = vec![root.clone()];
                for target in &targets {
                    if target.in_ancestry(root) {
                        members.extend(self.live_lineage(&target.agent));
                    }
                }
                for m in st.materializations.values() {
                    if m.lineage.iter().any(|a| Arc::ptr_eq(a, root)) {
                        members.extend(m.lineage.iter().cloned());
                    }
                }
                st.closing.push(ClosingScope {
                    root: root.clone(),
                    members,
                });
            }
            settled_of(&st.materializations, |m| {
                m.lineage
                    .iter()
                    .any(|a| roots.iter().any(|r| Arc::ptr_eq(a, r)))
            })
        };
        // Every target's teardown opens now; creations under way roll back meanwhile.
        let disposals = self.open_top_down(targets);
        for mut settled in pending {
            let _ = settled.wait_for(|s| *s).await;
        }
        aggregate(disposals, "scoped activation(s)").await
    }

    /// Tears down the resident direct children `children` of the exact live agent `parent`.
    /// Ids that are not resident are ignored; an id that is resident but not `parent`'s direct
    /// child is refused before anything is torn down. Admission stays open.
    pub async fn drain_children(
        &self,
        parent: &Arc<Agent>,
        children: &[SessionId],
    ) -> Result<(), SubagentError> {
        if !self.agents().is_live(parent) {
            return Err(unauthorized(
                "a selected child teardown requires the exact live parent agent".into(),
            ));
        }
        let mut seen = HashSet::new();
        let mut targets = Vec::new();
        for id in children.iter().filter(|id| seen.insert(**id)) {
            if let Some(activation) = self.activation(*id) {
                if activation.run.parent != parent.id() || !activation.in_ancestry(parent) {
                    return Err(unauthorized(format!(
                        "subagent {id} is not a direct child of agent {}",
                        parent.id()
                    )));
                }
                targets.push(activation);
            }
        }
        self.dispose_all(targets, "selected activation(s)").await
    }

    /// The activations no other resident activation owns.
    fn roots(&self) -> Vec<Arc<Activation>> {
        let activations: Vec<Arc<Activation>> = lock(&self.continuation().state)
            .activations
            .values()
            .cloned()
            .collect();
        let owned: HashSet<SessionId> = activations
            .iter()
            .flat_map(|a| lock(&a.st).owned.iter().copied().collect::<Vec<_>>())
            .collect();
        activations
            .into_iter()
            .filter(|a| !owned.contains(&a.child()))
            .collect()
    }

    async fn dispose_all(
        &self,
        targets: Vec<Arc<Activation>>,
        subject: &str,
    ) -> Result<(), SubagentError> {
        let disposals = self.open_top_down(targets);
        aggregate(disposals, subject).await
    }

    /// Opens the teardowns of `targets` shallowest first, in one synchronous span: every
    /// parent's cancellation fires before any of its descendants', whatever order the targets
    /// came in (each teardown also opens its own children's right after its cancel).
    fn open_top_down(&self, mut targets: Vec<Arc<Activation>>) -> Vec<Disposal> {
        targets.sort_by_key(|t| t.depth);
        targets.iter().map(|t| self.open_disposal(t)).collect()
    }

    /// The children resident now (running, waiting, or being torn down).
    pub fn resident(&self) -> Vec<SessionId> {
        lock(&self.continuation().state)
            .activations
            .keys()
            .copied()
            .collect()
    }

    /// Whether `child` has a resident activation (running or waiting).
    pub fn is_resident(&self, child: SessionId) -> bool {
        self.activation(child).is_some_and(|a| !a.is_closing())
    }
}

/// Counts `id` as accepted waking work of `activation` before `send` runs, so the activation
/// cannot be judged settled in between; undoes it if `send` fails.
fn admit_waking(
    activation: &Arc<Activation>,
    id: MessageId,
    send: impl FnOnce() -> Result<(), lineage_agent::AgentError>,
) -> Result<(), SubagentError> {
    lock(&activation.st).accepted.insert(id);
    if let Err(error) = send() {
        lock(&activation.st).accepted.remove(&id);
        return Err(SubagentError::agent(activation.agent.id(), error));
    }
    activation.poke();
    Ok(())
}

fn settled_of(
    materializations: &HashMap<u64, Materialization>,
    select: impl Fn(&Materialization) -> bool,
) -> Vec<watch::Receiver<bool>> {
    materializations
        .values()
        .filter(|m| select(m))
        .map(|m| m.settled.clone())
        .collect()
}

/// Waits for a teardown's outcome.
async fn wait(mut disposal: Disposal) -> Result<(), SubagentError> {
    match disposal.wait_for(Option::is_some).await.as_deref() {
        Ok(Some(outcome)) => outcome.clone(),
        // The sender is dropped without an outcome only if the teardown task panicked.
        _ => Err(teardown_failed(
            "an activation teardown stopped without an outcome".into(),
        )),
    }
}

/// Waits for every teardown and reports all failures together.
async fn aggregate(disposals: Vec<Disposal>, subject: &str) -> Result<(), SubagentError> {
    let mut failures = Vec::new();
    for disposal in disposals {
        if let Err(error) = wait(disposal).await {
            failures.push(error.to_string());
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(teardown_failed(format!(
            "continuable subagent teardown failed for {} {subject}: {}",
            failures.len(),
            failures.join("; ")
        )))
    }
}

/// How an epoch of a continuable child ended, from its own events.
///
/// The last turn that did work counts: one that ran a step, or that claimed input and ended
/// other than `completed`. A discard of pending input that never ran, with no such turn after
/// it, makes an otherwise complete epoch `aborted`.
pub(crate) fn epoch_stop_reason(own: &[Event]) -> StopReason {
    let mut open: Option<(bool, bool)> = None; // (stepped, claimed)
    let mut end: Option<&TurnEndReason> = None;
    let mut dropped_unrun = false;
    for event in own {
        match &event.body {
            EventBody::TurnStart(_) => open = Some((false, false)),
            EventBody::StepStart(_) => {
                if let Some(turn) = &mut open {
                    turn.0 = true;
                }
            }
            EventBody::InboxSpliced(splice) if splice.removed > 0 => {
                if splice.canceled {
                    dropped_unrun |= splice.inserted.is_empty();
                } else if let Some(turn) = &mut open {
                    turn.1 = true;
                }
            }
            EventBody::TurnEnd(turn_end) => {
                if let Some((stepped, claimed)) = open.take()
                    && (stepped || (claimed && turn_end.reason != TurnEndReason::Completed))
                {
                    end = Some(&turn_end.reason);
                    dropped_unrun = false;
                }
            }
            _ => {}
        }
    }
    match end {
        Some(TurnEndReason::MaxTokens) => StopReason::MaxTokens,
        Some(TurnEndReason::Aborted { .. } | TurnEndReason::Interrupted) => StopReason::Aborted,
        Some(TurnEndReason::Error(_)) => StopReason::Error,
        Some(TurnEndReason::Blocked) => StopReason::Refusal,
        Some(TurnEndReason::Completed) | None if dropped_unrun => StopReason::Aborted,
        Some(TurnEndReason::Completed) | None => StopReason::Completed,
    }
}

/// The closing message of an epoch: the content of its last assistant message that has any,
/// verbatim, tool-call blocks included. Empty when the epoch wrote no such message.
pub(crate) fn closing_message(own: &[Event]) -> Vec<ContentBlock> {
    own.iter()
        .rev()
        .find_map(|e| match &e.body {
            EventBody::AssistantMessage(m) if !m.message.content.is_empty() => {
                Some(m.message.content.clone())
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// The most characters a settlement notice's summary has.
pub(crate) const SUMMARY_BOUND: usize = 120;

/// The first line of a settlement notice, which is also its summary: every line fits
/// [`SUMMARY_BOUND`] with the child's full id, an abnormal end's reason being shortened to fit.
pub(crate) fn settlement_summary(child: SessionId, stop: &StopReason) -> String {
    let subject = format!("Background subagent {child}");
    match stop {
        StopReason::Completed => {
            format!("{subject} finished; it will do nothing more unless you message it again.")
        }
        StopReason::Aborted => format!("{subject} was stopped before it finished."),
        StopReason::MaxTokens => format!("{subject} ran out of output room before it finished."),
        StopReason::Refusal => format!("{subject} declined the task."),
        StopReason::Error => format!("{subject} failed before it finished."),
        StopReason::Other(reason) => {
            let (open, close) = (" ended abnormally (", ") before it finished.");
            let room = SUMMARY_BOUND
                .saturating_sub(subject.chars().count() + open.len() + close.len())
                .max(1);
            // One line: a control character in the reason reads as a space.
            let reason: String = reason
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let reason = if reason.chars().count() <= room {
                reason
            } else {
                let mut cut: String = reason.chars().take(room - 1).collect();
                cut.push('…');
                cut
            };
            format!("{subject}{open}{reason}{close}")
        }
    }
}

/// `summary` cut to [`SUMMARY_BOUND`] characters, ending in an ellipsis when cut.
pub(crate) fn bound_summary(summary: &str) -> String {
    if summary.chars().count() <= SUMMARY_BOUND {
        return summary.to_owned();
    }
    let mut cut: String = summary.chars().take(SUMMARY_BOUND - 1).collect();
    cut.push('…');
    cut
}

/// The refusal of a follow-up to `child` that `cancel` stopped before the child accepted it,
/// carrying the cancellation's cause.
fn followup_cancelled(child: SessionId, cancel: &Cancellation) -> SubagentError {
    let by = cancel.cause().map(|cause| CancelledBy { cause });
    let how = by
        .as_ref()
        .map_or_else(|| "cancelled".to_owned(), ToString::to_string);
    let error = SubagentError::new(
        ErrorCode::Cancelled,
        format!("the follow-up to subagent {child} was {how} before the child accepted it"),
    );
    match by {
        Some(by) => error.with_source(by),
        None => error,
    }
}

/// A follow-up's outcome: a refusal that the caller's cancellation caused (whichever step
/// noticed it) is reported as the follow-up's cancellation, with its cause.
fn as_followup(
    outcome: Result<MessageId, SubagentError>,
    child: SessionId,
    cancel: &Cancellation,
) -> Result<MessageId, SubagentError> {
    match outcome {
        Err(error) if error.code() == ErrorCode::Cancelled && cancel.is_cancelled() => {
            Err(followup_cancelled(child, cancel))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_settlement_summary_is_a_whole_line_within_its_bound_with_a_full_id() {
        let child = SessionId::new();
        let long = "a reason far too long to fit on the first line of a notice ".repeat(4);
        for stop in [
            StopReason::Completed,
            StopReason::Aborted,
            StopReason::MaxTokens,
            StopReason::Refusal,
            StopReason::Error,
            StopReason::Other("quota".into()),
            StopReason::Other("two\nlines".into()),
            StopReason::Other(long.as_str().into()),
        ] {
            let line = settlement_summary(child, &stop);
            assert!(line.contains(&child.to_string()), "{line}");
            assert!(line.chars().count() <= SUMMARY_BOUND, "{stop:?}: {line}");
            assert_eq!(bound_summary(&line), line, "{stop:?} needs no cut");
            assert!(!line.contains('\n'), "{line}");
        }
        let other = settlement_summary(child, &StopReason::Other(long.as_str().into()));
        assert!(other.ends_with("…) before it finished."), "{other}");
    }
}

#[cfg(test)]
mod cold_resume_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use lineage_agent::{AgentSpec, Agents, CreateAgent, ScriptedModel};
    use lineage_store::Store;

    use super::*;

    #[tokio::test]
    async fn the_inspection_of_a_cold_resume_honours_the_cancellation_around_and_during_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path().join("agents.lineage")).expect("the store opens");
        let agents = Agents::new(store, ScriptedModel::new([]));
        let runtime = SubagentRuntime::new(agents.clone());
        let parent = agents
            .create(CreateAgent::fresh(AgentSpec::default()))
            .await
            .expect("the parent is created");
        let child = SessionId::new();
        let resume =
            |cancel: Cancellation, inspect: Box<dyn FnOnce() -> Result<Loaded, String> + Send>| {
                let (runtime, parent) = (runtime.clone(), parent.clone());
                async move {
                    let content = vec![ContentBlock::text("again")];
                    let source = MessageSource::Coordinator {
                        sender: parent.id(),
                    };
                    runtime
                        .cold_resume_from(&parent, child, content, source, &cancel, inspect)
                        .await
                }
            };
        let expect_cancelled = |outcome: Result<MessageId, SubagentError>, cause: AbortCause| {
            let error = outcome.expect_err("a cancelled resume is refused");
            assert_eq!(error.code(), ErrorCode::Cancelled, "{error}");
            assert_eq!(error.cancel_cause(), Some(&cause), "{error}");
            assert!(error.to_string().contains("follow-up"), "{error}");
        };

        // Cancelled before: the store is not read.
        let reads = Arc::new(AtomicUsize::new(0));
        let cancel = Cancellation::new();
        cancel.cancel(AbortCause::Parent);
        let counted = reads.clone();
        let outcome = resume(
            cancel,
            Box::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Err("unread".into())
            }),
        )
        .await;
        expect_cancelled(outcome, AbortCause::Parent);
        assert_eq!(reads.load(Ordering::SeqCst), 0);

        // Cancelled during a read that then fails: the cancellation, not the read, is reported.
        let cancel = Cancellation::new();
        let fire = cancel.clone();
        let outcome = resume(
            cancel,
            Box::new(move || {
                fire.cancel(AbortCause::User);
                Err("the session is not stored".into())
            }),
        )
        .await;
        expect_cancelled(outcome, AbortCause::User);

        // Cancelled while the read is held up: the resume does not wait for it.
        let cancel = Cancellation::new();
        let fire = cancel.clone();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let resuming = resume(
            cancel,
            Box::new(move || {
                fire.cancel(AbortCause::Disposed);
                let _ = held.recv();
                Err("released".into())
            }),
        );
        // Only a resume that waits for the held read runs into this bound.
        let bound = std::time::Duration::from_secs(10);
        let Ok(outcome) = tokio::time::timeout(bound, resuming).await else {
            let _ = release.send(());
            panic!("the resume waited for a read its cancellation had overtaken");
        };
        expect_cancelled(outcome, AbortCause::Disposed);
        release.send(()).expect("the held read is released");
    }
}
