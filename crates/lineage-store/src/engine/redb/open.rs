//! Opening the embedded file: creating it crash-safely, reopening it after a failed commit,
//! reading it through the recovery overlay, checking and writing its `meta` table, and the
//! constructors of [`Store`] over a file or a redb storage backend.

use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use redb::{
    ConcurrencyMode, Database, ReadTransaction, ReadableDatabase, ReadableTable, StorageBackend,
};
use uuid::Uuid;

use super::create;
use super::error::Engine;
use super::recovery::Reader;
use super::tables::{CHILDREN, EVENTS, META, SESSIONS};
use super::{OneWriter, RedbEngine};
use crate::error::EngineError;
use crate::layout::{BlockFormat, MAGIC, META_FORMAT, META_MAGIC, META_STORE_ID};
use crate::store::{
    DEFAULT_CACHE_BYTES, STORE_FORMAT_VERSION, Store, StoreOptions, check_store_version, contained,
    guard, writable_format,
};
use crate::{Result, StoreError};

/// Opens the writable database, the first time or again.
pub(crate) type Opener = Box<dyn Fn() -> Result<Database> + Send + Sync>;

/// The writable database, which the writer replaces after a failed commit: the storage engine
/// refuses every later transaction on the handle that saw an I/O failure. While a reopen has not
/// succeeded (a long read transaction can keep the old handle's file lock), reads report
/// [`StoreError::Unavailable`] naming why the reopen failed, and every flush retries the reopen.
pub(crate) struct Writable {
    current: RwLock<Option<Arc<Database>>>,
    opener: Option<Opener>,
    /// Why the last reopen failed, while no handle is in place.
    reopen_failure: Mutex<Option<String>>,
}

impl Writable {
    /// A handle on `db` that cannot be reopened.
    pub fn single(db: Arc<Database>) -> Writable {
        Writable {
            current: RwLock::new(Some(db)),
            opener: None,
            reopen_failure: Mutex::new(None),
        }
    }

    /// The current handle. `Unavailable` (or `Closed`, for storage that cannot be reopened) while
    /// a reopen has not yet succeeded.
    pub fn get(&self) -> Result<Arc<Database>> {
        if let Some(db) = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(db);
        }
        match self
            .reopen_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            Some(reason) => Err(StoreError::Unavailable { reason }),
            None => Err(StoreError::Closed),
        }
    }

    /// Drops the current handle, first compacting the file if much of it is free, containing a
    /// panic the engine raises while closing a damaged file. Returns the panic's message, if any.
    ///
    /// The storage engine reuses the pages a commit frees only where a later value fits them, so a
    /// file whose writer rewrote its small blocks holds free space; compacting moves the last
    /// pages into it and truncates the file (milliseconds for a 50 MB file, but two durable
    /// commits, so only when a quarter of the file, and a mebibyte, or more is free). It needs the
    /// only handle and no live read: otherwise the file stays as it is.
    pub fn release(&self) -> Option<String> {
        let old = self
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        contained(move || {
            if let Some(mut db) = old.and_then(|db| Arc::try_unwrap(db).ok())
                && worth_compacting(&db)
                && let Err(error) = db.compact(redb::CompactionMode::Balanced)
            {
                tracing::debug!(%error, "the store file was not compacted at close");
            }
        })
        .err()
    }

    /// Drops the current handle and opens the storage again. Returns whether a fresh handle is
    /// in place (never, for storage that cannot be reopened).
    pub fn reopen(&self) -> bool {
        let Some(opener) = &self.opener else {
            return false;
        };
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = current.take() {
            // Readers hold a handle only while they begin a transaction; wait them out so the old
            // handle is the last and closing it releases the file's locks.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if let Err(panic) = contained(move || drop(old)) {
                tracing::warn!(%panic, "the storage engine panicked closing a failed handle");
            }
        }
        let mut failure = self
            .reopen_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match guard(opener) {
            Ok(db) => {
                *current = Some(Arc::new(db));
                *failure = None;
                true
            }
            Err(error) => {
                tracing::warn!(%error, "reopening the store after a failed commit failed");
                *failure = Some(error.to_string());
                false
            }
        }
    }
}

/// Whether a quarter or more of the file, and at least a mebibyte, is free or unused.
fn worth_compacting(db: &Database) -> bool {
    let Ok(txn) = db.begin_write() else {
        return false;
    };
    let stats = txn.stats();
    let _ = txn.abort();
    stats.is_ok_and(|stats| {
        // A damaged file can report anything: the arithmetic saturates.
        let used = stats
            .allocated_pages()
            .saturating_mul(stats.page_size() as u64);
        let free = stats.fragmented_bytes();
        free >= 1 << 20 && free.saturating_mul(4) >= used
    })
}

