//! Settlement and teardown: the settlement watcher, teardown children first, the notice.

use lineage_agent::{DiagnosticKind, Queued};
use lineage_log::{AbortCause, ContentBlock};

use super::*;
use crate::StopReason;
use crate::contract::settled;
use crate::lifecycle::Lifecycle;
use crate::outcome::{closing_message, epoch_stop_reason, settlement_notice, settlement_summary};

/// What a continuable child's epoch ended with, for the notice and `subagent/end`.
pub(super) struct Terminal {
    stop_reason: StopReason,
    /// The closing message's blocks (see [`closing_message`]); empty when there is none.
    output: Vec<ContentBlock>,
}

impl Activation {
    // ----- settlement and teardown --------------------------------------------------------------------

    /// Waits until the activation settles, then tears it down. It looks again whenever the
    /// agent goes idle, its status or inbox changes (a claim or a discard settles accepted
    /// work), or `manager` pokes it (ownership released, work admitted).
    pub(super) async fn watch_settlement(self: Arc<Self>, manager: Arc<Continuation>) {
        let mut poked = self.poke.subscribe();
        let mut changed = self.agent.changes();
        loop {
            poked.borrow_and_update();
            changed.borrow_and_update();
            if self.is_closing() {
                return;
            }
            tokio::select! {
                () = self.agent.when_idle() => {}
                _ = poked.changed() => {}
                _ = changed.changed() => {}
            }
            let disposal = {
                let _guard = manager.child_lock(self.child()).await;
                if self.is_closing() {
                    return;
                }
                match self.residency() {
                    Residency::Settled => Some(self.open_disposal(&manager)),
                    Residency::Running | Residency::Waiting => None,
                }
            };
            match disposal {
                Some(disposal) => {
                    // A failure is reported by the teardown itself.
                    let _ = wait(disposal).await;
                    return;
                }
                None => {
                    if self.agent.status() != AgentStatus::Running {
                        tokio::select! {
                            _ = poked.changed() => {}
                            _ = changed.changed() => {}
                        }
                    }
                }
            }
        }
    }

    /// Opens the activation's teardown (once; later calls share it): the admission cutoff
    /// and the cancellations happen now, in one synchronous span, this child's before those of
    /// the children it owns; the rest runs on its own task (where children finish first).
    pub(super) fn open_disposal(self: &Arc<Self>, manager: &Arc<Continuation>) -> Disposal {
        let (tx, rx) = {
            let mut st = lock(&self.st);
            if let Some(disposal) = &st.disposal {
                return disposal.clone();
            }
            let (tx, rx) = watch::channel(None);
            st.disposal = Some(rx.clone());
            (tx, rx)
        };
        self.poke();
        if let Err(error) = self.agent.cancel(AbortCause::Parent, Queued::Discard) {
            manager.diagnose(
                self.child(),
                DiagnosticKind::CancelFailed,
                format!("cancelling the settled child failed: {error}"),
            );
        }
        let owned: Vec<SessionId> = lock(&self.st).owned.iter().copied().collect();
        let children: Vec<Disposal> = owned
            .into_iter()
            .filter_map(|id| manager.activation(id).map(|a| a.open_disposal(manager)))
            .collect();
        let (manager, activation) = (manager.clone(), self.clone());
        let runtime = manager.hold_runtime();
        tokio::spawn(async move {
            let _runtime = runtime;
            let outcome = activation.finish_disposal(&manager, children).await;
            tx.send_replace(Some(outcome));
        });
        rx
    }

