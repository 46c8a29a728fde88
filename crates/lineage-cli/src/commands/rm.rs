//! `lineage rm`: delete a session (and, with `--subtree`, every session descending from it), then
//! verify the store.
//!
//! The store's rule: a session with children or forks is refused unless `--subtree` is given, so
//! no session is ever left naming a deleted parent. The deletion is one transaction: a crash
//! leaves the sessions whole or gone.

use std::io::Write;

use lineage_store::DeleteRule;
use serde_json::json;

use super::lifecycle::{Verified, delete_failure};
use super::ls::human_bytes;
use super::write_json;
use crate::cli::RmArgs;
use crate::error::{CliError, EXIT_OK, EXIT_PROBLEMS};
use crate::open::open_writable;

/// Deletes the session `args` names; exit 1 when the store's verify finds problems afterwards.
pub fn run(args: &RmArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open_writable(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let rule = if args.subtree {
        DeleteRule::Subtree
    } else {
        DeleteRule::Refuse
    };
    let deleted = opened
        .store
        .delete(info.header.id, rule)
        .map_err(|e| delete_failure(&opened, e))?;
    let verified = Verified::run(&opened)?;
    if args.output.json {
        write_json(
            out,
            &json!({
                "deleted": deleted.sessions.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "events": deleted.events,
                "blocks": deleted.blocks,
                "bytes": deleted.bytes,
                "verify": verified.json(),
            }),
        )?;
    } else {
        for session in &deleted.sessions {
            writeln!(out, "deleted {session}")?;
        }
        writeln!(
            out,
            "{} session(s), {} events, {} removed",
            deleted.sessions.len(),
            deleted.events,
            human_bytes(deleted.bytes)
        )?;
        verified.write(out)?;
    }
    Ok(if verified.problems() == 0 {
        EXIT_OK
    } else {
        EXIT_PROBLEMS
    })
}
