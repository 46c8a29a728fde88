//! The redb engine: the store in one embedded file (`tables` has its tables).

pub(crate) mod create;
pub(crate) mod error;
mod open;
pub(crate) mod recovery;
pub(crate) mod tables;
pub(crate) mod upgrade;

pub(crate) use open::{Writable, builder, check_meta, initialize_as, open_error};

use lineage_log::SessionId;
use redb::{
    ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable, Table, WriteTransaction,
};

use crate::Result;
use crate::engine::redb::recovery::Reader;
use crate::engine::{
    Acquired, Blocks, Bytes, CommitError, Committed, Coordination, Deletion, Engine, LeaseState,
    Mail, Removal, Removed, SessionWrite, View, Written, block_count, round_in_store,
};
use crate::error::EngineError;
use crate::layout::SessionRecord;
use crate::store::contained;
use error::Engine as _;
use tables::{CHILDREN, EVENTS, SESSIONS, session_blocks};

/// A writable file (whose handle the writer reopens after a failed commit) or a read-only one.
pub(crate) enum RedbEngine {
    Write(Writable),
    Read(Reader),
}

impl RedbEngine {
    pub fn begin_read(&self) -> Result<ReadTransaction> {
        match self {
            RedbEngine::Write(db) => db.get()?.begin_read().engine(),
            RedbEngine::Read(db) => db.begin_read(),
        }
    }
}

impl RedbEngine {
    /// The writable handle, reopened first if a reopen failed before.
    fn handle(&self) -> std::result::Result<std::sync::Arc<redb::Database>, EngineError> {
        let RedbEngine::Write(db) = self else {
            return Err(EngineError::io(std::io::Error::other(
                "the store is read-only",
            )));
        };
        // A handle is missing only after a reopen failed: try again before committing.
        let handle = db.get().or_else(|_| {
            db.reopen();
            db.get()
        });
        handle.map_err(|e| EngineError::io(std::io::Error::other(e.to_string())))
    }
}

fn panicked(doing: &str, panic: &str) -> EngineError {
    EngineError::from_engine(redb::Error::Corrupted(format!(
        "the storage engine panicked {doing}: {panic}"
    )))
}

impl Engine for RedbEngine {
    fn view(&self) -> Result<Box<dyn View>> {
        let txn = self.begin_read()?;
        Ok(Box::new(RedbView {
            sessions: txn.open_table(SESSIONS).engine()?,
            events: txn.open_table(EVENTS).engine()?,
            children: txn.open_table(CHILDREN).engine()?,
            _txn: txn,
        }))
    }

    fn commit(
        &self,
        writes: &[SessionWrite],
        deletions: &[&dyn Deletion],
    ) -> std::result::Result<Committed, CommitError> {
        let handle = self.handle().map_err(CommitError::before)?;
        // The engine may panic committing onto a damaged file: that is a failed commit, in
        // doubt (the panic may have come after the commit point), read back as one whose writes
        // all applied.
        contained(|| commit(&handle, writes, deletions)).unwrap_or_else(|panic| {
            Err(CommitError {
                error: panicked("committing", &panic),
                in_doubt: Some(Committed {
                    writes: writes.iter().map(|_| Written::Applied).collect(),
                    deletions: Vec::new(),
                }),
            })
        })
    }

    /// Reads the round back in a write transaction. A round found in the store is written again,
    /// the same blocks and rows at the same keys, and committed durably: a sync that failed may
    /// have left its pages in the page cache only (the kernel can drop dirty pages after reporting
    /// the failure), so only a later commit that writes them and syncs makes them durable.
    fn resolve(
        &self,
        writes: &[SessionWrite],
        in_doubt: &Committed,
    ) -> std::result::Result<bool, EngineError> {
        let handle = self.handle()?;
        contained(|| {
            let view = self.view().map_err(|e| match e.engine() {
                Some(error) => error.clone(),
                None => EngineError::new(crate::EngineErrorKind::Other, e.to_string()),
            })?;
            if !round_in_store(&*view, writes, in_doubt)? {
                return Ok(false);
            }
            drop(view);
            let again: Vec<SessionWrite> = writes
                .iter()
                .zip(&in_doubt.writes)
                .filter(|(_, written)| matches!(written, Written::Applied))
                .map(|(write, _)| write.rewritten())
                .collect();
            if !again.is_empty() {
                commit(&handle, &again, &[]).map_err(|e| e.error)?;
            }
            Ok(true)
        })
        .unwrap_or_else(|panic| Err(panicked("reading back a commit", &panic)))
    }

    fn read_only(&self) -> bool {
        matches!(self, RedbEngine::Read(_))
    }

    fn recover(&self) {
        if let RedbEngine::Write(db) = self {
            db.reopen();
        }
    }

    fn awaits_recovery(&self) -> bool {
        match self {
            RedbEngine::Write(_) => false,
            RedbEngine::Read(reader) => reader.awaits_recovery(),
        }
    }

    fn release(&self) {
        if let RedbEngine::Write(db) = self
            && let Some(panic) = db.release()
        {
            tracing::error!(%panic, "the storage engine panicked closing the store file");
        }
    }
}

