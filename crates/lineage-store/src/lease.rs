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
//! lease that ran out if nobody took it over meanwhile). A lease a renewal or a write finds lost
//! (taken over) is reported to the session's pending flushes at once, and every later write of
//! the session through this store is refused until its owner is dropped. Leases are released
//! when their owner is dropped and when the store closes; the token is kept, so the next holder's
//! is larger.
//!
//! The leases and the mailbox are the engine's [`Coordination`]. An embedded file has one writer
//! (its lock says so), and its coordination (`OneWriter`) grants every lease with token 0: the
//! same code runs on both engines.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use lineage_log::SessionId;

use crate::engine::{Coordination, LeaseState, Mail};
use crate::writer::{Queue, Refusal, refuse};
use crate::{Store, StoreError};

/// A held lease, as the writer's state keeps it.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub fence: u64,
    /// Set when a renewal or a write found the lease gone (taken over or released), with the
    /// lease as it then stood: it is never renewed again, and every later write of the session
    /// through this store is refused until its owner is dropped.
    pub lost: Option<Option<LeaseState>>,
}

impl Held {
    pub fn new(fence: u64) -> Held {
        Held { fence, lost: None }
    }

    /// The refusal of a write of `session` under this lost lease.
    pub fn refusal(&self, session: SessionId) -> Option<StoreError> {
        let lease = self.lost.as_ref()?;
        Some(StoreError::Fenced {
            session,
            fence: Some(self.fence),
            holder: lease.as_ref().and_then(|l| l.holder),
            current: lease.as_ref().map(|l| l.fence),
        })
    }
}

/// The thread that renews the store's leases.
pub(crate) struct Keeper {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: JoinHandle<()>,
}

impl Keeper {
    pub fn start(
        coordination: Arc<dyn Coordination>,
        queue: Arc<Queue>,
        ttl: Duration,
    ) -> std::io::Result<Keeper> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = stop.clone();
        let handle = std::thread::Builder::new()
            .name("lineage-store-leases".into())
            .spawn(move || {
                let (stopped, wake) = &*signal;
                let mut stopped_now = stopped.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    stopped_now = wake
                        .wait_timeout(stopped_now, ttl / 3)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if *stopped_now {
                        return;
                    }
                    drop(stopped_now);
                    renew(&*coordination, &queue, ttl);
                    stopped_now = stopped.lock().unwrap_or_else(|p| p.into_inner());
                }
            })?;
        Ok(Keeper { stop, handle })
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
        if self.handle.join().is_err() {
            tracing::error!("the store's lease keeper panicked");
        }
    }
}

/// One renewal of every held lease. A failure to reach the database is logged and tried again
/// next time (the lease may still be ours: the token decides).
fn renew(coordination: &dyn Coordination, queue: &Queue, ttl: Duration) {
    let held: Vec<_> = queue
        .lock()
        .leases
        .iter()
        .filter(|(_, held)| held.lost.is_none())
        .map(|(session, held)| (*session, held.fence))
        .collect();
    if held.is_empty() {
        return;
    }
    let lost = match crate::store::contained(|| coordination.renew(&held, ttl)) {
        Ok(Ok(lost)) => lost,
        Ok(Err(error)) => {
            tracing::warn!(%error, leases = held.len(), "renewing the store's leases failed; trying again");
            return;
        }
        Err(panic) => {
            tracing::error!(panic, "renewing the store's leases panicked; trying again");
            return;
        }
    };
    for session in lost {
        let renewed_fence = held.iter().find(|(s, _)| *s == session).map(|(_, f)| *f);
        let lease = coordination.lease(session).ok().flatten();
        let mut state = queue.lock();
        // The lease asked about, not a newer one taken since (its owner dropped and taken again).
        let Some(held) = state
            .leases
            .get_mut(&session)
            .filter(|held| Some(held.fence) == renewed_fence)
        else {
            continue;
        };
        held.lost = Some(lease.clone());
        let ours = Some(held.fence);
        let upto = state.tails.get(&session).map_or(0, |tail| tail.last_ticket);
        tracing::warn!(%session, ?lease, "the session's lease was lost; its writes are refused from now on");
        refuse(&mut state, session, upto, Refusal::Fenced { ours, lease });
        queue.wake_waiters.notify_all();
    }
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
        self.inner
            .coordination
            .watch_mail(std::sync::Arc::new(wake))
    }

    /// One call of the coordination's, its panic contained and its failure the store's.
    pub(crate) fn coordinate<T>(
        &self,
        call: impl FnOnce(&dyn Coordination) -> std::result::Result<T, crate::EngineError>,
    ) -> crate::Result<T> {
        crate::store::guard(|| call(&*self.inner.coordination).map_err(StoreError::Storage))
    }
}
