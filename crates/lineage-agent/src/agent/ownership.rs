//! The agent's ownership of its session in the store: held from publication until its disposal
//! ends (on a shared store, under a lease with a fencing token), and lost for good when the
//! lease is lost: the store refuses a write because another host took the session over, or
//! announces the loss ([`Store::watch_leases`](lineage_store::Store::watch_leases): a renewal
//! found it taken over, or the database did not answer for long enough that the store gave it
//! up). An agent whose log the store does not hold (a commit the store refused for its session)
//! is stopped the same way. A stopped agent writes nothing more and disposes of itself, so it
//! leaves its registry at once and a resume on this host starts over from the store.

use std::sync::{Arc, Mutex};

use lineage_log::AbortCause;
use lineage_store::{LeaseLoss, SessionOwner, StoreError};

use super::{Agent, State, lock};
use crate::{AgentError, AgentEvent, Diagnostic, DiagnosticKind, Queued, RegistryEvent};

/// The agent's hold on its session in the store: while it is held, `Store::load` never repairs
/// the session underneath the agent.
pub(super) struct Ownership {
    owner: Mutex<Option<SessionOwner>>,
}

impl Ownership {
    pub(super) fn new(owner: SessionOwner) -> Self {
        Ownership {
            owner: Mutex::new(Some(owner)),
        }
    }

    /// The fencing token of the lease held, on a shared store.
    fn fence(&self) -> Option<u64> {
        lock(&self.owner).as_ref().and_then(SessionOwner::fence)
    }

    /// Gives the session back to the store, which may repair it again.
    pub(super) fn release(&self) {
        drop(lock(&self.owner).take());
    }
}

/// Why an agent stopped writing for good.
#[derive(Clone)]
pub(super) struct Stopped {
    /// [`DiagnosticKind::Fenced`] or [`DiagnosticKind::LogAheadOfStore`].
    kind: DiagnosticKind,
    /// What the store said.
    pub(super) error: Arc<StoreError>,
    /// The diagnostic's reason.
    reason: String,
}

impl Stopped {
    /// The refusal of a write of the stopped agent `agent`.
    pub(super) fn refusal(&self, agent: lineage_log::SessionId) -> AgentError {
        let reason = self.reason.clone();
        match self.kind {
            DiagnosticKind::Fenced => AgentError::Fenced { agent, reason },
            _ => AgentError::LogAheadOfStore { agent, reason },
        }
    }
}

impl Agent {
    /// The fencing token of the lease the agent runs under, on a shared store (`None` on an
    /// embedded file, or once its disposal ended).
    pub fn lease_fence(&self) -> Option<u64> {
        self.ownership.fence()
    }

