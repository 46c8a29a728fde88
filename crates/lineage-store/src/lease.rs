//! Leases on a shared store: at most one host writes a session at a time.
//!
//! On an engine that many hosts share (PostgreSQL), owning a session ([`crate::Store::own`]) takes
//! its lease: a holder (the store handle's id), an expiry by the database's clock, and a fencing
//! token that every takeover raises and nothing lowers. Every write of an owned session carries
//! the token and applies only while the lease has not been taken over; a write of a session this
//! store does not own applies only while no other holder's lease on it is live. So a host that
//! was paused past its lease, and woke up to write, is refused ([`crate::StoreError::Fenced`])
//! instead of writing over the new holder's log, whatever its own clock says.
//!
//! A keeper thread renews every held lease each third of the lease's time (a late renewal keeps a
//! lease that ran out if nobody took it over meanwhile). It never waits on the database longer
//! than a lease allows: each renewal runs on a short-lived thread of its own, and the keeper
//! waits for its answer only until a lease's safe margin runs out. The database extends a lease
//! from the moment it runs the renewal, so a lease lasts at least `lease_ttl` from the *start* of
//! the last renewal that succeeded; once `lease_ttl - lease_ttl / 5` has passed since with no
//! renewal answered, the store gives the lease up itself (it *lapses*, [`LeaseLoss::Lapsed`])
//! before another host may take it, whatever became of the hung call (which the engine's own
//! deadline ends; no second renewal starts while one is still out). A lease lost either way, or
//! found taken over by a write, is reported to the session's pending flushes at once, every later
//! write of the session through this store is refused until its owner is dropped, and the loss is
//! announced to [`Store::watch_leases`]. Leases are released when their owner is dropped and when
//! the store closes; the token is kept, so the next holder's is larger. A store whose leases
//! lapsed works as before for sessions owned anew once the database answers again.
//!
//! The leases and the mailbox are the engine's [`Coordination`]. An embedded file has one writer
//! (its lock says so), and its coordination (`OneWriter`) grants every lease with token 0: the
//! same code runs on both engines.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lineage_log::SessionId;

use crate::engine::{Coordination, LeaseState, Mail};
use crate::writer::{Queue, Refusal, State, refuse};
use crate::{Store, StoreError};

/// Why a lease this store held was lost (see [`Store::watch_leases`]). The session is no longer
/// this store's to write: its pending flushes were refused, and so is every later write through
/// this store until its owner is dropped (owning it again takes a new lease).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLoss {
    /// A renewal found the lease taken over by another holder (or released); `lease` is the
    /// lease as it then stood (`None` when it could not be read).
    TakenOver {
        /// The lease as it stood.
        lease: Option<LeaseState>,
    },
    /// The database answered no renewal for `silent` (counted from the start of the last one
    /// that succeeded), which reached the lease's safe margin: the store gave the lease up
    /// itself, before another host could take it over.
    Lapsed {
        /// How long the database had not answered.
        silent: Duration,
    },
    /// A write of the session was refused by its lease, which another host had taken over;
    /// `lease` is the lease as the write found it.
    Refused {
        /// The lease as it stood.
        lease: Option<LeaseState>,
    },
}

impl LeaseLoss {
    /// The refusal of a write of `session` under the lost lease, whose token was `fence`.
    pub fn error(&self, session: SessionId, fence: u64) -> StoreError {
        match self {
            LeaseLoss::TakenOver { lease } | LeaseLoss::Refused { lease } => StoreError::Fenced {
                session,
                fence: Some(fence),
                holder: lease.as_ref().and_then(|l| l.holder),
                current: lease.as_ref().map(|l| l.fence),
            },
            LeaseLoss::Lapsed { silent } => StoreError::LeaseLapsed {
                session,
                fence,
                silent_ms: millis(*silent),
            },
        }
    }
}

/// What is called with each lost lease (see [`Store::watch_leases`]).
pub(crate) type LeaseWatch = Arc<dyn Fn(SessionId, LeaseLoss) + Send + Sync>;

