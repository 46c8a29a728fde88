//! The runtime's continuation methods: its public entry points to the manager, each handing
//! the manager what it needs of the rest of the runtime (its setup contributions, a provider,
//! its background jobs).

use std::future::Future;

use lineage_agent::Cancellation;
use lineage_log::{ContentBlock, MessageSource};

use super::*;
use crate::{
    Authority, ContinuableRequest, ContinuableStarted, FollowupRequest, ReportDelivery,
    SubagentRuntime,
};

impl SubagentRuntime {
    /// The children resident now (running, waiting, or being torn down).
    pub fn resident(&self) -> Vec<SessionId> {
        self.continuation().resident()
    }

    /// Whether a child in the delegation tree of the exact live agent `ancestor` is resident
    /// (being torn down included) or being made resident: whether its tree still has work that
    /// can reach it.
    pub fn has_resident_under(&self, ancestor: &Arc<Agent>) -> bool {
        self.continuation().has_resident_under(ancestor)
    }

    /// Whether `child` has a resident activation (running or waiting).
    pub fn is_resident(&self, child: SessionId) -> bool {
        self.continuation().is_resident(child)
    }

    /// Starts a continuable child of `request.parent` with the provider `provider` and gives it
    /// its first prompt. Resolves as soon as the child's inbox has accepted the prompt (before
    /// its turn starts), with the child's id and the prompt's id.
    ///
    /// Checked now, before anything awaits: admission (`DRAINING`), the parent is live
    /// (`PARENT_UNAVAILABLE`), the id is free (`DUPLICATE_CHILD`), the depth
    /// (`DEPTH_EXCEEDED`), the tool filter names something (`INVALID_REQUEST`), the provider is
    /// registered (`NO_PROVIDER`) and can prepare continuable children
    /// (`UNSUPPORTED_CAPABILITY`). The parent's policy and the fork point are captured now too.
    /// Every failure before the prompt is accepted leaves no activation, no live child and no
    /// ownership; the cancellation covers only that part.
    ///
    /// Cancel safety: the checks above run when this is called, not when the future is first
    /// polled. Fire `request.cancel` to give up before the prompt is accepted; dropping the future
    /// instead may leave a child created and resident without its prompt, which then settles at once
    /// (`completed`, no notice: it was never announced).
    pub fn start_continuable(
        &self,
        provider: &str,
        request: ContinuableRequest,
    ) -> impl Future<Output = Result<ContinuableStarted, SubagentError>> + Send + 'static {
        let prepared = self.continuation().prepare_continuable(
            provider,
            self.expect_provider(provider),
            &request,
        );
        let runtime = self.clone();
        async move {
            let (child, how) = prepared?;
            runtime
                .continuation()
                .start(child, how, request, runtime.installer())
                .await
        }
    }

    /// Delivers `content` to `child` as its next turn, on behalf of its exact live parent
    /// `parent`. A running child queues it in the same activation; a waiting one is woken in the
    /// same activation; a child that is not resident is resumed from its log first. Resolves
    /// once the child's inbox has accepted it; `cancel` covers only the work before that: when it
    /// fires first, at any step of a cold resume included, the follow-up is refused
    /// (`CANCELLED`) with the cancellation's cause ([`SubagentError::cancel_cause`]) and nothing
    /// reaches the child.
    ///
    /// Cancel safety: to give up, fire `cancel` rather than drop the future. Dropping it before it
    /// resolves may leave the message accepted (the child then runs it) or not; a cold resume already
    /// under way then completes and leaves the child resident, to settle and be torn down as usual.
    /// With `cancel`, the answer says which: `CANCELLED` means the child never got the message.
    ///
    /// The message gets a fresh id; [`Self::send_followup`] takes one the caller chose, to retry
    /// safely.
    pub async fn followup(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        content: Vec<ContentBlock>,
        source: MessageSource,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        let request = FollowupRequest {
            parent: parent.clone(),
            child,
            content,
            source,
            message_id: None,
            cancel: cancel.clone(),
        };
        self.send_followup(&request).await
    }

    /// [`Self::followup`] of `request`, with the message id it names, if any. The same id sent
    /// twice, from this host or any other of a shared store, reaches the child once, and a
    /// retry of a delivered one is accepted. Refused means not delivered: a follow-up whose
    /// fate the store cannot tell (its mail posted, then the database stopped answering) is
    /// answered `OUTCOME_UNKNOWN`, to be retried with the same id.
    pub async fn send_followup(
        &self,
        request: &FollowupRequest,
    ) -> Result<MessageId, SubagentError> {
        self.continuation()
            .followup(request, self.installer())
            .await
    }

    /// Cancels the current turn of the resident child `target`, keeping its queued work parked
    /// until the next waking send; its own children keep running. A target that is not resident
    /// (unknown, one-shot, settled, being torn down) is an accepted no-op. Refused
    /// (`UNAUTHORIZED`) for a stale or self-targeting ancestor (before the target is looked up),
    /// and for a caller that is not the target's parent (user) or live ancestor (agent).
    pub fn interrupt(&self, target: SessionId, authority: &Authority) -> Result<(), SubagentError> {
        self.continuation().interrupt(target, authority)
    }

    /// Delivers `content` from the continuable child `child` (the exact live agent of a resident
    /// activation) to its direct parent, marked as the child's report. Reporting never ends
    /// the child's turn.
    pub fn report(
        &self,
        child: &Arc<Agent>,
        content: Vec<ContentBlock>,
        delivery: ReportDelivery,
        cancel: &Cancellation,
    ) -> Result<MessageId, SubagentError> {
        self.continuation().report(child, content, delivery, cancel)
    }

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
        let disposed = self.continuation().drain().await;
        jobs_ended.await;
        disposed
    }

    /// Tears down every resident descendant of the exact live agents `parents` (every
    /// cancellation at once, parents before children), and keeps admission closed below each
    /// of them until that agent itself is gone. A parent that is not the live agent under its
    /// id is ignored; other trees are untouched.
    pub async fn drain_descendants(&self, parents: &[Arc<Agent>]) -> Result<(), SubagentError> {
        self.continuation().drain_descendants(parents).await
    }

    /// Tears down the resident direct children `children` of the exact live agent `parent`.
    /// Ids that are not resident are ignored; an id that is resident but not `parent`'s direct
    /// child is refused before anything is torn down. Admission stays open.
    pub async fn drain_children(
        &self,
        parent: &Arc<Agent>,
        children: &[SessionId],
    ) -> Result<(), SubagentError> {
        self.continuation().drain_children(parent, children).await
    }

    /// Tells `parent` about every continuable child of its whose last turn a crash tore: one
    /// settlement notice each ("was stopped by a crash before it finished", with what the turn
    /// wrote), queued for the parent's next turn without waking it, then the child's turn closed
    /// as crash repair would. A torn child that holds accepted input no turn claimed (queued
    /// follow-ups, or follow-ups waiting for it as mail) is resumed here instead, to run that
    /// input: the parent gets the crash notice all the same, and, when the child settles, its
    /// settlement notice, which wakes the parent as any child's does. Children live in this process, or kept by
    /// another host of a shared store (a live holder of their lease), are not looked at: a
    /// child is torn only when its holder is gone. Returns the
    /// children told by this call; a repeated call (or one after another restart) tells none of
    /// them again.
    ///
    /// Call it once a parent is resumed after a restart ([`crate::Host::resume`] does, and a
    /// cold resume of a continuable child does it for the child's own children).
    pub async fn recover_children(
        &self,
        parent: &Arc<Agent>,
    ) -> Result<Vec<SessionId>, SubagentError> {
        self.continuation()
            .recover_children(parent, self.installer())
            .await
    }

    /// Serves this host's mail until the runtime stops: whenever the store says the mailbox
    /// changed ([`Store::watch_mail`](lineage_store::Store::watch_mail)), and at least every
    /// [`MAIL_POLL`] where it does not (every 250 ms where it does), each piece of mail
    /// for an agent live here is claimed, delivered, made durable in its log, then taken out.
    /// Returns `None` on a store that is not shared (no other host sends mail), or outside a
    /// tokio runtime.
    pub fn serve_mail(&self) -> Option<tokio::task::JoinHandle<()>> {
        let manager = self.continuation();
        manager.mailbox.serve(Arc::downgrade(manager))
    }
}