    /// Whether the agent's lease was lost (another host took the session over, or this host
    /// gave the lease up): it writes nothing more, and disposes of itself (see
    /// [`DiagnosticKind::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        lock(&self.state)
            .stopped
            .as_ref()
            .is_some_and(|s| s.kind == DiagnosticKind::Fenced)
    }

    /// Whether the agent stopped writing for good: its lease was lost ([`Agent::is_fenced`]),
    /// or the store does not hold its log. It runs nothing more, and disposes of itself.
    pub fn is_stopped(&self) -> bool {
        lock(&self.state).stopped.is_some()
    }

    /// The error for a failed store operation. A write refused because the session's lease was
    /// lost stops the agent (see [`Agent::stop`]), and so does a failure after which the store
    /// no longer holds the agent's log: what the agent admitted was dropped by a refused commit
    /// (its flush says so), or the store's log of the session ends elsewhere than the agent's
    /// (a sequence refusal: the agent owns the session, so the store's log is not the agent's).
    /// Left serving, such an agent would have every later write refused as out of sequence.
    pub(super) fn store_failed(&self, st: &mut State, source: StoreError) -> AgentError {
        if st.stopped.is_some() {
            return AgentError::Store {
                agent: self.id,
                source,
            };
        }
        if source.is_lease_lost() {
            let stopped = self.stop(st, DiagnosticKind::Fenced, source.to_string(), source);
            return stopped.refusal(self.id);
        }
        let stored = match &source {
            StoreError::SeqMismatch { expected, .. } => Some(*expected),
            _ => self.store_behind(st),
        };
        if let Some(stored) = stored {
            let reason = format!(
                "session {}: the store holds {stored} events of its log, the agent's log {} \
                 ({source}); the agent stops, and a resume reloads the session from the store",
                self.id,
                st.log.next_seq()
            );
            let stopped = self.stop(st, DiagnosticKind::LogAheadOfStore, reason, source);
            return stopped.refusal(self.id);
        }
        AgentError::Store {
            agent: self.id,
            source,
        }
    }

    /// Where the store's log of the session ends (counting what was admitted and is not yet
    /// durable), when that is not where the agent's does; `None` when they agree or the store
    /// cannot say now (it is asked again at the next failure).
    fn store_behind(&self, st: &State) -> Option<u64> {
        let ours = st.log.next_seq();
        let theirs = match self.store.admitted_next_seq(self.id) {
            Some(next) => next,
            None => match self.store.info(self.id) {
                Ok(info) => info.len,
                Err(StoreError::UnknownSession { .. }) => 0,
                Err(_) => return None,
            },
        };
        (theirs != ours).then_some(theirs)
    }

    /// The store announced that the agent's lease was lost (see
    /// [`Store::watch_leases`](lineage_store::Store::watch_leases)): the agent stops, whether it
    /// was writing or idle, on its runtime (the announcement comes on a thread of the store's,
    /// which must not wait for the agent).
    pub(crate) fn on_lease_lost(self: &Arc<Self>, loss: LeaseLoss) {
        let agent = self.clone();
        self.runtime.spawn(async move { agent.lease_lost(&loss) });
    }

    fn lease_lost(&self, loss: &LeaseLoss) {
        // A loss announced late may be an earlier tenure's: only the lease held now counts.
        let Some(error) = self.store.lost_lease(self.id) else {
            tracing::debug!(agent = %self.id, ?loss, "a lease loss of an earlier tenure; the agent keeps its lease");
            return;
        };
        let mut st = lock(&self.state);
        if st.stopped.is_some() || st.released {
            return;
        }
        self.stop(&mut st, DiagnosticKind::Fenced, error.to_string(), error);
    }

    /// Stops the agent for good: its turn is cancelled, nothing more is written (not even the
    /// turn's closing events: on a lost lease the session is the new holder's to repair; when
    /// the store does not hold the log, the stored log is what a resume repairs), the host is
    /// told with a `kind` diagnostic, and the agent disposes of itself (keeping its pending
    /// input in the log for the next resume).
    fn stop(
        &self,
        st: &mut State,
        kind: DiagnosticKind,
        reason: String,
        source: StoreError,
    ) -> Stopped {
        tracing::warn!(agent = %self.id, ?kind, %reason, "the agent stops writing and disposes of itself");
        let stopped = Stopped {
            kind,
            error: Arc::new(source),
            reason: reason.clone(),
        };
        st.stopped = Some(stopped.clone());
        st.phase.cancel_turn(AbortCause::Disposed);
        // Watchers of the agent look again: an idle agent stopping changes no status.
        self.changed();
        let diagnostic = Diagnostic {
            agent: self.id,
            kind,
            reason,
        };
        st.subscribers
            .publish(AgentEvent::Diagnostic(diagnostic.clone()));
        if let Some(registry) = self.registry.upgrade() {
            registry.broadcast(RegistryEvent::Diagnostic(diagnostic));
            if let Some(me) = registry.live(self) {
                self.runtime
                    .spawn(async move { me.dispose_with(Queued::Keep).await });
            }
        }
        stopped
    }
}
