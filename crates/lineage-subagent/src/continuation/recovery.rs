//! After a crash: the continuable children of a resumed parent whose turn the crash tore.
//!
//! A crash stops a resident child mid-turn and nobody settles it, so its parent never hears of
//! it. [`crate::SubagentRuntime::recover_children`] finds those children in the store (their stored
//! logs, no agent loaded) and gives the parent one settlement notice each, exactly once however
//! many times the host restarts:
//!
//! 1. the notice has an id derived from the child and the seq of its torn turn's start, and it
//!    is sent only if the parent's log does not hold that id already;
//! 2. the parent's log is flushed, so the notice is durable;
//! 3. only then is the child's torn turn closed (crash repair, durably), which is what stops it
//!    from being found again. A crash between 2 and 3 finds the child again and step 1 skips it.
//!
//! A torn child whose log holds accepted input no turn claimed (follow-ups queued behind the
//! torn turn), or whose follow-ups wait in the mailbox, is not just closed: it is resumed here,
//! which closes its torn turn, and runs that input; its settlement notice tells the parent. On a
//! shared store a child is torn only when no other host holds its lease (its holder crashed, or
//! paused past the lease).

use lineage_agent::{Agent, Cancellation, DiagnosticKind, Inbox};
use lineage_log::{
    ContentBlock, DescriptorMode, Event, EventBody, InboxTarget, Message, MessageId, SessionId,
    fold_descriptor, own_suffix,
};
use lineage_store::{Loaded, Store, StoreError};

use super::delivery::resume_plan;
use super::mail::is_followup;
use super::*;
use crate::outcome::{closing_message, crash_summary, settlement_notice};
use crate::setup::Installer;

/// A continuable child whose stored log ends in a turn a crash tore.
struct Torn {
    child: SessionId,
    /// The seq of the torn turn's `turn/start`.
    turn_start: u64,
    /// The torn turn's closing message (what it wrote before the crash), if any.
    closing: Vec<ContentBlock>,
    /// Whether it holds accepted input no turn claimed, or has follow-ups waiting as mail.
    has_input: bool,
}

impl Continuation {
    /// [`crate::SubagentRuntime::recover_children`]; a child resumed to run its input gets
    /// `installer`'s contributions.
    pub(super) async fn recover_children(
        self: &Arc<Self>,
        parent: &Arc<Agent>,
        installer: Installer<'_>,
    ) -> Result<Vec<SessionId>, SubagentError> {
        let store = parent.store().clone();
        let parent_id = parent.id();
        let torn = blocking(parent_id, move || find_torn(&store, parent_id)).await?;
        let mut told = Vec::new();
        let mut recovered = Vec::new();
        for torn in torn {
            // A live child's open turn is work in progress, not a crash.
            if self.agents.get(torn.child).is_some() {
                continue;
            }
            // Resumed, its torn turn is closed: no repair. The crash notice still tells the
            // parent of the crash; the child's own notice follows when it settles.
            let mut resumed = false;
            if torn.has_input {
                match self.resume_torn(parent, &torn, installer).await {
                    // It runs what it accepted.
                    Ok(true) => resumed = true,
                    // Its input is gone since it was found: closed as any torn child.
                    Ok(false) => {}
                    // Another host resumed it meanwhile: it is that host's.
                    Err(_) if self.mailbox.held_elsewhere(torn.child).await => continue,
                    // Closing it would strand its input (nothing finds a closed child's
                    // queue again): it is left torn, for the next recovery to run it.
                    Err(error) => {
                        self.diagnose(
                            torn.child,
                            DiagnosticKind::NoticeUndelivered,
                            format!(
                                "the child torn by a crash was not resumed to run its queued \
                                 input ({error}); it is left as the crash left it, for the next \
                                 recovery of its parent"
                            ),
                        );
                        continue;
                    }
                }
            }
            // Its holder may have come back (or another host resumed it) since it was found:
            // then it was not torn, and the parent is told nothing.
            if self.mailbox.held_elsewhere(torn.child).await {
                continue;
            }
            let notice = crash_notice(&torn);
            if !holds_message(parent, notice.id) {
                parent
                    .send(notice, InboxTarget::NextTurn, false)
                    .map_err(|e| SubagentError::agent(parent_id, e))?;
                told.push(torn.child);
            }
            if !resumed {
                recovered.push(torn.child);
            }
        }
        // The notices are durable before any child stops being torn.
        parent
            .flush()
            .await
            .map_err(|e| SubagentError::agent(parent_id, e))?;
        for child in recovered {
            let store = parent.store().clone();
            blocking(child, move || match store.load(child) {
                // Another host resumed it meanwhile: the repair is that host's.
                Ok(_) | Err(StoreError::HeldElsewhere { .. }) => Ok(()),
                Err(error) => Err(error),
            })
            .await?;
        }
        Ok(told)
    }

