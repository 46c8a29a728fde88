//! `lineage show`: a session's events, readable.
//!
//! The session is streamed with its digests checked (`Store::scan`): events are written as their
//! blocks are read, one block in memory at a time, and the output stops as soon as its reader goes
//! away. Damage is reported where it is met, so the events of the intact blocks before it have
//! already been written (the damaged block's never are). The whole session is read even with
//! `--limit`, so damage anywhere is reported and the closing facts (the open turn, its crash-repair
//! closers) are the whole log's. Closers exist only in memory and are not printed as events.

use std::io::{self, Write};

use lineage_log::{Event, EventBody, SessionId};
use lineage_store::Scan;
use serde_json::json;

use super::{id_json, to_json};
use crate::cli::ShowArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::{Opened, open};
use crate::render::{EventPrinter, EventStyle};

/// Prints the events of a session from `--from`, at most `--limit` of them.
pub fn run(args: &ShowArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let session = info.header.id;
    let scan = opened.store.scan(session, 0).map_err(|e| opened.fail(e))?;
    // The length of the snapshot the scan reads, which may be longer than `info`'s.
    let len = scan.info().len;
    let start = args.from.min(len);
    let end = match args.limit {
        Some(limit) => start.saturating_add(limit).min(len),
        None => len,
    };
    let window = Window { start, end };
    if args.output.json {
        json_document(&opened, session, scan, window, out)
    } else {
        text(&opened, args, scan, window, out)
    }
}

/// The seqs shown: `start..end`.
#[derive(Clone, Copy)]
struct Window {
    start: u64,
    end: u64,
}

impl Window {
    fn holds(self, seq: u64) -> bool {
        (self.start..self.end).contains(&seq)
    }
}

/// The turn the log ends inside, from the closers that would close it.
fn open_turn(closers: &[Event]) -> Option<u32> {
    closers.iter().rev().find_map(|e| match &e.body {
        EventBody::TurnEnd(end) => Some(end.turn),
        _ => None,
    })
}

/// The next event of `scan`, mapping a read failure to the command's error.
fn next(opened: &Opened, scan: &mut Scan) -> Result<Option<Event>, CliError> {
    scan.next().transpose().map_err(|e| opened.fail(e))
}

/// The JSON document of the window, written as the scan reads:
///
/// `{"events": [...], "from", "len", "open_turn", "parent", "seed_len", "session"}`, pretty
/// printed with its keys in order, exactly as one `serde_json` value of the whole session would
/// print. The events come first, so the facts that need the whole log (the lineage, the open turn)
/// are known when they are written.
fn json_document(
    opened: &Opened,
    session: SessionId,
    mut scan: Scan,
    window: Window,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let len = scan.info().len;
    let mut lineage = None;
    let mut shown = 0u64;
    let mut buffer = Vec::new();
    out.write_all(b"{\n  \"events\": [")?;
    while let Some(event) = next(opened, &mut scan)? {
        if let EventBody::SessionLineage(l) = &event.body {
            lineage = Some((l.parent, l.seed_len));
        }
        if !window.holds(event.seq) {
            continue;
        }
        out.write_all(if shown == 0 { b"\n    " } else { b",\n    " })?;
        buffer.clear();
        serde_json::to_writer_pretty(&mut buffer, &to_json(&event)).map_err(io::Error::from)?;
        write_indented(out, &buffer, b"\n    ")?;
        shown += 1;
    }
    out.write_all(if shown == 0 { b"]" } else { b"\n  ]" })?;
    let closers = scan.closers().unwrap_or_default();
    let rest = json!({
        "from": window.start,
        "len": len,
        "open_turn": open_turn(closers),
        "parent": id_json(lineage.map(|(parent, _)| parent)),
        "seed_len": lineage.map_or(0, |(_, seed_len)| seed_len),
        "session": session.to_string(),
    });
    // The other keys, as they print inside the same object: after `{\n`, each line indented.
    let rest = serde_json::to_string_pretty(&rest).map_err(io::Error::from)?;
    out.write_all(b",\n")?;
    out.write_all(rest.strip_prefix("{\n").unwrap_or(&rest).as_bytes())?;
    writeln!(out)?;
    Ok(EXIT_OK)
}

/// Writes `json`, putting `newline` (a newline and the indentation) for each of its newlines. A
/// JSON text has newlines only between its tokens, never inside a string.
fn write_indented(out: &mut dyn Write, json: &[u8], newline: &[u8]) -> io::Result<()> {
    let mut lines = json.split(|b| *b == b'\n');
    if let Some(first) = lines.next() {
        out.write_all(first)?;
    }
    for line in lines {
        out.write_all(newline)?;
        out.write_all(line)?;
    }
    Ok(())
}

/// The events of the window as text, under a heading.
///
/// The heading is written before the first event is read, so the session's parent and seed length
/// come from its header, the cache of its log's lineage that every write keeps in step with it
/// (`lineage verify` reports any difference).
fn text(
    opened: &Opened,
    args: &ShowArgs,
    mut scan: Scan,
    window: Window,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let header = scan.info().header.clone();
    let len = scan.info().len;
    let session = header.id;
    let own_from = header.seed_len;
    let parent = header.parent;
    let mut heading = format!("session {session}: {len} events");
    if let Some(parent) = parent {
        heading.push_str(&format!(
            ", parent {parent}, own suffix from seq {own_from}"
        ));
    }
    if window.start == window.end {
        heading.push_str(&format!(", none at or after seq {}", args.from));
    } else if window.end - window.start != len {
        heading.push_str(&format!(
            ", showing seq {}..={}",
            window.start,
            window.end - 1
        ));
    }
    writeln!(out, "{heading}")?;
    let style = EventStyle {
        chunks: args.style.chunks,
        full: args.style.full,
    };
    let mut printer = EventPrinter::new(own_from, parent.map(|p| p.to_string()), style);
    while let Some(event) = next(opened, &mut scan)? {
        if event.seq < window.start {
            printer.skip(std::slice::from_ref(&event));
        } else if window.holds(event.seq) {
            let seq = event.seq;
            printer.feed(out, event)?;
            if seq + 1 == window.end {
                // The window's last line goes out now, not after the rest of the log is read.
                printer.finish(out)?;
            }
        }
    }
    printer.finish(out)?;
    let closers = scan.closers().unwrap_or_default();
    if window.end == len
        && let Some(turn) = open_turn(closers)
    {
        writeln!(
            out,
            "── the log ends inside turn {turn}: resuming would first close it with {} repair events ──",
            closers.len()
        )?;
    }
    Ok(EXIT_OK)
}
