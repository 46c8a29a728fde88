//! Disposal: one per agent, shared by every caller. It cancels the agent's work, waits until no
//! driver runs, makes the final flush, drops the tools, frees the id of a session nothing was
//! written to, gives the session back to the store once nothing more will be appended and, last,
//! leaves the registry: once the agent is gone from it, its session can be owned anew.

use std::sync::{Arc, Mutex};

use lineage_log::AbortCause;
use lineage_store::StoreError;
use tokio::sync::watch;

use super::{Agent, lock};
use crate::{AgentError, DiagnosticKind, Queued, RegistryEvent, Toolset};

/// What a shared disposal ended with: a failed final flush, if any.
type DisposalOutcome = Result<(), Arc<StoreError>>;

/// Makes the error an injected final-flush failure reports (see `Agent::fail_final_flush`).
#[doc(hidden)]
pub type FlushFault = Box<dyn Fn() -> StoreError + Send + Sync>;

/// The agent's one disposal, and the fault its final flush is to meet.
#[derive(Default)]
pub(super) struct Disposal {
    /// The outcome of the disposal under way, once one has started.
    outcome: Mutex<Option<watch::Receiver<Option<DisposalOutcome>>>>,
    /// While set, the final flush of disposal fails with the error it makes (a fault-injection
    /// seam for tests).
    flush_fault: Mutex<Option<FlushFault>>,
}

impl Disposal {
    /// The outcome of the disposal under way; with none, `start` starts one, handed where to
    /// send its outcome. Under the disposal lock, so exactly one ever starts.
    fn join_or_start(
        &self,
        start: impl FnOnce(watch::Sender<Option<DisposalOutcome>>),
    ) -> watch::Receiver<Option<DisposalOutcome>> {
        let mut outcome = lock(&self.outcome);
        match &*outcome {
            Some(done) => done.clone(),
            None => {
                let (tx, rx) = watch::channel(None);
                *outcome = Some(rx.clone());
                start(tx);
                rx
            }
        }
    }

    /// The error an injected fault makes, if one is set.
    fn injected_fault(&self) -> Option<StoreError> {
        lock(&self.flush_fault).as_ref().map(|fault| fault())
    }
}

impl Agent {
    /// Disposes of the agent: cancels its work with cause `disposed` (discarding pending input),
    /// waits until it is idle, flushes its log, drops its tools and leaves the registry. Every
    /// caller shares one disposal; later calls wait for the first. The session stays stored and
    /// can be resumed; an agent that never wrote anything leaves no session, and its id is free
    /// for a new one (this handle then refuses every write with [`AgentError::NotLive`]).
    ///
    /// Disposal is best effort: a failure (a failed final flush) does not stop it, and is
    /// published as a [`Diagnostic`](crate::Diagnostic) on the agent's events and to the
    /// registry's watchers; use [`Agent::try_dispose`] to get it back.
    ///
    /// Must not be awaited from inside one of the agent's own turns (a tool of this agent): the
    /// disposal waits for that turn to end.
    ///
    /// Cancel safety: the disposal runs on its own task once started; dropping this future stops
    /// only the wait, and a later call waits for the same disposal.
    pub async fn dispose(self: &Arc<Self>) {
        // The failure is already published as a diagnostic.
        let _ = self.try_dispose().await;
    }

    /// [`Agent::dispose`], returning how the shared disposal ended: every caller sees the same
    /// outcome, [`AgentError::FinalFlushFailed`] when the final flush failed. The agent is
    /// disposed either way.
    pub async fn try_dispose(self: &Arc<Self>) -> Result<(), AgentError> {
        self.dispose_with(Queued::Discard).await
    }

    /// Disposes of the agent as a host shutting down does: as [`Agent::try_dispose`], except
    /// that pending input stays queued in the log, so the agent resumed after a restart finds
    /// it there: a settlement notice that reached an idle parent is not lost to a shutdown.
    /// Input a running turn has claimed is not requeued (that turn ends `aborted`). If a
    /// disposal is already under way, this waits for it and keeps its choice.
    pub async fn shut_down(self: &Arc<Self>) -> Result<(), AgentError> {
        self.dispose_with(Queued::Keep).await
    }

    /// Waits for the agent's disposal, starting it (with `queued` for the pending input) if none
    /// has started.
    pub(super) async fn dispose_with(self: &Arc<Self>, queued: Queued) -> Result<(), AgentError> {
        let mut done = self.disposal.join_or_start(|tx| {
            let agent = self.clone();
            self.runtime.spawn(async move {
                let outcome = agent.dispose_now(queued).await;
                tx.send_replace(Some(outcome));
            });
        });
        let outcome = match done.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone().unwrap_or(Ok(())),
            // The disposing task ended without an outcome: only a panic in the store does that.
            Err(_) => Err(Arc::new(StoreError::Damaged {
                reason: "the disposal ended without finishing".into(),
            })),
        };
        outcome.map_err(|source| AgentError::FinalFlushFailed {
            agent: self.id,
            source,
        })
    }

    /// While `fault` is set, the final flush of this agent's disposal fails with the error it
    /// makes (and flushes nothing). Turn flushes and [`Agent::flush`] are not affected.
    #[doc(hidden)]
    pub fn fail_final_flush(&self, fault: Option<FlushFault>) {
        *lock(&self.disposal.flush_fault) = fault;
    }

    /// Whether disposal has begun.
    pub fn is_disposing(&self) -> bool {
        lock(&self.state).disposing
    }

    /// Whether the agent is on its way out of the registry: disposing, or stopped for good (see
    /// `ownership`), which disposes of it.
    pub(crate) fn is_leaving(&self) -> bool {
        let st = lock(&self.state);
        st.disposing || st.stopped.is_some()
    }

    async fn dispose_now(self: Arc<Self>, queued: Queued) -> DisposalOutcome {
        lock(&self.state).disposing = true;
        if let Err(error) = self.cancel(AbortCause::Disposed, queued) {
            self.diagnose(
                DiagnosticKind::DiscardFailed,
                format!("disposal could not discard pending input: {error}"),
            );
        }
        self.when_idle().await;
        let fault = self.disposal.injected_fault();
        let stopped = lock(&self.state).stopped.as_ref().map(|s| s.error.clone());
        let outcome = match (fault, stopped) {
            // Nothing more is the agent's to write: its final flush would only be refused.
            (_, Some(stopped)) => Err(stopped),
            (Some(error), None) => Err(Arc::new(error)),
            (None, None) => self.flush_store().await.map_err(Arc::new),
        };
        if let Err(error) = &outcome
            && lock(&self.state).stopped.is_none()
        {
            self.diagnose(
                DiagnosticKind::FinalFlushFailed,
                format!("the final flush of disposal failed: {error}"),
            );
        }
        *lock(&self.tools) = Arc::new(Toolset::default());
        {
            // A session nothing was written to holds nothing durable: its id is freed (under the
            // state lock, so no append can slip in between).
            let mut st = lock(&self.state);
            st.released = self.store.forget_unwritten(self.id);
        }
        // The session is the store's to repair again once nothing more will be appended, and
        // before the agent leaves the registry, so a resume that finds it gone can own it.
        self.ownership.release();
        if let Some(registry) = self.registry.upgrade() {
            registry.remove(&self);
            registry.broadcast(RegistryEvent::Disposed {
                agent: self.id,
                failed: outcome.is_err(),
            });
        }
        lock(&self.state).subscribers.clear();
        outcome
    }
}
