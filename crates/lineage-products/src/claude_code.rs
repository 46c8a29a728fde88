//! [`ClaudeCodeProvider`]: one-shot delegation to Claude Code through `claude -p` with
//! stream-json in and out (one JSON object a line).

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lineage_agent::BoxFuture;
use lineage_log::ContentBlock;
use lineage_subagent::{
    OutOfProcess, OutOfProcessAgent, ResolvedStart, StopReason, SubagentError, SubagentResult,
    SubagentRun, bound_diagnostic,
};
use serde_json::{Value, json};

use crate::link::{Connected, Delegation, Link, ProcessConfig, Stage, publish, result, text_of};

/// How diagnostics name the product.
const PRODUCT: &str = "Claude Code";

/// How Claude Code decides on a tool call that needs permission (its `--permission-mode`).
/// Whatever it asks is answered by nobody: a delegated run is unattended, so every ask is
/// denied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PermissionMode {
    /// Deny whatever is not allowed without asking; nothing is asked.
    #[default]
    DontAsk,
    /// Ask (denied here) for whatever is not allowed without asking.
    Ask,
    /// Allow file edits in the working directory; ask (denied here) for the rest.
    AcceptEdits,
    /// Plan only: no tool changes anything.
    Plan,
}

impl PermissionMode {
    fn as_str(self) -> &'static str {
        match self {
            PermissionMode::DontAsk => "dontAsk",
            PermissionMode::Ask => "default",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::Plan => "plan",
        }
    }
}

/// How a [`ClaudeCodeProvider`] runs Claude Code.
#[derive(Clone, Debug)]
pub struct ClaudeCodeConfig {
    /// The provider's name, which delegations select it by.
    pub name: String,
    /// The process: `program` is Claude Code's `claude`; the provider adds the print-mode and
    /// stream-json arguments. Claude Code reads its endpoint and key from its environment
    /// (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`, ...), so set those in `process.env`.
    pub process: ProcessConfig,
    /// The model, when not Claude Code's default.
    pub model: Option<String>,
    /// How tool calls that need permission are decided (default [`PermissionMode::DontAsk`]).
    pub permission_mode: PermissionMode,
    /// The most model turns a run may take (Claude Code's `--max-turns`); a run that reaches it
    /// ends with [`StopReason::Budget`].
    pub max_turns: Option<u32>,
}

impl ClaudeCodeConfig {
    /// A provider named `name` running the Claude Code program `program`, with the defaults.
    pub fn new(name: impl Into<String>, program: impl Into<std::path::PathBuf>) -> Self {
        ClaudeCodeConfig {
            name: name.into(),
            process: ProcessConfig::new(program),
            model: None,
            permission_mode: PermissionMode::default(),
            max_turns: None,
        }
    }

    /// The arguments the provider adds after [`ProcessConfig::args`].
    fn arguments(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--no-session-persistence",
            // The question tool waits for a person; nobody is there.
            "--disallowedTools",
            "AskUserQuestion",
            // Permission asks come to this client (and are denied) instead of a terminal.
            "--permission-prompt-tool",
            "stdio",
            "--permission-mode",
            self.permission_mode.as_str(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if let Some(model) = &self.model {
            args.extend(["--model".into(), model.into()]);
        }
        if let Some(turns) = self.max_turns {
            args.extend(["--max-turns".into(), turns.to_string().into()]);
        }
        args
    }
}

/// A one-shot provider whose children are Claude Code runs, each a `claude -p` process of its
/// own.
///
/// A start spawns Claude Code in the delegating agent's working directory (in its own process
/// group, with an allow-listed environment) with session persistence off, the question tool
/// disallowed and the configured permission mode; sends the `initialize` control request; and
/// publishes the run once it is answered. The run sends the task as a user message and ends on
/// the `result` line: only a `success` that is not an error and has a non-blank result is a
/// completed run. `error_max_turns` and `error_max_budget_usd` are [`StopReason::Budget`], a
/// prompt too long for the model is [`StopReason::MaxTokens`], and any other failure is
/// [`StopReason::Error`] with its category (subtype and terminal reason) in the diagnostic.
///
/// Every permission ask is denied; a control request of any other kind fails the run.
/// Cancelling sends the `interrupt` control request and settles `aborted` at once. Disposal
/// interrupts a turn still running (Claude Code does not exit at the end of its input while a
/// request is in flight), closes stdin and tears the process group down.
///
/// It supports no start-time option (a request for one is refused before a process starts),
/// its children never see the parent's conversation, and how deep Claude Code delegates is its
/// own business ([`MaxDepth::ProviderManaged`](lineage_subagent::tools::MaxDepth::ProviderManaged) in its tool row, [`ClaudeCodeProvider::tool_row`]).
pub type ClaudeCodeProvider = OutOfProcess<ClaudeCodeConfig>;

impl OutOfProcessAgent for ClaudeCodeConfig {
    fn name(&self) -> &str {
        &self.name
    }