pub(crate) fn open_backend(backend: impl StorageBackend, cache_bytes: usize) -> Result<Database> {
    // A shared lock on a range no page uses tells whether the backend has byte-range locks.
    let probe = (Bound::Included(u64::MAX - 1), Bound::Unbounded);
    let mode = match backend.try_lock_shared_range(probe.0, probe.1) {
        Ok(locked) => {
            if locked {
                let _ = backend.unlock_range(probe.0, probe.1);
            }
            ConcurrencyMode::SingleWriter
        }
        Err(_) => ConcurrencyMode::ExclusiveWriter,
    };
    let mut builder = builder(cache_bytes);
    builder.set_concurrency_mode(mode);
    builder
        .create_with_backend(backend)
        .map_err(|e| open_error(Path::new("<backend>"), e))
}

pub(crate) fn open_error(path: &Path, error: redb::DatabaseError) -> StoreError {
    match error {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen {
            path: path.to_owned(),
        },
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(reason)) => {
            StoreError::NotAStore {
                path: path.to_owned(),
                reason,
            }
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(e))
            if e.kind() == std::io::ErrorKind::InvalidData =>
        {
            StoreError::NotAStore {
                path: path.to_owned(),
                reason: e.to_string(),
            }
        }
        redb::DatabaseError::UpgradeRequired(version) => StoreError::NotAStore {
            path: path.to_owned(),
            reason: format!(
                "a redb file in storage format {version}, which this build cannot read"
            ),
        },
        other => StoreError::Storage(EngineError::from_engine(other.into())),
    }
}

pub(crate) fn builder(cache_bytes: usize) -> redb::Builder {
    let mut builder = redb::Builder::new();
    builder.set_concurrency_mode(ConcurrencyMode::SingleWriter);
    builder.set_cache_size(cache_bytes);
    builder
}

impl Store {
    /// Opens the store file at `path` for writing (see [`Store::open_with`]).
    pub(crate) fn open_file(path: &Path, options: StoreOptions) -> Result<Store> {
        Self::open_creating_with(path, options, |file| {
            Ok(redb::backends::FileBackend::new(file))
        })
    }

    /// [`Store::open_with`], creating a missing store through the storage backend `backend` makes
    /// of its new file (for example one that injects I/O errors). Not part of the stable API.
    #[doc(hidden)]
    pub fn open_creating_with<B: StorageBackend>(
        path: impl AsRef<Path>,
        options: StoreOptions,
        backend: impl FnOnce(File) -> io::Result<B>,
    ) -> Result<Store> {
        let path = path.as_ref().to_owned();
        let cache = options.cache_bytes;
        guard(|| {
            if let Err(e) = std::fs::metadata(&path)
                && e.kind() == io::ErrorKind::NotFound
            {
                create::create(&path, cache, backend)?;
            }
            refuse_older_format(&path)?;
            let opener = {
                let path = path.clone();
                move || {
                    // Only an empty file is initialized in place (the engine's own creation); a
                    // missing one is not recreated by a reopen.
                    let empty = std::fs::metadata(&path).is_ok_and(|m| m.len() == 0);
                    let builder = builder(cache);
                    let db = if empty {
                        builder.create(&path)
                    } else {
                        builder.open(&path)
                    };
                    db.map_err(|e| open_error(&path, e))
                }
            };
            let store = Self::start(Box::new(opener), true, Some(path.clone()), options)?;
            create::remove_leftovers(&path);
            Ok(store)
        })
    }

    /// Opens a writable store over a redb storage backend (for example
    /// `redb::backends::InMemoryBackend`). A backend with byte-range locks is opened so that
    /// read-only handles may share it; one without is this handle's alone. A handle over a
    /// single backend cannot be reopened, so after a failed commit every retry fails until the
    /// store is opened again: use [`Store::with_backend_factory`] to let the writer reopen it.
    pub fn with_backend(backend: impl StorageBackend, options: StoreOptions) -> Result<Store> {
        let cache = options.cache_bytes;
        let slot = Mutex::new(Some(backend));
        let opener = move || {
            let backend = slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .ok_or(StoreError::Closed)?;
            open_backend(backend, cache)
        };
        guard(|| Self::start(Box::new(opener), false, None, options))
    }

    /// Opens a writable store over the backend `factory` makes, calling it again to reopen the
    /// store after a failed commit (each call must return a handle on the same storage).
    pub fn with_backend_factory<B: StorageBackend>(
        factory: impl Fn() -> B + Send + Sync + 'static,
        options: StoreOptions,
    ) -> Result<Store> {
        let cache = options.cache_bytes;
        let opener = move || open_backend(factory(), cache);
        guard(|| Self::start(Box::new(opener), true, None, options))
    }

