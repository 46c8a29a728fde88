//! `lineage export`: a session as JSON Lines.
//!
//! One event per line in the serde form of `Event`: `{"seq", "time_ms", "body": {"type",
//! "data"}}`, `type` being the display name (`turn/start`, `tool/result`, …). The session is
//! streamed with its digests checked (`Store::scan`), one block in memory at a time: each line is
//! written as its block is read, and damage is reported where it is met. Crash-repair closers are
//! not exported (they are not stored).

use std::io::Write;

use super::write_json_line;
use crate::cli::ExportArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::open;

/// Writes every stored event of the session, one JSON object per line.
pub fn run(args: &ExportArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let scan = opened
        .store
        .scan(info.header.id, 0)
        .map_err(|e| opened.fail(e))?;
    for event in scan {
        let event = event.map_err(|e| opened.fail(e))?;
        write_json_line(out, &event)?;
    }
    Ok(EXIT_OK)
}
