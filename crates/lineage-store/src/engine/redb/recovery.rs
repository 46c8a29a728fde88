//! Read-only access to a store file that awaits recovery.
//!
//! A writer marks the file unclean when it opens it and clean when it closes it, so a writer that
//! was killed leaves a file that the storage engine refuses to open read-only until a writer
//! repairs it. That is exactly when someone wants to look. Such a file is opened here through a
//! copy-on-write [`Overlay`]: the engine opens it as a writable database in exclusive mode and
//! performs its repair in memory, while the file itself is only ever read (through a read-only
//! handle, with no lock taken on it). The store keeps the handle read-only: every write path
//! refuses it as it refuses any read-only handle.
//!
//! # Invariant: an overlay serves only bytes of the file as the crash left it
//!
//! A writer that opens the file writes no page that the committed trees reach before the file's
//! header differs from what it was: opening may rewrite the header (and even restore it byte for
//! byte) but writes no page outside a commit; a commit writes only pages that are free in the
//! committed state, then the header with a new transaction id; and a page the committed trees
//! reach is rewritten only by a later commit, once one has freed it. So the overlay reads the
//! file's first [`WATCHED_BYTES`] (the engine's header is the first 320) when it is made, and
//! re-reads them after every read from the file: the read is served only if they are unchanged,
//! and fails otherwise. The next read transaction of the handle then finds the change and replaces
//! the overlay by a plain read-only handle (the writer is live, or has closed the file) or, if the
//! file is unclean again without a writer, by a new overlay. On top of that every block is
//! digest-checked by the readers, so no byte a writer wrote meanwhile is ever returned as the
//! crashed file's.
//!
//! Because a writer's open may leave the header as it was, whether a writer has the file open is
//! asked of the engine itself ([`Reader::awaits_recovery`]): a plain read-only open succeeds only
//! beside a live writer or on a clean file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use redb::{ConcurrencyMode, Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase};

use super::error::Engine;
use super::open::{builder, open_error};
use crate::store::{DEFAULT_CACHE_BYTES, contained};
use crate::{Result, StoreError};

/// How many leading bytes of the file are compared to tell whether a writer has opened it.
pub(crate) const WATCHED_BYTES: usize = 512;

/// The granularity of the overlay's in-memory copy of written ranges.
const CHUNK: u64 = 4096;

/// Reads `out.len()` bytes of `file` at `offset`.
fn read_at(file: &File, offset: u64, out: &mut [u8]) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(out, offset)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::FileExt;
        let mut done = 0;
        while done < out.len() {
            match file.seek_read(&mut out[done..], offset + done as u64)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => done += n,
            }
        }
        Ok(())
    }
}

/// The store file, opened read-only, and its leading bytes as they were when an overlay was made.
#[derive(Debug)]
struct Watch {
    file: File,
    path: PathBuf,
    header: Vec<u8>,
    moved: AtomicBool,
}

impl Watch {
    fn open(path: &Path) -> io::Result<Watch> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut header = vec![0; WATCHED_BYTES.min(len as usize)];
        read_at(&file, 0, &mut header)?;
        Ok(Watch {
            file,
            path: path.to_owned(),
            header,
            moved: AtomicBool::new(false),
        })
    }

    /// Fails once the file's leading bytes differ from the snapshot: a writer has opened it.
    fn check(&self) -> io::Result<()> {
        if !self.moved.load(Ordering::Acquire) {
            let mut now = vec![0; self.header.len()];
            read_at(&self.file, 0, &mut now)?;
            if now == self.header {
                return Ok(());
            }
            self.moved.store(true, Ordering::Release);
        }
        Err(io::Error::other(format!(
            "{} was opened for writing while it was being read as a writer's crash left it; \
             read it again to see the recovered store",
            self.path.display()
        )))
    }
}

/// What the overlay holds in memory.
#[derive(Debug)]
struct Layer {
    /// The storage's length as the engine sees it.
    len: u64,
    /// Bytes of the file below this offset show through; above it the storage reads as zeros
    /// unless written (the engine shrank the storage at some point).
    visible: u64,
    /// Written chunks, by chunk index.
    chunks: BTreeMap<u64, Box<[u8]>>,
}

/// A storage backend that reads the file and keeps every write in memory. It takes no locks
/// (reporting them unsupported), never writes, resizes or syncs the file.
#[derive(Debug)]
struct Overlay {
    watch: Arc<Watch>,
    layer: Mutex<Layer>,
}

impl Overlay {
    fn new(watch: Arc<Watch>) -> io::Result<Overlay> {
        let len = watch.file.metadata()?.len();
        Ok(Overlay {
            watch,
            layer: Mutex::new(Layer {
                len,
                visible: len,
                chunks: BTreeMap::new(),
            }),
        })
    }

