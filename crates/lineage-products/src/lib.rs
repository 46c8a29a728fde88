//! External agent products as delegation children: Codex and Claude Code, each run as a process
//! of its own, one per delegation, driven over its stdio.
//!
//! - [`CodexProvider`] runs `codex app-server` and speaks its JSON-RPC: an ephemeral thread, one
//!   turn, the final agent message as the answer.
//! - [`ClaudeCodeProvider`] runs `claude -p` with stream-json in and out: one user message, the
//!   `result` line as the answer.
//!
//! Both are one-shot, support no start-time option, never see the parent's conversation and
//! manage their own depth. Both run unattended: whatever the product asks (an approval, a
//! permission, a question) is declined, and a request of a kind no unattended client can answer
//! fails the run. Cancelling interrupts the product's turn and settles `aborted` at once; disposal
//! tears the process group down with the ladder of [`lineage_process::AgentProcess`].
//!
//! `scripts/install-products DIR` installs the versions this crate is tested against
//! ([`CODEX_VERSION`], [`CLAUDE_CODE_VERSION`]) from the npm registry.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod claude_code;
mod codex;
mod link;

pub use claude_code::{ClaudeCodeConfig, ClaudeCodeProvider, PermissionMode};
pub use codex::{ApprovalPolicy, CodexConfig, CodexProvider, SandboxMode};
pub use link::ProcessConfig;

/// The version of `@openai/codex` this crate speaks to and is tested against.
pub const CODEX_VERSION: &str = "0.171.0";

/// The version of `@anthropic-ai/claude-code` this crate speaks to and is tested against.
pub const CLAUDE_CODE_VERSION: &str = "2.1.332";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_script_pins_the_versions_this_crate_is_tested_against() {
        let script = include_str!("../../../scripts/install-products");
        assert!(script.contains(&format!("codex_version={CODEX_VERSION}\n")));
        assert!(script.contains(&format!("claude_code_version={CLAUDE_CODE_VERSION}\n")));
    }
}
