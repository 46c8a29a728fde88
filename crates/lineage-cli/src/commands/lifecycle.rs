//! What the commands that change a store (`rm`, `tag`, `prune`, `copy`, `upgrade`) share: the
//! verification they end with, and how a refused deletion is said.

use std::io::Write;

use lineage_store::{StoreError, VerifyReport};
use serde_json::{Value, json};

use super::write_json;
use crate::error::{CliError, EXIT_OK, EXIT_PROBLEMS};
use crate::open::Opened;

/// The store's `verify` after a change: every session checked, every problem listed.
pub struct Verified {
    /// The report.
    pub report: VerifyReport,
}

impl Verified {
    /// Verifies the whole store.
    pub fn run(opened: &Opened) -> Result<Verified, CliError> {
        let report = opened.store.verify().map_err(|e| opened.fail(e))?;
        Ok(Verified { report })
    }

    /// How many problems were found.
    pub fn problems(&self) -> usize {
        self.report.sessions.iter().map(|s| s.problems.len()).sum()
    }

    /// As JSON: `{"ok", "sessions", "problems": [{"session", "problem"}]}`.
    pub fn json(&self) -> Value {
        let problems: Vec<Value> = self
            .report
            .failures()
            .flat_map(|s| {
                s.problems.iter().map(
                    move |p| json!({"session": s.session.to_string(), "problem": p.to_string()}),
                )
            })
            .collect();
        json!({
            "ok": problems.is_empty(),
            "sessions": self.report.sessions.len(),
            "problems": problems,
        })
    }

    /// As text: each problem on its own line, then `verify: ok, N sessions intact` or the count.
    pub fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        for session in self.report.failures() {
            for problem in &session.problems {
                writeln!(out, "{}: {problem}", session.session)?;
            }
        }
        let sessions = self.report.sessions.len();
        match self.problems() {
            0 => writeln!(out, "verify: ok, {sessions} sessions intact"),
            n => writeln!(out, "verify: {n} problem(s) in {sessions} sessions"),
        }
    }

    /// A changing command's last word: its `report` with this verify under `"verify"` as JSON,
    /// or its `text` and then this verify's lines; exit 1 when the verify found problems.
    pub fn conclude(
        &self,
        out: &mut dyn Write,
        as_json: bool,
        mut report: Value,
        text: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<u8, CliError> {
        if as_json {
            report["verify"] = self.json();
            write_json(out, &report)?;
        } else {
            text(out)?;
            self.write(out)?;
        }
        Ok(if self.problems() == 0 {
            EXIT_OK
        } else {
            EXIT_PROBLEMS
        })
    }
}

/// Maps a failed deletion: a refusal by the descendant rule is a usage error (exit 2) saying how
/// to delete the subtree; the rest as any failure of the store.
pub fn delete_failure(opened: &Opened, error: StoreError) -> CliError {
    match error {
        e @ StoreError::HasDescendants { .. } => {
            CliError::Usage(format!("{e} (lineage rm --subtree)"))
        }
        e @ StoreError::OwnedSession { .. } => CliError::Usage(e.to_string()),
        e => opened.fail(e),
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