    /// The rest of a teardown, in order: the children's teardowns, quiescence, the epoch's
    /// terminal facts, disposal of the agent (its final flush included), the activation
    /// forgotten, the notice, ownership released, `subagent/end`. A child's failed teardown or
    /// a failed disposal of the agent fails this one (the epoch then counts as failed), and it is
    /// still carried through to the end, then reported to the registry's watchers.
    async fn finish_disposal(
        self: &Arc<Self>,
        manager: &Continuation,
        children: Vec<Disposal>,
    ) -> Result<(), SubagentError> {
        let id = self.child();
        let mut failures = Vec::new();
        if let Err(error) = aggregate(children, "child activation(s)").await {
            failures.push(format!("child teardown failed: {error}"));
        }
        self.agent.when_idle().await;
        let terminal = self.agent.with_events(|events| {
            let own = &events[self.boundary.min(events.len())..];
            Terminal {
                stop_reason: epoch_stop_reason(own),
                output: closing_message(own),
            }
        });
        if let Err(error) = self.agent.try_dispose().await {
            failures.push(format!("its agent's disposal failed: {error}"));
        }
        let failure = match failures.as_slice() {
            [] => None,
            [one] => Some(teardown_failed(format!("subagent {id}: {one}"))),
            many => Some(teardown_failed(format!(
                "subagent {id}: teardown failed at {} boundaries: {}",
                many.len(),
                many.join("; ")
            ))),
        };
        manager.forget(self);
        let terminal = match &failure {
            Some(_) => Terminal {
                stop_reason: StopReason::Error,
                output: Vec::new(),
            },
            None => terminal,
        };
        // A child another host took over has not settled: it lives on there, and that host
        // tells the parent when it does.
        if !self.agent.is_fenced() {
            self.notify_settlement(manager, &terminal).await;
        }
        manager.release_ownership(id);
        manager.listeners.emit(&Lifecycle::End {
            info: self.run.clone(),
            stop_reason: terminal.stop_reason,
            last_assistant_message: (!terminal.output.is_empty()).then_some(terminal.output),
        });
        match failure {
            Some(error) => {
                manager.diagnose(id, DiagnosticKind::TeardownFailed, error.to_string());
                Err(error)
            }
            None => Ok(()),
        }
    }

    /// Tells the parent that the child settled, with its closing message. Sent only when the
    /// child was announced and the parent is live (here, or by mail); never fails the teardown.
    /// A parent object here whose session another host holds (its lease taken over, or lost
    /// with the agent not yet gone from the registry) is not the parent any more: the notice
    /// goes by mail, to whichever host holds or next resumes the parent.
    async fn notify_settlement(&self, manager: &Continuation, terminal: &Terminal) {
        if !lock(&self.st).announced {
            return;
        }
        let child = self.child();
        let parent = match manager.mailbox.parent_here(self.run.parent) {
            Some(parent) if manager.mailbox.holds_here_within_bound(&parent).await => Some(parent),
            _ => None,
        };
        let message = settlement_notice(
            MessageId::new(),
            child,
            settlement_summary(child, &terminal.stop_reason),
            &terminal.output,
        );
        let id = message.id;
        let Some(parent) = parent else {
            // Kept by another host (or by none yet): told there, by mail.
            manager
                .mailbox
                .post_to_absent_parent(child, self.run.parent, message, None);
            return;
        };
        // A parent in teardown (its runtime or subtree draining, its own activation closing, or
        // its agent being disposed) gets the notice quietly: waking it would start a turn its
        // teardown then has to wait for.
        let tearing_down = manager.assert_admitting(&parent).is_err()
            || parent.is_disposing()
            || manager
                .activation(parent.id())
                .is_some_and(|owner| Arc::ptr_eq(&owner.agent, &parent) && owner.is_closing());
        let handed = message.clone();
        let sent = if tearing_down {
            parent
                .inject(message)
                .map_err(|e| SubagentError::agent(parent.id(), e))
        } else {
            let recipient = parent.clone();
            manager.send_waking(&parent, id, move || {
                if recipient.status() == AgentStatus::Idle {
                    recipient.followup(message)
                } else {
                    recipient.steer(message)
                }
            })
        };
        match sent {
            Ok(()) => manager.mailbox.confirm_handed(child, parent, handed, None),
            Err(error) => manager.diagnose(
                parent.id(),
                DiagnosticKind::NoticeUndelivered,
                format!("the settlement notice of subagent {child} was not delivered: {error}"),
            ),
        }
    }
}

/// Waits for a teardown's outcome.
pub(super) async fn wait(disposal: Disposal) -> Result<(), SubagentError> {
    settled(disposal, || {
        teardown_failed("an activation teardown stopped without an outcome".into())
    })
    .await
}

/// Waits for every teardown and reports all failures together.
pub(super) async fn aggregate(
    disposals: Vec<Disposal>,
    subject: &str,
) -> Result<(), SubagentError> {
    let mut failures = Vec::new();
    for disposal in disposals {
        if let Err(error) = wait(disposal).await {
            failures.push(error.to_string());
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(teardown_failed(format!(
            "continuable subagent teardown failed for {} {subject}: {}",
            failures.len(),
            failures.join("; ")
        )))
    }
}
