//! Deleting sessions: a session's row, blocks and children-index entries removed in one commit of
//! the writer thread.
//!
//! **The rule for descendants.** A session's children and forks (the sessions whose header names
//! it as their parent, listed in the `children` table) copied its history, and their
//! `seed_digest` vouches for it. Deleting the session alone would leave them naming a parent that
//! no longer exists, so by default a deletion is refused while any descendant is stored
//! ([`StoreError::HasDescendants`], naming the session and how many descendants it has). On
//! request ([`DeleteRule::Subtree`]) the session and every descendant are deleted together, in
//! the same transaction. Either way nothing is left naming a deleted parent, and `verify` of what
//! remains is clean.

use std::collections::HashSet;

use lineage_log::SessionId;

pub use crate::engine::Deleted;
use crate::engine::{Deletion, Removal};
use crate::error::EngineError;
use crate::owners::Owners;
use crate::store::Store;
use crate::{Result, StoreError};

/// What [`Store::delete`] does about the sessions that descend from the one it deletes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeleteRule {
    /// Refuse while any child or fork of the session is stored
    /// ([`StoreError::HasDescendants`]). Nothing is deleted.
    #[default]
    Refuse,
    /// Delete the session and every stored descendant (children, their children, forks of any of
    /// them), all in one transaction.
    Subtree,
}

/// A deletion queued for the writer thread.
#[derive(Debug)]
pub(crate) struct DeleteJob {
    /// Matches the answer to its caller.
    pub id: u64,
    pub session: SessionId,
    pub rule: DeleteRule,
    /// The sessions live writers own through this store, checked inside the transaction.
    pub owners: Owners,
}

impl Store {
    /// Deletes `session` from the store, durably: its row, every block of its events, and its
    /// entries in the children index (as a child and as a parent) are removed in one transaction
    /// of the writer thread, committed before this returns. A crash leaves the session either
    /// whole or gone.
    ///
    /// **Descendants.** With [`DeleteRule::Refuse`] (the default) a session that has stored
    /// children or forks is not deleted: [`StoreError::HasDescendants`] names it and how many
    /// sessions descend from it. With [`DeleteRule::Subtree`] they are deleted too, in the same
    /// transaction. So no stored session is ever left naming a deleted parent.
    ///
    /// **Live writers.** A session that a live writer in this process owns ([`Store::own`], as
    /// every live agent does), or with such a descendant under [`DeleteRule::Subtree`], is
    /// refused with [`StoreError::OwnedSession`]. (Another process cannot hold the store while
    /// this handle writes to it.) Events admitted to a deleted session that were not yet durable
    /// are discarded with it; from then on this handle refuses appends, loads and forks of it
    /// with [`StoreError::UnknownSession`].
    ///
    /// A session that is not stored (never written, or already deleted) is
    /// [`StoreError::UnknownSession`]; a session created but never written is forgotten with
    /// [`Store::forget_unwritten`] instead. A failed commit deletes nothing and is returned as
    /// [`StoreError::CommitFailed`]. Refused on a read-only store.
    pub fn delete(&self, session: SessionId, rule: DeleteRule) -> Result<Deleted> {
        self.writable()?;
        let queue = &self.inner.queue;
        let mut state = queue.lock();
        if state.writer_gone {
            return Err(StoreError::Closed);
        }
        state.last_deletion += 1;
        let id = state.last_deletion;
        state.deletions.push(DeleteJob {
            id,
            session,
            rule,
            owners: self.inner.owners.clone(),
        });
        state.paused = false;
        queue.wake_writer.notify_one();
        loop {
            if let Some(answer) = state.deleted_answers.remove(&id) {
                return answer;
            }
            if state.writer_gone {
                return Err(StoreError::Closed);
            }
            state = queue
                .wake_waiters
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// One deletion inside the writer's transaction. A refusal (unknown session, descendants, an
/// owned session) is decided before anything is removed and is the inner error; a failure of the
/// storage engine is the outer one and aborts the whole transaction.
impl Deletion for DeleteJob {
    fn id(&self) -> u64 {
        self.id
    }

    fn run(&self, txn: &mut dyn Removal) -> std::result::Result<Result<Deleted>, EngineError> {
        let session = self.session;
        if !txn.is_stored(session)? {
            return Ok(Err(StoreError::UnknownSession { session }));
        }
        // The subtree, breadth first, each session once (a damaged index could hold a cycle); only
        // stored sessions count: an index entry naming a missing child is removed with its parent.
        let mut order = vec![session];
        let mut seen: HashSet<SessionId> = order.iter().copied().collect();
        let mut next = 0;
        while next < order.len() {
            for child in txn.children(order[next])? {
                if !seen.contains(&child) && txn.is_stored(child)? && seen.insert(child) {
                    order.push(child);
                }
            }
            next += 1;
        }
        if self.rule == DeleteRule::Refuse && order.len() > 1 {
            return Ok(Err(StoreError::HasDescendants {
                session,
                descendants: order.len() - 1,
            }));
        }
        if let Some(&owned) = order.iter().find(|s| self.owners.contains(**s)) {
            return Ok(Err(StoreError::OwnedSession { session, owned }));
        }
        // Nor one another host keeps resident.
        for &kept in &order {
            if let Some(lease) = txn.held_elsewhere(kept)? {
                return Ok(Err(StoreError::held_elsewhere(kept, &lease)));
            }
        }
        let mut deleted = Deleted {
            sessions: order.clone(),
            ..Deleted::default()
        };
        for &gone in &order {
            let removed = txn.remove(gone)?;
            deleted.blocks += removed.blocks;
            deleted.events += removed.events;
            deleted.bytes += removed.bytes;
        }
        Ok(Ok(deleted))
    }
}
