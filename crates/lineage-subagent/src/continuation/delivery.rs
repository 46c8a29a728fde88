//! Delivery: follow-ups (one route: resident here, kept by another host, or resumed cold),
//! interrupts and reports.

use lineage_agent::{AgentOptions, Cancellation, Queued};
use lineage_log::{
    AbortCause, ContentBlock, DescriptorMode, Message, MessageSource, Role, fold_descriptor,
};
use lineage_store::Loaded;

use super::activation::ActivationPlan;
use super::admission::is_live_agent;
use super::recovery::{holds_retry, log_pending, run_restored_input};
use super::teardown::wait;
use super::*;
use crate::birth;
use crate::setup::Installer;
use crate::{Authority, CancelledBy, FollowupRequest, ReportDelivery};

/// A follow-up under way: from the exact live `parent` to `child`, given up when `cancel` fires
/// before the child accepts it; a cold resume installs `installer`'s contributions.
#[derive(Clone, Copy)]
struct Followup<'a> {
    parent: &'a Arc<Agent>,
    child: SessionId,
    cancel: &'a Cancellation,
    installer: Installer<'a>,
}

/// Where a follow-up's recipient is, under its lock.
enum Holder {
    /// Resident here and accepting.
    Here(Arc<Activation>),
    /// Resident here, its teardown under way.
    TearingDown(Disposal),
    /// Kept by another host of a shared store: reached by mail.
    Elsewhere,
    /// Resident nowhere: resumed from its log.
    Cold,
}

impl Continuation {
    // ----- submission --------------------------------------------------------------------------------

    /// Submits to a freshly resident child; if that fails, tears it down (it was never
    /// announced, so no notice is sent) and reports the failure.
    pub(super) async fn submit_to_new_activation(
        self: &Arc<Self>,
        activation: &Arc<Activation>,
        message: Message,
        parent: &Arc<Agent>,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        match self.submit_admitted(activation, message, parent, cancel) {
            Ok(id) => Ok(id),
            Err(error) => {
                let _ = wait(activation.open_disposal(self)).await;
                Err(error)
            }
        }
    }

    /// The synchronous acceptance of a message by a resident child.
    fn submit_admitted(
        &self,
        activation: &Arc<Activation>,
        message: Message,
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
        let id = message.id;
        // A message the child's log holds already (a retry with the same id, or mail another
        // host delivered before it stopped) is accepted without being delivered again.
        let child = activation.child();
        if !activation
            .agent
            .with_events(|events: &[lineage_log::Event]| holds_retry(events, child, &message))?
        {
            let agent = activation.agent.clone();
            activation.admit_waking(id, || agent.followup(message))?;
        }
        lock(&activation.st).announced = true;
        Ok(id)
    }

    /// Sends `message` to `parent` with `send`; when `parent` is itself resident, the message
    /// counts as accepted work so it is not judged settled before claiming it.
    pub(super) fn send_waking(
        &self,
        parent: &Arc<Agent>,
        id: MessageId,
        send: impl FnOnce() -> Result<(), lineage_agent::AgentError>,
    ) -> Result<(), SubagentError> {
        match self.activation(parent.id()) {
            Some(owner) if Arc::ptr_eq(&owner.agent, parent) => owner.admit_waking(id, send),
            _ => send().map_err(|e| SubagentError::agent(parent.id(), e)),
        }
    }

    // ----- follow-ups and cold resume ----------------------------------------------------------------

    /// [`crate::SubagentRuntime::followup`]: `content` delivered to `child` as its next turn, on
    /// behalf of its exact live parent `parent`; a cold resume installs `installer`'s
    /// contributions.
    pub(super) async fn followup(
        self: &Arc<Self>,
        request: &FollowupRequest,
        installer: Installer<'_>,
    ) -> Result<MessageId, SubagentError> {
        let FollowupRequest {
            parent,
            child,
            content,
            source,
            message_id,
            cancel,
        } = request;
        let (child, cancel) = (*child, cancel);
        let message = Message {
            id: message_id.unwrap_or_default(),
            role: Role::User,
            content: content.clone(),
            source: source.clone(),
        };
        let to = Followup {
            parent,
            child,
            cancel,
            installer,
        };
        let id = self.followup_message(to, message).await?;
        // On a shared store another host may take the child over at any moment: a follow-up it
        // accepted here is durable before it is reported accepted (mail is, by its deliverer).
        // A flush that fails leaves the message in the child's inbox here, and perhaps in the
        // store: not refused, and not known to be durable.
        if self.agents.store().is_shared()
            && let Some(agent) = self.agents.get(child)
            && let Err(error) = agent.flush().await
        {
            return Err(SubagentError::new(
                ErrorCode::OutcomeUnknown,
                format!(
                    "the follow-up {id} to subagent {child} was accepted but may not be durable \
                     ({error}); retry with the same message id"
                ),
            )
            .with_source(error));
        }
        Ok(id)
    }

