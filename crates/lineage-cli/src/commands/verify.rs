//! `lineage verify`: rebuild every cache from the log and report each difference.
//!
//! `Store::verify` checks the whole store (a child's seed digest needs its parent's log, the
//! children index needs every header); with a SESSION only that session's report is printed.

use std::io::Write;

use lineage_store::{Problem, SessionReport};
use serde_json::{Value, json};

use super::write_json;
use crate::cli::VerifyArgs;
use crate::error::{CliError, EXIT_OK, EXIT_PROBLEMS};
use crate::open::open;

/// Verifies the store (or reports one session of it); exit 1 when anything is wrong.
pub fn run(args: &VerifyArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let report = opened.store.verify().map_err(|e| opened.fail(e))?;
    let reports: Vec<&SessionReport> = match &args.session {
        None => report.sessions.iter().collect(),
        Some(arg) => vec![pick(&report.sessions, arg, &opened.path)?],
    };
    let events: u64 = reports.iter().map(|r| r.events).sum();
    let problems: usize = reports.iter().map(|r| r.problems.len()).sum();

    if args.output.json {
        let items: Vec<Value> = reports
            .iter()
            .map(|r| {
                json!({
                    "session": r.session.to_string(),
                    "events": r.events,
                    "blocks": r.blocks,
                    "open_turn": r.open_turn,
                    "problems": r.problems.iter().map(problem_json).collect::<Vec<Value>>(),
                })
            })
            .collect();
        write_json(
            out,
            &json!({
                "ok": problems == 0,
                "sessions": reports.len(),
                "events": events,
                "problems": problems,
                "reports": items,
            }),
        )?;
    } else {
        for r in &reports {
            for problem in &r.problems {
                writeln!(out, "{}: {problem}", r.session)?;
            }
        }
        for r in &reports {
            if let Some(turn) = r.open_turn {
                writeln!(
                    out,
                    "{}: ends inside turn {turn} (open; resuming closes it, not a problem)",
                    r.session
                )?;
            }
        }
        let sessions = reports.len();
        writeln!(
            out,
            "{sessions} {}, {events} events checked, {problems} {}",
            if sessions == 1 { "session" } else { "sessions" },
            if problems == 1 { "problem" } else { "problems" },
        )?;
    }
    Ok(if problems == 0 {
        EXIT_OK
    } else {
        EXIT_PROBLEMS
    })
}

/// The report of the session `arg` names: a full id or the start of exactly one id. The reports
/// are searched rather than the store, so a session whose header does not decode can be named.
fn pick<'a>(
    reports: &'a [SessionReport],
    arg: &str,
    path: &std::path::Path,
) -> Result<&'a SessionReport, CliError> {
    let wanted = arg.trim().to_ascii_lowercase();
    if let Ok(id) = wanted.parse::<lineage_log::SessionId>() {
        return reports
            .iter()
            .find(|r| r.session == id)
            .ok_or_else(|| CliError::Usage(format!("session {id} is not in {}", path.display())));
    }
    let matches: Vec<&SessionReport> = reports
        .iter()
        .filter(|r| !wanted.is_empty() && r.session.to_string().starts_with(&wanted))
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(CliError::Usage(format!(
            "no session in {} has an id starting with {arg:?}",
            path.display()
        ))),
        many => Err(CliError::Usage(format!(
            "{} sessions in {} have ids starting with {arg}: give more of the id",
            many.len(),
            path.display()
        ))),
    }
}

/// A problem as JSON: a stable kind, the seqs it names, and the sentence.
fn problem_json(problem: &Problem) -> Value {
    let (kind, seqs) = match problem {
        Problem::UndecodableHeader { .. } => ("undecodable-header", json!({})),
        Problem::UnsupportedFormat { found, supported } => (
            "unsupported-format",
            json!({"found": found, "supported": supported}),
        ),
        Problem::CorruptBlock {
            first_seq,
            last_seq,
            ..
        } => (
            "corrupt-block",
            json!({"first_seq": first_seq, "last_seq": last_seq}),
        ),
        Problem::CorruptRecord { seq, .. } => ("corrupt-record", json!({"seq": seq})),
        Problem::SeqGap { expected, found } => {
            ("seq-gap", json!({"expected": expected, "found": found}))
        }
        Problem::InvalidEvent { seq, .. } => ("invalid-event", json!({"seq": seq})),
        Problem::HeadMismatch { .. } => ("head-mismatch", json!({})),
        Problem::HeaderMismatch { field, .. } => ("header-mismatch", json!({"field": field})),
        Problem::MissingChildIndex { parent } => {
            ("missing-child-index", json!({"parent": parent.to_string()}))
        }
        Problem::StrayChildIndex { child } => {
            ("stray-child-index", json!({"child": child.to_string()}))
        }
        Problem::SeedDigestMismatch { parent, seed_len } => (
            "seed-digest-mismatch",
            json!({"parent": parent.to_string(), "seed_len": seed_len}),
        ),
    };
    let mut value = json!({"kind": kind, "message": problem.to_string()});
    if let (Value::Object(target), Value::Object(extra)) = (&mut value, seqs) {
        target.extend(extra);
    }
    value
}
