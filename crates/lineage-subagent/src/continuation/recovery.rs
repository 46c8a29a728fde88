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

use lineage_agent::Agent;
use lineage_log::{
    ContentBlock, DescriptorMode, Event, EventBody, InboxTarget, Message, MessageId, SessionId,
    fold_descriptor,
};
use lineage_store::{Store, StoreError};

use super::*;
use crate::outcome::{closing_message, crash_summary, settlement_notice};

/// A continuable child whose stored log ends in a turn a crash tore.
struct Torn {
    child: SessionId,
    /// The seq of the torn turn's `turn/start`.
    turn_start: u64,
    /// The torn turn's closing message (what it wrote before the crash), if any.
    closing: Vec<ContentBlock>,
}

impl Continuation {
    /// [`crate::SubagentRuntime::recover_children`].
    pub(super) async fn recover_children(
        &self,
        parent: &Arc<Agent>,
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
            let notice = crash_notice(&torn);
            if !holds_message(parent, notice.id) {
                parent
                    .send(notice, InboxTarget::NextTurn, false)
                    .map_err(|e| SubagentError::agent(parent_id, e))?;
                told.push(torn.child);
            }
            recovered.push(torn.child);
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
}

/// The continuable children of `parent` whose stored logs end in a torn turn.
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
        torn.push(Torn {
            child,
            turn_start: events[turn_start].seq,
            closing: closing_message(&events[turn_start..]),
        });
    }
    Ok(torn)
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
    agent.with_events(|events: &[Event]| {
        events.iter().any(|e| match &e.body {
            EventBody::InboxSpliced(splice) => splice.inserted.iter().any(|m| m.id == id),
            EventBody::UserMessage(m) => m.id == id,
            _ => false,
        })
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