    /// Where `child` is now; asked under its lock. A resident child whose agent stopped for
    /// good (its lease lost) is torn down now rather than handed the follow-up it cannot run.
    async fn locate(self: &Arc<Self>, child: SessionId) -> Holder {
        let Some(activation) = self.activation(child) else {
            return if self.mailbox.held_elsewhere(child).await {
                Holder::Elsewhere
            } else {
                Holder::Cold
            };
        };
        let disposal = lock(&activation.st).disposal.clone();
        match disposal {
            Some(disposal) => Holder::TearingDown(disposal),
            None if activation.agent.is_stopped() => {
                Holder::TearingDown(activation.open_disposal(self))
            }
            None => Holder::Here(activation),
        }
    }

    /// A follow-up of a message with its id: the child's log holds it once, whichever way and
    /// however many times it is sent. Each round takes the child's lock and goes where
    /// [`Self::locate`] finds the child; mail goes without the lock.
    async fn followup_message(
        self: &Arc<Self>,
        to: Followup<'_>,
        message: Message,
    ) -> Result<MessageId, SubagentError> {
        let Followup {
            parent,
            child,
            cancel,
            ..
        } = to;
        self.assert_admitting(parent)?;
        let not_accepted = || followup_cancelled(child, cancel);
        loop {
            // The caller's cancellation ends the wait for the child's lock and for a teardown in
            // progress: nothing has been accepted yet.
            let guard = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(not_accepted()),
                guard = self.child_lock(child) => guard,
            };
            let by_mail = match self.locate(child).await {
                Holder::Here(activation) => {
                    let submitted = self.submit_admitted(&activation, message, parent, cancel);
                    return as_followup(submitted, child, cancel);
                }
                // Lost the race with the final teardown: wait for it, then resume.
                Holder::TearingDown(disposal) => {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return Err(not_accepted()),
                        _ = wait(disposal) => {}
                    }
                    false
                }
                Holder::Cold => {
                    let resumed = self.cold_resume(to, message.clone()).await;
                    // Unless another host resumed it first.
                    if resumed.is_ok() || !self.mailbox.held_elsewhere(child).await {
                        return as_followup(resumed, child, cancel);
                    }
                    true
                }
                Holder::Elsewhere => true,
            };
            // Mail goes without the child's lock: its wait may end in a resume here, which takes
            // it.
            drop(guard);
            if by_mail && let Some(id) = self.followup_by_mail(to, &message).await? {
                return Ok(id);
            }
            self.assert_admitting(parent)?;
            if cancel.is_cancelled() {
                return Err(not_accepted());
            }
        }
    }

    /// The checks of a follow-up to a child that is not resident here, against the durable
    /// parent its stored header names: admission, then the exact live parent.
    fn authorize_stored(
        &self,
        to: Followup<'_>,
        stored_parent: Option<SessionId>,
    ) -> Result<(), SubagentError> {
        self.assert_admitting(to.parent)?;
        self.authorize_lineage(to.parent, to.child, stored_parent)
    }

    /// A follow-up to a child another host keeps: checked here as a cold resume would check it,
    /// then sent by mail. `None`: nobody holds the child any more and the mail was taken back,
    /// for the follow-up to find the child again.
    async fn followup_by_mail(
        &self,
        to: Followup<'_>,
        message: &Message,
    ) -> Result<Option<MessageId>, SubagentError> {
        let info = self
            .mailbox
            .info(to.child)
            .await
            .map_err(|reason| unavailable(to.child, reason))?;
        self.authorize_stored(to, info.header.parent)?;
        self.mailbox
            .followup(to.parent.id(), to.child, message, info.len, to.cancel)
            .await
    }

    /// Resumes a settled child from its log and submits `message` to it. No provider is asked:
    /// the child's model endpoint, model, persona and tool filter come from its descriptor, its
    /// token limit, depth and policy from its own events.
    async fn cold_resume(
        self: &Arc<Self>,
        to: Followup<'_>,
        message: Message,
    ) -> Result<MessageId, SubagentError> {
        let (store, child) = (self.agents.store().clone(), to.child);
        self.cold_resume_from(to, message, move || {
            store.inspect(child).map_err(|e| e.to_string())
        })
        .await
    }

    /// [`Self::cold_resume`] with the store inspection `inspect`, run on a blocking thread. The
    /// caller's cancellation is honoured before the inspection starts, while it runs (the
    /// resume does not wait for it) and once it returns.
    async fn cold_resume_from(
        self: &Arc<Self>,
        to: Followup<'_>,
        message: Message,
        inspect: impl FnOnce() -> Result<Loaded, String> + Send + 'static,
    ) -> Result<MessageId, SubagentError> {
        let Followup {
            parent,
            child,
            cancel,
            installer,
        } = to;
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
        let loaded = inspected.map_err(|reason| unavailable(child, reason))?;
        self.authorize_stored(to, loaded.header.parent)?;
        // A retry of a message the child claimed or cancelled already: accepted, and not
        // resumed for it. One still pending (its host stopped before running it) is run.
        let pending = log_pending(&loaded.events, message.id);
        if holds_retry(&loaded.events, child, &message)? && !pending {
            return Ok(message.id);
        }
        let plan = resume_plan(child, &loaded)?;
        let activation = self
            .activate(parent, child, plan, cancel, installer)
            .await?;
        let id = self
            .submit_to_new_activation(&activation, message, parent, cancel)
            .await?;
        if pending {
            run_restored_input(&activation);
        }
        Ok(id)
    }

    // ----- interrupt and report ----------------------------------------------------------------------

    /// [`crate::SubagentRuntime::interrupt`].
    pub(super) fn interrupt(
        &self,
        target: SessionId,
        authority: &Authority,
    ) -> Result<(), SubagentError> {
        if let Authority::Ancestor(agent) = authority {
            if !is_live_agent(&self.agents, agent) {
                return Err(unauthorized(format!(
                    "interrupting {target} requires the exact live ancestor agent, and agent {} \
                     is no longer live here",
                    agent.id()
                )));
            }
            if agent.id() == target {
                return Err(unauthorized(format!(
                    "agent {target} cannot interrupt itself"
                )));
            }
        }
        let Some(activation) = self.activation(target) else {
            // Kept by another host: interrupted there, by mail.
            self.mailbox.interrupt_elsewhere(target, authority)?;
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

    /// [`crate::SubagentRuntime::report`].
    pub(super) fn report(
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
        let parent_id = child.header().parent.ok_or_else(parent_unavailable)?;
        // A fenced parent object is not the parent any more: its session's holder gets the report.
        let parent = self.mailbox.parent_here(parent_id);
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
        let Some(parent) = parent else {
            // Kept by another host: reported there, by mail.
            return if self.mailbox.post_to_absent_parent(
                child.id(),
                parent_id,
                message,
                Some(delivery),
            ) {
                Ok(id)
            } else {
                Err(parent_unavailable())
            };
        };
        let handed = message.clone();
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
        self.mailbox
            .confirm_handed(child.id(), parent, handed, Some(delivery));
        Ok(id)
    }
}

/// How the stored child `child` (as `loaded`) is made resident again from its log alone: its
/// model endpoint, model, persona and tool filter from its descriptor, its token limit from its
/// own events. Refused (`NOT_RESUMABLE`) for a child that is not continuable or whose descriptor
/// breaks the contract.
pub(super) fn resume_plan(
    child: SessionId,
    loaded: &Loaded,
) -> Result<ActivationPlan, SubagentError> {
    let folded = fold_descriptor(&loaded.events);
    if let Some(d) = folded
        && let Err(problem) = lineage_log::check_descriptor(d)
    {
        return Err(SubagentError::new(
            ErrorCode::NotResumable,
            format!(
                "subagent {child} cannot be resumed: its stored subagent descriptor breaks the \
                 descriptor contract ({problem}); do not send it messages again"
            ),
        ));
    }
    let descriptor = match folded {
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
    Ok(ActivationPlan {
        descriptor,
        options,
        birth: None,
    })
}

/// The refusal of a message to `child`, whose stored state could not be read (or mail to it
/// could not be posted) for `reason`.
pub(super) fn unavailable(child: SessionId, reason: impl std::fmt::Display) -> SubagentError {
    SubagentError::new(
        ErrorCode::NotResumable,
        format!("subagent {child} is unavailable: {reason}"),
    )
}

impl Activation {
    /// Counts `id` as accepted waking work before `send` runs, so the activation cannot be
    /// judged settled in between; undoes it if `send` fails.
    pub(super) fn admit_waking(
        &self,
        id: MessageId,
        send: impl FnOnce() -> Result<(), lineage_agent::AgentError>,
    ) -> Result<(), SubagentError> {
        lock(&self.st).accepted.insert(id);
        if let Err(error) = send() {
            lock(&self.st).accepted.remove(&id);
            return Err(SubagentError::agent(self.agent.id(), error));
        }
        self.poke();
        Ok(())
    }
}

/// The refusal of a follow-up to `child` that `cancel` stopped before the child accepted it,
/// carrying the cancellation's cause.
pub(super) fn followup_cancelled(child: SessionId, cancel: &Cancellation) -> SubagentError {
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
pub(super) fn as_followup(
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
mod cold_resume_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use lineage_agent::{AgentSpec, Agents, CreateAgent, ScriptedModel};
    use lineage_store::Store;

    use crate::SubagentRuntime;

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
                    let message = Message {
                        id: MessageId::new(),
                        role: Role::User,
                        content: vec![ContentBlock::text("again")],
                        source: MessageSource::Coordinator {
                            sender: parent.id(),
                        },
                    };
                    let to = Followup {
                        parent: &parent,
                        child,
                        cancel: &cancel,
                        installer: runtime.installer(),
                    };
                    runtime
                        .continuation()
                        .cold_resume_from(to, message, inspect)
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
