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
use crate::cli::RmArgs;
use crate::error::CliError;
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
    let report = json!({
        "deleted": deleted.sessions.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "events": deleted.events,
        "blocks": deleted.blocks,
        "bytes": deleted.bytes,
    });
    Verified::run(&opened)?.conclude(out, args.output.json, report, |out| {
        for session in &deleted.sessions {
            writeln!(out, "deleted {session}")?;
        }
        writeln!(
            out,
            "{} session(s), {} events, {} removed",
            deleted.sessions.len(),
            deleted.events,
            human_bytes(deleted.bytes)
        )
    })
}