/// An embedded file's coordination. One process writes the file (its lock keeps out every other
/// writer), so that process holds every session: a lease is granted at once, with token 0, and is
/// never lost; no session is leased elsewhere; and no other host keeps a session to deliver mail
/// to, so there is no mailbox.
pub(crate) struct OneWriter;

impl Coordination for OneWriter {
    fn shared(&self) -> bool {
        false
    }

    fn holder(&self) -> uuid::Uuid {
        uuid::Uuid::nil()
    }

    fn acquire(
        &self,
        _session: SessionId,
        _ttl: std::time::Duration,
    ) -> std::result::Result<Acquired, EngineError> {
        Ok(Acquired::Granted { fence: 0 })
    }

    fn renew(
        &self,
        _held: &[(SessionId, u64)],
        _ttl: std::time::Duration,
    ) -> std::result::Result<Vec<SessionId>, EngineError> {
        Ok(Vec::new())
    }

    fn release_lease(
        &self,
        _session: SessionId,
        _fence: u64,
    ) -> std::result::Result<(), EngineError> {
        Ok(())
    }

    fn lease(&self, _session: SessionId) -> std::result::Result<Option<LeaseState>, EngineError> {
        Ok(None)
    }

    fn post(&self, _mail: &Mail) -> std::result::Result<bool, EngineError> {
        Err(EngineError::new(
            crate::EngineErrorKind::Other,
            "an embedded store has no mailbox: its one writer keeps every session",
        ))
    }

    fn mail_for(&self, _recipients: &[SessionId]) -> std::result::Result<Vec<Mail>, EngineError> {
        Ok(Vec::new())
    }

    fn take_mail(&self, _ids: &[uuid::Uuid]) -> std::result::Result<Vec<uuid::Uuid>, EngineError> {
        Ok(Vec::new())
    }

    fn claim_mail(&self, _id: uuid::Uuid, _fence: u64) -> std::result::Result<bool, EngineError> {
        Ok(false)
    }

    fn withdraw_mail(&self, _id: uuid::Uuid) -> std::result::Result<bool, EngineError> {
        Ok(false)
    }
}

/// A value read in place from a page the read transaction keeps.
struct Page(redb::OwnedAccessGuard<&'static [u8]>);

impl AsRef<[u8]> for Page {
    fn as_ref(&self) -> &[u8] {
        self.0.value()
    }
}

/// One read transaction with the store's tables open. (The tables go before the transaction.)
struct RedbView {
    sessions: ReadOnlyTable<u128, &'static [u8]>,
    events: ReadOnlyTable<(u128, u64), &'static [u8]>,
    children: ReadOnlyTable<(u128, u128), ()>,
    _txn: ReadTransaction,
}

impl View for RedbView {
    fn row(&self, session: SessionId) -> Result<Option<Bytes>> {
        Ok(self
            .sessions
            .get_owned(session.as_u128())
            .engine()?
            .map(|guard| Bytes::new(Page(guard))))
    }

    fn rows(&self) -> Result<Vec<(SessionId, Bytes)>> {
        let mut out = Vec::new();
        for entry in self.sessions.range_owned(..).engine()? {
            let (key, value) = entry.engine()?;
            out.push((SessionId::from_u128(key.value()), Bytes::new(Page(value))));
        }
        Ok(out)
    }

    fn blocks(&self, session: SessionId, start: u64) -> Result<Blocks> {
        let id = session.as_u128();
        let range = self
            .events
            .range_owned((id, start)..=(id, u64::MAX))
            .engine()?;
        Ok(Box::new(range.map(|entry| {
            let (key, value) = entry.engine()?;
            Ok((key.value().1, Bytes::new(Page(value))))
        })))
    }

    fn block_start(&self, session: SessionId, seq: u64) -> Result<u64> {
        let id = session.as_u128();
        match self.events.range((id, 0)..=(id, seq)).engine()?.next_back() {
            Some(entry) => Ok(entry.engine()?.0.value().1),
            None => Ok(0),
        }
    }

    fn children(&self, parent: SessionId) -> Result<Vec<SessionId>> {
        let id = parent.as_u128();
        let mut out = Vec::new();
        for entry in self.children.range((id, 0)..=(id, u128::MAX)).engine()? {
            out.push(SessionId::from_u128(entry.engine()?.0.value().1));
        }
        Ok(out)
    }

    fn child_index(&self) -> Result<Vec<(SessionId, SessionId)>> {
        let mut out = Vec::new();
        for entry in self.children.iter().engine()? {
            let (parent, child) = entry.engine()?.0.value();
            out.push((SessionId::from_u128(parent), SessionId::from_u128(child)));
        }
        Ok(out)
    }
}

/// The next seq a stored row records, `None` for no row. A row that does not decode conflicts
/// with every write (the write would bury the damage).
fn stored_next_seq(
    sessions: &Table<u128, &[u8]>,
    session: SessionId,
) -> std::result::Result<Option<u64>, redb::Error> {
    Ok(sessions.get(session.as_u128())?.map(|row| {
        SessionRecord::decode(session, row.value()).map_or(u64::MAX, |record| record.next_seq)
    }))
}

/// One transaction: each write whose session ends where it expects (its blocks, its row, a new
/// child's index entry), then the deletions, then one durable commit. A failure before the commit
/// committed nothing; one of the commit itself leaves the round in doubt.
fn commit(
    db: &redb::Database,
    writes: &[SessionWrite],
    deletions: &[&dyn Deletion],
) -> std::result::Result<Committed, CommitError> {
    let txn = db
        .begin_write()
        .map_err(|e| CommitError::before(engine_error(e)))?;
    let written = write_sessions(&txn, writes).map_err(|e| CommitError::before(engine_error(e)))?;
    let mut answers = Vec::with_capacity(deletions.len());
    let mut removal = RedbRemoval { txn: &txn };
    for deletion in deletions {
        answers.push((
            deletion.id(),
            deletion.run(&mut removal).map_err(CommitError::before)?,
        ));
    }
    let committed = Committed {
        writes: written,
        deletions: answers,
    };
    match txn.commit() {
        Ok(()) => Ok(committed),
        Err(error) => Err(CommitError {
            error: engine_error(error),
            in_doubt: Some(committed),
        }),
    }
}

fn write_sessions(
    txn: &WriteTransaction,
    writes: &[SessionWrite],
) -> std::result::Result<Vec<Written>, redb::Error> {
    let mut events = txn.open_table(EVENTS)?;
    let mut sessions = txn.open_table(SESSIONS)?;
    let mut children = txn.open_table(CHILDREN)?;
    let mut written = Vec::with_capacity(writes.len());
    for write in writes {
        let found = stored_next_seq(&sessions, write.session)?;
        let expected = (!write.new).then_some(write.expected);
        if found != expected {
            written.push(Written::Conflict { found });
            continue;
        }
        let id = write.session.as_u128();
        for first_seq in &write.replaced {
            events.remove((id, *first_seq))?;
        }
        for (first_seq, value) in &write.blocks {
            events.insert((id, *first_seq), value.as_slice())?;
        }
        sessions.insert(id, write.row.as_slice())?;
        if write.new
            && let Some(parent) = write.parent
        {
            children.insert((parent.as_u128(), id), ())?;
        }
        written.push(Written::Applied);
    }
    Ok(written)
}

struct RedbRemoval<'a> {
    txn: &'a WriteTransaction,
}

