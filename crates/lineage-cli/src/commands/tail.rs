//! `lineage tail`: a session's last events, and with `-f` every event committed after them.
//!
//! Events are streamed from the block holding the first one (`Store::scan_unchecked`), one block
//! in memory at a time. Following reads again at the session's next seq every `--interval`
//! milliseconds through one read-only handle; each read sees the writer's latest commit. Reads
//! from a seq do not check digests (that needs the log from seq 0): `lineage verify` does. Ctrl-C
//! stops it.

use std::io::Write;
use std::time::Duration;

use lineage_log::SessionId;

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
    emit(&opened, session, args, &mut printer, out, &mut next)?;
    if !args.follow {
        return Ok(EXIT_OK);
    }
    let interval = Duration::from_millis(args.interval);
    loop {
        std::thread::sleep(interval);
        emit(&opened, session, args, &mut printer, out, &mut next)?;
    }
}

/// Prints the committed events of `session` from `next` (as text or JSON Lines) as they are
/// read, flushes, and moves `next` past them.
fn emit(
    opened: &Opened,
    session: SessionId,
    args: &TailArgs,
    printer: &mut EventPrinter,
    out: &mut dyn Write,
    next: &mut u64,
) -> Result<(), CliError> {
    let scan = opened
        .store
        .scan_unchecked(session, *next)
        .map_err(|e| opened.fail(e))?;
    let mut any = false;
    for event in scan {
        let event = event.map_err(|e| opened.fail(e))?;
        *next = event.seq + 1;
        any = true;
        if args.output.json {
            write_json_line(out, &event)?;
        } else {
            printer.feed(out, event)?;
        }
    }
    if any {
        printer.finish(out)?;
        out.flush()?;
    }
    Ok(())
}
