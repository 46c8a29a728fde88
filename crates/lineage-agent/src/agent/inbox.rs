//! The inbox's live side: sending (admission), removing, claiming a step's input and requeueing
//! it. Every change is a splice the pure [`Inbox`](crate::Inbox) plans, logged as
//! `inbox/spliced` before the inbox changes; a refused splice changes nothing.

use std::sync::Arc;

use lineage_log::{InboxSpliced, InboxTarget, Message, MessageId, Role, TurnNo};

use super::{Agent, State, lock};
use crate::{AgentError, AgentEvent, Cancellation};

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

impl Agent {
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
            let after_abort = wake && st.phase.is_cancelling();
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

    /// Wakes the agent for the input already pending (restored by a resume, or parked by a
    /// cancel), as a waking send would without adding any: on an idle agent a turn starts and
    /// claims it. Returns whether anything was pending; with nothing pending nothing happens.
    pub fn run_pending(self: &Arc<Self>) -> bool {
        let opened = {
            let mut st = lock(&self.state);
            if !st.inbox.has_pending() {
                return false;
            }
            self.wake(&mut st, false)
        };
        if let Some(opened) = opened {
            self.spawn_driver(opened);
        }
        true
    }

    /// Removes the pending message `id`, cancelling it durably. Returns whether it was pending.
    pub fn remove_pending(&self, id: MessageId) -> Result<bool, AgentError> {
        let mut st = lock(&self.state);
        match st.inbox.remove_splice(id) {
            Some(splice) => self.splice(&mut st, splice, true).map(|_| true),
            None => Ok(false),
        }
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

    /// Logs `splice`, then applies it and publishes its effects. With `discard`, removed
    /// messages are published as discarded (a claim removes without discarding).
    pub(super) fn splice(
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
                st.subscribers.publish(AgentEvent::InboxDiscarded {
                    agent: self.id,
                    message: message.clone(),
                });
            }
        }
        for message in splice.inserted {
            st.subscribers.publish(AgentEvent::InboxInserted {
                agent: self.id,
                target: splice.target,
                message,
            });
        }
        Ok(removed)
    }

    /// Claims the input of a step (see [`Inbox::claim_splices`](crate::Inbox::claim_splices))
    /// and publishes the claims.
    pub(super) fn claim(&self, target: InboxTarget, turn: TurnNo) -> Claimed {
        self.claim_locked(&mut lock(&self.state), target, turn)
    }

    /// [`Agent::claim`] under the state lock the caller holds.
    pub(super) fn claim_locked(
        &self,
        st: &mut State,
        target: InboxTarget,
        turn: TurnNo,
    ) -> Claimed {
        let mut claimed = Claimed::default();
        for splice in st.inbox.claim_splices(target) {
            let from = splice.target;
            match self.splice(st, splice, false) {
                Ok(messages) => {
                    for message in &messages {
                        st.subscribers.publish(AgentEvent::InboxClaimed {
                            agent: self.id,
                            turn,
                            message: message.clone(),
                        });
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
    pub(super) fn requeue(
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
    pub(super) fn has_step_input(&self) -> bool {
        !lock(&self.state)
            .inbox
            .list(InboxTarget::NextStep)
            .is_empty()
    }

    /// Adds `message` to the end of `next-step`, without waking (a tool result's context).
    pub(super) fn push_step_input(&self, message: Message) -> Result<(), AgentError> {
        let mut st = lock(&self.state);
        let splice = st.inbox.append_splice(InboxTarget::NextStep, message);
        self.splice(&mut st, splice, true).map(|_| ())
    }
}
