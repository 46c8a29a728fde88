//! Upgrading a store file: the file half of [`crate::Store::upgrade`] (see `upgrade` for how a
//! file is rewritten beside itself and renamed over the old one).

use std::path::Path;
use std::sync::Arc;

use redb::ReadableDatabase;

use super::create::{self, Purpose};
use super::error::Engine;
use super::{OneWriter, RedbEngine, Writable, builder, check_meta, initialize_as, open_error};
use crate::error::EngineError;
use crate::layout::BlockFormat;
use crate::store::{DEFAULT_CACHE_BYTES, STORE_FORMAT_VERSION, Store};
use crate::upgrade::Upgraded;
use crate::{Result, StoreError};

pub(crate) fn upgrade_file(path: &Path) -> Result<Upgraded> {
    // The file a symbolic link names is the store: it is rewritten beside itself, not the link.
    let path = &std::fs::canonicalize(path).map_err(|error| StoreError::NotAStore {
        path: path.to_owned(),
        reason: format!("cannot read it: {error}"),
    })?;
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
            Arc::new(OneWriter),
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
        // The new file is the store: it keeps the old one's permissions (session logs are often
        // private to their owner).
        let permissions = std::fs::metadata(path).map_err(io)?.permissions();
        std::fs::set_permissions(&temporary, permissions).map_err(io)?;
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
