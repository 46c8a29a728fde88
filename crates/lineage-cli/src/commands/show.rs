//! `lineage show`: a session's events, readable.
//!
//! The session is read whole with its digests checked (`Store::inspect`), so damage is reported
//! instead of shown; crash-repair closers exist only in memory and are not printed as events.

use std::io::Write;

use lineage_log::{Event, fold_lineage, seed_len};
use serde_json::{Value, json};

use super::{id_json, to_json, write_json};
use crate::cli::ShowArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::open;
use crate::render::{EventPrinter, EventStyle};

/// Prints the events of a session from `--from`, at most `--limit` of them.
pub fn run(args: &ShowArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let session = info.header.id;
    let loaded = opened.store.inspect(session).map_err(|e| opened.fail(e))?;
    let stored: &[Event] = &loaded.events[..loaded.events.len() - loaded.closers];
    let len = stored.len();
    let start = usize::try_from(args.from).unwrap_or(usize::MAX).min(len);
    let end = match args.limit {
        Some(limit) => start
            .saturating_add(usize::try_from(limit).unwrap_or(usize::MAX))
            .min(len),
        None => len,
    };
    let shown = &stored[start..end];
    let own_from = seed_len(stored);
    let parent = fold_lineage(stored).map(|l| l.parent);
    let open_turn = (loaded.closers > 0)
        .then(|| {
            stored.iter().rev().find_map(|e| match &e.body {
                lineage_log::EventBody::TurnStart(t) => Some(t.turn),
                _ => None,
            })
        })
        .flatten();

    if args.output.json {
        let events: Vec<Value> = shown.iter().map(to_json).collect();
        write_json(
            out,
            &json!({
                "session": session.to_string(),
                "parent": id_json(parent),
                "seed_len": own_from,
                "len": len,
                "from": start,
                "open_turn": open_turn,
                "events": events,
            }),
        )?;
        return Ok(EXIT_OK);
    }

    let mut heading = format!("session {session}: {len} events");
    if let Some(parent) = parent {
        heading.push_str(&format!(
            ", parent {parent}, own suffix from seq {own_from}"
        ));
    }
    if shown.is_empty() {
        heading.push_str(&format!(", none at or after seq {}", args.from));
    } else if shown.len() != len {
        heading.push_str(&format!(
            ", showing seq {}..={}",
            shown[0].seq,
            shown[shown.len() - 1].seq
        ));
    }
    writeln!(out, "{heading}")?;
    let style = EventStyle {
        chunks: args.style.chunks,
        full: args.style.full,
    };
    let mut printer = EventPrinter::new(own_from, parent.map(|p| p.to_string()), style);
    printer.skip(&stored[..start]);
    printer.print(out, shown)?;
    if end == len
        && let Some(turn) = open_turn
    {
        writeln!(
            out,
            "── the log ends inside turn {turn}: resuming would first close it with {} repair events ──",
            loaded.closers
        )?;
    }
    Ok(EXIT_OK)
}
