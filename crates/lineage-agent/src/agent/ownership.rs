//! The agent's ownership of its session in the store: held from publication until its disposal
//! ends (on a shared store, under a lease with a fencing token), and lost for good when the store
//! refuses a write because another host took the session over. A fenced agent writes nothing
//! more and disposes of itself.

use std::sync::{Arc, Mutex};

use lineage_log::AbortCause;
use lineage_store::{SessionOwner, StoreError};

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

impl Agent {
    /// The fencing token of the lease the agent runs under, on a shared store (`None` on an
    /// embedded file, or once its disposal ended).
    pub fn lease_fence(&self) -> Option<u64> {
        self.ownership.fence()
    }

    /// Whether another host took the agent's session over: it writes nothing more, and disposes
    /// of itself (see [`DiagnosticKind::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        lock(&self.state).fenced.is_some()
    }

    /// The error for a failed store operation. A write refused because another host took the
    /// session over stops the agent: its turn is cancelled, nothing more is written (not even
    /// the turn's closing events: the session is the new holder's to repair), the host is told
    /// with a [`DiagnosticKind::Fenced`] diagnostic, and the agent disposes of itself.
    pub(super) fn store_failed(&self, st: &mut State, source: StoreError) -> AgentError {
        if !matches!(source, StoreError::Fenced { .. }) || st.fenced.is_some() {
            return AgentError::Store {
                agent: self.id,
                source,
            };
        }
        let reason = source.to_string();
        tracing::warn!(agent = %self.id, %reason, "another host took the session over; the agent stops");
        st.fenced = Some(Arc::new(source));
        st.phase.cancel_turn(AbortCause::Disposed);
        let diagnostic = Diagnostic {
            agent: self.id,
            kind: DiagnosticKind::Fenced,
            reason: reason.clone(),
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
        AgentError::Fenced {
            agent: self.id,
            reason,
        }
    }
}
