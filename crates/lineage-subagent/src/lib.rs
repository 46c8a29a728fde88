//! Lineage delegation: a parent agent hands work to children that named providers create.
//!
//! [`SubagentRuntime`] holds the providers and validates every start in a fixed order before a
//! child exists. [`SpawnProvider`] starts a fresh child; [`ForkProvider`] seeds it with the
//! parent's completed turns, never the turn in flight. A child's first own events are its
//! `session/lineage`, its `subagent/descriptor` and the policy its parent fixed (approvals pinned
//! to `never`, the parent's sandbox override), written with its seed in one store operation, so
//! its depth, policy and descriptor can always be folded from its own log.
//!
//! A one-shot run ([`SubagentRun`]) resolves with a [`SubagentResult`] for every way the child
//! can end; only infrastructure faults are errors. A continuable child
//! ([`SubagentRuntime::start_continuable`]) keeps its conversation: its parent sends it
//! follow-ups, interrupts it, hears its reports and, when it settles, a notice; after a restart a
//! follow-up resumes it from its log alone. The model reaches all of it through [`tools`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod birth;
mod continuation;
mod contract;
mod error;
mod host;
mod in_process;
mod jobs;
mod lifecycle;
mod listing;
mod oneshot;
mod out_of_process;
mod outcome;
mod runtime;
pub mod schema;
mod setup;
mod structured;
pub mod tools;

use std::sync::{Mutex, MutexGuard};

pub use birth::{DELEGATION_CONTEXT, capture_policy, child_depth, child_options, child_spec};
pub use continuation::{
    Authority, ContinuableRequest, ContinuableStarted, FollowupRequest, MAIL_DISCARDED_EVENT,
    MAIL_POLL, ReportDelivery,
};
pub use contract::{
    Capabilities, Capability, ChildOptions, ContinuableCreate, ContinuableSpec, DelegatedPolicy,
    MAX_DIAGNOSTIC_BYTES, PrepareContinuable, Provider, ResolvedStart, StartRequest, StopReason,
    SubagentResult, SubagentRun, bound_diagnostic, child_working_directory,
};
pub use error::{CancelledBy, DepthExceeded, ErrorCode, SubagentError};
pub use host::{Host, HostError, Outcome};
pub use in_process::{ForkProvider, SpawnProvider};
pub use jobs::{JobId, JobOutcome};
pub use lifecycle::{Lifecycle, Listener, ListenerError, ListenerId, RunInfo};
pub use listing::{ChildRow, DiagnosticReason, DiagnosticRow, ListingRow};
pub use oneshot::start_in_process;
pub use out_of_process::{OutOfProcess, OutOfProcessAgent};
pub use runtime::SubagentRuntime;
pub use setup::{ContinuableSetup, Installed, SetupId};
pub use structured::{ALREADY_RECORDED, STRUCTURED_OUTPUT};

/// Locks `m`, ignoring poisoning: every critical section here leaves its data consistent
/// before anything that could panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
