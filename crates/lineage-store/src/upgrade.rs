//! Upgrading a store written by an earlier build to this build's format.
//!
//! A store file is rewritten whole beside itself and renamed over the old one:
//!
//! 1. The old file is opened as its writer, which keeps every other writer out (another process
//!    gets `AlreadyOpen`) until the new file has replaced it.
//! 2. A new store with the same store id is built under a temporary name in the same directory
//!    (`.<name>.upgrading.<pid>.<n>`): every session copied into it with all of a load's checks,
//!    its blocks laid out anew; then it is closed and synced.
//! 3. It is renamed over the old file and the directory is synced.
//!
//! A process killed at any moment leaves the old store (before the rename) or the new one (after
//! it): a rename replaces a name atomically. A killed upgrade's temporary file is never opened as
//! the store; the next upgrade or writable open removes it.
//!
//! A PostgreSQL store is rewritten in one transaction (the tables locked, every session's blocks
//! checked and laid out anew, the format version raised), refused while any host holds a lease.

use std::path::Path;

use lineage_log::{Chain, SessionId};

use crate::engine::redb::upgrade::upgrade_file;
use crate::fill::lay_out_log;
use crate::layout::{Block, BlockFormat};
use crate::store::{Store, guard};
use crate::{Result, StoreError, StoreOptions};

/// What [`Store::upgrade`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgraded {
    /// The store's format version before.
    pub from: u32,
    /// Its format version now: [`crate::STORE_FORMAT_VERSION`].
    pub to: u32,
    /// The sessions rewritten (0 when the store was already in this format).
    pub sessions: usize,
    /// Their events.
    pub events: u64,
}

impl Store {
    /// Rewrites the store at `path`, written by an earlier build, in this build's format
    /// ([`crate::STORE_FORMAT_VERSION`]), keeping every session's log, digests, revision and lineage, and
    /// the store's id. Crash-safe: a process killed at any moment leaves the old store or the new
    /// one at `path`, never neither. A store already in this format is left alone.
    ///
    /// The store must not be open for writing elsewhere ([`StoreError::AlreadyOpen`]); readers
    /// that hold the old file keep reading it as it was. `path` may be a `postgres://` URL: the
    /// database's store is rewritten in one transaction, refused while a host holds a lease on
    /// one of its sessions (stop the older build's hosts first: they checked the format when they
    /// opened the store, not at each write).
    pub fn upgrade(path: impl AsRef<Path>) -> Result<Upgraded> {
        let path = path.as_ref();
        if let Some(url) = path.to_str().filter(|p| crate::engine::is_url(p)) {
            return guard(|| upgrade_database(url));
        }
        guard(|| upgrade_file(path))
    }
}

/// A PostgreSQL store: every session's blocks rewritten in one transaction, while no host holds
/// a lease on any of them (a transaction is all or nothing, so a killed upgrade changed nothing).
#[cfg(feature = "postgres")]
fn upgrade_database(url: &str) -> Result<Upgraded> {
    let done = crate::engine::postgres::upgrade(url, relayout)?;
    Ok(Upgraded {
        from: done.from,
        to: crate::STORE_FORMAT_VERSION,
        sessions: done.sessions,
        events: done.events,
    })
}

#[cfg(not(feature = "postgres"))]
fn upgrade_database(url: &str) -> Result<Upgraded> {
    Err(crate::store::no_postgres(url))
}

/// A session's format-1 blocks, their seqs and digests checked, laid out anew in format 2.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn relayout(session: SessionId, blocks: Vec<(u64, Vec<u8>)>) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut records = Vec::new();
    let mut chain = Chain::new();
    let mut expected = 0;
    for (first_seq, value) in &blocks {
        let block = Block::parse(BlockFormat::V1, session, *first_seq, value)?;
        if *first_seq != expected {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq: *first_seq,
                last_seq: block.last_seq(*first_seq),
                reason: format!("seq gap: expected a block starting at seq {expected}"),
            });
        }
        chain.update(&block.records);
        if chain.digest() != block.digest {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq: *first_seq,
                last_seq: block.last_seq(*first_seq),
                reason: "digest mismatch: the block's records are not the ones written".into(),
            });
        }
        records.extend_from_slice(&block.records);
        expected = block.last_seq(*first_seq) + 1;
    }
    Ok(lay_out_log(&records, &StoreOptions::default()))
}
