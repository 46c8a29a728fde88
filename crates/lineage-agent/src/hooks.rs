//! Extension points of the turn loop.

use std::sync::Arc;

use lineage_log::{Message, StepNo, TurnNo};

use crate::{Agent, BoxFuture, Cancellation};

/// The input of a step, before it enters the log.
pub struct PreStep {
    /// The agent.
    pub agent: Arc<Agent>,
    /// The turn.
    pub turn: TurnNo,
    /// The step about to open.
    pub step: StepNo,
    /// The input claimed for the step (step input first, then the turn's prompt).
    pub messages: Vec<Message>,
    /// The turn's cancellation.
    pub cancel: Cancellation,
}

/// What a pre-step hook decides.
#[derive(Clone, Debug, PartialEq)]
pub enum PreStepDecision {
    /// Open the step with these messages (possibly rewritten, possibly none).
    Enter(Vec<Message>),
    /// Refuse the input: the turn ends `blocked` and the claimed input never enters the history.
    Reject,
}

/// Hooks a host gives an agent. Every method has a default that changes nothing.
pub trait Hooks: Send + Sync + 'static {
    /// Runs before each step opens, with its claimed input.
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, PreStepDecision> {
        Box::pin(async move { PreStepDecision::Enter(step.messages) })
    }
}

/// Hooks that change nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}
