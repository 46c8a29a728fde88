//! Delivery across hosts: the mailbox of a shared store.
//!
//! On a shared store a continuable child may be resident on another host (that host holds its
//! lease), and a parent may be live on another host than its child. What one host sends to an
//! agent another host keeps goes through the store's mailbox instead: a follow-up, an interrupt,
//! a report or a settlement notice becomes a piece of mail addressed to the recipient's session,
//! after the sender's authority was checked here as for a local delivery.
//!
//! Every host with a shared store serves its mail ([`crate::SubagentRuntime::serve_mail`]): it polls the
//! mailbox for the agents it keeps live, claims each piece, delivers it as the local operation
//! would, flushes the recipient's log, and only then takes the piece out. A piece whose message
//! the recipient's log already holds (its holder stopped between the flush and the taking) is
//! taken out without being delivered again, so each message reaches its recipient once.
//!
//! A follow-up's sender waits until its mail is gone and the child's stored log holds the
//! message, or until no host holds the child any more: it then takes its mail back and resumes
//! the child itself, as a local follow-up to a settled child does (mail gone that the log lacks,
//! taken by another sender of the same id, sends it on the same way). A sender whose follow-up
//! is cancelled takes its mail back unless a host has claimed it; it then waits on for the
//! claimant to deliver it (accepted) or to let the child go (taken back, cancelled).

use std::time::Duration;

use lineage_agent::{AgentStatus, Cancellation, DiagnosticKind, Queued};
use lineage_log::{AbortCause, Event, EventBody, Message, MessageId};
use lineage_store::{Mail, SessionInfo, Store};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::admission::diagnose;
use super::delivery::{followup_cancelled, unavailable};
use super::recovery::{holds_message, holds_retry, log_holds};
use super::*;
use crate::{Authority, ReportDelivery};

/// How often a host looks for mail, and a waiting sender for its mail's fate, on a store that
/// does not wake them ([`Store::watch_mail`]).
pub const MAIL_POLL: Duration = Duration::from_millis(50);

/// How often they look on a store that wakes them when the mailbox changes: a wake-up missed
/// while the store reconnects, and a holder that stopped (which posts nothing), are seen this
/// late at most.
const MAIL_POLL_PUSHED: Duration = Duration::from_millis(250);

/// How long a teardown waits to read whether this host still holds a parent's lease.
const LEASE_READ_BOUND: Duration = Duration::from_secs(1);

/// What a piece of mail asks of its recipient. Its body is this as JSON, `kind` naming the
/// variant (`{"kind": "report", "message": …, "quiet": false}`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Post {
    /// A follow-up for a resident child.
    Followup { message: Message },
    /// A child's settlement notice for its parent.
    Notice { message: Message },
    /// A child's report for its parent: at its next step, or `quiet`ly into it
    /// ([`ReportDelivery`]).
    Report {
        message: Message,
        #[serde(default)]
        quiet: bool,
    },
    /// An interrupt of a resident child's current turn, in the tenure of the lease with this
    /// fencing token (a later tenure's turns are not its to interrupt).
    Interrupt { cause: AbortCause, fence: u64 },
}

impl Post {
    fn report(message: Message, delivery: ReportDelivery) -> Post {
        Post::Report {
            message,
            quiet: delivery == ReportDelivery::Quiet,
        }
    }

    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("mail serializes")
    }

    fn decode(body: &[u8]) -> Result<Post, String> {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    }
}

/// Whether a piece of mail's `body` is a follow-up.
pub(super) fn is_followup(body: &[u8]) -> bool {
    matches!(Post::decode(body), Ok(Post::Followup { .. }))
}

/// The custom event type that records, in its recipient's log, mail that could not be delivered
/// and was taken out of the mailbox.
pub const MAIL_DISCARDED_EVENT: &str = "lineage.subagent/mail-discarded";

