//! The log's error type.

use crate::EventKind;

/// Why a log operation refused. Every variant names the seq, index or field involved; a refused
/// operation leaves its log unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// An appended event does not carry the next seq.
    #[error("append seq mismatch at batch index {index}: expected seq {expected}, got {got}")]
    SeqMismatch {
        /// The event's position in its batch.
        index: usize,
        /// The seq it should carry.
        expected: u64,
        /// The seq it carries.
        got: u64,
    },
    /// An event breaks the log's rules (message shape, turn and step structure, lineage placement).
    #[error("invalid {kind} event at seq {seq}: {reason}")]
    InvalidEvent {
        /// The event's seq.
        seq: u64,
        /// The event's kind.
        kind: EventKind,
        /// What is wrong.
        reason: String,
    },
    /// A seed breaks the seed contract.
    #[error("invalid seed event at index {index}: {reason}")]
    InvalidSeed {
        /// The event's index in the seed.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A header breaks its rules.
    #[error("invalid session header field {field}: {reason}")]
    InvalidHeader {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A fork boundary falls inside an open turn.
    #[error("fork boundary {boundary} ends inside open turn {turn}")]
    OpenTurn {
        /// The boundary seq.
        boundary: u64,
        /// The turn that is open there.
        turn: u32,
    },
    /// A fork boundary is not a seq of the log.
    #[error("fork boundary {boundary} does not exist (the log has {len} events)")]
    InvalidBoundary {
        /// The boundary seq.
        boundary: u64,
        /// The log's length.
        len: u64,
    },
    /// A record carries a tag this build does not know and is not marked ignorable.
    #[error(
        "record at seq {seq} has event tag {tag}, unknown to this build and not marked ignorable: it was likely written by a newer Lineage"
    )]
    UnknownKind {
        /// The record's seq.
        seq: u64,
        /// Its tag.
        tag: u32,
    },
    /// A record sets flag bits this build does not know.
    #[error(
        "record at seq {seq} sets unknown flag bits {flags:#04x}: it was likely written by a newer Lineage"
    )]
    UnknownFlags {
        /// The record's seq.
        seq: u64,
        /// Its flags byte.
        flags: u8,
    },
    /// A log written in a newer format.
    #[error(
        "log format v{found} is newer than v{supported}, the newest this build reads: upgrade Lineage to open it"
    )]
    NewerFormat {
        /// The version found.
        found: u32,
        /// The version this build supports.
        supported: u32,
    },
    /// A log written in an older format this build cannot upgrade.
    #[error(
        "log format v{found} is older than v{supported} and this build has no upgrade path for it"
    )]
    OlderFormat {
        /// The version found.
        found: u32,
        /// The version this build supports.
        supported: u32,
    },
    /// A record that does not decode.
    #[error("corrupt record at seq {seq}: {reason}")]
    Corrupt {
        /// The record's seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
}

impl LogError {
    /// Whether the error means "written by a different format" rather than "damaged or invalid".
    pub fn is_format(&self) -> bool {
        matches!(
            self,
            LogError::UnknownKind { .. }
                | LogError::UnknownFlags { .. }
                | LogError::NewerFormat { .. }
                | LogError::OlderFormat { .. }
        )
    }
}
