//! Extension points of the turn loop.

use std::sync::Arc;

use lineage_log::{Message, StepNo, TurnNo};

use crate::{Agent, BoxFuture, Cancellation};

/// The error code of a turn whose pre-step hook returned an error.
pub const HOOK_FAILED: &str = "HOOK_FAILED";
/// The error code of a turn whose pre-step hook panicked, in the call or in its future.
pub const HOOK_PANICKED: &str = "HOOK_PANICKED";

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

/// A hook that could not decide: the turn ends `error` with code [`HOOK_FAILED`] and this message,
/// and the input claimed for the step goes back to the front of the inbox lists it came from, for
/// the next wake. Unlike [`PreStepDecision::Reject`], a failure refuses nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HookError {
    /// What went wrong, for people.
    pub message: String,
}

impl HookError {
    /// A failure saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        HookError {
            message: message.into(),
        }
    }
}

/// Hooks a host gives an agent. Every method has a default that changes nothing.
///
/// A hook that panics (in the call or while its future runs) is treated like one that failed,
/// with code [`HOOK_PANICKED`] and the panic's message.
pub trait Hooks: Send + Sync + 'static {
    /// Runs before each step opens, with its claimed input.
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        Box::pin(async move { Ok(PreStepDecision::Enter(step.messages)) })
    }
}

/// Hooks that change nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}
