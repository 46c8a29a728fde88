//! What hosts can watch besides an agent's own events: the registry's events (agents created,
//! resumed and disposed) and diagnostics, the failures of best-effort work that never fail the
//! operation that ran it (a final flush, an undelivered notice, a teardown).

use lineage_log::SessionId;

/// Which best-effort work failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DiagnosticKind {
    /// A final flush failed (during disposal or a teardown): what the agent appended last may not
    /// be durable, and its stored state may be stale on resume.
    FinalFlushFailed,
    /// Disposal could not durably discard the agent's pending input.
    DiscardFailed,
    /// Cancelling an agent's work failed.
    CancelFailed,
    /// A notice meant for an agent (such as a child's settlement notice) was not delivered.
    NoticeUndelivered,
    /// A teardown (of a child's activation, for example) failed.
    TeardownFailed,
    /// The agent's lease on its session was lost (on a shared store): another host took the
    /// session over (seen by the lease's renewal or by a refused write), or the database did not
    /// answer for long enough that this host gave the lease up before another could take it.
    /// The agent wrote nothing more and disposed of itself; the reason names the session and the
    /// cause. A later resume on this host takes a new lease.
    Fenced,
    /// The agent's log held events the store does not (a commit the store refused for the
    /// session: its outcome was unknown and it met itself, or the session's write failed): the
    /// agent stopped, wrote nothing more, and disposed of itself, so a resume reloads the
    /// session from what the store holds.
    LogAheadOfStore,
}

/// A failure of best-effort work, as the host sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The agent whose work failed (for an undelivered notice: the agent it was meant for).
    pub agent: SessionId,
    /// What failed.
    pub kind: DiagnosticKind,
    /// Why, in words (the error's message).
    pub reason: String,
}

/// What a registry's observers see (see `Agents::subscribe`), in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryEvent {
    /// A new agent was created and is live.
    Created {
        /// The agent.
        agent: SessionId,
    },
    /// A stored session was resumed as a live agent.
    Resumed {
        /// The agent.
        agent: SessionId,
    },
    /// An agent's disposal finished: it left the registry. `failed` says whether its disposal
    /// reported a failure (a [`RegistryEvent::Diagnostic`] before this one says which).
    Disposed {
        /// The agent.
        agent: SessionId,
        /// Whether the disposal failed.
        failed: bool,
    },
    /// Best-effort work of one of the registry's agents failed.
    Diagnostic(Diagnostic),
}
