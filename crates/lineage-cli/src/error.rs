//! Failures of a command and the exit codes they map to.
//!
//! Every failure is one sentence for people, printed on stderr as `lineage: <sentence>`.

use std::io;
use std::path::Path;

use lineage_store::StoreError;

/// Exit code: everything went well.
pub const EXIT_OK: u8 = 0;
/// Exit code: problems were found (`verify`), or damage stopped a read.
pub const EXIT_PROBLEMS: u8 = 1;
/// Exit code: the command line is wrong, including a session the store does not hold.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the store cannot be opened or read (missing file, not a Lineage store, a newer
/// format, an I/O error).
pub const EXIT_CANNOT_OPEN: u8 = 3;

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    /// The command line is wrong (exit 2).
    Usage(String),
    /// The store cannot be opened or read (exit 3).
    CannotOpen(String),
    /// Damage was found while reading (exit 1).
    Damaged(String),
    /// The output could not be written. A closed pipe (`lineage show … | head`) is not a failure.
    Output(io::Error),
    /// The demo could not run to its end (exit 1).
    Demo(String),
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::CannotOpen(_) => EXIT_CANNOT_OPEN,
            CliError::Damaged(_) => EXIT_PROBLEMS,
            CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe => EXIT_OK,
            CliError::Output(_) | CliError::Demo(_) => EXIT_PROBLEMS,
        }
    }

    /// The sentence to print on stderr, or `None` when nothing should be said (a closed pipe).
    pub fn message(&self) -> Option<String> {
        match self {
            CliError::Usage(m)
            | CliError::CannotOpen(m)
            | CliError::Damaged(m)
            | CliError::Demo(m) => Some(m.clone()),
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
            output @ CliError::Output(_) => output,
        }
    }

    /// Maps a failure to open the store at `path`: every one means it cannot be opened.
    pub fn opening(path: &Path, error: StoreError) -> CliError {
        let shown = path.display();
        CliError::CannotOpen(match error {
            // These already name the file and say what is wrong with it.
            e @ (StoreError::NotAStore { .. }
            | StoreError::NewerFormat { .. }
            | StoreError::OlderFormat { .. }
            | StoreError::AlreadyOpen { .. }) => e.to_string(),
            StoreError::Damaged { reason } => {
                format!("{shown} is not a Lineage store or is damaged: {reason}")
            }
            StoreError::Storage(redb::Error::RepairAborted) => format!(
                "{shown} was left unrecovered by a writer that stopped without closing it, and a \
                 read-only open cannot recover it: open it once with a writer (for example by \
                 restarting its host), then try again"
            ),
            StoreError::Storage(e) => format!("cannot open {shown}: {e}"),
            other => format!("cannot open {shown}: {other}"),
        })
    }

    /// Maps a failure while reading an open store at `path`.
    pub fn reading(path: &Path, error: StoreError) -> CliError {
        match error {
            StoreError::UnknownSession { session } => {
                CliError::Usage(format!("session {session} is not in {}", path.display()))
            }
            e @ (StoreError::Corrupt { .. }
            | StoreError::CorruptBlock { .. }
            | StoreError::CorruptHeader { .. }
            | StoreError::Damaged { .. }) => CliError::Damaged(e.to_string()),
            e @ (StoreError::NewerFormat { .. }
            | StoreError::OlderFormat { .. }
            | StoreError::UnsupportedRecord { .. }) => CliError::CannotOpen(e.to_string()),
            e => CliError::CannotOpen(format!("cannot read {}: {e}", path.display())),
        }
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Output(e)
    }
}
