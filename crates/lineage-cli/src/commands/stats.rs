//! `lineage stats`: space used, overall and by event kind.

use std::io::Write;

use serde_json::{Value, json};

use super::write_json;
use crate::cli::StoreArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::open;
use crate::render::Table;

/// `bytes / events` with one decimal, or 0 for no events.
fn per_event(bytes: u64, events: u64) -> f64 {
    if events == 0 {
        0.0
    } else {
        (bytes as f64 / events as f64 * 10.0).round() / 10.0
    }
}

/// Prints the store's statistics.
pub fn run(args: &StoreArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let stats = opened.store.stats().map_err(|e| opened.fail(e))?;

    if args.output.json {
        let kinds: Vec<Value> = stats
            .by_kind
            .iter()
            .map(|(kind, k)| {
                json!({
                    "kind": kind.name(),
                    "events": k.events,
                    "bytes": k.bytes,
                    "bytes_per_event": per_event(k.bytes, k.events),
                })
            })
            .collect();
        write_json(
            out,
            &json!({
                "sessions": stats.sessions,
                "events": stats.events,
                "blocks": stats.blocks,
                "record_bytes": stats.record_bytes,
                "block_bytes": stats.block_bytes,
                "file_bytes": stats.file_bytes,
                "bytes_per_event": per_event(stats.record_bytes, stats.events),
                "by_kind": kinds,
            }),
        )?;
        return Ok(EXIT_OK);
    }

    let mut totals = Table::new(&["WHAT", "VALUE"], &["VALUE"]).untitled();
    totals.row(vec!["sessions".into(), stats.sessions.to_string()]);
    totals.row(vec!["events".into(), stats.events.to_string()]);
    totals.row(vec!["blocks".into(), stats.blocks.to_string()]);
    totals.row(vec!["record bytes".into(), stats.record_bytes.to_string()]);
    totals.row(vec!["block bytes".into(), stats.block_bytes.to_string()]);
    totals.row(vec![
        "file bytes".into(),
        stats.file_bytes.map_or("-".to_owned(), |b| b.to_string()),
    ]);
    totals.row(vec![
        "bytes per event".into(),
        format!("{:.1}", per_event(stats.record_bytes, stats.events)),
    ]);
    totals.write(out)?;
    writeln!(out)?;
    let mut table = Table::new(
        &["KIND", "EVENTS", "BYTES", "BYTES/EVENT", "SHARE"],
        &["EVENTS", "BYTES", "BYTES/EVENT", "SHARE"],
    );
    for (kind, k) in &stats.by_kind {
        let share = if stats.record_bytes == 0 {
            0.0
        } else {
            k.bytes as f64 * 100.0 / stats.record_bytes as f64
        };
        table.row(vec![
            kind.name().to_owned(),
            k.events.to_string(),
            k.bytes.to_string(),
            format!("{:.1}", per_event(k.bytes, k.events)),
            format!("{share:.1}%"),
        ]);
    }
    table.write(out)?;
    Ok(EXIT_OK)
}
