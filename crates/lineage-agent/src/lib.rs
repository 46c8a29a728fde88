//! The Lineage agent runtime, on tokio.
//!
//! An [`Agent`] owns one session: an inbox (its only queue), a turn loop that asks a streaming
//! [`Model`] and runs [`Tool`]s, and the session's log, mirrored event by event to a
//! [`lineage_store::Store`]. [`Agents`] is the registry that creates, resumes, hands out and
//! disposes of live agents. [`ScriptedModel`] is a deterministic model for tests and demos.
//!
//! Every inbox change is logged (`inbox/spliced`) before memory changes; the log is flushed before
//! every model request, before tools run and at every turn end, so a crash loses at most the
//! unflushed tail of a step, and resuming closes the torn turn.
//!
//! Host code cannot stop an agent by panicking: a tool's panic is its call's error result, and a
//! panic in a model (starting a request, in its stream or in the stream's drop) or in a pre-step
//! hook ends the turn `error` ([`MODEL_PANICKED`], [`HOOK_PANICKED`]; [`TURN_PANICKED`] for other
//! host code the turn calls, such as a tool's schema) with the panic's message, the log balanced,
//! and the agent idle and ready for the next message.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod agent;
mod budget;
mod cancel;
mod contain;
mod error;
mod hooks;
mod inbox;
mod model;
mod prompt;
mod registry;
mod scripted;
mod tool;
mod turn;
mod watch;

pub use agent::{Agent, AgentEvent, AgentOptions, AgentStatus, FlushFault, Queued};
pub use budget::{BUDGET_EVENT, Budget, BudgetUse};
pub use cancel::Cancellation;
pub use error::AgentError;
pub use hooks::{HOOK_FAILED, HOOK_PANICKED, HookError, Hooks, NoHooks, PreStep, PreStepDecision};
pub use inbox::Inbox;
pub use model::{
    ABORTED, Assembler, ChunkStream, MODEL_PANICKED, Model, ModelError, ModelRequest, ToolSchema,
};
pub use prompt::Prompt;
pub use registry::{AgentSpec, Agents, CreateAgent, DEFAULT_MAX_PARALLEL_TOOLS, LEASE_EVENT, Seed};
pub use scripted::{Gate, Response, SCRIPT_EXHAUSTED, ScriptedCall, ScriptedModel};
pub use tool::{
    ABORTED_BEFORE_DISPATCH, BoxFuture, INVALID_ARGUMENTS, TOOL_NOT_AVAILABLE, TOOL_PANICKED, Tool,
    ToolContext, ToolOutput, Toolset,
};
pub use turn::{NO_MODEL, PERSISTENCE, TURN_PANICKED};
pub use watch::{Diagnostic, DiagnosticKind, RegistryEvent};
