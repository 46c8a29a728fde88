//! `lineage tail`: a session's last events, and with `-f` every event committed after them.
//!
//! Following polls `Store::read_from` at the session's next seq every `--interval` milliseconds
//! through one read-only handle; each read sees the writer's latest commit. Reads from a seq do
//! not check digests (that needs the log from seq 0): `lineage verify` does. Ctrl-C stops it.

use std::io::Write;
use std::time::Duration;

use lineage_log::Event;

use super::write_json_line;
use crate::cli::TailArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::{Opened, open};
use crate::render::{EventPrinter, EventStyle};

/// Prints the last `-n` events, then (with `-f`) new events as they are committed.
pub fn run(args: &TailArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let session = info.header.id;
    let from = info.len.saturating_sub(args.last);
    let style = EventStyle {
        chunks: args.style.chunks,
        full: args.style.full,
    };
    let mut printer = EventPrinter::new(
        info.header.seed_len,
        info.header.parent.map(|p| p.to_string()),
        style,
    );
    let mut next = from;
    let first = read(&opened, session, from)?;
    emit(args, &mut printer, out, &first, &mut next)?;
    if !args.follow {
        return Ok(EXIT_OK);
    }
    let interval = Duration::from_millis(args.interval);
    loop {
        std::thread::sleep(interval);
        let new = read(&opened, session, next)?;
        emit(args, &mut printer, out, &new, &mut next)?;
    }
}

/// The committed events of `session` from `from`.
fn read(
    opened: &Opened,
    session: lineage_log::SessionId,
    from: u64,
) -> Result<Vec<Event>, CliError> {
    opened
        .store
        .read_from(session, from)
        .map_err(|e| opened.fail(e))
}

/// Prints `events` (as text or JSON Lines), flushes, and moves `next` past them.
fn emit(
    args: &TailArgs,
    printer: &mut EventPrinter,
    out: &mut dyn Write,
    events: &[Event],
    next: &mut u64,
) -> Result<(), CliError> {
    let Some(last) = events.last() else {
        return Ok(());
    };
    if args.output.json {
        for event in events {
            write_json_line(out, event)?;
        }
    } else {
        printer.print(out, events)?;
    }
    out.flush()?;
    *next = last.seq + 1;
    Ok(())
}
