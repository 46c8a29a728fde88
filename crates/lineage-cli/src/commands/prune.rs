//! `lineage prune`: retention. Deletes whole root trees by age or count, each in one transaction,
//! then verifies the store.
//!
//! A *root* is a session whose parent is not in the store (usually: it has none). Each root is
//! deleted with its whole subtree (its children and forks, recursively), so nothing is left naming
//! a deleted parent. A tree's age is its **last activity**: the time of the latest event of any
//! session in it (a root whose child was active yesterday is one day old, however old the root).
//! `--older-than D` deletes the trees whose last activity is more than `D` ago; `--keep N` keeps
//! the `N` trees most recently active and deletes the rest; with both, a tree is deleted when
//! either says so. Each tree is one transaction: a crash leaves every tree whole or gone, and
//! running the command again finishes the job. `--dry-run` only says what would be deleted (and
//! opens the store read-only).

use std::collections::HashSet;
use std::io::Write;
use std::time::Duration;

use lineage_log::SessionId;
use lineage_store::{DeleteRule, SessionInfo};
use serde_json::{Value, json};

use super::lifecycle::{Verified, delete_failure, now_ms};
use super::ls::human_bytes;
use super::write_json;
use crate::cli::PruneArgs;
use crate::error::{CliError, EXIT_OK, EXIT_PROBLEMS};
use crate::open::{Opened, open, open_writable};
use crate::time::iso_seconds;

/// One root tree and when it was last active.
struct Tree {
    root: SessionId,
    sessions: Vec<SessionId>,
    last_active_ms: i64,
}

/// Prunes the store as `args` says; exit 1 when the store's verify finds problems afterwards.
pub fn run(args: &PruneArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let older_than = args
        .older_than
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(CliError::Usage)?;
    if older_than.is_none() && args.keep.is_none() {
        return Err(CliError::Usage(
            "say what to prune: --older-than DURATION, --keep N, or both".to_owned(),
        ));
    }
    let opened = if args.dry_run {
        open(&args.store)?
    } else {
        open_writable(&args.store)?
    };
    let now = now_ms();
    let mut trees = trees(&opened)?;
    // Most recently active first; ties by id (creation order), newest first.
    trees.sort_by(|a, b| {
        b.last_active_ms
            .cmp(&a.last_active_ms)
            .then(b.root.cmp(&a.root))
    });
    let limit_ms = older_than.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let doomed: Vec<&Tree> = trees
        .iter()
        .enumerate()
        .filter(|(rank, tree)| {
            let beyond_count = args.keep.is_some_and(|keep| *rank as u64 >= keep);
            let too_old =
                limit_ms.is_some_and(|limit| now.saturating_sub(tree.last_active_ms) > limit);
            beyond_count || too_old
        })
        .map(|(_, tree)| tree)
        .collect();

    let mut rows = Vec::with_capacity(doomed.len());
    let (mut sessions, mut events, mut bytes) = (0usize, 0u64, 0u64);
    for tree in &doomed {
        let (count, tree_events, tree_bytes) = if args.dry_run {
            let mut e = 0;
            let mut b = 0;
            for s in &tree.sessions {
                e += opened.store.info(*s).map_err(|e| opened.fail(e))?.len;
                b += opened.store.session_bytes(*s).map_err(|e| opened.fail(e))?;
            }
            (tree.sessions.len(), e, b)
        } else {
            let deleted = opened
                .store
                .delete(tree.root, DeleteRule::Subtree)
                .map_err(|e| delete_failure(&opened, e))?;
            (deleted.sessions.len(), deleted.events, deleted.bytes)
        };
        sessions += count;
        events += tree_events;
        bytes += tree_bytes;
        rows.push((tree, count, tree_events, tree_bytes));
    }
    let verified = if args.dry_run {
        None
    } else {
        Some(Verified::run(&opened)?)
    };

    if args.output.json {
        let items: Vec<Value> = rows
            .iter()
            .map(|(tree, count, e, b)| {
                json!({
                    "root": tree.root.to_string(),
                    "sessions": count,
                    "events": e,
                    "bytes": b,
                    "last_active_ms": tree.last_active_ms,
                    "last_active": iso_seconds(tree.last_active_ms),
                })
            })
            .collect();
        write_json(
            out,
            &json!({
                "dry_run": args.dry_run,
                "deleted": items,
                "roots_deleted": rows.len(),
                "roots_kept": trees.len() - rows.len(),
                "sessions_deleted": sessions,
                "events_deleted": events,
                "bytes_deleted": bytes,
                "verify": verified.as_ref().map(Verified::json),
            }),
        )?;
    } else {
        let verb = if args.dry_run {
            "would delete"
        } else {
            "deleted"
        };
        for (tree, count, e, b) in &rows {
            writeln!(
                out,
                "{verb} {} ({count} session(s), {e} events, {}), last active {}",
                tree.root,
                human_bytes(*b),
                iso_seconds(tree.last_active_ms)
            )?;
        }
        writeln!(
            out,
            "{} {} of {} root trees ({sessions} sessions, {events} events, {}); {} kept",
            if args.dry_run {
                "would prune"
            } else {
                "pruned"
            },
            rows.len(),
            trees.len(),
            human_bytes(bytes),
            trees.len() - rows.len()
        )?;
        if let Some(verified) = &verified {
            verified.write(out)?;
        }
    }
    Ok(match verified {
        Some(v) if v.problems() > 0 => EXIT_PROBLEMS,
        _ => EXIT_OK,
    })
}

