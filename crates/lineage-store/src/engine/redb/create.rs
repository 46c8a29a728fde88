//! Crash-safe creation of a store file.
//!
//! The storage engine initializes a new file in place: it sizes the file, writes its header
//! without the magic number, syncs, then writes the magic. A process killed (or an I/O error) in
//! between leaves a file that every later open refuses. So a new store is built whole under a
//! temporary name in the same directory (its tables created and committed, the database closed,
//! the file synced), then published at its path with a hard link, which never replaces a file that
//! appeared meanwhile, and the directory is synced. The path thus holds either nothing or a
//! complete store. When two processes create the same store at once, the first link wins and the
//! other opens the winner's store.
//!
//! # Leftovers
//!
//! A creator killed before it published leaves its temporary file, named
//! `.<store file name>.creating.<pid>.<n>`. Such a file is never opened as the store, and it is
//! removed by the next writable open of the store at that path (see [`remove_leftovers`]): once
//! the store exists no creator publishes again, so any temporary file of its name belongs to a
//! dead creator or to one that lost the race, which then finds its link refused or its file gone
//! and opens the published store like any later opener.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::StorageBackend;

use super::error::Engine;
use super::open::{initialize, open_backend};
use crate::error::EngineError;
use crate::{Result, StoreError};

/// The directory holding `path` (the current one for a bare file name).
pub(crate) fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// What a temporary file beside a store is for: it is named after it.
#[derive(Clone, Copy)]
pub(crate) enum Purpose {
    /// A new store, published by a hard link.
    Creating,
    /// The store rewritten in this build's format, renamed over the old one (`Store::upgrade`).
    Upgrading,
}

impl Purpose {
    const ALL: [Purpose; 2] = [Purpose::Creating, Purpose::Upgrading];

    fn infix(self) -> &'static str {
        match self {
            Purpose::Creating => "creating",
            Purpose::Upgrading => "upgrading",
        }
    }
}

/// The prefix of every temporary file for `purpose` of the store at `path`.
fn temporary_prefix(path: &Path, purpose: Purpose) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    Some(format!(".{name}.{}.", purpose.infix()))
}

/// A new, unused temporary path beside `path`, created empty and opened for writing.
pub(crate) fn temporary_file(path: &Path, purpose: Purpose) -> io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = temporary_prefix(path, purpose).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the store path has no file name (or one that is not UTF-8)",
        )
    })?;
    let dir = directory_of(path);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let temporary = dir.join(format!("{prefix}{}.{n}", std::process::id()));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&temporary)
        {
            Ok(file) => return Ok((temporary, file)),
            // A name a killed process of the same id left: take the next.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

fn io_error(error: io::Error) -> StoreError {
    StoreError::Storage(EngineError::io(error))
}

/// Creates the store at `path`, which did not exist, through the backend `backend` makes of the
/// temporary file; returns once a complete store is at `path`, this call's or another creator's.
/// An error leaves no file at `path` unless another creator published its store there.
pub(crate) fn create<B: StorageBackend>(
    path: &Path,
    cache_bytes: usize,
    backend: impl FnOnce(File) -> io::Result<B>,
) -> Result<()> {
    let failed = |source: StoreError| StoreError::CreateFailed {
        path: path.to_owned(),
        source: Box::new(source),
    };
    let (temporary, file) =
        temporary_file(path, Purpose::Creating).map_err(|e| failed(io_error(e)))?;
    let built = build(&file, cache_bytes, backend);
    drop(file);
    let outcome = built
        .and_then(|()| publish(&temporary, path))
        .map_err(failed);
    // Gone already once published (or removed by the store's writer); otherwise a leftover.
    match std::fs::remove_file(&temporary) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(error) => tracing::warn!(
            %error,
            temporary = %temporary.display(),
            "could not remove the temporary file of a store creation"
        ),
    }
    outcome
}

/// Builds a complete store in `file`: tables committed, database closed, file synced.
fn build<B: StorageBackend>(
    file: &File,
    cache_bytes: usize,
    backend: impl FnOnce(File) -> io::Result<B>,
) -> Result<()> {
    let handle = file.try_clone().map_err(io_error)?;
    let db = open_backend(backend(handle).map_err(io_error)?, cache_bytes)?;
    initialize(&db, Path::new("<new store>"))?;
    db.close().engine()?;
    file.sync_all().map_err(io_error)
}

/// Links `temporary` at `path` unless a file is there (then the store there, another creator's,
/// is the store), and syncs the directory.
fn publish(temporary: &Path, path: &Path) -> Result<()> {
    match std::fs::hard_link(temporary, path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        // The store's writer removed this leftover: the store exists.
        Err(e) if e.kind() == io::ErrorKind::NotFound && path.exists() => {}
        // A file system without hard links: rename, unless a store appeared meanwhile. Two
        // creators racing on such a file system may both rename; the second then replaces a store
        // that holds no session yet.
        Err(_) if path.exists() => {}
        Err(link) => std::fs::rename(temporary, path).map_err(|rename| {
            io_error(io::Error::new(
                rename.kind(),
                format!(
                    "linking the new store failed ({link}), then renaming it failed ({rename})"
                ),
            ))
        })?,
    }
    sync_directory(directory_of(path)).map_err(io_error)
}

/// Makes the directory's entries durable (a no-op where directories cannot be synced).
pub(crate) fn sync_directory(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Removes the temporary files creators of the store at `path` left, once the store exists (see
/// the module's comment). Failures are only logged: a leftover is never read.
pub(crate) fn remove_leftovers(path: &Path) {
    let prefixes: Vec<String> = Purpose::ALL
        .iter()
        .filter_map(|&purpose| temporary_prefix(path, purpose))
        .collect();
    if prefixes.is_empty() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(directory_of(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if !prefixes.iter().any(|prefix| name.starts_with(prefix)) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => tracing::info!(
                leftover = %entry.path().display(),
                "removed the temporary file of an interrupted store creation"
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(
                %error,
                leftover = %entry.path().display(),
                "could not remove the temporary file of an interrupted store creation"
            ),
        }
    }
}
