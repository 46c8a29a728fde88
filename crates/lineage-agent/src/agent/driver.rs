//! The phase: whether a driver (the task that runs the turn loop) runs turns. A wake starts one
//! on an idle agent, `after_turn` hands it from turn to turn or lets the agent go idle, and
//! `cancel` stops its turn. [`Driver`] is the turn loop's whole interface to its agent.

use std::sync::Arc;

use lineage_log::{AbortCause, EventBody, InboxTarget, Message, TurnNo, TurnStart};
use tokio::runtime::Handle;

use super::{Agent, Claimed, Config, State, lock};
use crate::turn;
use crate::{AgentError, AgentEvent, AgentStatus, Cancellation};

/// What [`Agent::cancel`] does with the messages queued in the inbox and not yet claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Discard them durably: the agent forgets the work it was asked to do next.
    Discard,
    /// Keep them parked until the next waking send: the agent stops only what it is doing now.
    Keep,
}

/// What the agent is doing.
#[derive(Debug)]
pub(super) enum Phase {
    Idle { last_turn: TurnNo },
    Running(Running),
}

#[derive(Debug)]
pub(super) struct Running {
    /// The cancellation of the current turn (a fresh one per turn).
    cancel: Cancellation,
    /// The last turn opened.
    turn: TurnNo,
    /// A waking send arrived after the current turn was cancelled: replay it once the driver has
    /// closed that turn.
    wake_requested: bool,
}

impl Phase {
    /// Whether a driver runs a turn that is being cancelled.
    pub(super) fn is_cancelling(&self) -> bool {
        matches!(self, Phase::Running(r) if r.cancel.is_cancelled())
    }

    /// Cancels the current turn with `cause`, if a driver runs one (the first cause stays).
    pub(super) fn cancel_turn(&self, cause: AbortCause) {
        if let Phase::Running(r) = self {
            r.cancel.cancel(cause);
        }
    }
}

/// A turn that has been opened (`turn/start` written, first input claimed) and must be run.
pub(crate) struct Opened {
    pub turn: TurnNo,
    pub cancel: Cancellation,
    pub claimed: Claimed,
}

/// The turn loop's interface to its agent: all that a driver reads of it and does to it.
///
/// The wake that moves the agent from idle to running makes a `Driver` and spawns the turn loop
/// with it; the loop runs turns until [`Driver::after_turn`] has let the agent go idle, and then
/// does nothing more with it. So while the agent is running exactly one driver acts for it, and
/// at most one turn is open.
///
/// What the turn loop may rely on:
/// - No method returns holding a lock of the agent: the loop may await anything between calls.
/// - [`Driver::append`] is the only write. An event it refuses is in neither the log nor the
///   store and is charged to no budget. A refusal because another host took the session over
///   also fences the agent (its turn is cancelled); a fenced or released agent refuses every
///   event.
/// - [`Driver::flush`] makes everything appended so far durable. The loop owes a flush before
///   every model request, before tools run and at every turn end.
/// - Input a claim returns belongs to the turn: it is in no list any more, and
///   [`Driver::requeue`] puts it back only while the turn is not cancelled and the agent is not
///   being disposed.
pub(crate) struct Driver {
    agent: Arc<Agent>,
}

impl Driver {
    /// The agent: the handle hooks and tools are given, and its public reads (id, options,
    /// tools, budgets, events).
    pub(crate) fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }

    /// What the agent runs with: model, prompt, hooks, the parallel-call limit.
    pub(crate) fn config(&self) -> &Config {
        &self.agent.config
    }

    /// The runtime a tool call runs on.
    pub(crate) fn runtime(&self) -> &Handle {
        &self.agent.runtime
    }

    /// The model's history now: what the next request carries.
    pub(crate) fn history(&self) -> Vec<Message> {
        self.agent.history()
    }

    /// Appends one event (see [`Agent::append`]). Returns its seq.
    pub(crate) fn append(&self, body: impl Into<EventBody>) -> Result<u64, AgentError> {
        self.agent.append(body)
    }

    /// Waits until everything appended is durable (see [`Agent::flush`]).
    pub(crate) async fn flush(&self) -> Result<(), AgentError> {
        self.agent.flush().await
    }

    /// Claims all of `next-step` for a step of `turn` after its first (whose input the wake or
    /// `after_turn` claimed with the turn's prompt).
    pub(crate) fn claim_step_input(&self, turn: TurnNo) -> Claimed {
        self.agent.claim(InboxTarget::NextStep, turn)
    }

    /// Whether input is waiting for the next step.
    pub(crate) fn has_step_input(&self) -> bool {
        self.agent.has_step_input()
    }

    /// Adds `message` to the end of `next-step`, without waking (a tool result's context).
    pub(crate) fn push_step_input(&self, message: Message) -> Result<(), AgentError> {
        self.agent.push_step_input(message)
    }

    /// Puts a step's claimed input back, unless `cancel` fired (see [`Agent::requeue`]).
    /// Returns whether it was requeued.
    pub(crate) fn requeue(
        &self,
        claimed: Claimed,
        cancel: &Cancellation,
    ) -> Result<bool, AgentError> {
        self.agent.requeue(claimed, cancel)
    }

    /// Called after each turn's `turn/end`: opens the next turn when the last one completed
    /// (`run_more`) and work is pending, otherwise lets the agent go idle (replaying a latched
    /// wake). `None` ends the drive.
    pub(crate) fn after_turn(&self, run_more: bool) -> Option<Opened> {
        self.agent.after_turn(run_more)
    }
}

impl Agent {
    /// The current status.
    pub fn status(&self) -> AgentStatus {
        match lock(&self.state).phase {
            Phase::Idle { .. } => AgentStatus::Idle,
            Phase::Running(_) => AgentStatus::Running,
        }
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
        st.subscribers.publish(AgentEvent::Cancelled {
            agent: self.id,
            cause: cause.clone(),
            queued,
        });
        st.phase.cancel_turn(cause);
        Ok(())
    }

    /// Makes sure a driver will claim pending input. On an idle agent this starts one: status
    /// `running`, `turn/start` and the claim happen here, under the lock; the caller spawns the
    /// rest. On a running agent the live driver claims the input itself, unless its turn is being
    /// cancelled, in which case the wake is latched (never for a disposal).
    pub(super) fn wake(&self, st: &mut State, after_abort: bool) -> Option<Opened> {
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

    /// Moves a running agent to idle, publishing the status. Returns whether a wake was latched.
    fn go_idle(&self, st: &mut State) -> bool {
        let (turn, wake_requested) = match &st.phase {
            Phase::Running(r) => (r.turn, r.wake_requested),
            Phase::Idle { .. } => return false,
        };
        st.phase = Phase::Idle { last_turn: turn };
        self.publish_status(st, AgentStatus::Idle);
        wake_requested
    }

    /// See [`Driver::after_turn`].
    fn after_turn(&self, run_more: bool) -> Option<Opened> {
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

    /// Spawns the turn loop for the turn a wake opened, with the agent's one [`Driver`].
    pub(super) fn spawn_driver(self: &Arc<Self>, opened: Opened) {
        let driver = Driver {
            agent: self.clone(),
        };
        self.runtime.spawn(turn::drive(driver, opened));
    }
}
