//! Drains: tearing down every resident child, a subtree, or selected children.

use super::teardown::aggregate;
use super::*;

impl SubagentRuntime {
    // ----- drains --------------------------------------------------------------------------------------

    /// Closes admission for good and tears every resident child down: every cancellation fires
    /// at once, parents before children, and every background job is killed; each teardown then
    /// waits for its children's, and the drain for every job's end.
    /// Creations under way are awaited (they roll back).
    ///
    /// Cancel safety: admission is closed and every cancellation has fired by the first poll's
    /// end; the teardowns run on their own tasks, so dropping this future stops only the wait.
    ///
    /// ```no_run
    /// # async fn shut_down(runtime: lineage_subagent::SubagentRuntime) {
    /// // A host's shutdown: children first, then every agent, then the store's last flush.
    /// runtime.drain().await.ok();
    /// runtime.agents().dispose_all().await;
    /// # }
    /// ```
    pub async fn drain(&self) -> Result<(), SubagentError> {
        let jobs_ended = self.jobs().kill_all();
        let pending = {
            let mut st = lock(&self.continuation().state);
            st.draining = true;
            settled_of(&st.pending, |_| true)
        };
        for mut settled in pending {
            let _ = settled.wait_for(|s| *s).await;
        }
        let roots = self.continuation().roots();
        let disposed = self.dispose_all(roots, "activation(s)").await;
        jobs_ended.await;
        disposed
    }

    /// Tears down every resident descendant of the exact live agents `parents` (every
    /// cancellation at once, parents before children), and keeps admission closed below each
    /// of them until that agent itself is gone. A parent that is not the live agent under its
    /// id is ignored; other trees are untouched.
    pub async fn drain_descendants(&self, parents: &[Arc<Agent>]) -> Result<(), SubagentError> {
        let roots: Vec<Arc<Agent>> = parents
            .iter()
            .filter(|p| self.agents().is_live(p))
            .cloned()
            .collect();
        if roots.is_empty() {
            return Ok(());
        }
        let activations = self.continuation().activations();
        let targets: Vec<Arc<Activation>> = activations
            .into_iter()
            .filter(|a| {
                roots
                    .iter()
                    .any(|r| !Arc::ptr_eq(&a.agent, r) && a.in_ancestry(r))
            })
            .collect();
        let pending = {
            let mut st = lock(&self.continuation().state);
            for root in &roots {
                let mut members = vec![root.clone()];
                for target in &targets {
                    if target.in_ancestry(root) {
                        members.extend(self.continuation().live_lineage(&target.agent));
                    }
                }
                for m in st.pending.values() {
                    if m.lineage.iter().any(|a| Arc::ptr_eq(a, root)) {
                        members.extend(m.lineage.iter().cloned());
                    }
                }
                st.closing.push(ClosingScope {
                    root: root.clone(),
                    members,
                });
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

    /// Tears down the resident direct children `children` of the exact live agent `parent`.
    /// Ids that are not resident are ignored; an id that is resident but not `parent`'s direct
    /// child is refused before anything is torn down. Admission stays open.
    pub async fn drain_children(
        &self,
        parent: &Arc<Agent>,
        children: &[SessionId],
    ) -> Result<(), SubagentError> {
        if !self.agents().is_live(parent) {
            return Err(unauthorized(
                "a selected child teardown requires the exact live parent agent".into(),
            ));
        }
        let mut seen = HashSet::new();
        let mut targets = Vec::new();
        for id in children.iter().filter(|id| seen.insert(**id)) {
            if let Some(activation) = self.continuation().activation(*id) {
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

    pub(super) async fn dispose_all(
        &self,
        targets: Vec<Arc<Activation>>,
        subject: &str,
    ) -> Result<(), SubagentError> {
        let disposals = self.open_top_down(targets);
        aggregate(disposals, subject).await
    }

    /// Opens the teardowns of `targets` shallowest first, in one synchronous span: every
    /// parent's cancellation fires before any of its descendants', whatever order the targets
    /// came in (each teardown also opens its own children's right after its cancel).
    pub(super) fn open_top_down(&self, mut targets: Vec<Arc<Activation>>) -> Vec<Disposal> {
        targets.sort_by_key(|t| t.depth);
        targets.iter().map(|t| self.open_disposal(t)).collect()
    }
}

pub(super) fn settled_of(
    pending: &HashMap<u64, PendingActivation>,
    select: impl Fn(&PendingActivation) -> bool,
) -> Vec<watch::Receiver<bool>> {
    pending
        .values()
        .filter(|m| select(m))
        .map(|m| m.settled.clone())
        .collect()
}