/// Records in `recipient`'s log that `piece` is discarded, and why (the caller flushes, then
/// takes the mail out): accepted mail is claimed into a turn or discarded with an event.
fn discard(recipient: &Agent, piece: &Mail, reason: &str) -> Result<(), lineage_agent::AgentError> {
    let payload = json!({
        "mail": piece.id.to_string(),
        "sender": piece.sender.to_string(),
        "reason": reason,
    });
    recipient
        .record(lineage_log::Custom {
            type_name: MAIL_DISCARDED_EVENT.into(),
            payload: payload.to_string().into(),
            ignorable: true,
        })
        .map(drop)
}

/// What became of a follow-up's mail, as the mailbox and its child's stored log tell.
enum Fate {
    /// The child's stored log holds the message.
    Delivered,
    /// A host took the mail out with a discard event in the child's log, for this reason.
    Discarded(String),
    /// A host has claimed the mail and not yet taken it out.
    Claimed,
    /// Neither in the mailbox nor in the child's log.
    Absent,
}

/// The fate of follow-up `id`'s mail, gone from the mailbox, by `child`'s stored log. Its
/// delivery or discard is looked for from seq `from` on (where the log ended when the mail was
/// posted: a delivery comes after), so a follow-up accepted costs a read of the events since,
/// not of the whole log; only a message found in neither is looked for in the whole log (a
/// retry of one delivered before).
fn stored_fate(
    store: &Store,
    child: SessionId,
    id: MessageId,
    from: u64,
) -> lineage_store::Result<Fate> {
    let fate = fate_in(&store.read_from(child, from)?, id);
    if from == 0 || !matches!(fate, Fate::Absent) {
        return Ok(fate);
    }
    Ok(fate_in(&store.inspect(child)?.events, id))
}

fn fate_in(events: &[Event], id: MessageId) -> Fate {
    if log_holds(events, id) {
        return Fate::Delivered;
    }
    let mail = id.as_uuid().to_string();
    let reason = events.iter().find_map(|event| match &event.body {
        EventBody::Custom(custom) if *custom.type_name == *MAIL_DISCARDED_EVENT => {
            let payload: serde_json::Value = serde_json::from_str(&custom.payload).ok()?;
            (payload["mail"] == mail.as_str()).then(|| payload["reason"].to_string())
        }
        _ => None,
    });
    reason.map_or(Fate::Absent, Fate::Discarded)
}

/// The refusal of follow-up `id` to `child`, whose mail a host discarded for `reason`.
fn discarded(child: SessionId, id: MessageId, reason: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::NotResumable,
        format!("the follow-up {id} to subagent {child} was not delivered: {reason}"),
    )
}

/// When to look at the mailbox again.
struct MailWatch {
    changes: tokio::sync::watch::Receiver<()>,
    poll: Duration,
}

impl MailWatch {
    /// Waits for a change of the mailbox since the last look, or for the poll.
    async fn next_look(&mut self) {
        tokio::select! {
            changed = self.changes.changed() => {
                if changed.is_err() {
                    tokio::time::sleep(self.poll).await;
                }
            }
            () = tokio::time::sleep(self.poll) => {}
        }
    }
}

/// The shared store's mailbox, as the agents of one registry send and serve it. Clones share it.
#[derive(Clone)]
pub(super) struct Mailbox {
    agents: Agents,
    /// Changes when the store says the mailbox may have changed.
    changes: tokio::sync::watch::Receiver<()>,
    /// Whether the store says so at all (else only polling finds mail).
    pushed: bool,
}

impl Mailbox {
    pub(super) fn new(agents: Agents) -> Self {
        let (changed, changes) = tokio::sync::watch::channel(());
        let pushed = agents.store().watch_mail(move || {
            changed.send_replace(());
        });
        Mailbox {
            agents,
            changes,
            pushed,
        }
    }

