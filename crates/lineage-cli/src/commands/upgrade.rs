//! `lineage upgrade`: a store written by an earlier Lineage, rewritten in this build's format.
//!
//! The rewrite is the store's own (`Store::upgrade`): crash-safe, every session checked as a load
//! checks it. The store is then opened read-only and verified, as `copy` verifies its destination.

use std::io::Write;

use lineage_store::{Store, StoreError};
use serde_json::json;

use super::lifecycle::Verified;
use crate::cli::StoreArgs;
use crate::error::CliError;
use crate::open::{check_file, open};

/// Upgrades `args.store`; exit 1 when the upgraded store's verify finds problems.
pub fn run(args: &StoreArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    check_file(&args.store)?;
    let shown = args.store.display();
    let upgraded = Store::upgrade(&args.store).map_err(|e| match e {
        StoreError::AlreadyOpen { .. } => CliError::CannotOpen(format!(
            "{shown} is open for writing by another process (a running host): stop it, then try again"
        )),
        e => CliError::opening(&args.store, e),
    })?;
    let report = json!({
        "from": upgraded.from,
        "to": upgraded.to,
        "sessions": upgraded.sessions,
        "events": upgraded.events,
    });
    Verified::run(&open(&args.store)?)?.conclude(out, args.output.json, report, |out| {
        if upgraded.from == upgraded.to {
            writeln!(out, "{shown} is in format v{} already", upgraded.to)
        } else {
            writeln!(
                out,
                "upgraded {shown} from format v{} to v{}: {} session(s), {} events",
                upgraded.from, upgraded.to, upgraded.sessions, upgraded.events
            )
        }
    })
}
