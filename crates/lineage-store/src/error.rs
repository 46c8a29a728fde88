//! The store's error type.

use std::io;
use std::panic::Location;
use std::path::PathBuf;
use std::sync::Arc;

use lineage_log::{LogError, SessionId};

/// Why a store operation failed. Every variant names the session, seq, path or field involved; a
/// refused operation changes nothing in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No session with this id is stored (or created and not yet written).
    #[error("session {session} not found")]
    UnknownSession {
        /// The session asked for.
        session: SessionId,
    },
    /// A session with this id already exists.
    #[error("session {session} already exists")]
    SessionExists {
        /// The session.
        session: SessionId,
    },
    /// An append does not continue at the session's next seq, or has an internal gap.
    #[error(
        "append to session {session} at batch index {index}: expected seq {expected}, got {got}"
    )]
    SeqMismatch {
        /// The session.
        session: SessionId,
        /// The event's position in its batch.
        index: usize,
        /// The seq it should carry.
        expected: u64,
        /// The seq it carries.
        got: u64,
    },
    /// A seed breaks the seed contract.
    #[error("invalid seed for session {session} at index {index}: {reason}")]
    InvalidSeed {
        /// The session.
        session: SessionId,
        /// The event's index in the seed.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// An operation broke a log rule (an invalid event, a bad header, a fork boundary inside an
    /// open turn or past the log).
    #[error("session {session}: {source}")]
    Rejected {
        /// The session.
        session: SessionId,
        /// The rule that refused it.
        #[source]
        source: LogError,
    },
    /// The store or a session was written by a newer Lineage.
    #[error(
        "{what} uses format v{found}, newer than v{supported}, the newest this build reads: upgrade Lineage to open it"
    )]
    NewerFormat {
        /// The store file or session.
        what: String,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The store or a session is in an older format this build cannot upgrade.
    #[error(
        "{what} uses format v{found}, older than v{supported}, and this build has no upgrade path for it"
    )]
    OlderFormat {
        /// The store file or session.
        what: String,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The store is in an older layout that this build reads but does not write.
    #[error(
        "store {store} uses format v{found}, which this build opens read-only: run `lineage upgrade {store}` to write to it"
    )]
    UpgradeRequired {
        /// The store file or database.
        store: String,
        /// The store's format version.
        found: u32,
    },
    /// A record this build cannot interpret (an unknown kind not marked ignorable, or unknown
    /// flags): the session was likely written by a newer Lineage.
    #[error("session {session}: {source}")]
    UnsupportedRecord {
        /// The session.
        session: SessionId,
        /// What the record carries.
        #[source]
        source: LogError,
    },
    /// A stored record is damaged or does not decode.
    #[error("corrupt record in session {session} at seq {seq}: {reason}")]
    Corrupt {
        /// The session.
        session: SessionId,
        /// The record's seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// A stored block is damaged: its digest does not match its records.
    #[error("corrupt block in session {session}, seqs {first_seq}..={last_seq}: {reason}")]
    CorruptBlock {
        /// The session.
        session: SessionId,
        /// The block's first seq.
        first_seq: u64,
        /// The block's last seq.
        last_seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// An event's record is larger than the store keeps ([`crate::MAX_RECORD_BYTES`]); its batch
    /// is refused whole.
    #[error(
        "append to session {session}: the event at seq {seq} is {bytes} bytes as a record, more than the {limit} a record may take"
    )]
    RecordTooLarge {
        /// The session.
        session: SessionId,
        /// The event's seq.
        seq: u64,
        /// Its record's size.
        bytes: usize,
        /// The most a record may take.
        limit: usize,
    },
    /// A stored session header does not decode or disagrees with its blocks.
    #[error("corrupt header of session {session}: {reason}")]
    CorruptHeader {
        /// The session.
        session: SessionId,
        /// What is wrong.
        reason: String,
    },
    /// The storage engine failed on a damaged file (it panicked; the panic was contained).
    #[error("the store file is damaged: the storage engine failed reading it: {reason}")]
    Damaged {
        /// What the engine reported.
        reason: String,
    },
    /// The file is not a Lineage store.
    #[error("{} is not a Lineage store: {reason}", path.display())]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// Why it is not one.
        reason: String,
    },
    /// Creating a new store file failed. Nothing is left at the path (unless another process
    /// created the store there meanwhile), so a later open creates it again.
    #[error("could not create the store {}: {source}", path.display())]
    CreateFailed {
        /// The store's path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: Box<StoreError>,
    },
    /// Another handle, in this process or another, has the file open for writing.
    #[error("{} is already open for writing by another process or handle", path.display())]
    AlreadyOpen {
        /// The file.
        path: PathBuf,
    },
    /// A new session's header says what the log it is created with does not (see
    /// [`crate::Store::create`]).
    #[error(
        "session {session}: the header's {field} is {header_says}, but its log says {log_says}"
    )]
    HeaderContradictsLog {
        /// The session.
        session: SessionId,
        /// The header field.
        field: &'static str,
        /// What the header says.
        header_says: String,
        /// What the log says.
        log_says: String,
    },
    /// `load` of a session whose live writer is in the middle of a turn: repairing it would close
    /// a turn that is still running. `inspect` reads it.
    #[error("cannot load session {session}: its turn is open in a live agent (inspect it instead)")]
    LiveTurnOpen {
        /// The session.
        session: SessionId,
    },
    /// Another live writer in this process owns the session.
    #[error("session {session} is already owned by a live writer")]
    AlreadyOwned {
        /// The session.
        session: SessionId,
    },
    /// A store option is out of its range.
    #[error("store option {field}: {reason}")]
    InvalidOption {
        /// The option ([`crate::StoreOptions`]' field).
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// Another holder has the session's lease (another host keeps it resident): it cannot be
    /// owned here, nor repaired, until that lease is released or expires.
    #[error(
        "session {session} is held by another host ({holder}, fencing token {fence}) for {expires_in_ms} ms more"
    )]
    HeldElsewhere {
        /// The session.
        session: SessionId,
        /// The holder ([`crate::Store::holder`] of its store).
        holder: uuid::Uuid,
        /// The holder's fencing token.
        fence: u64,
        /// How long its lease has left, by the database's clock.
        expires_in_ms: u64,
    },
    /// A write of the session was refused by its lease: the lease this store held (`fence`) was
    /// taken over by another host (`holder`, with the larger token `current`) or released, or
    /// the write held no lease while another host's was live. Nothing of it was written, and the
    /// session is no longer this store's to write: its admitted batches were dropped.
    #[error(
        "session {session} was fenced off: written with {} but its lease is {}",
        fence.map_or("no lease".to_owned(), |f| format!("fencing token {f}")),
        match (holder, current) {
            (Some(holder), Some(current)) => format!("held by {holder} with fencing token {current}"),
            (None, Some(current)) => format!("released at fencing token {current}"),
            _ => "gone".to_owned(),
        }
    )]
    Fenced {
        /// The session.
        session: SessionId,
        /// The token the write carried (`None`: it held no lease).
        fence: Option<u64>,
        /// Who holds the lease now, if anyone.
        holder: Option<uuid::Uuid>,
        /// The lease's token now.
        current: Option<u64>,
    },
    /// The session's lease lapsed on this host: the database answered none of the lease's
    /// renewals for `silent_ms`, so the store gave the lease up itself before another host could
    /// take the session over (see [`crate::LeaseLoss::Lapsed`]). Nothing admitted since its last
    /// durable write is kept, and the session is no longer this store's to write until it is
    /// owned again.
    #[error(
        "session {session}'s lease (fencing token {fence}) lapsed: the database did not answer \
         for {silent_ms} ms, so this host stopped writing the session before another host could \
         take it over"
    )]
    LeaseLapsed {
        /// The session.
        session: SessionId,
        /// The lapsed lease's token.
        fence: u64,
        /// How long the database had not answered, counted from the start of the lease's last
        /// renewal that succeeded.
        silent_ms: u64,
    },
    /// [`crate::Store::delete`] with [`crate::DeleteRule::Refuse`] of a session that has stored
    /// children or forks: deleting it alone would leave them naming a parent that is gone.
    #[error(
        "cannot delete session {session}: {descendants} stored session(s) descend from it \
         (children and forks that copied its history); delete the whole subtree to remove them too"
    )]
    HasDescendants {
        /// The session asked for.
        session: SessionId,
        /// How many stored sessions descend from it.
        descendants: usize,
    },
    /// [`crate::Store::copy_into`] found the session in the destination with another log than the
    /// source's (another header or head digest, or another length).
    #[error(
        "cannot copy session {session}: the destination holds another log under its id \
         ({destination_len} events there, {source_len} here)"
    )]
    CopyDiverged {
        /// The session.
        session: SessionId,
        /// Its events in the source.
        source_len: u64,
        /// Its events in the destination.
        destination_len: u64,
    },
    /// [`crate::Store::delete`] of a session that a live writer in this process owns, or whose
    /// subtree holds one.
    #[error("cannot delete session {session}: {}", owned_phrase(*session, *owned))]
    OwnedSession {
        /// The session asked for.
        session: SessionId,
        /// The owned session (the one asked for, or a descendant).
        owned: SessionId,
    },
    /// A write on a store opened read-only.
    #[error("the store is open read-only")]
    ReadOnly,
    /// The store's writer has stopped.
    #[error("the store is closed")]
    Closed,
    /// A commit failed and the store file could not be opened again since; every flush retries.
    #[error("the store file could not be reopened after a failed commit: {reason}")]
    Unavailable {
        /// Why the latest reopen failed.
        reason: String,
    },
    /// A group commit failed. Its batches stay queued, in order, and the next flush retries them;
    /// `not_durable` names what the flush (or append) waited for that is not yet durable.
    #[error(
        "commit failed; not yet durable: {}; the batches stay queued and the next flush retries them: {source}",
        not_durable_phrase(not_durable)
    )]
    CommitFailed {
        /// What the storage engine said.
        #[source]
        source: EngineError,
        /// The admitted events the waiting call covered that are not yet durable, by session, in
        /// session order (empty when the failed round held none of them).
        not_durable: Vec<NotDurable>,
    },
    /// The storage engine failed ([`EngineError::kind`] says how).
    #[error("storage error: {0}")]
    Storage(EngineError),
}