/// Every root tree of the store with its last activity. A session whose last event cannot be read
/// stops the command before anything is deleted.
fn trees(opened: &Opened) -> Result<Vec<Tree>, CliError> {
    let list = opened.list()?;
    let stored: HashSet<SessionId> = list.iter().map(|i| i.header.id).collect();
    let mut out = Vec::new();
    for info in list
        .iter()
        .filter(|i| i.header.parent.is_none_or(|p| !stored.contains(&p)))
    {
        let root = info.header.id;
        let mut sessions = vec![root];
        sessions.extend(
            opened
                .store
                .descendants(root)
                .map_err(|e| opened.fail(e))?
                .into_iter()
                .filter(|s| stored.contains(s)),
        );
        let mut last_active_ms = i64::MIN;
        for session in &sessions {
            let info = match list.iter().find(|i| i.header.id == *session) {
                Some(info) => info.clone(),
                None => opened.store.info(*session).map_err(|e| opened.fail(e))?,
            };
            last_active_ms = last_active_ms.max(last_activity(opened, &info)?);
        }
        out.push(Tree {
            root,
            sessions,
            last_active_ms,
        });
    }
    Ok(out)
}

/// The time of a session's last stored event (its creation time if that is later).
fn last_activity(opened: &Opened, info: &SessionInfo) -> Result<i64, CliError> {
    let created = i64::try_from(info.header.created_at_ms).unwrap_or(i64::MAX);
    let from = info.len.saturating_sub(1);
    let mut last = created;
    let scan = opened
        .store
        .scan_unchecked(info.header.id, from)
        .map_err(|e| opened.fail(e))?;
    for event in scan {
        let event = event.map_err(|e| opened.fail(e))?;
        if event.seq >= info.len {
            break;
        }
        last = last.max(event.time_ms);
    }
    Ok(last)
}

/// Parses a duration: one or more `<number><unit>` with units `s`, `m`, `h`, `d`, `w`
/// (`90d`, `1h30m`, `2w`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{text:?} is not a duration: write a number and a unit (s, m, h, d, w), for example \
             30d, 12h or 1h30m"
        )
    };
    let text_trimmed = text.trim();
    if text_trimmed.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    let mut rest = text_trimmed;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit = rest[digits..].chars().next().ok_or_else(bad)?;
        let seconds = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(bad()),
        };
        total = number
            .checked_mul(seconds)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
        rest = &rest[digits + unit.len_utf8()..];
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_are_numbers_with_units() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(1_209_600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in [
            "",
            "30",
            "d",
            "1x",
            "-1d",
            "1.5h",
            "99999999999999999999d",
            "1dé",
            "5m5",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_duration("1y").unwrap_err().contains("\"1y\""));
    }
}
