//! The store's error type.

use std::path::PathBuf;
use std::sync::Arc;

use lineage_log::{LogError, SessionId};

/// Why a store operation failed. Every variant names the session, seq, path or field involved; a
/// refused operation changes nothing in the store.
#[derive(Debug, thiserror::Error)]
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
    /// A group commit failed. Its batches stay queued, in order, and the next flush retries them.
    #[error("commit failed; the batches stay queued and the next flush retries them: {source}")]
    CommitFailed {
        /// What the storage engine said.
        #[source]
        source: Arc<redb::Error>,
    },
    /// The storage engine failed.
    #[error("storage error: {0}")]
    Storage(#[from] redb::Error),
}

impl StoreError {
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

macro_rules! storage_from {
    ($($ty:ty),*) => {
        $(impl From<$ty> for StoreError {
            fn from(e: $ty) -> Self {
                StoreError::Storage(e.into())
            }
        })*
    };
}

storage_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The store's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
