//! redb's errors in the store's terms.

use crate::error::{EngineError, EngineErrorKind};
use crate::{Result, StoreError};

impl EngineError {
    /// The engine's `error` in Lineage's terms. A function, not a `From` impl: trait impls are
    /// public API, and the engine's error types must not appear in the store's.
    pub(crate) fn from_engine(error: redb::Error) -> EngineError {
        let message = error.to_string();
        let (kind, io, poisoned_at) = match error {
            redb::Error::Io(e) => (EngineErrorKind::Io, Some(e), None),
            redb::Error::Corrupted(_)
            | redb::Error::TableDoesNotExist(_)
            | redb::Error::TableTypeMismatch { .. }
            | redb::Error::TableIsMultimap(_)
            | redb::Error::TableIsNotMultimap(_)
            | redb::Error::TypeDefinitionChanged { .. } => (EngineErrorKind::Corrupted, None, None),
            redb::Error::PreviousIo => (EngineErrorKind::PreviousIo, None, None),
            redb::Error::LockPoisoned(at) => (EngineErrorKind::Poisoned, None, Some(at)),
            redb::Error::RepairAborted => (EngineErrorKind::AwaitsRecovery, None, None),
            redb::Error::DatabaseAlreadyOpen => (EngineErrorKind::AlreadyOpen, None, None),
            _ => (EngineErrorKind::Other, None, None),
        };
        EngineError::from_parts(kind, message, io, poisoned_at)
    }
}

/// Converts a storage engine result to the store's, for `?` inside the crate. (A `From` impl of
/// the engine's error types for [`StoreError`] would be public API.)
pub(crate) trait Engine<T> {
    /// The result, with an engine error as [`StoreError::Storage`].
    fn engine(self) -> Result<T>;
}

impl<T, E: Into<redb::Error>> Engine<T> for std::result::Result<T, E> {
    fn engine(self) -> Result<T> {
        self.map_err(|e| StoreError::Storage(EngineError::from_engine(e.into())))
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::panic::Location;

    use super::*;
    use crate::{EngineErrorKind, StoreError};

    fn kind_of(error: redb::Error) -> EngineErrorKind {
        EngineError::from_engine(error).kind()
    }

    #[test]
    fn engine_failures_are_classified_in_lineage_terms_and_keep_the_engine_message() {
        let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "short read");
        let engine = EngineError::from_engine(redb::Error::Io(eof));
        assert_eq!(engine.kind(), EngineErrorKind::Io);
        assert_eq!(
            engine.io_error().map(io::Error::kind),
            Some(io::ErrorKind::UnexpectedEof)
        );
        assert_eq!(engine.to_string(), "I/O error: short read");
        // A clone shares the I/O error rather than losing it.
        assert_eq!(
            engine
                .clone()
                .io_error()
                .map(ToString::to_string)
                .as_deref(),
            Some("short read")
        );

        assert_eq!(
            kind_of(redb::Error::Corrupted("bad page".into())),
            EngineErrorKind::Corrupted
        );
        assert_eq!(
            kind_of(redb::Error::TableDoesNotExist("lineage/events".into())),
            EngineErrorKind::Corrupted
        );
        assert_eq!(
            kind_of(redb::Error::PreviousIo),
            EngineErrorKind::PreviousIo
        );
        assert_eq!(
            kind_of(redb::Error::RepairAborted),
            EngineErrorKind::AwaitsRecovery
        );
        assert_eq!(
            kind_of(redb::Error::DatabaseAlreadyOpen),
            EngineErrorKind::AlreadyOpen
        );
        assert_eq!(kind_of(redb::Error::DatabaseClosed), EngineErrorKind::Other);
        assert!(
            EngineError::from_engine(redb::Error::DatabaseClosed)
                .io_error()
                .is_none()
        );

        let at = Location::caller();
        let poisoned = EngineError::from_engine(redb::Error::LockPoisoned(at));
        assert_eq!(poisoned.kind(), EngineErrorKind::Poisoned);
        assert_eq!(poisoned.poisoned_at(), Some(at));
    }

    #[test]
    fn the_engine_error_of_a_store_error_is_reachable_and_worded_as_before() {
        let failed: std::result::Result<(), redb::StorageError> =
            Err(redb::StorageError::Corrupted("bad page".into()));
        let error = failed.engine().unwrap_err();
        assert!(matches!(error, StoreError::Storage(_)), "{error:?}");
        assert_eq!(error.to_string(), "storage error: DB corrupted: bad page");
        assert_eq!(
            error.engine().map(EngineError::kind),
            Some(EngineErrorKind::Corrupted)
        );
    }
}
