//! Failures of a command and the exit codes they map to.
//!
//! Every failure is one sentence for people, printed on stderr as `lineage: <sentence>`.

use std::io;
use std::path::Path;

use lineage_store::{EngineErrorKind, StoreError};

/// Exit code: everything went well.
pub const EXIT_OK: u8 = 0;
/// Exit code: problems were found (`verify`), or a damaged session (a corrupt record or block)
/// stopped a read.
pub const EXIT_PROBLEMS: u8 = 1;
/// Exit code: the command line is wrong, including a session the store does not hold.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the store cannot be opened or read (missing file, not a Lineage store, a newer
/// format, a file cut short or damaged beneath its sessions, an I/O error).
pub const EXIT_CANNOT_OPEN: u8 = 3;
/// Exit code: the database's server cannot be reached, or did not answer within its bound.
pub const EXIT_UNREACHABLE: u8 = 4;
/// Exit code: the server refused the login (a wrong password, an unknown role).
pub const EXIT_AUTHENTICATION: u8 = 5;
/// Exit code: the role lacks a right the store needs on the database.
pub const EXIT_PERMISSION: u8 = 6;
/// Exit code: the server holds no database of the URL's name.
pub const EXIT_NO_DATABASE: u8 = 7;

/// Why a database's server would not serve a command: each has its exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerRefusal {
    /// Nothing answers at its address, or it did not answer within its bound (exit 4).
    Unreachable,
    /// It refused the login (exit 5).
    Authentication,
    /// The role lacks a right (exit 6).
    Permission,
    /// It holds no such database (exit 7).
    NoDatabase,
}

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    /// The command line is wrong (exit 2).
    Usage(String),
    /// The store cannot be opened or read (exit 3).
    CannotOpen(String),
    /// A damaged session was found while reading (exit 1).
    Damaged(String),
    /// The output could not be written. A closed pipe (`lineage show … | head`) is not a failure.
    Output(io::Error),
    /// The demo could not run to its end (exit 1).
    Demo(String),
    /// The chat could not run, or a turn of its prompt failed (exit 1).
    Chat(String),
    /// The ACP server could not start, or its connection or shutdown failed (exit 1).
    Acp(String),
    /// `import` refused its file: a bad line, a digest that differs, a session the store holds
    /// with other content (exit 1). Nothing was written.
    Refused(String),
    /// The database's server would not serve the command (exit 4 to 7, by why).
    Server(ServerRefusal, String),
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::CannotOpen(_) => EXIT_CANNOT_OPEN,
            CliError::Damaged(_) => EXIT_PROBLEMS,
            CliError::Server(refusal, _) => match refusal {
                ServerRefusal::Unreachable => EXIT_UNREACHABLE,
                ServerRefusal::Authentication => EXIT_AUTHENTICATION,
                ServerRefusal::Permission => EXIT_PERMISSION,
                ServerRefusal::NoDatabase => EXIT_NO_DATABASE,
            },
            CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe => EXIT_OK,
            CliError::Output(_)
            | CliError::Demo(_)
            | CliError::Chat(_)
            | CliError::Acp(_)
            | CliError::Refused(_) => EXIT_PROBLEMS,
        }
    }

    /// The sentence to print on stderr, or `None` when nothing should be said (a closed pipe).
    pub fn message(&self) -> Option<String> {
        match self {
            CliError::Usage(m)
            | CliError::CannotOpen(m)
            | CliError::Damaged(m)
            | CliError::Demo(m)
            | CliError::Chat(m)
            | CliError::Acp(m)
            | CliError::Refused(m)
            | CliError::Server(_, m) => Some(m.clone()),
            CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe => None,
            CliError::Output(e) => Some(format!("cannot write the output: {e}")),
        }
    }

    /// The same kind of failure (and so the same exit code) with another sentence.
    pub fn restated(self, message: String) -> CliError {
        match self {
            CliError::Usage(_) => CliError::Usage(message),
            CliError::CannotOpen(_) => CliError::CannotOpen(message),
            CliError::Damaged(_) => CliError::Damaged(message),
            CliError::Demo(_) => CliError::Demo(message),
            CliError::Chat(_) => CliError::Chat(message),
            CliError::Acp(_) => CliError::Acp(message),
            CliError::Refused(_) => CliError::Refused(message),
            CliError::Server(refusal, _) => CliError::Server(refusal, message),
            output @ CliError::Output(_) => output,
        }
    }

    /// Maps a failure to open the store at `path`: every one means it cannot be opened.
    pub fn opening(path: &Path, error: StoreError) -> CliError {
        if let Some(refused) = server_refusal(&error) {
            return refused;
        }
        if let Some(sentence) = file_sentence(path, &error) {
            return CliError::CannotOpen(sentence);
        }
        let shown = path.display();
        CliError::CannotOpen(match error {
            // These already name the file and say what is wrong with it.
            e @ (StoreError::NotAStore { .. }
            | StoreError::NewerFormat { .. }
            | StoreError::OlderFormat { .. }
            | StoreError::UpgradeRequired { .. }
            | StoreError::AlreadyOpen { .. }) => e.to_string(),
            other => format!("cannot open {shown}: {other}"),
        })
    }

    /// Maps a failure while reading an open store at `path`.
    pub fn reading(path: &Path, error: StoreError) -> CliError {
        if let Some(refused) = server_refusal(&error) {
            return refused;
        }
        if let Some(sentence) = file_sentence(path, &error) {
            return CliError::CannotOpen(sentence);
        }
        match error {
            StoreError::UnknownSession { session } => {
                CliError::Usage(format!("session {session} is not in {}", path.display()))
            }
            e @ (StoreError::Corrupt { .. }
            | StoreError::CorruptBlock { .. }
            | StoreError::CorruptHeader { .. }) => CliError::Damaged(e.to_string()),
            e @ (StoreError::NewerFormat { .. }
            | StoreError::OlderFormat { .. }
            | StoreError::UnsupportedRecord { .. }
            | StoreError::NotAStore { .. }) => CliError::CannotOpen(e.to_string()),
            e => CliError::CannotOpen(format!("cannot read {}: {e}", path.display())),
        }
    }
}

