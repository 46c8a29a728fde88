//! What an agent's observers see: [`AgentEvent`]s, published under the state lock so every
//! subscriber hears them in the order they happened; the change counter, for waiters that only
//! need to know when to look again; and diagnostics, the failures of best-effort work.

use lineage_log::{AbortCause, Event, InboxTarget, Message, SessionId, TurnNo};
use tokio::sync::{mpsc, watch};

use super::{Agent, State, lock};
use crate::{Diagnostic, DiagnosticKind, Queued, RegistryEvent};

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

/// The agent's subscribers. A subscriber that has gone away is forgotten at the next event.
#[derive(Default)]
pub(super) struct Subscribers(Vec<mpsc::UnboundedSender<AgentEvent>>);

impl Subscribers {
    /// A new subscriber's stream of every event from now on.
    fn add(&mut self) -> mpsc::UnboundedReceiver<AgentEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.0.push(tx);
        rx
    }

    /// Whether nobody listens (so an event need not even be copied).
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sends `event` to every subscriber still listening.
    pub(super) fn publish(&mut self, event: AgentEvent) {
        match self.0.as_slice() {
            [] => {}
            [only] => {
                if only.send(event).is_err() {
                    self.0.clear();
                }
            }
            _ => self.0.retain(|s| s.send(event.clone()).is_ok()),
        }
    }

    /// Forgets every subscriber, which ends their streams.
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}

impl Agent {
    /// A stream of everything that happens to the agent from now on, in order. Nothing is
    /// dropped; the stream ends when the agent is disposed.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<AgentEvent> {
        lock(&self.state).subscribers.add()
    }

    /// A counter bumped whenever the status or the inbox changes (a message inserted, claimed or
    /// discarded): for a waiter that only needs to know when to look again. Unlike
    /// [`Agent::subscribe`] it copies no events, so it costs the turn loop nothing per append.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Bumps the change counter.
    pub(super) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Publishes a status change (callers publish only changes).
    pub(super) fn publish_status(&self, st: &mut State, status: AgentStatus) {
        self.changed();
        st.subscribers.publish(AgentEvent::Status {
            agent: self.id,
            status,
        });
    }

    /// Publishes a failure of best-effort work: on the agent's events, to its registry's
    /// watchers and to `tracing`.
    pub(super) fn diagnose(&self, kind: DiagnosticKind, reason: String) {
        tracing::warn!(agent = %self.id, ?kind, %reason, "best-effort work failed");
        let diagnostic = Diagnostic {
            agent: self.id,
            kind,
            reason,
        };
        lock(&self.state)
            .subscribers
            .publish(AgentEvent::Diagnostic(diagnostic.clone()));
        if let Some(registry) = self.registry.upgrade() {
            registry.broadcast(RegistryEvent::Diagnostic(diagnostic));
        }
    }
}