    /// A watch of the mailbox's changes from now on: its next look comes at the first change
    /// after this call, or at the poll.
    fn watch(&self) -> MailWatch {
        let mut changes = self.changes.clone();
        changes.mark_unchanged();
        MailWatch {
            changes,
            poll: if self.pushed {
                MAIL_POLL_PUSHED
            } else {
                MAIL_POLL
            },
        }
    }

    fn store(&self) -> &Store {
        self.agents.store()
    }

    /// Runs a blocking store call off the runtime's threads.
    async fn on_store<T: Send + 'static>(
        &self,
        call: impl FnOnce(&Store) -> lineage_store::Result<T> + Send + 'static,
    ) -> Result<T, String> {
        let store = self.store().clone();
        match tokio::task::spawn_blocking(move || call(&store)).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(join) => Err(join.to_string()),
        }
    }

    /// Whether another host keeps `session` (holds its live lease) on a shared store; a lease
    /// that cannot be read counts as nobody's.
    pub(super) async fn held_elsewhere(&self, session: SessionId) -> bool {
        self.holder_elsewhere(session).await.unwrap_or(false)
    }

    /// [`Self::held_elsewhere`], telling a lease that cannot be read apart.
    async fn holder_elsewhere(&self, session: SessionId) -> Result<bool, String> {
        if !self.store().is_shared() {
            return Ok(false);
        }
        self.on_store(move |store| store.held_elsewhere(session))
            .await
            .map(|lease| lease.is_some())
    }

    /// Whether this host still holds the session of the live agent `agent` here: always on a
    /// store that is not shared; on a shared one, the lease as the database has it is live,
    /// ours, and of the agent's tenure (its fencing token). When the lease cannot be read the
    /// agent is taken to be ours: its own writes are fenced if it is not.
    pub(super) async fn holds_here(&self, agent: &Arc<Agent>) -> bool {
        if !self.store().is_shared() {
            return true;
        }
        let (session, fence) = (agent.id(), agent.lease_fence());
        let me = self.store().holder();
        match self.on_store(move |store| store.lease(session)).await {
            Ok(lease) => lease.is_some_and(|lease| {
                lease.is_live() && lease.holder == Some(me) && Some(lease.fence) == fence
            }),
            Err(_) => true,
        }
    }

    /// The parent object here for the session `parent`, as a child's notice or report is
    /// handed to it: in the registry and not fenced. Whatever it is handed is confirmed
    /// ([`Self::confirm_handed`]): a parent whose session another host took over without this
    /// host knowing yet is found out by its refused flush, and the message goes by mail.
    pub(super) fn parent_here(&self, parent: SessionId) -> Option<Arc<Agent>> {
        self.agents.get(parent).filter(|agent| !agent.is_fenced())
    }

    /// [`Self::holds_here`] within [`LEASE_READ_BOUND`]: a read that takes longer counts as
    /// ours (a teardown does not wait on the database; [`Self::confirm_handed`] covers it).
    pub(super) async fn holds_here_within_bound(&self, agent: &Arc<Agent>) -> bool {
        tokio::time::timeout(LEASE_READ_BOUND, self.holds_here(agent))
            .await
            .unwrap_or(true)
    }

    /// Confirms, off the caller's path, that `parent` (live here) keeps the `message` from
    /// `child` it was just handed (a notice, or a `report`): its log is flushed, and a flush
    /// refused because another host holds the parent's session sends the message by mail
    /// under its own id, for that host (its log lacks it: the refused write stored nothing).
    pub(super) fn confirm_handed(
        &self,
        child: SessionId,
        parent: Arc<Agent>,
        message: Message,
        report: Option<ReportDelivery>,
    ) {
        if !self.store().is_shared() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mailbox = self.clone();
        runtime.spawn(async move {
            if parent.flush().await.is_err() && parent.is_fenced() {
                mailbox.post_to_absent_parent(child, parent.id(), message, report);
            }
        });
    }

    /// What the store says of `session` (its header names its durable parent).
    pub(super) async fn info(&self, session: SessionId) -> Result<SessionInfo, String> {
        self.on_store(move |store| store.info(session)).await
    }

    /// Posts `post` for `recipient`; the mail's id is the message's (or a new one).
    async fn post(
        &self,
        sender: SessionId,
        recipient: SessionId,
        id: MessageId,
        post: &Post,
    ) -> Result<(), String> {
        let mail = Mail {
            id: id.as_uuid(),
            recipient,
            sender,
            body: post.encode(),
        };
        self.on_store(move |store| store.post(&mail))
            .await
            .map(drop)
    }

    /// Posts the follow-up `message` from `sender` to `child`, whom another host keeps (the
    /// caller checked the follow-up), and waits for its fate (see the module docs): `Some` once
    /// the child's stored log holds it, `None` once its mail is gone without reaching the child
    /// (nobody holds the child any more and the mail is taken back, or another sender of the
    /// same id took it back), for the sender to find the child again and deliver it itself.
    ///
    /// Refused means not delivered: once the mail may be in the mailbox, a refusal is reported
    /// only after the mail is taken back ([`Self::resolve_fate`]); when that cannot be done the
    /// answer is `OUTCOME_UNKNOWN`. Mail gone counts as delivered only once the child's stored
    /// log holds the message: a host takes mail out only after flushing what it delivered.
    /// `from` is where the child's stored log ended before the post (see [`stored_fate`]).
    pub(super) async fn followup(
        &self,
        sender: SessionId,
        child: SessionId,
        message: &Message,
        from: u64,
        cancel: &Cancellation,
    ) -> Result<Option<MessageId>, SubagentError> {
        let id = message.id;
        // Watched before posting, so a host taking the mail at once is not missed.
        let mut watch = self.watch();
        let post = Post::Followup {
            message: message.clone(),
        };
        // Mail with this id already waiting (another sender's of the same message) is waited
        // for as this sender's own.
        if let Err(reason) = self.post(sender, child, id, &post).await {
            // The post may have been stored even so, its answer lost on the way back.
            return self.resolve_fate(child, id, reason).await;
        }
        let mail = id.as_uuid();
        // The caller cancelled while a host had claimed the mail: that host delivers it, and
        // the wait goes on (without the cancellation) until it has, or is gone.
        let mut claimed_when_cancelled = false;
        loop {
            let cancelled = if claimed_when_cancelled {
                watch.next_look().await;
                false
            } else {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => true,
                    () = watch.next_look() => false,
                }
            };
            let waiting = match self.on_store(move |store| store.mail_for(&[child])).await {
                Ok(waiting) => waiting.iter().any(|m| m.id == mail),
                Err(reason) => return self.resolve_fate(child, id, reason).await,
            };
            if !waiting {
                let fate = self
                    .on_store(move |store| stored_fate(store, child, id, from))
                    .await;
                return match fate {
                    Ok(Fate::Delivered) => Ok(Some(id)),
                    Ok(Fate::Discarded(reason)) => Err(discarded(child, id, &reason)),
                    Ok(_) if claimed_when_cancelled => Err(followup_cancelled(child, cancel)),
                    Ok(_) => Ok(None),
                    Err(failure) => Err(outcome_unknown(
                        child,
                        id,
                        unavailable(child, "its mail is gone"),
                        failure,
                    )),
                };
            }
            if cancelled {
                // Taken back unless a host has claimed it, which then delivers it.
                match self.on_store(move |store| store.withdraw_mail(mail)).await {
                    Ok(true) => return Err(followup_cancelled(child, cancel)),
                    Ok(false) => claimed_when_cancelled = true,
                    Err(failure) => {
                        let cancelled = followup_cancelled(child, cancel);
                        return Err(outcome_unknown(child, id, cancelled, failure));
                    }
                }
                continue;
            }
            // A lease that cannot be read is looked at again: its holder may be live.
            match self.holder_elsewhere(child).await {
                Ok(true) | Err(_) => continue,
                Ok(false) => {}
            }
            // Nobody holds the child any more: whoever takes the mail out delivers it (a holder
            // that stopped after delivering it left it in the child's log, where it is found).
            match self.on_store(move |store| store.take_mail(&[mail])).await {
                Ok(took) if took.is_empty() => continue,
                Ok(_) if claimed_when_cancelled => return Err(followup_cancelled(child, cancel)),
                Ok(_) => return Ok(None),
                Err(reason) => return self.resolve_fate(child, id, reason).await,
            }
        }
    }

    /// The answer to a follow-up `id` to `child` whose mail may be in the mailbox when the
    /// store failed with `reason`: the mail is taken back first, and the follow-up is refused
    /// only if that worked, or if the mail is gone and the child's stored log lacks the
    /// message (the post never landed, or this sender took it out). Mail a host has claimed,
    /// or that the child's log holds, is not refused: the one is reported of unknown outcome
    /// (its claimant may stop before delivering it), the other accepted.
    async fn resolve_fate(
        &self,
        child: SessionId,
        id: MessageId,
        reason: String,
    ) -> Result<Option<MessageId>, SubagentError> {
        let refused = unavailable(child, &reason);
        let mail = id.as_uuid();
        let fate = self
            .on_store(move |store| {
                if store.withdraw_mail(mail)? {
                    return Ok(Fate::Absent);
                }
                if store.mail_for(&[child])?.iter().any(|m| m.id == mail) {
                    return Ok(Fate::Claimed);
                }
                stored_fate(store, child, id, 0)
            })
            .await;
        match fate {
            Ok(Fate::Delivered) => Ok(Some(id)),
            Ok(Fate::Absent) => Err(refused),
            Ok(Fate::Discarded(reason)) => Err(discarded(child, id, &reason)),
            Ok(Fate::Claimed) => Err(outcome_unknown(
                child,
                id,
                refused,
                "a host has claimed it".into(),
            )),
            Err(failure) => Err(outcome_unknown(child, id, refused, failure)),
        }
    }

    /// Sends a child's settlement notice or report to a parent that is not live here: by mail,
    /// on a shared store, for the host that keeps the parent (or the next one to resume it).
    /// Returns whether it was posted.
    pub(super) fn post_to_absent_parent(
        &self,
        child: SessionId,
        parent: SessionId,
        message: Message,
        report: Option<ReportDelivery>,
    ) -> bool {
        if !self.store().is_shared() {
            return false;
        }
        let id = message.id;
        let post = match report {
            Some(delivery) => Post::report(message, delivery),
            None => Post::Notice { message },
        };
        let mailbox = self.clone();
        // Posted from a task: the notice is sent from a teardown that must not wait for it.
        tokio::spawn(async move {
            if let Err(error) = mailbox.post(child, parent, id, &post).await {
                diagnose(
                    &mailbox.agents,
                    parent,
                    DiagnosticKind::NoticeUndelivered,
                    format!("the mail of subagent {child} to its parent was not posted: {error}"),
                );
            }
        });
        true
    }

    /// Interrupts a child another host keeps, by mail, after checking `authority` against the
    /// stored lineage. Returns whether the child is kept elsewhere (and so was sent the mail).
    /// Synchronous, as [`crate::SubagentRuntime::interrupt`] is: its store calls are short reads
    /// and one insert.
    pub(super) fn interrupt_elsewhere(
        &self,
        target: SessionId,
        authority: &Authority,
    ) -> Result<bool, SubagentError> {
        let store = self.store();
        if !store.is_shared() {
            return Ok(false);
        }
        let unreadable = |error: lineage_store::StoreError| unavailable(target, error);
        let Some(lease) = store.held_elsewhere(target).map_err(unreadable)? else {
            return Ok(false);
        };
        let parent = store.info(target).map_err(unreadable)?.header.parent;
        let (sender, cause) = match authority {
            Authority::User { parent: expected } => {
                if parent != Some(*expected) {
                    return Err(unauthorized(format!(
                        "subagent {target} belongs to another parent session"
                    )));
                }
                (*expected, AbortCause::User)
            }
            Authority::Ancestor(agent) => {
                // The stored lineage from the target up must pass through the agent.
                let ancestor = agent.id();
                let mut at = parent;
                while let Some(session) = at.filter(|s| *s != ancestor) {
                    at = store.info(session).map_err(unreadable)?.header.parent;
                }
                if at.is_none() {
                    return Err(unauthorized(format!(
                        "subagent {target} is not a descendant of agent {ancestor}"
                    )));
                }
                (ancestor, AbortCause::Parent)
            }
        };
        let mail = Mail {
            id: MessageId::new().as_uuid(),
            recipient: target,
            sender,
            body: Post::Interrupt {
                cause,
                fence: lease.fence,
            }
            .encode(),
        };
        store.post(&mail).map_err(unreadable)?;
        Ok(true)
    }

    /// Serves this host's mail for `manager` until it is gone (see the module docs): whenever
    /// the mailbox changed (or at the poll), the mail for the agents live here is delivered and taken out. Returns `None`
    /// on a store that is not shared (no other host sends mail), or outside a tokio runtime.
    pub(super) fn serve(&self, manager: Weak<Continuation>) -> Option<tokio::task::JoinHandle<()>> {
        if !self.store().is_shared() {
            return None;
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let mut watch = self.watch();
        Some(handle.spawn(async move {
            loop {
                watch.next_look().await;
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                // A pass that panics (in host code it calls) is reported; the next one runs.
                let pass =
                    tokio::spawn(async move { manager.mailbox.deliver_mail(&manager).await });
                if let Err(error) = pass.await {
                    tracing::error!(%error, "a pass over the mailbox failed; the next one runs");
                }
            }
        }))
    }

    /// One look at the mailbox: each piece for an agent live here is delivered through
    /// `manager`, made durable in the recipient's log, then taken out.
    async fn deliver_mail(&self, manager: &Continuation) {
        let live: Vec<SessionId> = self.agents.list().iter().map(|a| a.id()).collect();
        if live.is_empty() {
            return;
        }
        let mail = match self.on_store(move |store| store.mail_for(&live)).await {
            Ok(mail) => mail,
            Err(error) => {
                tracing::warn!(%error, "reading the mailbox failed; trying again");
                return;
            }
        };
        for piece in mail {
            // A fenced agent is not its session's any more: its mail is the new holder's.
            let Some(recipient) = self
                .agents
                .get(piece.recipient)
                .filter(|agent| !agent.is_fenced())
            else {
                continue;
            };
            let post = Post::decode(&piece.body);
            self.serve_piece(&recipient, &piece, Via::Server(manager, post))
                .await;
        }
    }

    /// Delivers the follow-ups waiting in the mailbox for the child of `activation`, just made
    /// resident here by a recovery whose caller holds the child's lock: mail a host that is
    /// gone never delivered reaches the child before it can settle. Other mail waits for the
    /// mail server.
    pub(super) async fn deliver_waiting_followups(&self, activation: &Arc<Activation>) {
        let child = activation.child();
        let mail = match self.on_store(move |store| store.mail_for(&[child])).await {
            Ok(mail) => mail,
            Err(error) => {
                tracing::warn!(%error, %child, "reading the mailbox failed; the mail server delivers it");
                return;
            }
        };
        for piece in mail {
            if let Ok(Post::Followup { message }) = Post::decode(&piece.body) {
                let via = Via::Locked(activation, message);
                self.serve_piece(&activation.agent, &piece, via).await;
            }
        }
    }

    /// Serves one piece of mail for `recipient`, live here: claimed (so a sender cannot take it
    /// back while it is being delivered), delivered `via`, made durable in the recipient's log
    /// (or discarded there with an event when it cannot be delivered), then taken out. What
    /// fails on the way leaves it in the mailbox, for the next look.
    async fn serve_piece(&self, recipient: &Arc<Agent>, piece: &Mail, via: Via<'_>) {
        // An agent whose lease another host took over is not the recipient any more (even before
        // this host lets it go): the mail is the new holder's. The claim succeeds only while the
        // agent's tenure of the lease is live, as the database has it.
        let Some(fence) = recipient.lease_fence() else {
            return;
        };
        let id = piece.id;
        match self
            .on_store(move |store| store.claim_mail(id, fence))
            .await
        {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                tracing::warn!(%error, mail = %id, "claiming mail failed; trying again");
                return;
            }
        }
        let delivered = match via {
            Via::Server(manager, Ok(post)) => deliver(manager, recipient, post).await,
            Via::Server(_, Err(reason)) => Err(SubagentError::new(
                ErrorCode::InvalidRequest,
                format!("the mail is unreadable: {reason}"),
            )),
            Via::Locked(activation, message) => accept_followup(activation, message),
        };
        match delivered {
            Ok(true) => {}
            // Not deliverable here now (a teardown under way): left for the next look.
            Ok(false) => return,
            // The recipient is going away: whoever keeps it next gets the mail.
            Err(_) if recipient.is_disposing() => return,
            Err(error) => {
                if let Err(failure) = discard(recipient, piece, &error.to_string()) {
                    tracing::warn!(%failure, mail = %piece.id, "undeliverable mail could not be discarded; it stays");
                    return;
                }
            }
        }
        if let Err(error) = recipient.flush().await {
            tracing::warn!(%error, mail = %piece.id, "the recipient's log was not flushed; the mail stays");
            return;
        }
        if let Err(error) = self.on_store(move |store| store.take_mail(&[id])).await {
            tracing::warn!(%error, mail = %id, "delivered mail was not taken out; its recipient has it once");
        }
    }
}

