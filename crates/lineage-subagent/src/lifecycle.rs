//! Lifecycle events of delegations: `subagent/start` before `subagent/end`, one pair per run,
//! delivered to listeners that cannot disturb the run.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lineage_log::{ContentBlock, RunId, SessionId, Text};

use crate::{StopReason, lock};

/// Who ran what: the identity shared by a run's start and end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunInfo {
    /// Fresh for every run (and for every activation epoch of a continuable child).
    pub run: RunId,
    /// The provider's name when the run started.
    pub provider: Text,
    /// The child.
    pub child: SessionId,
    /// The delegating parent.
    pub parent: SessionId,
    /// Whether the child runs in this process.
    pub local: bool,
}

/// A delegation's lifecycle event.
#[derive(Clone, Debug, PartialEq)]
pub enum Lifecycle {
    /// `subagent/start`: the child exists and the run is under way.
    Start(RunInfo),
    /// `subagent/end`: the run is over.
    End {
        /// The run.
        info: RunInfo,
        /// How it ended.
        stop_reason: StopReason,
        /// Its final output's content blocks, when it has any: for an epoch of a continuable
        /// child, its closing message (its final assistant message, verbatim, tool calls
        /// included); for a one-shot run, the output of its result.
        last_assistant_message: Option<Vec<ContentBlock>>,
    },
}

impl Lifecycle {
    /// The event's name.
    pub fn name(&self) -> &'static str {
        match self {
            Lifecycle::Start(_) => "subagent/start",
            Lifecycle::End { .. } => "subagent/end",
        }
    }

    /// The run.
    pub fn info(&self) -> &RunInfo {
        match self {
            Lifecycle::Start(info) | Lifecycle::End { info, .. } => info,
        }
    }
}

/// What a listener's failure carries.
pub type ListenerError = Box<dyn std::error::Error + Send + Sync>;

/// A lifecycle listener. It is called on the task that produced the event, so it should be
/// quick; its failure (an error or a panic) is logged and changes nothing else.
pub type Listener = Arc<dyn Fn(&Lifecycle) -> Result<(), ListenerError> + Send + Sync>;

/// Identifies a lifecycle listener, to remove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ListenerId(u64);

/// A runtime's lifecycle listeners, shared by everything in it that emits events.
#[derive(Default)]
pub(crate) struct Listeners {
    listeners: Mutex<Vec<(ListenerId, Listener)>>,
    next: AtomicU64,
}

impl Listeners {
    pub(crate) fn add(&self, listener: Listener) -> ListenerId {
        let id = ListenerId(self.next.fetch_add(1, Ordering::Relaxed));
        lock(&self.listeners).push((id, listener));
        id
    }

    /// Removes a listener. Returns whether it was there.
    pub(crate) fn remove(&self, id: ListenerId) -> bool {
        let mut listeners = lock(&self.listeners);
        let before = listeners.len();
        listeners.retain(|(l, _)| *l != id);
        listeners.len() != before
    }

    /// Calls every listener with `event`, each on its own: one failing does not stop the
    /// others. The list is not locked while they run.
    pub(crate) fn emit(&self, event: &Lifecycle) {
        let listeners: Vec<Listener> = lock(&self.listeners)
            .iter()
            .map(|(_, l)| l.clone())
            .collect();
        for listener in listeners {
            match catch_unwind(AssertUnwindSafe(|| listener(event))) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(event = event.name(), %error, "a subagent lifecycle listener failed");
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a value that is not a message".into());
                    tracing::warn!(event = event.name(), panic = %message, "a subagent lifecycle listener panicked");
                }
            }
        }
    }
}