    /// Upstream's tool for it is `subagent_claude_code`.
    fn describe(&self) -> String {
        "Hands a self-contained coding task to Claude Code, which works in \
            this agent's working directory with its own tools. It cannot see this conversation, \
            so the prompt must say everything it needs to know. You get its final answer."
            .to_owned()
    }

    fn start(
        config: Arc<Self>,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        let delegation = Delegation::read(PRODUCT, &config.name, &config.process, request);
        Box::pin(start(config, delegation))
    }
}

/// A running Claude Code and whether a turn is in flight.
struct Connection {
    link: Link,
    next_request: AtomicU64,
    running: AtomicBool,
}

impl Connection {
    /// Sends control request `subtype`; its id.
    async fn control(&self, subtype: &str) -> Result<String, String> {
        let id = format!(
            "lineage-{}",
            self.next_request.fetch_add(1, Ordering::Relaxed)
        );
        let request = json!({
            "type": "control_request",
            "request_id": id,
            "request": { "subtype": subtype },
        });
        self.link
            .send(&request)
            .await
            .map_err(|e| format!("cannot send the {subtype} control request: {e}"))?;
        Ok(id)
    }

    /// Answers a control request as nobody can be asked: permission asks are denied; `Err` for
    /// a request of another kind (answered with an error), which fails the run.
    async fn answer(&self, frame: &Value) -> Result<(), String> {
        let id = frame["request_id"].clone();
        let subtype = frame["request"]["subtype"].as_str().unwrap_or("(none)");
        let (response, unanswerable) = if subtype == "can_use_tool" {
            let denial = json!({ "behavior": "deny", "message": DENIED });
            let response = json!({ "subtype": "success", "request_id": id, "response": denial });
            (response, None)
        } else {
            let why =
                format!("Claude Code asked for {subtype}, which an unattended run cannot answer");
            let response = json!({ "subtype": "error", "request_id": id, "error": why });
            (response, Some(why))
        };
        // A product that went away is noticed by the next read.
        let _ = self
            .link
            .send(&json!({ "type": "control_response", "response": response }))
            .await;
        unanswerable.map_or(Ok(()), Err)
    }

    /// The run: the task as a user message, then frames until the `result` line.
    async fn run(&self, text: String) -> Result<Value, String> {
        let message = json!({
            "type": "user",
            "message": { "role": "user", "content": text },
            "parent_tool_use_id": null,
        });
        self.running.store(true, Ordering::Release);
        self.link
            .send(&message)
            .await
            .map_err(|e| format!("cannot send the task: {e}"))?;
        loop {
            let frame = self.link.next().await?;
            match frame["type"].as_str() {
                Some("result") => {
                    self.running.store(false, Ordering::Release);
                    return Ok(frame);
                }
                Some("control_request") => self.answer(&frame).await?,
                _ => {}
            }
        }
    }
}

impl Connected for Connection {
    fn link(&self) -> &Link {
        &self.link
    }