/// How a piece of mail is delivered: by the mail server, through the manager (which takes the
/// recipient's lock), as its body decoded; or as a follow-up's message, to an activation whose
/// lock the caller holds.
enum Via<'a> {
    Server(&'a Continuation, Result<Post, String>),
    Locked(&'a Arc<Activation>, Message),
}

/// The acceptance of the follow-up `message` by the resident child of `activation`, under its
/// lock: `Ok(false)` while its teardown is under way (not now). A message its log holds is
/// accepted without being delivered again.
fn accept_followup(activation: &Arc<Activation>, message: Message) -> Result<bool, SubagentError> {
    if activation.is_closing() {
        return Ok(false);
    }
    let child = activation.child();
    if !activation
        .agent
        .with_events(|events: &[lineage_log::Event]| holds_retry(events, child, &message))?
    {
        let agent = activation.agent.clone();
        activation.admit_waking(message.id, || agent.followup(message))?;
    }
    lock(&activation.st).announced = true;
    Ok(true)
}

/// The answer to a follow-up `id` to `child` that would have been refused (`refusal`), had its
/// mail not stayed where the store could not take it back (`failure`).
fn outcome_unknown(
    child: SessionId,
    id: MessageId,
    refusal: SubagentError,
    failure: String,
) -> SubagentError {
    SubagentError::new(
        ErrorCode::OutcomeUnknown,
        format!(
            "the follow-up {id} to subagent {child} may or may not be delivered: {refusal}, and \
             its mail could not be taken back ({failure}); retry with the same message id"
        ),
    )
}

/// Delivers one piece of mail to `recipient`, live here, through `manager`. `Ok(false)`: not now.
async fn deliver(
    manager: &Continuation,
    recipient: &Arc<Agent>,
    post: Post,
) -> Result<bool, SubagentError> {
    let id = recipient.id();
    match post {
        Post::Followup { message } => {
            let _guard = manager.child_lock(id).await;
            let Some(activation) = manager
                .activation(id)
                .filter(|a| Arc::ptr_eq(&a.agent, recipient))
            else {
                return Err(SubagentError::new(
                    ErrorCode::NotResumable,
                    format!("agent {id} is not a resident continuable subagent here"),
                ));
            };
            accept_followup(&activation, message)
        }
        Post::Notice { message }
        | Post::Report {
            message,
            quiet: false,
        } => {
            if !holds_message(recipient, message.id) {
                let agent = recipient.clone();
                manager.send_waking(recipient, message.id, move || {
                    if agent.status() == AgentStatus::Idle {
                        agent.followup(message)
                    } else {
                        agent.steer(message)
                    }
                })?;
            }
            Ok(true)
        }
        Post::Report {
            message,
            quiet: true,
        } => {
            if !holds_message(recipient, message.id) {
                recipient
                    .inject(message)
                    .map_err(|e| SubagentError::agent(id, e))?;
            }
            Ok(true)
        }
        Post::Interrupt { cause, fence } => {
            // Meant for the turn running when it was sent, in that tenure; a tenure since is
            // not interrupted by it.
            if let Some(activation) = manager.activation(id)
                && !activation.is_closing()
                && recipient.lease_fence() == Some(fence)
            {
                recipient
                    .cancel(cause, Queued::Keep)
                    .map_err(|e| SubagentError::agent(id, e))?;
            }
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use lineage_log::{ContentBlock, MessageSource, Role, SessionId};

    use super::*;

    fn a_message() -> Message {
        Message {
            id: MessageId::new(),
            role: Role::User,
            content: vec![ContentBlock::text("again, with the second file")],
            source: MessageSource::SubagentSettled {
                sender: SessionId::new(),
                summary: "done".into(),
            },
        }
    }

    #[test]
    fn every_kind_of_mail_reads_back_as_it_was_written() {
        let message = a_message();
        let posts = [
            Post::Followup {
                message: message.clone(),
            },
            Post::Notice {
                message: message.clone(),
            },
            Post::report(message.clone(), ReportDelivery::Quiet),
            Post::report(message.clone(), ReportDelivery::NextStep),
            Post::Interrupt {
                cause: AbortCause::Hook {
                    reason: "stop".into(),
                },
                fence: 7,
            },
        ];
        for post in posts {
            let read = Post::decode(&post.encode()).unwrap();
            assert_eq!(format!("{read:?}"), format!("{post:?}"));
        }
        assert!(Post::decode(b"{\"kind\":\"other\"}").is_err());
        assert!(Post::decode(b"not json").is_err());
    }

    /// The bodies mail has had on the wire since the mailbox came: each reads as its kind (a
    /// report without `quiet` is delivered at the next step), and anything else is refused.
    #[test]
    fn mail_bodies_read_by_their_kind() {
        let message = a_message();
        let m = serde_json::to_value(&message).unwrap();
        let cause = serde_json::to_value(AbortCause::Hook {
            reason: "stop".into(),
        })
        .unwrap();
        let bodies = [
            (json!({"kind": "followup", "message": m}), "Followup"),
            (json!({"kind": "notice", "message": m}), "Notice"),
            (
                json!({"kind": "report", "message": m, "quiet": true}),
                "quiet: true",
            ),
            (
                json!({"kind": "report", "message": m, "quiet": false}),
                "quiet: false",
            ),
            (json!({"kind": "report", "message": m}), "quiet: false"),
            (
                json!({"cause": cause, "fence": 7, "kind": "interrupt"}),
                "fence: 7",
            ),
        ];
        for (body, says) in bodies {
            let read = Post::decode(body.to_string().as_bytes()).unwrap();
            assert!(format!("{read:?}").contains(says), "{body}: {read:?}");
        }
        for refused in [
            json!({"kind": "interrupt", "cause": cause}),
            json!({"kind": "followup"}),
            json!({"message": m}),
        ] {
            assert!(
                Post::decode(refused.to_string().as_bytes()).is_err(),
                "{refused}"
            );
        }
    }
}
