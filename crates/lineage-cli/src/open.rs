//! Opening a store read-only and finding the session a command names.
//!
//! A file whose writer stopped without closing it (a killed host) opens like any other: the store
//! reads it as that writer left it, every durable commit included, without modifying it. The
//! command then works normally and leaves a note ([`take_notes`]) that the file awaits recovery by
//! its next writer, which `lineage_cli::run` prints on stderr before the command's first output.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use lineage_log::SessionId;
use lineage_store::{SessionInfo, Store, StoreError};

use crate::error::CliError;

/// A store opened read-only, with the path it was opened from (for messages).
#[derive(Debug)]
pub struct Opened {
    /// The store.
    pub store: Store,
    /// Where it lives.
    pub path: PathBuf,
}

/// Opens the store at `path` read-only, so it works while a host has the file open for writing.
///
/// The path must name an existing file (a missing one is reported, never created), or be a
/// `postgres://` URL of a database that holds a store.
pub fn open(path: &Path) -> Result<Opened, CliError> {
    check_file(path)?;
    let shown_path = PathBuf::from(lineage_store::display_location(path));
    let shown = shown_path.display();
    let store = Store::open_read_only(path).map_err(|e| CliError::opening(&shown_path, e))?;
    if store.awaits_recovery() {
        note(format!(
            "{shown} awaits recovery by its next writer (a writer stopped without closing it); \
             showing its last durable commit"
        ));
    }
    Ok(Opened {
        store,
        path: shown_path.clone(),
    })
}

/// Opens the existing store at `path` for writing (the commands that change a store: `rm`,
/// `tag`, `prune`). The path must name an existing store; a missing one is reported, never
/// created. A store that a host has open for writing cannot be opened (one writer per file):
/// that is said in one sentence, exit 3.
pub fn open_writable(path: &Path) -> Result<Opened, CliError> {
    check_file(path)?;
    open_for_writing(path)
}

/// Opens the store at `path` for writing, creating it if it does not exist (a file) or has no
/// tables yet (a database).
pub fn open_for_writing(path: &Path) -> Result<Opened, CliError> {
    let shown = PathBuf::from(lineage_store::display_location(path));
    let store = Store::open(path).map_err(|e| match e {
        StoreError::AlreadyOpen { .. } => CliError::CannotOpen(format!(
            "{} is open for writing by another process (a running host): stop it, then try again",
            shown.display()
        )),
        e => CliError::opening(&shown, e),
    })?;
    Ok(Opened { store, path: shown })
}

/// Refuses a path that is missing, a directory or an empty file, before any open. A database URL
/// is the server's to refuse.
pub fn check_file(path: &Path) -> Result<(), CliError> {
    if lineage_store::is_database_url(path) {
        return Ok(());
    }
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CliError::CannotOpen(format!(
                "cannot open {shown}: no such file"
            )));
        }
        Err(e) => return Err(CliError::CannotOpen(format!("cannot open {shown}: {e}"))),
        Ok(meta) if meta.is_dir() => {
            return Err(CliError::CannotOpen(format!(
                "cannot open {shown}: it is a directory, not a store file"
            )));
        }
        Ok(meta) if meta.len() == 0 => {
            return Err(CliError::CannotOpen(format!(
                "{shown} is not a Lineage store: the file is empty"
            )));
        }
        Ok(_) => {}
    }
    Ok(())
}

thread_local! {
    /// Notes left by the commands running on this thread, not yet printed.
    static NOTES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Leaves `note` for the command's stderr, once however often it is left.
fn note(note: String) {
    NOTES.with(|notes| {
        let mut notes = notes.borrow_mut();
        if !notes.contains(&note) {
            notes.push(note);
        }
    });
}

/// The notes left on this thread since the last call, oldest first.
pub fn take_notes() -> Vec<String> {
    NOTES.with(|notes| std::mem::take(&mut *notes.borrow_mut()))
}

impl Opened {
    /// Maps a read failure to the command's error, naming this store.
    pub fn fail(&self, error: lineage_store::StoreError) -> CliError {
        CliError::reading(&self.path, error)
    }

    /// Every session, in creation order.
    pub fn list(&self) -> Result<Vec<SessionInfo>, CliError> {
        self.store.list().map_err(|e| self.fail(e))
    }

    /// Every session whose row reads, in creation order, and the failure of each that does not
    /// (a damaged row, naming its session): one damaged session does not hide the others.
    pub fn list_readable(&self) -> Result<(Vec<SessionInfo>, Vec<CliError>), CliError> {
        let mut readable = Vec::new();
        let mut unreadable = Vec::new();
        for listed in self.store.list_each().map_err(|e| self.fail(e))? {
            match listed {
                Ok(info) => readable.push(info),
                Err(e) => unreadable.push(self.fail(e)),
            }
        }
        Ok((readable, unreadable))
    }

    /// The session `arg` names: a full id, or a prefix of exactly one stored session's id.
    pub fn resolve(&self, arg: &str) -> Result<SessionInfo, CliError> {
        let arg = arg.trim();
        if let Ok(id) = arg.parse::<SessionId>() {
            return self.store.info(id).map_err(|e| self.fail(e));
        }
        let looks_like_prefix =
            !arg.is_empty() && arg.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        if !looks_like_prefix {
            return Err(CliError::Usage(format!(
                "{arg:?} is not a session id (a UUID, or the start of one)"
            )));
        }
        let wanted = arg.to_ascii_lowercase();
        let mut matches: Vec<SessionInfo> = self
            .list()?
            .into_iter()
            .filter(|info| info.header.id.to_string().starts_with(&wanted))
            .collect();
        match matches.len() {
            0 => Err(CliError::Usage(format!(
                "no session in {} has an id starting with {arg}",
                self.path.display()
            ))),
            1 => Ok(matches.remove(0)),
            n => Err(CliError::Usage(format!(
                "{n} sessions in {} have ids starting with {arg}: give more of the id",
                self.path.display()
            ))),
        }
    }
}
