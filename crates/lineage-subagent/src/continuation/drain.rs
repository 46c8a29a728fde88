//! Drains: tearing down every resident child, a subtree, or selected children.

use super::admission::live_lineage;
use super::teardown::aggregate;
use super::*;

impl Continuation {
    // ----- drains --------------------------------------------------------------------------------------

    /// Closes admission for good and tears every resident child down (see
    /// [`crate::SubagentRuntime::drain`], which kills the background jobs around it).
    pub(super) async fn drain(self: &Arc<Self>) -> Result<(), SubagentError> {
        let pending = {
            let mut st = lock(&self.state);
            st.admission.close_all();
            settled_of(&st.pending, |_| true)
        };
        for mut settled in pending {
            let _ = settled.wait_for(|s| *s).await;
        }
        let roots = self.roots();
        self.dispose_all(roots, "activation(s)").await
    }

    /// [`crate::SubagentRuntime::drain_descendants`].
    pub(super) async fn drain_descendants(
        self: &Arc<Self>,
        parents: &[Arc<Agent>],
    ) -> Result<(), SubagentError> {
        let roots: Vec<Arc<Agent>> = parents
            .iter()
            .filter(|p| self.agents.is_live(p))
            .cloned()
            .collect();
        if roots.is_empty() {
            return Ok(());
        }
        let activations = self.activations();
        let targets: Vec<Arc<Activation>> = activations
            .into_iter()
            .filter(|a| {
                roots
                    .iter()
                    .any(|r| !Arc::ptr_eq(&a.agent, r) && a.in_ancestry(r))
            })
            .collect();
        let pending = {
            let mut st = lock(&self.state);
            for root in &roots {
                let mut members = vec![root.clone()];
                for target in &targets {
                    if target.in_ancestry(root) {
                        members.extend(live_lineage(&self.agents, &target.agent));
                    }
                }
                for m in st.pending.values() {
                    if m.lineage.iter().any(|a| Arc::ptr_eq(a, root)) {
                        members.extend(m.lineage.iter().cloned());
                    }
                }
                st.admission.close_below(root.clone(), members);
            }
            settled_of(&st.pending, |m| {
                m.lineage
                    .iter()
                    .any(|a| roots.iter().any(|r| Arc::ptr_eq(a, r)))
            })
        };
        // Every target's teardown opens now; creations under way roll back meanwhile.
        let disposals = self.open_top_down(targets);
        for mut settled in pending {
            let _ = settled.wait_for(|s| *s).await;
        }
        aggregate(disposals, "scoped activation(s)").await
    }

    /// [`crate::SubagentRuntime::drain_children`].
    pub(super) async fn drain_children(
        self: &Arc<Self>,
        parent: &Arc<Agent>,
        children: &[SessionId],
    ) -> Result<(), SubagentError> {
        if !self.agents.is_live(parent) {
            return Err(unauthorized(
                "a selected child teardown requires the exact live parent agent".into(),
            ));
        }
        let mut seen = HashSet::new();
        let mut targets = Vec::new();
        for id in children.iter().filter(|id| seen.insert(**id)) {
            if let Some(activation) = self.activation(*id) {
                if activation.run.parent != parent.id() || !activation.in_ancestry(parent) {
                    return Err(unauthorized(format!(
                        "subagent {id} is not a direct child of agent {}",
                        parent.id()
                    )));
                }
                targets.push(activation);
            }
        }
        self.dispose_all(targets, "selected activation(s)").await
    }

    async fn dispose_all(
        self: &Arc<Self>,
        targets: Vec<Arc<Activation>>,
        subject: &str,
    ) -> Result<(), SubagentError> {
        let disposals = self.open_top_down(targets);
        aggregate(disposals, subject).await
    }

    /// Opens the teardowns of `targets` shallowest first, in one synchronous span: every
    /// parent's cancellation fires before any of its descendants', whatever order the targets
    /// came in (each teardown also opens its own children's right after its cancel).
    fn open_top_down(self: &Arc<Self>, mut targets: Vec<Arc<Activation>>) -> Vec<Disposal> {
        targets.sort_by_key(|t| t.depth);
        targets.iter().map(|t| t.open_disposal(self)).collect()
    }
}

fn settled_of(
    pending: &HashMap<u64, PendingActivation>,
    select: impl Fn(&PendingActivation) -> bool,
) -> Vec<watch::Receiver<bool>> {
    pending
        .values()
        .filter(|m| select(m))
        .map(|m| m.settled.clone())
        .collect()
}
