//! `lineage copy`: every session of one store into another, either engine to either engine.
//!
//! The source is opened read-only (a host may be writing to it: a snapshot is copied), the
//! destination for writing and created if missing. Each session is checked as a load checks it
//! before it is written, the destination is verified afterwards, and a session the destination
//! already holds identically is left alone, so running the copy again changes nothing.

use std::io::Write;

use lineage_store::StoreError;
use serde_json::json;

use super::lifecycle::Verified;
use super::unreadable_sessions;
use crate::cli::CopyArgs;
use crate::error::CliError;
use crate::open::{open, open_for_writing};

/// Copies `args.source` into `args.destination`; exit 1 when the destination's verify finds
/// problems afterwards, or a session of the source was not copied because its row is damaged
/// (the others are).
pub fn run(args: &CopyArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let source = open(&args.source)?;
    let destination = open_for_writing(&args.destination)?;
    let copied = source
        .store
        .copy_into(&destination.store)
        .map_err(|e| match e {
            e @ StoreError::CopyDiverged { .. } => CliError::Refused(format!(
                "{e} ({} is left as it was for that session)",
                destination.path.display()
            )),
            e => source.fail(e),
        })?;
    let report = json!({
        "copied": copied.copied.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "present": copied.present.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "events": copied.events,
        "damaged": copied.damaged.iter().map(|(id, _)| id.to_string()).collect::<Vec<_>>(),
    });
    let verified = Verified::run(&destination)?.conclude(out, args.output.json, report, |out| {
        writeln!(
            out,
            "copied {} session(s), {} events, from {} to {}; {} already there",
            copied.copied.len(),
            copied.events,
            source.path.display(),
            destination.path.display(),
            copied.present.len()
        )
    })?;
    let damaged = copied
        .damaged
        .iter()
        .map(|(session, reason)| {
            CliError::Damaged(format!(
                "{reason} in {} (session {session} was not copied)",
                source.path.display()
            ))
        })
        .collect();
    unreadable_sessions(damaged)?;
    Ok(verified)
}
