//! Which sessions a live writer owns.
//!
//! A live agent appends to its session turn by turn, and between its appends the stored log may
//! end inside its open turn. A repair then would be wrong: `load` would close that turn as
//! interrupted, durably, although it is still running, and the store would refuse the agent's
//! next append. So a live writer owns its session ([`Store::own`]) for as long as it runs, and
//! `load` of an owned session never repairs it: it flushes what the owner admitted and returns the
//! log when no turn is open, or refuses with [`StoreError::LiveTurnOpen`] while one is. `inspect`,
//! which repairs in memory only, reads it as usual.
//!
//! On a shared store ownership spans hosts: owning a session takes its lease (see the `lease`
//! module), so no other host owns, repairs or writes it until the lease is released or expires.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use lineage_log::SessionId;

use crate::engine::Acquired;
use crate::lease::Held;
use crate::store::{Inner, contained};
use crate::{Loaded, Result, Store, StoreError};

/// The sessions owned through one store (every clone of a handle shares them, and so does a
/// clone of this).
#[derive(Clone, Debug, Default)]
pub(crate) struct Owners(Arc<Mutex<HashSet<SessionId>>>);

impl Owners {
    fn lock(&self) -> MutexGuard<'_, HashSet<SessionId>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn contains(&self, session: SessionId) -> bool {
        self.lock().contains(&session)
    }
}

/// A live writer's ownership of one session, from [`Store::own`]. Dropping it (or
/// [`SessionOwner::release`]) ends the ownership and releases the session's lease.
#[derive(Debug)]
#[must_use = "the session is owned only while this is held"]
pub struct SessionOwner {
    store: Weak<Inner>,
    session: SessionId,
    /// The lease's fencing token, on a shared store.
    fence: Option<u64>,
}

impl SessionOwner {
    /// The owned session.
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// The fencing token of the session's lease on a shared store (`None` on an embedded file,
    /// whose one writer needs none). Each owner of a session is given a larger one than the last.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Ends the ownership.
    pub fn release(self) {}
}

impl Drop for SessionOwner {
    fn drop(&mut self) {
        let Some(inner) = self.store.upgrade() else {
            // The store is closed; it released its leases as it closed.
            return;
        };
        // The lease goes first: until the ownership ends nobody here can own the session anew.
        let held = inner.queue.lock().leases.remove(&self.session);
        if let Some(held) = held.filter(|held| held.lost.is_none()) {
            match contained(|| inner.coordination.release_lease(self.session, held.fence)) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(session = %self.session, %error, "releasing the session's lease failed; it expires by itself")
                }
                Err(panic) => {
                    tracing::error!(session = %self.session, panic, "releasing the session's lease panicked; it expires by itself")
                }
            }
        }
        inner.owners.lock().remove(&self.session);
    }
}

impl Store {
    /// Makes the caller the live writer of `session` until the returned owner is dropped: until
    /// then `load` never repairs the session (see the module docs). Refused on a read-only store,
    /// and with [`StoreError::AlreadyOwned`] while another owner in this store holds it.
    ///
    /// On a shared store this takes the session's lease, refused with
    /// [`StoreError::HeldElsewhere`] while another host's is live; what this store knew of the
    /// session is read again, so its next write continues the log as the last holder left it.
    pub fn own(&self, session: SessionId) -> Result<SessionOwner> {
        self.writable()?;
        if !self.inner.owners.lock().insert(session) {
            return Err(StoreError::AlreadyOwned { session });
        }
        let mut owner = SessionOwner {
            store: Arc::downgrade(&self.inner),
            session,
            fence: None,
        };
        if !self.inner.coordination.shared() {
            return Ok(owner);
        }
        // What was admitted without the lease goes first, under the rules of a write without one.
        self.flush_before_read(session)?;
        let ttl = self.inner.options.lease_ttl;
        // The lease lasts at least `ttl` from before the call: its margin counts from here.
        let asked_at = std::time::Instant::now();
        let acquired = self.coordinate(|c| c.acquire(session, ttl))?;
        match acquired {
            Acquired::Granted { fence } => {
                let mut state = self.inner.queue.lock();
                state.leases.insert(session, Held::new(fence, asked_at));
                owner.fence = Some(fence);
                // Another host may have written since this store last read the session (a
                // session created here and not yet written is this store's alone).
                if state
                    .tails
                    .get(&session)
                    .is_some_and(|t| t.row_written && t.pending.is_empty())
                {
                    state.tails.remove(&session);
                }
                Ok(owner)
            }
            Acquired::HeldElsewhere(lease) => Err(StoreError::held_elsewhere(session, &lease)),
        }
    }

    /// Owns `session` ([`Store::own`]) and loads it under that ownership: a turn torn by a crash
    /// is repaired, as [`Store::load`] does, and on a shared store only by the lease's holder.
    /// This is how a host resumes a session it will keep writing.
    pub fn own_and_load(&self, session: SessionId) -> Result<(SessionOwner, Loaded)> {
        let owner = self.own(session)?;
        let loaded = self.load_repairing(session)?;
        Ok((owner, loaded))
    }

    /// Whether a live writer owns `session`.
    pub fn is_owned(&self, session: SessionId) -> bool {
        self.inner.owners.contains(session)
    }

    /// For `load`: an owned session is flushed and must have no open turn, so nothing is written.
    pub(crate) fn check_owned_load(&self, session: SessionId) -> Result<()> {
        self.flush(session)?;
        self.ensure_tail(session)?;
        let open = self
            .inner
            .queue
            .lock()
            .tails
            .get(&session)
            .is_some_and(|tail| !tail.structure.is_balanced());
        if open {
            return Err(StoreError::LiveTurnOpen { session });
        }
        Ok(())
    }
}