    /// Makes the torn child of `torn`, whose log holds accepted input no turn claimed (or whose
    /// follow-ups wait in the mailbox), resident here under `parent` to run it: resuming it
    /// closes its torn turn, and its input then runs as turns, the follow-ups its host never
    /// delivered included. Every accepted waking message is so claimed into a turn (or
    /// discarded with an event), whichever host was holding the child when it stopped.
    /// `Ok(false)`: under the child's lock its stored log and the mailbox hold no such input
    /// any more, and it was not resumed. `Ok(true)` too when it is live here already.
    async fn resume_torn(
        self: &Arc<Self>,
        parent: &Arc<Agent>,
        torn: &Torn,
        installer: Installer<'_>,
    ) -> Result<bool, SubagentError> {
        let child = torn.child;
        let _guard = self.child_lock(child).await;
        if self.activation(child).is_some() || self.agents.get(child).is_some() {
            return Ok(true);
        }
        let store = parent.store().clone();
        let (loaded, has_input) = blocking(child, move || {
            let loaded = store.inspect(child)?;
            let has_input = has_waking_input(&store, child, &loaded)?;
            Ok((loaded, has_input))
        })
        .await?;
        if !has_input {
            return Ok(false);
        }
        let plan = resume_plan(child, &loaded)?;
        let activation = self
            .activate(parent, child, plan, &Cancellation::new(), installer)
            .await?;
        run_restored_input(&activation);
        self.mailbox.deliver_waiting_followups(&activation).await;
        activation.poke();
        Ok(true)
    }
}

/// Runs the input the just-resumed child of `activation` restored from its log (accepted, no
/// turn claimed it): it counts as accepted work, so the child is not judged settled before
/// claiming it, and the parent, which knows this child, is told when it settles.
pub(super) fn run_restored_input(activation: &Arc<Activation>) {
    let agent = activation.agent.clone();
    {
        let mut st = lock(&activation.st);
        st.announced = true;
        for target in [InboxTarget::NextTurn, InboxTarget::NextStep] {
            st.accepted
                .extend(agent.pending(target).iter().map(|m| m.id));
        }
    }
    agent.run_pending();
}

/// Whether `events` (a stored log) hold the message `id` pending: accepted, not yet claimed
/// by a turn or cancelled.
pub(super) fn log_pending(events: &[Event], id: MessageId) -> bool {
    Inbox::replay(own_suffix(events)).is_ok_and(|inbox| inbox.position(id).is_some())
}

/// The continuable children of `parent` whose stored logs end in a torn turn, on a shared store
/// only those nobody holds (their holder is gone: crashed, or paused past its lease).
fn find_torn(store: &Store, parent: SessionId) -> Result<Vec<Torn>, StoreError> {
    let mut torn = Vec::new();
    for child in store.children(parent)? {
        let inspected = store.inspect(child)?;
        if inspected.closers == 0 {
            continue;
        }
        // On a shared store, a child another host holds is resident there, not torn.
        if store.held_elsewhere(child)?.is_some() {
            continue;
        }
        let events = &inspected.events[..inspected.events.len() - inspected.closers];
        if fold_descriptor(events).is_none_or(|d| d.mode != DescriptorMode::Continuable) {
            continue;
        }
        let Some(turn_start) = events
            .iter()
            .rposition(|e| matches!(e.body, EventBody::TurnStart(_)))
        else {
            continue;
        };
        let has_input = has_waking_input(store, child, &inspected)?;
        torn.push(Torn {
            child,
            turn_start: events[turn_start].seq,
            closing: closing_message(&events[turn_start..]),
            has_input,
        });
    }
    Ok(torn)
}

