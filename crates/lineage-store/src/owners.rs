//! Which sessions a live writer in this process owns.
//!
//! A live agent appends to its session turn by turn, and between its appends the stored log may
//! end inside its open turn. A repair then would be wrong: `load` would close that turn as
//! interrupted, durably, although it is still running, and the store would refuse the agent's
//! next append. So a live writer owns its session ([`Store::own`]) for as long as it runs, and
//! `load` of an owned session never repairs it: it flushes what the owner admitted and returns the
//! log when no turn is open, or refuses with [`StoreError::LiveTurnOpen`] while one is. `inspect`,
//! which repairs in memory only, reads it as usual.
//!
//! Ownership is one process's today; a shared store extends it across hosts with leases.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use lineage_log::SessionId;

use crate::{Result, Store, StoreError};

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
/// [`SessionOwner::release`]) ends the ownership.
#[derive(Debug)]
#[must_use = "the session is owned only while this is held"]
pub struct SessionOwner {
    owners: Arc<Mutex<HashSet<SessionId>>>,
    session: SessionId,
}

impl SessionOwner {
    /// The owned session.
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// Ends the ownership.
    pub fn release(self) {}
}

impl Drop for SessionOwner {
    fn drop(&mut self) {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.session);
    }
}

impl Store {
    /// Makes the caller the live writer of `session` until the returned owner is dropped: until
    /// then `load` never repairs the session (see the module docs). Refused on a read-only store,
    /// and with [`StoreError::AlreadyOwned`] while another owner holds it.
    pub fn own(&self, session: SessionId) -> Result<SessionOwner> {
        self.writable()?;
        let owners = &self.inner.owners;
        if !owners.lock().insert(session) {
            return Err(StoreError::AlreadyOwned { session });
        }
        Ok(SessionOwner {
            owners: owners.0.clone(),
            session,
        })
    }

    /// Whether a live writer owns `session`.
    pub fn is_owned(&self, session: SessionId) -> bool {
        self.inner.owners.contains(session)
    }

    /// For `load`: an owned session is flushed and must have no open turn, so nothing is written.
    pub(crate) fn check_owned_load(&self, session: SessionId) -> Result<()> {
        if !self.is_owned(session) {
            return Ok(());
        }
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
