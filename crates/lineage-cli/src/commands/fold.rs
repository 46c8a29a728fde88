//! `lineage fold`: what resuming a session would rebuild from its log.

use std::io::Write;

use lineage_log::{
    Event, EventBody, final_output, fold_delegation_depth, fold_descriptor, fold_header,
    fold_lineage, fold_policy, is_balanced, model_history, seed_len,
};
use serde_json::{Value, json};

use super::{id_json, to_json, write_json};
use crate::cli::SessionArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::open;
use crate::render::{
    Table, descriptor_label, event_detail, policy_source_label, quote, stop_detail, stop_label,
};

/// Prints the folds of a session's log.
pub fn run(args: &SessionArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let session = info.header.id;
    let loaded = opened.store.inspect(session).map_err(|e| opened.fail(e))?;
    let split = loaded.events.len() - loaded.closers;
    let (stored, closers): (&[Event], &[Event]) = loaded.events.split_at(split);

    let lineage = fold_lineage(stored);
    let own_from = seed_len(stored);
    let depth = fold_delegation_depth(stored, 0);
    let policy = fold_policy(stored);
    let descriptor = fold_descriptor(stored);
    let mut turns = 0u32;
    let mut own_turns = 0u64;
    let mut last_stop = None;
    for event in stored {
        match &event.body {
            EventBody::TurnStart(t) => {
                turns = turns.max(t.turn);
                if event.seq >= own_from {
                    own_turns += 1;
                }
            }
            EventBody::TurnEnd(t) => last_stop = Some(&t.reason),
            _ => {}
        }
    }
    let balanced = is_balanced(stored);
    let open_turn = (!balanced).then_some(turns);
    let history = model_history(stored).len();
    // The last answer's text; an answer of tool calls only has none.
    let output = final_output(stored)
        .map(|m| m.text())
        .filter(|t| !t.is_empty());
    let header_agrees = fold_header(&loaded.header, stored) == loaded.header;

    if args.output.json {
        write_json(
            out,
            &json!({
                "session": session.to_string(),
                "events": stored.len(),
                "lineage": lineage.map(|l| json!({
                    "parent": l.parent.to_string(),
                    "seed_len": l.seed_len,
                    "seed_digest": l.seed_digest.to_string(),
                    "delegation_depth": l.delegation_depth,
                })),
                "parent": id_json(lineage.map(|l| l.parent)),
                "seed_len": own_from,
                "delegation_depth": depth,
                "policy": {
                    "approval": policy.approval.map(|p| json!({
                        "policy": p.policy.as_str(),
                        "source": policy_source_label(p.source),
                    })),
                    "sandbox": policy.sandbox.map(|m| json!({
                        "mode": m.mode.as_str(),
                        "source": policy_source_label(m.source),
                    })),
                },
                "descriptor": descriptor.map(to_json),
                "turns": turns,
                "own_turns": own_turns,
                "last_stop": last_stop.map(stop_label),
                "last_stop_reason": last_stop.map(to_json),
                "open_turn": open_turn,
                "balanced": balanced,
                "closers": closers.len(),
                "closer_events": closers.iter().map(to_json).collect::<Vec<Value>>(),
                "history_messages": history,
                "final_output": output,
                "header_agrees_with_log": header_agrees,
            }),
        )?;
        return Ok(EXIT_OK);
    }

    let mut rows: Vec<(&'static str, String)> = vec![("session", session.to_string())];
    rows.push(("events", stored.len().to_string()));
    match lineage {
        Some(l) => {
            rows.push(("parent", l.parent.to_string()));
            rows.push(("seed_len", l.seed_len.to_string()));
            rows.push(("seed_digest", l.seed_digest.to_string()));
        }
        None => rows.push(("parent", "- (a top-level session)".into())),
    }
    rows.push(("delegation depth", depth.to_string()));
    rows.push((
        "approval",
        policy.approval.map_or("- (no override)".to_owned(), |p| {
            format!("{} ({})", p.policy, policy_source_label(p.source))
        }),
    ));
    rows.push((
        "sandbox",
        policy.sandbox.map_or("- (no override)".to_owned(), |m| {
            format!("{} ({})", m.mode, policy_source_label(m.source))
        }),
    ));
    rows.push((
        "descriptor",
        descriptor.map_or("- (not a delegated child)".to_owned(), |d| {
            descriptor_label(d, false)
        }),
    ));
    rows.push(("turns", format!("{turns} ({own_turns} in the own suffix)")));
    rows.push((
        "last stop",
        last_stop.map_or("- (no turn has ended)".to_owned(), |r| {
            stop_detail(r, false)
        }),
    ));
    rows.push((
        "balanced",
        if balanced {
            "yes".to_owned()
        } else {
            format!(
                "no: turn {turns} is open; crash repair would add {} closers",
                closers.len()
            )
        },
    ));
    rows.push(("history", format!("{history} messages")));
    rows.push((
        "final output",
        output.map_or("-".to_owned(), |t| quote(&t, false)),
    ));
    rows.push((
        "header",
        if header_agrees {
            "agrees with the log".to_owned()
        } else {
            "differs from the log (run lineage verify)".to_owned()
        },
    ));
    let mut table = Table::new(&["FACT", "VALUE"], &[]).untitled();
    for (fact, value) in rows {
        table.row(vec![fact.to_owned(), value]);
    }
    table.write(out)?;
    for closer in closers {
        let (detail, _) = event_detail(closer, false);
        writeln!(
            out,
            "  would add seq {} {}: {detail}",
            closer.seq,
            closer.kind()
        )?;
    }
    Ok(EXIT_OK)
}