    /// Fills `out` with the file's bytes at `offset` as far as they show through, zeros beyond.
    /// Returns whether anything was read from the file.
    fn read_base(&self, layer: &Layer, offset: u64, out: &mut [u8]) -> io::Result<bool> {
        let end = offset + out.len() as u64;
        let from_file = end.min(layer.visible).saturating_sub(offset) as usize;
        if from_file > 0 {
            read_at(&self.watch.file, offset, &mut out[..from_file])?;
        }
        out[from_file..].fill(0);
        Ok(from_file > 0)
    }
}

impl redb::StorageBackend for Overlay {
    fn len(&self) -> Result<u64, redb::BackendError> {
        Ok(self.layer.lock().unwrap_or_else(|p| p.into_inner()).len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        let layer = self.layer.lock().unwrap_or_else(|p| p.into_inner());
        let end = offset + out.len() as u64;
        if end > layer.len {
            return Err(redb::BackendError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the storage",
            )));
        }
        let read_file = self.read_base(&layer, offset, out)?;
        if out.is_empty() {
            return Ok(());
        }
        for (&index, chunk) in layer.chunks.range(offset / CHUNK..=(end - 1) / CHUNK) {
            let start = index * CHUNK;
            let from = offset.max(start);
            let to = end.min(start + CHUNK);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&chunk[(from - start) as usize..(to - start) as usize]);
        }
        // Only bytes read while the header was unchanged are served (see the module's invariant).
        if read_file {
            self.watch.check()?;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        let mut layer = self.layer.lock().unwrap_or_else(|p| p.into_inner());
        if len < layer.len {
            layer.visible = layer.visible.min(len);
            let first_gone = len.div_ceil(CHUNK);
            layer.chunks.split_off(&first_gone);
            if !len.is_multiple_of(CHUNK)
                && let Some(last) = layer.chunks.get_mut(&(len / CHUNK))
            {
                last[(len % CHUNK) as usize..].fill(0);
            }
        }
        layer.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), redb::BackendError> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        let mut layer = self.layer.lock().unwrap_or_else(|p| p.into_inner());
        let end = offset + data.len() as u64;
        if end > layer.len {
            return Err(redb::BackendError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "write past the end of the storage",
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        for index in offset / CHUNK..=(end - 1) / CHUNK {
            let start = index * CHUNK;
            if !layer.chunks.contains_key(&index) {
                let mut base = vec![0; CHUNK as usize].into_boxed_slice();
                let size = (layer.len - start).min(CHUNK) as usize;
                if self.read_base(&layer, start, &mut base[..size])? {
                    self.watch.check()?;
                }
                layer.chunks.insert(index, base);
            }
            let chunk = layer.chunks.get_mut(&index).expect("just inserted");
            let from = offset.max(start);
            let to = end.min(start + CHUNK);
            chunk[(from - start) as usize..(to - start) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
        }
        Ok(())
    }
}

/// The database a read-only store reads through.
enum Handle {
    /// The engine's own read-only handle: the file is clean, or its writer is live.
    Plain(ReadOnlyDatabase),
    /// A file that awaits recovery, repaired in memory.
    Overlaid { db: Database, watch: Arc<Watch> },
    /// Dropped with its store.
    Closed,
}

impl Handle {
    fn open(path: &Path) -> Result<Handle> {
        // The snapshot is taken before the engine looks: a writer that opens the file after it
        // changes the header, which the overlay then notices (see the module's invariant).
        let watch = Watch::open(path)
            .map_err(|e| open_error(path, redb::DatabaseError::Storage(e.into())))?;
        match builder(DEFAULT_CACHE_BYTES).open_read_only(path) {
            Ok(db) => Ok(Handle::Plain(db)),
            Err(redb::DatabaseError::RepairAborted) => {
                let watch = Arc::new(watch);
                let overlay = Overlay::new(watch.clone())
                    .map_err(|e| open_error(path, redb::DatabaseError::Storage(e.into())))?;
                let mut builder = builder(DEFAULT_CACHE_BYTES);
                builder.set_concurrency_mode(ConcurrencyMode::ExclusiveWriter);
                let db = builder
                    .create_with_backend(overlay)
                    .map_err(|e| open_error(path, e))?;
                Ok(Handle::Overlaid { db, watch })
            }
            Err(e) => Err(open_error(path, e)),
        }
    }

    /// Whether this handle still reads the file as its crash left it.
    fn current(&self) -> bool {
        match self {
            Handle::Plain(_) | Handle::Closed => true,
            Handle::Overlaid { watch, .. } => watch.check().is_ok(),
        }
    }

    fn begin_read(&self) -> Result<ReadTransaction> {
        Ok(match self {
            Handle::Plain(db) => db.begin_read().engine()?,
            Handle::Overlaid { db, .. } => db.begin_read().engine()?,
            Handle::Closed => return Err(StoreError::Closed),
        })
    }
}

/// The database of a read-only store: a plain read-only handle, or an overlay while the file
/// awaits recovery, replaced as soon as a writer has opened the file.
pub(crate) struct Reader {
    path: PathBuf,
    handle: RwLock<Handle>,
}

impl Reader {
    pub fn open(path: &Path) -> Result<Reader> {
        Ok(Reader {
            path: path.to_owned(),
            handle: RwLock::new(Handle::open(path)?),
        })
    }

    /// Begins a read transaction, first replacing an overlay whose file a writer has opened.
    pub fn begin_read(&self) -> Result<ReadTransaction> {
        {
            let handle = self.handle.read().unwrap_or_else(|p| p.into_inner());
            if handle.current() {
                return handle.begin_read();
            }
        }
        let mut handle = self.handle.write().unwrap_or_else(|p| p.into_inner());
        if !handle.current() {
            let fresh = Handle::open(&self.path)?;
            let stale = std::mem::replace(&mut *handle, fresh);
            // Closing the in-memory repair writes only to memory; a panic of the engine there
            // is of no consequence to the file.
            if let Err(error) = contained(move || drop(stale)) {
                tracing::warn!(%error, "closing a replaced read-only view of the store failed");
            }
        }
        handle.begin_read()
    }

    /// Whether the file awaits recovery by its next writer: this handle reads it as the crash
    /// left it, and no writer has opened it since. A writer that has opened the file but not yet
    /// committed may have left its header as it was, so the engine is asked: its read-only open
    /// succeeds once a writer is live (or has closed the file), and the plain handle it gives
    /// then replaces the overlay.
    pub fn awaits_recovery(&self) -> bool {
        {
            let handle = self.handle.read().unwrap_or_else(|p| p.into_inner());
            if !matches!(&*handle, Handle::Overlaid { watch, .. } if watch.check().is_ok()) {
                return false;
            }
        }
        let probe = contained(|| builder(DEFAULT_CACHE_BYTES).open_read_only(&self.path));
        let Ok(Ok(plain)) = probe else {
            return true;
        };
        let mut handle = self.handle.write().unwrap_or_else(|p| p.into_inner());
        if let Handle::Overlaid { .. } = &*handle {
            let stale = std::mem::replace(&mut *handle, Handle::Plain(plain));
            if let Err(error) = contained(move || drop(stale)) {
                tracing::warn!(%error, "closing a replaced read-only view of the store failed");
            }
        }
        false
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let handle = std::mem::replace(
            self.handle.get_mut().unwrap_or_else(|p| p.into_inner()),
            Handle::Closed,
        );
        if let Err(error) = contained(move || drop(handle)) {
            tracing::warn!(%error, "closing the read-only store failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::StorageBackend;

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn overlay(path: &Path) -> Overlay {
        Overlay::new(Arc::new(Watch::open(path).unwrap())).unwrap()
    }

    #[test]
    fn writes_resizes_and_syncs_stay_in_memory() {
        let original: Vec<u8> = (0..3 * CHUNK as usize + 100).map(|i| i as u8).collect();
        let (_dir, path) = file_of(&original);
        let layer = overlay(&path);
        layer.write(CHUNK - 2, &[0xee; 4]).unwrap();
        layer.set_len(original.len() as u64 + 50).unwrap();
        layer.sync_data().unwrap();
        let mut out = vec![0; 8];
        layer.read(CHUNK - 4, &mut out).unwrap();
        let mut expected = original[CHUNK as usize - 4..CHUNK as usize + 4].to_vec();
        expected[2..6].fill(0xee);
        assert_eq!(
            out, expected,
            "a written range reads back over the file's bytes"
        );
        let mut tail = vec![1; 50];
        layer.read(original.len() as u64, &mut tail).unwrap();
        assert_eq!(tail, vec![0; 50], "grown storage reads as zeros");
        // Shrunk and grown again: the file's bytes past the cut no longer show through.
        layer.set_len(10).unwrap();
        layer.set_len(CHUNK * 2).unwrap();
        let mut again = vec![1; 20];
        layer.read(0, &mut again).unwrap();
        assert_eq!(again[..10], original[..10]);
        assert_eq!(again[10..], [0; 10]);
        assert!(
            std::fs::read(&path).unwrap() == original,
            "the file is untouched"
        );
    }

    #[test]
    fn a_read_after_the_header_changed_fails_instead_of_serving_new_bytes() {
        let original = vec![7u8; 2 * CHUNK as usize];
        let (_dir, path) = file_of(&original);
        let layer = overlay(&path);
        let mut out = vec![0; 16];
        layer.read(CHUNK, &mut out).unwrap();
        // A writer rewrites the header, then a page.
        let mut changed = original.clone();
        changed[100] = 8;
        changed[CHUNK as usize..CHUNK as usize + 16].fill(9);
        std::fs::write(&path, &changed).unwrap();
        let err = layer.read(CHUNK, &mut out).unwrap_err();
        assert!(err.to_string().contains("opened for writing"), "{err}");
        assert!(
            layer.read(0, &mut out).is_err(),
            "and every later file read"
        );
    }
}