fn engine_error(error: impl Into<redb::Error>) -> EngineError {
    EngineError::from_engine(error.into())
}

impl Removal for RedbRemoval<'_> {
    fn is_stored(&mut self, session: SessionId) -> std::result::Result<bool, EngineError> {
        let sessions = self.txn.open_table(SESSIONS).map_err(engine_error)?;
        Ok(sessions
            .get(session.as_u128())
            .map_err(engine_error)?
            .is_some())
    }

    fn children(&mut self, parent: SessionId) -> std::result::Result<Vec<SessionId>, EngineError> {
        let children = self.txn.open_table(CHILDREN).map_err(engine_error)?;
        let id = parent.as_u128();
        let mut out = Vec::new();
        for entry in children
            .range((id, 0)..=(id, u128::MAX))
            .map_err(engine_error)?
        {
            out.push(SessionId::from_u128(
                entry.map_err(engine_error)?.0.value().1,
            ));
        }
        Ok(out)
    }

    fn remove(&mut self, session: SessionId) -> std::result::Result<Removed, EngineError> {
        remove_session(self.txn, session).map_err(engine_error)
    }

    /// One writer process holds every session of the file ([`OneWriter`]).
    fn held_elsewhere(
        &mut self,
        _session: SessionId,
    ) -> std::result::Result<Option<LeaseState>, EngineError> {
        Ok(None)
    }
}

/// Removes one session's row, blocks and index entries, counting what its blocks held.
fn remove_session(
    txn: &WriteTransaction,
    session: SessionId,
) -> std::result::Result<Removed, redb::Error> {
    let mut sessions = txn.open_table(SESSIONS)?;
    let mut events = txn.open_table(EVENTS)?;
    let mut children = txn.open_table(CHILDREN)?;
    let id = session.as_u128();
    // The parent's index entry: the row names the parent; a row that does not decode could name
    // any, so then every entry listing this session as a child is looked for.
    let parent = match sessions.remove(id)? {
        Some(row) => SessionRecord::decode(session, row.value())
            .ok()
            .map(|r| r.header.parent),
        None => Some(None),
    };
    match parent {
        Some(Some(parent)) => {
            children.remove((parent.as_u128(), id))?;
        }
        Some(None) => {}
        None => children.retain(|(_, child), ()| child != id)?,
    }
    children.retain_in((id, 0)..=(id, u128::MAX), |_, ()| false)?;
    let mut removed = Removed::default();
    events.retain_in(session_blocks(session), |_, value| {
        removed.blocks += 1;
        removed.bytes += value.len() as u64;
        // A damaged block header counts no events; the block is removed all the same.
        removed.events += block_count(value);
        false
    })?;
    Ok(removed)
}
