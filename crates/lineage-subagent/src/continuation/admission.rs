//! Admission and authority: draining, closing scopes, the exact live parent, fresh ids, and the
//! child locks.

use lineage_agent::{Diagnostic, DiagnosticKind};

use super::*;

/// Who may be admitted: what `drain` and `drain_descendants` closed. Kept in
/// `Continuation::state`.
#[derive(Default)]
pub(super) struct Admission {
    /// Subtrees closed by `drain_descendants`: admission is refused below each root until that
    /// exact root is no longer live.
    closing: Vec<ClosingScope>,
    /// Set by `drain`, never cleared.
    draining: bool,
}

/// A subtree `drain_descendants` closed: its root, and the agents that were in it then.
struct ClosingScope {
    root: Arc<Agent>,
    members: Vec<Arc<Agent>>,
}

impl Admission {
    /// Closes admission for good.
    pub(super) fn close_all(&mut self) {
        self.draining = true;
    }

    /// Closes admission below `root` (and for `members`) until `root` is no longer live.
    pub(super) fn close_below(&mut self, root: Arc<Agent>, members: Vec<Arc<Agent>>) {
        self.closing.push(ClosingScope { root, members });
    }

    /// Refuses work for `agent` (of `agents`) while the runtime drains or `agent` is inside a
    /// closing scope.
    fn check(&mut self, agents: &Agents, agent: &Arc<Agent>) -> Result<(), SubagentError> {
        if self.draining {
            return Err(SubagentError::new(
                ErrorCode::Draining,
                "continuable subagents are draining; the operation was not admitted",
            ));
        }
        // A scope stays closed until its exact root is no longer live.
        self.closing.retain(|scope| agents.is_live(&scope.root));
        if self.closing.is_empty() {
            return Ok(());
        }
        let lineage = live_lineage(agents, agent);
        for scope in &self.closing {
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
}

/// Whether `agent` may act as a live parent or ancestor: the exact agent `agents` holds under its
/// id, not being disposed, and not fenced (another host took its session over). A lost agent is
/// never the live parent of anything, even before its host's registry lets it go.
pub(crate) fn is_live_agent(agents: &Agents, agent: &Arc<Agent>) -> bool {
    agents.is_live(agent) && !agent.is_disposing() && !agent.is_fenced()
}

/// `agent`, then its parent, grandparent, ... as long as each is live in `agents` (exact
/// registry entries), stopping at a repeated id.
pub(super) fn live_lineage(agents: &Agents, agent: &Arc<Agent>) -> Vec<Arc<Agent>> {
    let mut lineage = vec![agent.clone()];
    let mut seen = HashSet::from([agent.id()]);
    let mut next = agent.header().parent;
    while let Some(id) = next {
        if !seen.insert(id) {
            break;
        }
        match agents.get(id) {
            Some(ancestor) => {
                next = ancestor.header().parent;
                lineage.push(ancestor);
            }
            None => break,
        }
    }
    lineage
}

impl Continuation {
    /// Reports a failure of best-effort work about `agent` to the registry's watchers.
    pub(super) fn diagnose(&self, agent: SessionId, kind: DiagnosticKind, reason: String) {
        diagnose(&self.agents, agent, kind, reason);
    }

    /// Refuses work for `agent` while the runtime drains or `agent` is inside a closing scope.
    pub(super) fn assert_admitting(&self, agent: &Arc<Agent>) -> Result<(), SubagentError> {
        lock(&self.state).admission.check(&self.agents, agent)
    }

    /// Refuses a delivery to `child` (whose durable parent is `parent_session`) unless `parent`
    /// is the exact live agent and that parent.
    pub(super) fn authorize_lineage(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        parent_session: Option<SessionId>,
    ) -> Result<(), SubagentError> {
        if !is_live_agent(&self.agents, parent) {
            return Err(unauthorized(format!(
                "subagent {child}: delivery requires the exact live parent agent, and agent {} \
                 is no longer live here",
                parent.id()
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

    /// Takes `child`'s lock (see the lock order in the module's documentation), waiting for the
    /// operations on it that asked first.
    pub(super) async fn child_lock(&self, child: SessionId) -> ChildGuard<'_> {
        let mutex = lock(&self.locks).entry(child).or_default().clone();
        let guard = mutex.lock_owned().await;
        ChildGuard {
            guard: Some(guard),
            child,
            manager: self,
        }
    }
}

/// Reports a failure of best-effort work about `agent` to the watchers of `agents`.
pub(super) fn diagnose(agents: &Agents, agent: SessionId, kind: DiagnosticKind, reason: String) {
    agents.report(Diagnostic {
        agent,
        kind,
        reason,
    });
}
