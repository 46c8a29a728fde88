//! The agent runtime's error type.

use std::sync::Arc;

use lineage_log::{LogError, MessageId, SessionId};
use lineage_store::StoreError;

/// Why an agent operation failed. Every variant names the agent (its session id) and the message,
/// tool, seq or option involved; a refused operation changes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The store refused or failed an operation for this agent.
    #[error("agent {agent}: {source}")]
    Store {
        /// The agent.
        agent: SessionId,
        /// What the store said.
        #[source]
        source: StoreError,
    },
    /// The agent's lease on its session was lost: another host took the session over, or the
    /// database did not answer for long enough that this host gave the lease up (see
    /// [`DiagnosticKind::Fenced`](crate::DiagnosticKind::Fenced)): the agent writes nothing more.
    #[error("agent {agent} stopped: its session's lease was lost ({reason})")]
    Fenced {
        /// The agent.
        agent: SessionId,
        /// The store's refusal, in words.
        reason: String,
    },
    /// The store does not hold what the agent's log holds (see
    /// [`DiagnosticKind::LogAheadOfStore`](crate::DiagnosticKind::LogAheadOfStore)): the agent
    /// writes nothing more; resuming it reloads the session from the store.
    #[error("agent {agent} stopped: {reason}")]
    LogAheadOfStore {
        /// The agent.
        agent: SessionId,
        /// What the store holds and why, in words.
        reason: String,
    },
    /// An event the agent was about to append breaks a log rule (a bug in the caller's input,
    /// such as a message with the wrong role).
    #[error("agent {agent}: {source}")]
    Log {
        /// The agent.
        agent: SessionId,
        /// The rule.
        #[source]
        source: LogError,
    },
    /// The message is already pending in the inbox.
    #[error("agent {agent}: message {message} is already pending in its inbox")]
    AlreadyPending {
        /// The agent.
        agent: SessionId,
        /// The message.
        message: MessageId,
    },
    /// The message cannot enter an inbox.
    #[error("agent {agent}: message {message} cannot be queued: {reason}")]
    InvalidMessage {
        /// The agent.
        agent: SessionId,
        /// The message.
        message: MessageId,
        /// Why.
        reason: String,
    },
    /// A live agent already has this id.
    #[error("agent {agent} is already live")]
    AlreadyLive {
        /// The id.
        agent: SessionId,
    },
    /// No live agent has this id.
    #[error("agent {agent} is not live")]
    NotLive {
        /// The id.
        agent: SessionId,
    },
    /// An agent option is out of range.
    #[error("agent {agent}: option {field} {reason}")]
    InvalidOption {
        /// The agent.
        agent: SessionId,
        /// The option.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The tool filter names a tool the agent does not have.
    #[error("agent {agent}: the tool filter names {name:?}, which is not one of its tools")]
    UnknownTool {
        /// The agent.
        agent: SessionId,
        /// The name.
        name: String,
    },
    /// Two of the agent's tools share a name.
    #[error("agent {agent}: two tools are named {name:?}")]
    DuplicateTool {
        /// The agent.
        agent: SessionId,
        /// The name.
        name: String,
    },
    /// A stored budget record is malformed.
    #[error("agent {agent}: the budget recorded at seq {seq} {reason}")]
    InvalidBudget {
        /// The agent.
        agent: SessionId,
        /// The record's seq.
        seq: u64,
        /// What is wrong with it, naming the field.
        reason: String,
    },
    /// A stored inbox splice does not apply to the inbox replayed before it.
    #[error("agent {agent}: invalid persisted inbox splice at seq {seq}: {reason}")]
    InvalidInboxSplice {
        /// The agent.
        agent: SessionId,
        /// The splice's seq.
        seq: u64,
        /// Why it does not apply.
        reason: String,
    },
    /// A host tried to record an event kind that only the runtime writes.
    #[error("agent {agent}: a host cannot record {kind} events; only policy and custom events")]
    NotRecordable {
        /// The agent.
        agent: SessionId,
        /// The refused kind's display name.
        kind: &'static str,
    },
    /// The agent was disposed (it left the registry), but its final flush failed: what it
    /// appended last may not be durable, and the stored session may be stale on resume. Every
    /// caller of the shared disposal sees this same failure.
    #[error("agent {agent}: disposed, but the final flush failed: {source}")]
    FinalFlushFailed {
        /// The agent.
        agent: SessionId,
        /// What the store said.
        #[source]
        source: Arc<StoreError>,
    },
    /// The creation was cancelled before anything was written.
    #[error("creating agent {agent} was cancelled")]
    Cancelled {
        /// The agent.
        agent: SessionId,
    },
}