/// Whether the stored child `child` (as `loaded`) holds waking input no turn claimed: queued in
/// its durable inbox for a next turn, or follow-ups posted for it that its host did not
/// deliver. Injected (quiet) messages do not count: no turn is started for them.
fn has_waking_input(store: &Store, child: SessionId, loaded: &Loaded) -> Result<bool, StoreError> {
    let queued = Inbox::replay(own_suffix(&loaded.events))
        .is_ok_and(|i| !i.list(InboxTarget::NextTurn).is_empty());
    Ok(queued
        || (store.is_shared()
            && store
                .mail_for(&[child])?
                .iter()
                .any(|m| is_followup(&m.body))))
}

/// The settlement notice of a torn child, with its derived id.
fn crash_notice(torn: &Torn) -> Message {
    settlement_notice(
        crash_notice_id(torn.child, torn.turn_start),
        torn.child,
        crash_summary(torn.child),
        &torn.closing,
    )
}

/// The id of the crash notice of `child`'s turn that started at `turn_start`: the same on every
/// restart.
fn crash_notice_id(child: SessionId, turn_start: u64) -> MessageId {
    MessageId::derived(&[
        b"crash notice",
        &child.as_u128().to_be_bytes(),
        &turn_start.to_le_bytes(),
    ])
}

/// Whether `agent`'s log holds the message `id` (queued, claimed or cancelled).
pub(super) fn holds_message(agent: &Agent, id: MessageId) -> bool {
    agent.with_events(|events: &[Event]| log_holds(events, id))
}

/// Whether `events` hold `message` already (queued, claimed or cancelled), for `child`: a
/// message a log holds is not delivered to it again. Refused (`MESSAGE_ID_REUSED`) when the
/// log holds a message with its id but other content.
pub(super) fn holds_retry(
    events: &[Event],
    child: SessionId,
    message: &Message,
) -> Result<bool, SubagentError> {
    let held = events.iter().find_map(|e| match &e.body {
        EventBody::InboxSpliced(splice) => splice.inserted.iter().find(|m| m.id == message.id),
        EventBody::UserMessage(m) if m.id == message.id => Some(m),
        _ => None,
    });
    match held {
        None => Ok(false),
        Some(held) if held.content == message.content => Ok(true),
        Some(_) => Err(SubagentError::new(
            ErrorCode::MessageIdReused,
            format!(
                "subagent {child} holds the message {} already, with other content; send new \
                 content under a new message id",
                message.id
            ),
        )),
    }
}

/// Whether `events` hold the message `id` (queued, claimed or cancelled): a message a log holds
/// is not delivered to it again.
pub(super) fn log_holds(events: &[Event], id: MessageId) -> bool {
    events.iter().any(|e| match &e.body {
        EventBody::InboxSpliced(splice) => splice.inserted.iter().any(|m| m.id == id),
        EventBody::UserMessage(m) => m.id == id,
        _ => false,
    })
}

/// Runs a store operation on `session` off the async threads.
async fn blocking<T: Send + 'static>(
    session: SessionId,
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, SubagentError> {
    let store_error = |e: StoreError| {
        SubagentError::new(
            ErrorCode::AgentFailure,
            format!("recovering the children of a crash, session {session}: {e}"),
        )
    };
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(store_error),
        Err(join) => Err(store_error(StoreError::Damaged {
            reason: join.to_string(),
        })),
    }
}
