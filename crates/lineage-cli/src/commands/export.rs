//! `lineage export`: a session as JSON Lines.
//!
//! One event per line in the serde form of `Event`: `{"seq", "time_ms", "body": {"type",
//! "data"}}`, `type` being the display name (`turn/start`, `tool/result`, …). The session is read
//! with its digests checked; crash-repair closers are not exported (they are not stored).

use std::io::Write;

use super::write_json_line;
use crate::cli::ExportArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::open;

/// Writes every stored event of the session, one JSON object per line.
pub fn run(args: &ExportArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let loaded = opened
        .store
        .inspect(info.header.id)
        .map_err(|e| opened.fail(e))?;
    let stored = &loaded.events[..loaded.events.len() - loaded.closers];
    for event in stored {
        write_json_line(out, event)?;
    }
    Ok(EXIT_OK)
}