    /// Best effort: interrupts the turn in flight, if any.
    async fn interrupt(&self) {
        if self.running.swap(false, Ordering::AcqRel) {
            let _ = self.control("interrupt").await;
        }
    }
}

/// The reason Claude Code is given for a denied tool call.
const DENIED: &str = "Denied: this run is unattended and nobody can grant permission.";

/// A `result` line as a run's result.
fn outcome(who: &str, line: &Value) -> SubagentResult {
    let subtype = line["subtype"].as_str().unwrap_or("(none)");
    let is_error = line["is_error"].as_bool().unwrap_or(true);
    let text = line["result"].as_str().unwrap_or_default();
    let output = if text.trim().is_empty() {
        Vec::new()
    } else {
        vec![ContentBlock::text(text)]
    };
    if subtype == "success" && !is_error && !output.is_empty() {
        return result(output, StopReason::Completed, None);
    }
    let terminal = line["terminal_reason"].as_str().unwrap_or("(none)");
    let stop_reason = match (subtype, terminal) {
        ("error_max_turns" | "error_max_budget_usd", _) => StopReason::Budget,
        (_, "prompt_too_long") => StopReason::MaxTokens,
        _ => StopReason::Error,
    };
    let what = if subtype == "success" && !is_error {
        "finished without an answer".to_owned()
    } else if !text.trim().is_empty() {
        text.to_owned()
    } else {
        match line["errors"].as_array() {
            Some(errors) if !errors.is_empty() => {
                errors.iter().map(text_of).collect::<Vec<_>>().join("; ")
            }
            _ => "no message".to_owned(),
        }
    };
    let diagnostic = format!("{who} ended {subtype} ({terminal}): {what}");
    // A failure's text is its diagnostic, not an answer.
    result(Vec::new(), stop_reason, Some(bound_diagnostic(&diagnostic)))
}

/// The whole start: spawn, the `initialize` control request answered, then the run published.
async fn start(
    config: Arc<ClaudeCodeConfig>,
    delegation: Delegation,
) -> Result<SubagentRun, SubagentError> {
    let Delegation {
        who,
        cwd,
        task,
        cancel,
    } = delegation;
    let cwd = cwd?;
    let link = Link::spawn(who, &config.process, &config.arguments(), &cwd)?;
    let connection = Arc::new(Connection {
        link,
        next_request: AtomicU64::new(0),
        running: AtomicBool::new(false),
    });
    let handshake = async {
        let id = connection.control("initialize").await?;
        loop {
            let frame = connection.link.next().await?;
            if frame["type"] == "control_response" && frame["response"]["request_id"] == id {
                let response = &frame["response"];
                return match response["subtype"].as_str() {
                    Some("success") => Ok(()),
                    _ => Err(format!(
                        "initialize was refused: {}",
                        text_of(&response["error"])
                    )),
                };
            }
        }
    };
    let stage = Mutex::new(Stage::Initialize);
    connection
        .link
        .handshake(&config.process, &cancel, &stage, handshake)
        .await?;
    let run = {
        let connection = connection.clone();
        async move {
            let ran = tokio::select! {
                ran = connection.run(task) => ran,
                _ = cancel.cancelled() => {
                    connection.interrupt().await;
                    return Ok(result(Vec::new(), StopReason::Aborted, None));
                }
            };
            Ok(match ran {
                Ok(line) => outcome(connection.link.who(), &line),
                Err(what) => {
                    connection.interrupt().await;
                    let text = connection.link.diagnostic(Stage::Turn, &what).await;
                    result(Vec::new(), StopReason::Error, Some(text))
                }
            })
        }
    };
    Ok(publish(PRODUCT, &config.name, &config.process, connection, run).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(result: Value) -> SubagentResult {
        outcome("Claude Code (claude)", &result)
    }

    #[test]
    fn only_a_successful_result_with_text_completes() {
        let done = ended(json!({ "subtype": "success", "is_error": false, "result": "42" }));
        assert_eq!(done.stop_reason, StopReason::Completed);
        assert_eq!(done.output, vec![ContentBlock::text("42")]);
        let blank = ended(json!({ "subtype": "success", "is_error": false, "result": "  " }));
        assert_eq!(blank.stop_reason, StopReason::Error);
        let api = ended(json!({
            "subtype": "success", "is_error": true, "terminal_reason": "api_error",
            "result": "API Error: 500 it broke",
        }));
        assert_eq!(api.stop_reason, StopReason::Error);
        assert!(api.output.is_empty());
        assert_eq!(
            api.diagnostic.as_deref(),
            Some("Claude Code (claude) ended success (api_error): API Error: 500 it broke")
        );
    }

    #[test]
    fn error_subtypes_keep_their_category() {
        let turns = ended(json!({
            "subtype": "error_max_turns", "is_error": true, "terminal_reason": "max_turns",
            "errors": ["Reached maximum number of turns (1)"],
        }));
        assert_eq!(turns.stop_reason, StopReason::Budget);
        assert_eq!(
            turns.diagnostic.as_deref(),
            Some(
                "Claude Code (claude) ended error_max_turns (max_turns): Reached maximum number \
                 of turns (1)"
            )
        );
        let long = ended(json!({
            "subtype": "success", "is_error": true, "terminal_reason": "prompt_too_long",
            "result": "Prompt is too long",
        }));
        assert_eq!(long.stop_reason, StopReason::MaxTokens);
        let during = ended(json!({ "subtype": "error_during_execution", "is_error": true }));
        assert_eq!(during.stop_reason, StopReason::Error);
        assert!(
            during
                .diagnostic
                .unwrap()
                .contains("error_during_execution")
        );
    }

    #[test]
    fn the_arguments_keep_the_run_unattended() {
        let mut config = ClaudeCodeConfig::new("claude", "claude");
        config.model = Some("m".into());
        config.max_turns = Some(3);
        let args: Vec<String> = config
            .arguments()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let has = |pair: &[&str]| args.windows(2).any(|w| w == pair);
        assert!(has(&["--disallowedTools", "AskUserQuestion"]), "{args:?}");
        assert!(has(&["--permission-mode", "dontAsk"]), "{args:?}");
        assert!(has(&["--permission-prompt-tool", "stdio"]), "{args:?}");
        assert!(
            has(&["--model", "m"]) && has(&["--max-turns", "3"]),
            "{args:?}"
        );
        assert!(args.iter().any(|a| a == "--no-session-persistence"));
    }
}
