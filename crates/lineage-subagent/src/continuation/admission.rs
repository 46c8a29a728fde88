//! Admission and authority: draining, closing scopes, the exact live parent, fresh ids.

use lineage_agent::{Diagnostic, DiagnosticKind};

use super::*;

impl Continuation {
    /// Reports a failure of best-effort work about `agent` to the registry's watchers.
    pub(super) fn diagnose(&self, agent: SessionId, kind: DiagnosticKind, reason: String) {
        self.agents.report(Diagnostic {
            agent,
            kind,
            reason,
        });
    }

    /// `agent`, then its parent, grandparent, ... as long as each is live (exact registry
    /// entries), stopping at a repeated id.
    pub(super) fn live_lineage(&self, agent: &Arc<Agent>) -> Vec<Arc<Agent>> {
        let mut lineage = vec![agent.clone()];
        let mut seen = HashSet::from([agent.id()]);
        let mut next = agent.header().parent;
        while let Some(id) = next {
            if !seen.insert(id) {
                break;
            }
            match self.agents.get(id) {
                Some(ancestor) => {
                    next = ancestor.header().parent;
                    lineage.push(ancestor);
                }
                None => break,
            }
        }
        lineage
    }

    /// Refuses work for `agent` while the runtime drains or `agent` is inside a closing scope.
    pub(super) fn assert_admitting(&self, agent: &Arc<Agent>) -> Result<(), SubagentError> {
        let mut st = lock(&self.state);
        if st.draining {
            return Err(SubagentError::new(
                ErrorCode::Draining,
                "continuable subagents are draining; the operation was not admitted",
            ));
        }
        // A scope stays closed until its exact root is no longer live.
        st.closing.retain(|scope| self.agents.is_live(&scope.root));
        if st.closing.is_empty() {
            return Ok(());
        }
        let lineage = self.live_lineage(agent);
        for scope in &st.closing {
            let member = scope.members.iter().any(|m| Arc::ptr_eq(m, agent))
                || lineage.iter().any(|a| Arc::ptr_eq(a, &scope.root));
            if member {
                return Err(SubagentError::new(
                    ErrorCode::Draining,
                    format!(
                        "continuable subagents below parent {} are draining; the operation was \
                         not admitted",
                        scope.root.id()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a delivery to `child` (whose durable parent is `parent_session`) unless `parent`
    /// is the exact live agent and that parent.
    pub(super) fn authorize_lineage(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        parent_session: Option<SessionId>,
    ) -> Result<(), SubagentError> {
        if !self.agents.is_live(parent) {
            return Err(unauthorized(format!(
                "subagent {child}: delivery requires the exact live parent agent"
            )));
        }
        if parent_session != Some(parent.id()) {
            return Err(unauthorized(format!(
                "subagent {child} belongs to another parent session"
            )));
        }
        Ok(())
    }

    pub(super) fn child_id_available(&self, child: SessionId) -> Result<(), SubagentError> {
        if self.agents.get(child).is_some() || self.activation(child).is_some() {
            return Err(SubagentError::new(
                ErrorCode::DuplicateChild,
                format!("subagent {child} already exists"),
            ));
        }
        Ok(())
    }
}

impl SubagentRuntime {
    /// Takes `child`'s lock (see the lock order in the module's documentation), waiting for the
    /// operations on it that asked first.
    pub(super) async fn child_lock(&self, child: SessionId) -> ChildGuard {
        let mutex = lock(&self.continuation().locks)
            .entry(child)
            .or_default()
            .clone();
        let guard = mutex.lock_owned().await;
        ChildGuard {
            guard: Some(guard),
            child,
            runtime: self.clone(),
        }
    }
}