/// A held lease, as the writer's state keeps it.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub fence: u64,
    /// When the last call that extended the lease (its acquisition or a renewal) *started*: the
    /// database's expiry is at least `lease_ttl` after it.
    pub since: Instant,
    /// Set when the lease was lost, with why: it is never renewed again, and every later write
    /// of the session through this store is refused until its owner is dropped.
    pub lost: Option<LeaseLoss>,
}

impl Held {
    pub fn new(fence: u64, since: Instant) -> Held {
        Held {
            fence,
            since,
            lost: None,
        }
    }

    /// The refusal of a write of `session` under this lost lease.
    pub fn refusal(&self, session: SessionId) -> Option<StoreError> {
        Some(self.lost.as_ref()?.error(session, self.fence))
    }
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Marks `session`'s lease lost for `loss`, if the store still holds it with `fence` and it was
/// not lost already, and queues the loss's announcement (see [`Queue::announce_losses`]). Says
/// whether it was newly lost. The caller refuses the session's pending flushes.
pub(crate) fn lose(state: &mut State, session: SessionId, fence: u64, loss: LeaseLoss) -> bool {
    let Some(held) = state
        .leases
        .get_mut(&session)
        .filter(|held| held.fence == fence && held.lost.is_none())
    else {
        return false;
    };
    tracing::warn!(%session, fence, ?loss, "the session's lease was lost; its writes are refused from now on");
    held.lost = Some(loss.clone());
    state.losses.push((session, loss));
    true
}

/// What the keeper hears: a renewal's answer, or that the store is closing.
enum Message {
    Stop,
    Renewed(Renewal),
}

/// One renewal's answer: the leases it asked for, when it started, and those it found lost with
/// each lease as it then stood (or why it failed).
struct Renewal {
    started: Instant,
    asked: Vec<(SessionId, u64)>,
    outcome: Result<Vec<(SessionId, Option<LeaseState>)>, String>,
}

/// The thread that renews the store's leases.
pub(crate) struct Keeper {
    stop: Sender<Message>,
    handle: JoinHandle<()>,
}

impl Keeper {
    pub fn start(
        coordination: Arc<dyn Coordination>,
        queue: Arc<Queue>,
        ttl: Duration,
    ) -> std::io::Result<Keeper> {
        let (tx, rx) = channel();
        let answers = tx.clone();
        let handle = std::thread::Builder::new()
            .name("lineage-store-leases".into())
            .spawn(move || keep(&coordination, &queue, ttl, &answers, &rx))?;
        Ok(Keeper { stop: tx, handle })
    }