    /// Opens the store file at `path` read-only (see [`Store::open_read_only`]).
    pub(crate) fn open_file_read_only(path: &Path) -> Result<Store> {
        guard(|| {
            let db = Reader::open(path)?;
            let txn = db.begin_read()?;
            let (store_id, format) =
                check_meta(&txn, path)?.ok_or_else(|| StoreError::NotAStore {
                    path: path.to_owned(),
                    reason: "it holds no Lineage tables".into(),
                })?;
            drop(txn);
            Ok(Self::reader(
                Arc::new(RedbEngine::Read(db)),
                Arc::new(OneWriter),
                Some(path.to_owned()),
                store_id,
                format,
            ))
        })
    }

    fn start(
        opener: Opener,
        reopenable: bool,
        path: Option<PathBuf>,
        options: StoreOptions,
    ) -> Result<Store> {
        let db = opener()?;
        let shown = path.clone().unwrap_or_else(|| PathBuf::from("<backend>"));
        let store_id = match check_meta(&db.begin_read().engine()?, &shown)? {
            Some((id, format)) => {
                writable_format(&shown.display().to_string(), format)?;
                id
            }
            None => initialize(&db, &shown)?,
        };
        let engine = Arc::new(RedbEngine::Write(Writable {
            current: RwLock::new(Some(Arc::new(db))),
            opener: reopenable.then_some(opener),
            reopen_failure: Mutex::new(None),
        }));
        Self::start_writer(engine, Arc::new(OneWriter), path, store_id, options)
    }
}

/// Checks the `meta` table: `Some(store id)` for a Lineage store of a supported format, `None` for
/// an empty database, an error for anything else.
pub(crate) fn check_meta(
    txn: &ReadTransaction,
    path: &Path,
) -> Result<Option<(Uuid, BlockFormat)>> {
    let not_a_store = |reason: String| StoreError::NotAStore {
        path: path.to_owned(),
        reason,
    };
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return if txn.list_tables().engine()?.next().is_none() {
                Ok(None)
            } else {
                Err(not_a_store(
                    "a redb database without Lineage's tables".into(),
                ))
            };
        }
        Err(redb::TableError::TableTypeMismatch { .. }) => {
            return Err(not_a_store("its meta table has foreign types".into()));
        }
        Err(e) => return Err(StoreError::Storage(EngineError::from_engine(e.into()))),
    };
    let magic = meta.get(META_MAGIC).engine()?;
    if magic.as_ref().map(|m| m.value()) != Some(MAGIC) {
        return Err(not_a_store("its meta table lacks the Lineage magic".into()));
    }
    let version = meta
        .get(META_FORMAT)
        .engine()?
        .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| not_a_store("its meta table has no format version".into()))?;
    let format = check_store_version(&path.display().to_string(), version)?;
    let id = meta
        .get(META_STORE_ID)
        .engine()?
        .and_then(|v| Uuid::from_slice(v.value()).ok())
        .ok_or_else(|| not_a_store("its meta table has no store id".into()))?;
    Ok(Some((id, format)))
}

/// Refuses a store file of an older layout before it is opened for writing: the storage engine's
/// writable open would rewrite its header, and the file must stay as its writer left it. A file
/// the engine cannot open read-only as it is (new, empty, awaiting recovery, not a store) is left
/// to the writable open, which reports it (or recovers it and checks its meta).
fn refuse_older_format(path: &Path) -> Result<()> {
    let Ok(db) = builder(DEFAULT_CACHE_BYTES).open_read_only(path) else {
        return Ok(());
    };
    let found = db
        .begin_read()
        .ok()
        .and_then(|txn| check_meta(&txn, path).ok().flatten());
    drop(db);
    match found {
        Some((_, format)) => writable_format(&path.display().to_string(), format),
        None => Ok(()),
    }
}

/// Writes the `meta` table and creates the other tables of a fresh store, durably.
pub(crate) fn initialize(db: &Database, path: &Path) -> Result<Uuid> {
    initialize_as(db, path, Uuid::now_v7())
}

/// [`initialize`] with the store id `id` (an upgraded store keeps its own).
pub(crate) fn initialize_as(db: &Database, path: &Path, id: Uuid) -> Result<Uuid> {
    let txn = db.begin_write().engine()?;
    {
        if txn.list_tables().engine()?.next().is_some() {
            return Err(StoreError::NotAStore {
                path: path.to_owned(),
                reason: "a redb database without Lineage's tables".into(),
            });
        }
        let mut meta = txn.open_table(META).engine()?;
        meta.insert(META_MAGIC, MAGIC).engine()?;
        meta.insert(META_FORMAT, STORE_FORMAT_VERSION.to_le_bytes().as_slice())
            .engine()?;
        meta.insert(META_STORE_ID, id.as_bytes().as_slice())
            .engine()?;
        txn.open_table(SESSIONS).engine()?;
        txn.open_table(EVENTS).engine()?;
        txn.open_table(CHILDREN).engine()?;
    }
    txn.commit().engine()?;
    Ok(id)
}