/// Admitted events of one session that are not yet durable: what a failed flush names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotDurable {
    /// The session.
    pub session: SessionId,
    /// Their seqs: every admitted event from the first not durable one to the last admitted.
    pub seqs: std::ops::Range<u64>,
}

impl std::fmt::Display for NotDurable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "session {} seqs {}..{}",
            self.session, self.seqs.start, self.seqs.end
        )
    }
}

/// The sessions and seqs of a [`StoreError::CommitFailed`], as its message shows them.
fn not_durable_phrase(not_durable: &[NotDurable]) -> String {
    if not_durable.is_empty() {
        return "nothing this call waited for".into();
    }
    let shown: Vec<String> = not_durable.iter().take(8).map(|n| n.to_string()).collect();
    let more = not_durable.len().saturating_sub(shown.len());
    if more == 0 {
        shown.join(", ")
    } else {
        format!("{} and {more} more sessions", shown.join(", "))
    }
}

/// How an [`StoreError::OwnedSession`] names the owned session.
fn owned_phrase(session: SessionId, owned: SessionId) -> String {
    if session == owned {
        "a live writer in this process owns it".to_owned()
    } else {
        format!("its descendant {owned} is owned by a live writer in this process")
    }
}

impl StoreError {
    /// [`StoreError::HeldElsewhere`] for `session`, whose live lease is `lease`.
    pub(crate) fn held_elsewhere(session: SessionId, lease: &crate::LeaseState) -> StoreError {
        StoreError::HeldElsewhere {
            session,
            holder: lease.holder.unwrap_or_default(),
            fence: lease.fence,
            expires_in_ms: u64::try_from(lease.expires_in.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Maps a log error about `session` to the store's vocabulary.
    pub(crate) fn from_log(session: SessionId, error: LogError) -> StoreError {
        match error {
            LogError::SeqMismatch {
                index,
                expected,
                got,
            } => StoreError::SeqMismatch {
                session,
                index,
                expected,
                got,
            },
            LogError::InvalidSeed { index, reason } => StoreError::InvalidSeed {
                session,
                index,
                reason,
            },
            LogError::Corrupt { seq, reason } => StoreError::Corrupt {
                session,
                seq,
                reason,
            },
            LogError::NewerFormat { found, supported } => StoreError::NewerFormat {
                what: format!("session {session}"),
                found,
                supported,
            },
            LogError::OlderFormat { found, supported } => StoreError::OlderFormat {
                what: format!("session {session}"),
                found,
                supported,
            },
            e @ (LogError::UnknownKind { .. } | LogError::UnknownFlags { .. }) => {
                StoreError::UnsupportedRecord { session, source: e }
            }
            source => StoreError::Rejected { session, source },
        }
    }
}

impl StoreError {
    /// Whether the session's lease was lost ([`StoreError::Fenced`] or
    /// [`StoreError::LeaseLapsed`]): the session is no longer this store's to write.
    pub fn is_lease_lost(&self) -> bool {
        matches!(
            self,
            StoreError::Fenced { .. } | StoreError::LeaseLapsed { .. }
        )
    }

    /// The storage engine's failure, when that is what this error is (a [`StoreError::Storage`]
    /// or a [`StoreError::CommitFailed`]).
    pub fn engine(&self) -> Option<&EngineError> {
        match self {
            StoreError::Storage(engine) | StoreError::CommitFailed { source: engine, .. } => {
                Some(engine)
            }
            _ => None,
        }
    }
}

/// What kind of failure the storage engine reported, in Lineage's terms: what a caller may act
/// on, independent of the engine's own error types. New kinds may be added; match the kinds you
/// act on and treat the rest as a failure of the storage layer ([`EngineError`]'s `Display` says
/// what it was).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EngineErrorKind {
    /// Reading or writing the file failed ([`EngineError::io_error`] is the operating system's or
    /// the backend's error: a file cut short reads as [`io::ErrorKind::UnexpectedEof`], a page
    /// the engine's checks reject as [`io::ErrorKind::InvalidData`]).
    Io,
    /// The file's storage structure is damaged: a page does not hold together, or a table is
    /// missing or of the wrong type.
    Corrupted,
    /// An earlier I/O failure on this handle makes the engine refuse it until it is reopened (the
    /// file is likely cut short or damaged).
    PreviousIo,
    /// A panic inside the engine earlier poisoned one of its locks: it refuses the handle from
    /// then on (the file is likely damaged).
    Poisoned,
    /// The file awaits recovery by its next writer (a writer stopped without closing it), and
    /// reading it as that writer left it failed.
    AwaitsRecovery,
    /// Another handle, in this process or another, has the file open for writing.
    AlreadyOpen,
    /// The server did not answer within a bound of [`crate::PostgresTimeouts`] (the message
    /// names the operation and the bound); the connection it used is dropped. A commit that
    /// timed out is in doubt, and the writer reads it back before it commits again.
    Timeout,
    /// The database's server cannot be reached: nothing listens at its address, the name does
    /// not resolve, or the connection was closed before the server answered.
    Unreachable,
    /// The server holds no database of the name the URL gives (SQLSTATE 3D000).
    DatabaseMissing,
    /// The server refused the login: a wrong password, an unknown role, or a connection its
    /// access rules refuse (SQLSTATE class 28).
    AuthenticationFailed,
    /// The role lacks a right the store needs, on its tables or on the database's schema
    /// (SQLSTATE 42501).
    PermissionDenied,
    /// Any other failure of the storage layer.
    Other,
}

/// A failure of the storage engine, converted to Lineage's own representation: its kind, and
/// the engine's message. Cloning shares the I/O error, if any.
#[derive(Clone, Debug)]
pub struct EngineError {
    kind: EngineErrorKind,
    /// The engine's own description of the failure (its `Display`).
    message: String,
    io: Option<Arc<io::Error>>,
    /// Where the poisoned lock was taken, for a [`EngineErrorKind::Poisoned`] failure.
    poisoned_at: Option<&'static Location<'static>>,
}

impl EngineError {
    /// What kind of failure it is.
    pub fn kind(&self) -> EngineErrorKind {
        self.kind
    }

    /// The I/O error underneath an [`EngineErrorKind::Io`] failure.
    pub fn io_error(&self) -> Option<&io::Error> {
        self.io.as_deref()
    }

    /// Where the poisoned lock was taken, for an [`EngineErrorKind::Poisoned`] failure.
    pub(crate) fn poisoned_at(&self) -> Option<&'static Location<'static>> {
        self.poisoned_at
    }

    /// A failure of the given kind, said in `message`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn new(kind: EngineErrorKind, message: impl Into<String>) -> EngineError {
        EngineError {
            kind,
            message: message.into(),
            io: None,
            poisoned_at: None,
        }
    }

    /// A failure as an engine reports it: its kind, the engine's message, the I/O error
    /// underneath and where a poisoned lock was taken.
    pub(crate) fn from_parts(
        kind: EngineErrorKind,
        message: String,
        io: Option<io::Error>,
        poisoned_at: Option<&'static Location<'static>>,
    ) -> EngineError {
        EngineError {
            kind,
            message,
            io: io.map(Arc::new),
            poisoned_at,
        }
    }

    /// An I/O failure outside the engine (creating the file, starting the writer thread), said
    /// as an engine says its own.
    pub(crate) fn io(error: io::Error) -> EngineError {
        let message = format!("I/O error: {error}");
        EngineError::from_parts(EngineErrorKind::Io, message, Some(error), None)
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The message already says what the I/O error does (the engine's own `Display` includes it), so
/// it is not repeated as a source; [`EngineError::io_error`] gives it to a program.
impl std::error::Error for EngineError {}

/// The store's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_error_of_a_store_error_is_reachable() {
        let commit = StoreError::CommitFailed {
            source: EngineError::io(io::Error::other("injected")),
            not_durable: Vec::new(),
        };
        assert_eq!(
            commit.engine().map(EngineError::kind),
            Some(EngineErrorKind::Io)
        );
        assert!(
            std::error::Error::source(&commit)
                .is_some_and(|s| s.to_string() == "I/O error: injected")
        );
        assert!(StoreError::Closed.engine().is_none());
    }
}