    /// Stops the thread and waits for it (not for a renewal still out, which ends by itself).
    pub fn stop(self) {
        let _ = self.stop.send(Message::Stop);
        if self.handle.join().is_err() {
            tracing::error!("the store's lease keeper panicked");
        }
    }
}

/// The keeper's loop: a renewal every third of `ttl` (none while one is out), leases lapsed as
/// their margin runs out, losses announced.
fn keep(
    coordination: &Arc<dyn Coordination>,
    queue: &Arc<Queue>,
    ttl: Duration,
    answers: &Sender<Message>,
    messages: &Receiver<Message>,
) {
    let margin = ttl - ttl / 5;
    let mut next_renewal = Instant::now() + ttl / 3;
    let mut out = false;
    loop {
        let lapse_at = queue
            .lock()
            .leases
            .values()
            .filter(|held| held.lost.is_none())
            .map(|held| held.since + margin)
            .min();
        let wake_at = [(!out).then_some(next_renewal), lapse_at]
            .into_iter()
            .flatten()
            .min();
        let message = match wake_at {
            Some(at) => messages.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => messages.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match message {
            Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(Message::Renewed(renewal)) => {
                out = false;
                settle(queue, renewal);
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        lapse_overdue(queue, margin);
        queue.announce_losses();
        if !out && Instant::now() >= next_renewal {
            out = start_renewal(coordination, queue, ttl, answers);
            next_renewal = Instant::now() + ttl / 3;
        }
    }
}

/// Starts one renewal of every held lease on a thread of its own, which sends its answer to the
/// keeper. Says whether one is out (none is when nothing is held).
fn start_renewal(
    coordination: &Arc<dyn Coordination>,
    queue: &Queue,
    ttl: Duration,
    answers: &Sender<Message>,
) -> bool {
    let asked: Vec<_> = queue
        .lock()
        .leases
        .iter()
        .filter(|(_, held)| held.lost.is_none())
        .map(|(session, held)| (*session, held.fence))
        .collect();
    if asked.is_empty() {
        return false;
    }
    let (coordination, answers) = (coordination.clone(), answers.clone());
    let started = Instant::now();
    let spawned = std::thread::Builder::new()
        .name("lineage-store-renewal".into())
        .spawn(move || {
            let outcome = crate::store::contained(|| {
                let lost = coordination.renew(&asked, ttl)?;
                // Each lost lease as it now stands, for the refusal to name its holder.
                Ok(lost
                    .into_iter()
                    .map(|session| (session, coordination.lease(session).ok().flatten()))
                    .collect())
            })
            .and_then(|answer: Result<_, crate::EngineError>| answer.map_err(|e| e.to_string()));
            let _ = answers.send(Message::Renewed(Renewal {
                started,
                asked,
                outcome,
            }));
        });
    match spawned {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(%error, "the lease renewal's thread did not start; trying again");
            false
        }
    }
}

/// Acts on a renewal's answer: the leases it renewed count from its start, those it found lost
/// are lost. A failure is logged and tried again next time (the lease may still be ours: the
/// token decides, until its margin runs out).
fn settle(queue: &Queue, renewal: Renewal) {
    let lost = match renewal.outcome {
        Ok(lost) => lost,
        Err(error) => {
            tracing::warn!(%error, leases = renewal.asked.len(), "renewing the store's leases failed; trying again");
            return;
        }
    };
    let mut state = queue.lock();
    for (session, fence) in renewal.asked {
        if let Some((_, lease)) = lost.iter().find(|(s, _)| *s == session) {
            let lease = lease.clone();
            if lose(
                &mut state,
                session,
                fence,
                LeaseLoss::TakenOver {
                    lease: lease.clone(),
                },
            ) {
                let upto = state.tails.get(&session).map_or(0, |tail| tail.last_ticket);
                let ours = Some(fence);
                refuse(&mut state, session, upto, Refusal::Fenced { ours, lease });
            }
        } else if let Some(held) = state
            .leases
            .get_mut(&session)
            .filter(|held| held.fence == fence && held.lost.is_none())
        {
            held.since = held.since.max(renewal.started);
        }
    }
    queue.wake_waiters.notify_all();
}

/// Lapses every held lease whose last extension started more than `margin` ago.
fn lapse_overdue(queue: &Queue, margin: Duration) {
    let mut state = queue.lock();
    let now = Instant::now();
    let overdue: Vec<_> = state
        .leases
        .iter()
        .filter(|(_, held)| held.lost.is_none() && now.duration_since(held.since) >= margin)
        .map(|(session, held)| (*session, held.fence, now.duration_since(held.since)))
        .collect();
    if overdue.is_empty() {
        return;
    }
    for (session, fence, silent) in overdue {
        if lose(&mut state, session, fence, LeaseLoss::Lapsed { silent }) {
            let upto = state.tails.get(&session).map_or(0, |tail| tail.last_ticket);
            refuse(&mut state, session, upto, Refusal::Lapsed { fence, silent });
        }
    }
    queue.wake_waiters.notify_all();
}

impl Store {
    /// Whether other hosts may share this store (PostgreSQL), so that leases and the mailbox
    /// mean something; an embedded file has one writer.
    pub fn is_shared(&self) -> bool {
        self.inner.coordination.shared()
    }

    /// The session's lease as it stands on a shared store (`None` on an embedded file, or when
    /// the session was never leased).
    pub fn lease(&self, session: SessionId) -> crate::Result<Option<LeaseState>> {
        self.coordinate(|c| c.lease(session))
    }

    /// The refusal of `session`'s writes if the lease this store holds on it now was lost (see
    /// [`Store::watch_leases`]); `None` while it holds it, or holds none. A watcher checks it to
    /// tell a loss of the current tenure from one of an earlier owner's, announced late.
    pub fn lost_lease(&self, session: SessionId) -> Option<StoreError> {
        let state = self.inner.queue.lock();
        state.leases.get(&session)?.refusal(session)
    }

    /// The session's lease if another host holds it live (it keeps the session resident).
    pub fn held_elsewhere(&self, session: SessionId) -> crate::Result<Option<LeaseState>> {
        let me = self.holder();
        Ok(self.lease(session)?.filter(|lease| lease.held_by_other(me)))
    }

    /// Posts `mail` for the host that keeps its recipient resident (see [`Mail`]); says
    /// whether it was new. Only a shared store has a mailbox.
    pub fn post(&self, mail: &Mail) -> crate::Result<bool> {
        self.writable()?;
        self.coordinate(|c| c.post(mail))
    }

    /// The mail waiting for any of `recipients`, in posting order. It stays waiting until taken.
    pub fn mail_for(&self, recipients: &[SessionId]) -> crate::Result<Vec<Mail>> {
        self.coordinate(|c| c.mail_for(recipients))
    }

    /// Claims mail for delivery by this store's host (see [`Mail`]), in its tenure of the
    /// recipient's lease with the fencing token `fence`: says whether this host may deliver it
    /// (it holds that lease, live, as the database has it), which it then takes out
    /// ([`Store::take_mail`]). A claim lapses when its claimant no longer holds the lease.
    pub fn claim_mail(&self, id: uuid::Uuid, fence: u64) -> crate::Result<bool> {
        self.writable()?;
        self.coordinate(|c| c.claim_mail(id, fence))
    }

    /// Takes mail back unless a host has claimed it for delivery; says whether it was taken.
    pub fn withdraw_mail(&self, id: uuid::Uuid) -> crate::Result<bool> {
        self.writable()?;
        self.coordinate(|c| c.withdraw_mail(id))
    }

    /// Takes the mail with these ids out of the mailbox; returns the ids this call took. Of two
    /// hosts taking one piece of mail, exactly one gets its id back.
    pub fn take_mail(&self, ids: &[uuid::Uuid]) -> crate::Result<Vec<uuid::Uuid>> {
        self.writable()?;
        self.coordinate(|c| c.take_mail(ids))
    }

    /// Calls `wake` whenever the mailbox may have changed: mail posted for any recipient, or
    /// taken out, by any host (on PostgreSQL, by `LISTEN`/`NOTIFY`; see
    /// [`StoreOptions::mail_push`](crate::StoreOptions::mail_push)). It runs on the store's own
    /// thread and must return at once (set a flag, notify a task). Says whether wake-ups come:
    /// with `false` (an embedded file, or pushes turned off) the caller only polls. A wake-up
    /// says only "look again", and one may be missed while the store reconnects, so a watcher
    /// polls slowly as well.
    pub fn watch_mail(&self, wake: impl Fn() + Send + Sync + 'static) -> bool {
        self.inner.coordination.watch_mail(Arc::new(wake))
    }

    /// Calls `lost` once for every lease this store loses, with the session and why (see
    /// [`LeaseLoss`]): found taken over by a renewal, lapsed because the database did not answer,
    /// or a write refused by it. It runs on the store's own threads, after the session's pending
    /// flushes were refused, and must return at once (notify a task); a panic in it is contained
    /// and logged. Every watcher registered hears every loss from then on. An embedded file
    /// loses no leases.
    pub fn watch_leases(&self, lost: impl Fn(SessionId, LeaseLoss) + Send + Sync + 'static) {
        self.inner
            .queue
            .lease_watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::new(lost));
    }

    /// One call of the coordination's, its panic contained and its failure the store's.
    pub(crate) fn coordinate<T>(
        &self,
        call: impl FnOnce(&dyn Coordination) -> std::result::Result<T, crate::EngineError>,
    ) -> crate::Result<T> {
        crate::store::guard(|| call(&*self.inner.coordination).map_err(StoreError::Storage))
    }
}
