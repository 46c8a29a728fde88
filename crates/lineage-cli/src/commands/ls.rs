//! `lineage ls`: one row per session.
//!
//! Turns, the last stop reason and the open turn come from the tail of each log only. A session's
//! size is the sum of its stored blocks' lengths: one range scan per session that reads the
//! blocks' pages but decodes nothing (`lineage stats` breaks the bytes down by event kind).
//!
//! The title and tags come from each session's `lineage.session/meta` events
//! (`Store::session_meta`): a scan of the session's own blocks that decodes only its `custom`
//! records, so a listing reads every session's bytes once, without replaying them. `--tag
//! KEY=VALUE` (repeatable) lists only the sessions carrying every one of those tags.

use std::io::Write;

use lineage_log::{Origin, SessionMeta};
use serde_json::{Value, json};

use super::tag::{tags_json, tags_text};
use super::{Ending, ending, id_json, unreadable_sessions, write_json};
use crate::cli::LsArgs;
use crate::error::CliError;
use crate::open::open;
use crate::render::{Table, stop_label};
use crate::time::iso_seconds_u64;

/// Lists every session of the store, oldest first.
pub fn run(args: &LsArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let wanted = wanted_tags(&args.tags)?;
    let opened = open(&args.store)?;
    let (sessions, mut unreadable) = opened.list_readable()?;
    let mut rows = Vec::with_capacity(sessions.len());
    let mut metas = Vec::with_capacity(sessions.len());
    for info in &sessions {
        let meta = match opened.store.session_meta(info.header.id) {
            Ok(meta) => Some(meta),
            Err(e) => {
                unreadable.push(opened.fail(e));
                None
            }
        };
        // With a filter, a session whose metadata cannot be read is not listed (its failure is
        // still reported).
        let listed = match &meta {
            Some(meta) => meta.matches(wanted.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            None => wanted.is_empty(),
        };
        if !listed {
            continue;
        }
        metas.push(meta);
        let size = opened
            .store
            .session_bytes(info.header.id)
            .map_err(|e| opened.fail(e));
        match (size, ending(&opened, info)) {
            (Ok(size), Ok(end)) => rows.push((info, Some(end), Some(size))),
            // A write failing mid-output is no session's fault.
            (_, Err(e @ CliError::Output(_))) => return Err(e),
            // One damaged or newer session does not hide the others: its row says so, and the
            // exit code reports it after the listing. The first failure is the one reported, as
            // a failed read of the file can make the next ones fail for that reason alone.
            (Err(e), end) => {
                unreadable.push(e);
                rows.push((info, end.ok(), None));
            }
            (Ok(size), Err(e)) => {
                unreadable.push(e);
                rows.push((info, None, Some(size)));
            }
        }
    }

    if args.output.json {
        let items: Vec<Value> = rows
            .iter()
            .zip(&metas)
            .map(|((info, end, size), meta)| {
                let h = &info.header;
                json!({
                    "title": meta.as_ref().and_then(|m| m.title.as_deref()),
                    "tags": meta.as_ref().map(tags_json),
                    "id": h.id.to_string(),
                    "created_at_ms": h.created_at_ms,
                    "created": iso_seconds_u64(h.created_at_ms),
                    "parent": id_json(h.parent),
                    "origin": origin_name(h.origin),
                    "delegation_depth": h.delegation_depth,
                    "seed_len": h.seed_len,
                    "cwd": h.cwd.as_deref(),
                    "agent_preset": h.agent_preset.as_deref(),
                    "events": info.len,
                    "bytes": size,
                    "turns": end.as_ref().map(|e| e.turns),
                    "last_stop": end.as_ref().and_then(|e| e.last_stop.as_ref()).map(stop_label),
                    "open_turn": end.as_ref().and_then(|e| e.open_turn),
                    "readable": end.is_some(),
                })
            })
            .collect();
        write_json(out, &Value::Array(items))?;
    } else {
        let mut table = Table::new(
            &[
                "ID",
                "CREATED",
                "PARENT",
                "ORIGIN",
                "DEPTH",
                "EVENTS",
                "TURNS",
                "LAST STOP",
                "OPEN TURN",
                "SIZE",
                "TITLE",
                "TAGS",
            ],
            &["DEPTH", "EVENTS", "TURNS", "SIZE"],
        );
        for ((info, end, size), meta) in rows.iter().zip(&metas) {
            let h = &info.header;
            let (turns, stop, open) = match end {
                Some(Ending {
                    turns,
                    last_stop,
                    open_turn,
                }) => (
                    turns.to_string(),
                    last_stop.as_ref().map_or("-".to_owned(), stop_label),
                    open_turn.map_or("-".to_owned(), |t| format!("turn {t}")),
                ),
                None => ("?".into(), "unreadable".into(), "?".into()),
            };
            table.row(vec![
                h.id.to_string(),
                iso_seconds_u64(h.created_at_ms),
                h.parent.map_or("-".to_owned(), |p| p.to_string()),
                origin_name(h.origin).unwrap_or("-").to_owned(),
                h.delegation_depth.to_string(),
                info.len.to_string(),
                turns,
                stop,
                open,
                size.map_or("?".to_owned(), human_bytes),
                meta_title(meta.as_ref()),
                meta.as_ref().map_or("?".to_owned(), tags_text),
            ]);
        }
        table.write(out)?;
    }

    unreadable_sessions(unreadable)
}

/// The JSON and table name of an origin.
fn origin_name(origin: Option<Origin>) -> Option<&'static str> {
    origin.map(|o| match o {
        Origin::Subagent => "subagent",
    })
}

/// The `--tag` filters as (key, value) pairs.
fn wanted_tags(tags: &[String]) -> Result<Vec<(String, String)>, CliError> {
    tags.iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(CliError::Usage(format!(
                "--tag {pair:?} is not a tag: write --tag KEY=VALUE"
            ))),
        })
        .collect()
}

/// The title column: the title, `-` without one, `?` when the metadata could not be read.
fn meta_title(meta: Option<&SessionMeta>) -> String {
    match meta {
        Some(SessionMeta { title: Some(t), .. }) => t.clone(),
        Some(_) => "-".to_owned(),
        None => "?".to_owned(),
    }
}

/// `bytes` in B, KiB, MiB or GiB, one decimal above bytes.
pub(super) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn sizes_are_shown_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(human_bytes(3 << 40), "3072.0 GiB");
    }
}
