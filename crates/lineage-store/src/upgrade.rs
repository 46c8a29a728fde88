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

use std::path::Path;
use std::sync::Arc;

use redb::ReadableDatabase;

use crate::create::{self, Purpose};
use crate::error::{Engine, EngineError};
use crate::layout::BlockFormat;
use crate::redb_engine::RedbEngine;
use crate::store::{
    DEFAULT_CACHE_BYTES, STORE_FORMAT_VERSION, Store, Writable, builder, check_meta, guard,
    initialize_as, open_error,
};
use crate::{Result, StoreError};

/// What [`Store::upgrade`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgraded {
    /// The store's format version before.
    pub from: u32,
    /// Its format version now: [`STORE_FORMAT_VERSION`].
    pub to: u32,
    /// The sessions rewritten (0 when the store was already in this format).
    pub sessions: usize,
    /// Their events.
    pub events: u64,
}

impl Store {
    /// Rewrites the store at `path`, written by an earlier build, in this build's format
    /// ([`STORE_FORMAT_VERSION`]), keeping every session's log, digests, revision and lineage, and
    /// the store's id. Crash-safe: a process killed at any moment leaves the old store or the new
    /// one at `path`, never neither. A store already in this format is left alone.
    ///
    /// The store must not be open for writing elsewhere ([`StoreError::AlreadyOpen`]); readers
    /// that hold the old file keep reading it as it was.
    pub fn upgrade(path: impl AsRef<Path>) -> Result<Upgraded> {
        let path = path.as_ref();
        if path.to_str().is_some_and(crate::engine::is_url) {
            return Err(StoreError::NotAStore {
                path: crate::engine::display_location(path).into(),
                reason: "a PostgreSQL store is created in this build's format and needs no upgrade"
                    .into(),
            });
        }
        guard(|| upgrade_file(path))
    }
}

fn upgrade_file(path: &Path) -> Result<Upgraded> {
    if let Err(error) = std::fs::metadata(path) {
        return Err(StoreError::NotAStore {
            path: path.to_owned(),
            reason: format!("cannot read it: {error}"),
        });
    }
    // The old file's writer lock, held until the new file has replaced it.
    let old = Arc::new(
        builder(DEFAULT_CACHE_BYTES)
            .open(path)
            .map_err(|e| open_error(path, e))?,
    );
    let (store_id, format) =
        check_meta(&old.begin_read().engine()?, path)?.ok_or_else(|| StoreError::NotAStore {
            path: path.to_owned(),
            reason: "it holds no Lineage tables".into(),
        })?;
    let from = match format {
        BlockFormat::V1 => 1,
        BlockFormat::V2 => {
            return Ok(Upgraded {
                from: STORE_FORMAT_VERSION,
                to: STORE_FORMAT_VERSION,
                sessions: 0,
                events: 0,
            });
        }
    };
    create::remove_leftovers(path);
    let io = |e: std::io::Error| StoreError::Storage(EngineError::io(e));
    let (temporary, file) = create::temporary_file(path, Purpose::Upgrading).map_err(io)?;
    drop(file);
    let rewritten = (|| {
        // The extra handle on `old` keeps the reader from closing (and compacting) the old file.
        let source = Store::reader(
            Arc::new(RedbEngine::Write(Writable::single(old.clone()))),
            Some(path.to_owned()),
            store_id,
            format,
        );
        {
            let new = builder(DEFAULT_CACHE_BYTES)
                .create(&temporary)
                .map_err(|e| open_error(&temporary, e))?;
            initialize_as(&new, &temporary, store_id)?;
        }
        let destination = Store::open(&temporary)?;
        let copied = source.copy_into(&destination)?;
        destination.close()?;
        std::fs::File::open(&temporary)
            .and_then(|file| file.sync_all())
            .map_err(io)?;
        std::fs::rename(&temporary, path).map_err(io)?;
        create::sync_directory(create::directory_of(path)).map_err(io)?;
        Ok(copied)
    })();
    if rewritten.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    let copied = rewritten?;
    drop(old);
    Ok(Upgraded {
        from,
        to: STORE_FORMAT_VERSION,
        sessions: copied.copied.len(),
        events: copied.events,
    })
}