/// The failure of a database's server that would not serve the command, in the store's words
/// (which name the server, without its password, and say what to do).
fn server_refusal(error: &StoreError) -> Option<CliError> {
    let refusal = match error.engine()?.kind() {
        EngineErrorKind::Unreachable | EngineErrorKind::Timeout => ServerRefusal::Unreachable,
        EngineErrorKind::AuthenticationFailed => ServerRefusal::Authentication,
        EngineErrorKind::PermissionDenied => ServerRefusal::Permission,
        EngineErrorKind::DatabaseMissing => ServerRefusal::NoDatabase,
        _ => return None,
    };
    let message = match error {
        StoreError::Storage(engine) => engine.to_string(),
        other => other.to_string(),
    };
    Some(CliError::Server(refusal, message))
}

/// The sentence for a failure of the file itself, in Lineage's words, or `None` for a failure
/// the store already words itself (a session's damage, a newer format, a foreign file).
///
/// The storage engine's own messages are never shown: they speak of its internals ("previous I/O
/// error", "magic number", a panic's location) rather than of the file. What they mean for the
/// file is said instead: it is cut short, it is damaged, it is not a store, it could not be read.
fn file_sentence(path: &Path, error: &StoreError) -> Option<String> {
    let shown = path.display();
    Some(match error {
        StoreError::NotAStore { reason, .. } if !lineage_reason(reason) => format!(
            "{shown} is not a Lineage store, or its header is damaged: it does not begin as a \
             store file does"
        ),
        // The storage engine panicked on the file (the store contained it).
        StoreError::Damaged { .. } => damaged(path),
        StoreError::Closed => format!("cannot read {shown}: the store was closed while reading it"),
        StoreError::Storage(engine) => match (engine.kind(), engine.io_error()) {
            (EngineErrorKind::Io, Some(e)) => io_sentence(path, e),
            (EngineErrorKind::Corrupted | EngineErrorKind::Poisoned, _) => damaged(path),
            (EngineErrorKind::PreviousIo, _) => format!(
                "{shown} cannot be read: an earlier read of the file failed (it is likely cut \
                 short or damaged)"
            ),
            // A read-only open reads such a file as its writer left it; this is what remains
            // when even that failed.
            (EngineErrorKind::AwaitsRecovery, _) => format!(
                "{shown} awaits recovery by its next writer (a writer stopped without closing \
                 it), and reading it as that writer left it failed: open it once with a writer \
                 (for example by restarting its host), then try again"
            ),
            (EngineErrorKind::AlreadyOpen, _) => {
                format!("{shown} is already open for writing by another process or handle")
            }
            // A database's server speaks of the database, not of a file: its words are shown.
            _ if lineage_store::is_database_url(path) => {
                format!("cannot read {shown}: the database failed: {engine}")
            }
            // `Other`, and kinds added after this was written: the engine's own words stay
            // unshown (see above), the failure is still named.
            _ => format!(
                "cannot read {shown}: the storage layer failed on it (the file may be damaged)"
            ),
        },
        _ => return None,
    })
}

/// The sentence for a file whose storage structure is broken.
fn damaged(path: &Path) -> String {
    format!(
        "{} is damaged: the storage structure inside it does not hold together (parts of the \
         file were overwritten or lost), so it cannot be read",
        path.display()
    )
}

/// The sentence for an I/O error reading `path`: the operating system's words, except for the
/// errors that mean something about the file itself.
fn io_sentence(path: &Path, error: &io::Error) -> String {
    let shown = path.display();
    match error.kind() {
        io::ErrorKind::UnexpectedEof => {
            let size = std::fs::metadata(path)
                .map_or(String::new(), |m| format!(" (it holds {} bytes)", m.len()));
            format!(
                "{shown} is cut short{size}: it ends before the data it records, so part of the \
                 store is missing (a truncated file, or a copy taken before it was complete)"
            )
        }
        // The engine's checks of its own header and pages.
        io::ErrorKind::InvalidData => damaged(path),
        // The operating system's own words.
        _ if error.raw_os_error().is_some() => format!("cannot read {shown}: {error}"),
        // The store's own sentence about the file, or the kind of failure.
        _ => match error.get_ref() {
            Some(inner) => format!("cannot read {shown}: {inner}"),
            None => format!("cannot read {shown}: {}", error.kind()),
        },
    }
}

/// Whether a "not a Lineage store" reason is the store's own (about the tables it found) rather
/// than the storage engine's (about a file it could not parse).
fn lineage_reason(reason: &str) -> bool {
    reason.contains("Lineage")
        || reason.starts_with("its meta table")
        || reason.starts_with("a redb file in storage format")
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Output(e)
    }
}
