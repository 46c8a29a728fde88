//! [`CodexProvider`]: one-shot delegation to Codex through `codex app-server`, JSON-RPC on its
//! stdio (one message a line, without the `jsonrpc` member).

use std::ffi::OsString;
use std::sync::atomic::{AtomicU64, Ordering};
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
const PRODUCT: &str = "Codex";

/// When Codex may run a command without asking (its `approvalPolicy`). Whatever it asks is
/// answered by nobody: a delegated run is unattended, so every approval is declined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApprovalPolicy {
    /// Never ask: commands run within the sandbox, and what the sandbox refuses fails.
    #[default]
    Never,
    /// Ask when the model requests more than the sandbox allows (declined here).
    OnRequest,
    /// Ask for anything but known-safe reads (declined here).
    Untrusted,
}

impl ApprovalPolicy {
    fn as_str(self) -> &'static str {
        match self {
            ApprovalPolicy::Never => "never",
            ApprovalPolicy::OnRequest => "on-request",
            ApprovalPolicy::Untrusted => "untrusted",
        }
    }
}

/// What Codex's commands may touch (its `sandbox` mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SandboxMode {
    /// Read anything, write nothing.
    ReadOnly,
    /// Write inside the working directory only.
    #[default]
    WorkspaceWrite,
    /// No sandbox at all.
    DangerFullAccess,
}

impl SandboxMode {
    fn as_str(self) -> &'static str {
        match self {
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::DangerFullAccess => "danger-full-access",
        }
    }
}

/// How a [`CodexProvider`] runs Codex.
#[derive(Clone, Debug)]
pub struct CodexConfig {
    /// The provider's name, which delegations select it by.
    pub name: String,
    /// The process: `program` is Codex's `codex`; the provider adds `app-server`. Codex reads
    /// its model provider and credentials from `CODEX_HOME` (`config.toml`, `auth.json`) and its
    /// environment, so set those in `process.env`.
    pub process: ProcessConfig,
    /// The model, when not Codex's configured one.
    pub model: Option<String>,
    /// When Codex asks before acting (default [`ApprovalPolicy::Never`]).
    pub approval_policy: ApprovalPolicy,
    /// What its commands may touch (default [`SandboxMode::WorkspaceWrite`]).
    pub sandbox: SandboxMode,
}

impl CodexConfig {
    /// A provider named `name` running the Codex program `program`, with the defaults.
    pub fn new(name: impl Into<String>, program: impl Into<std::path::PathBuf>) -> Self {
        CodexConfig {
            name: name.into(),
            process: ProcessConfig::new(program),
            model: None,
            approval_policy: ApprovalPolicy::default(),
            sandbox: SandboxMode::default(),
        }
    }
}

/// A one-shot provider whose children are Codex runs, each a `codex app-server` process of its
/// own.
///
/// A start spawns Codex in the delegating agent's working directory (in its own process group,
/// with an allow-listed environment), sends `initialize`, `initialized` and `thread/start` (an
/// ephemeral thread with the configured approval policy and sandbox), and only then publishes
/// the run. The run sends the task as `turn/start`; its answer is the turn's last final agent
/// message (or, when Codex marks none final, its last agent message), and it ends on
/// `turn/completed`. A failed turn keeps Codex's error category in the diagnostic (context-window
/// exhaustion is `max-tokens`, anything else `error`).
///
/// Nobody answers Codex's questions: command and file-change approvals are declined, permission
/// requests get nothing, questions for the user get no answers and MCP elicitations are
/// declined; a request of any other kind fails the run. Cancelling sends `turn/interrupt` and
/// settles `aborted` at once. Disposal interrupts a turn still running, closes stdin and tears
/// the process group down (SIGTERM, then SIGKILL).
///
/// It supports no start-time option (a request for one is refused before a process starts),
/// its children never see the parent's conversation, and how deep Codex delegates is its own
/// business ([`MaxDepth::ProviderManaged`](lineage_subagent::tools::MaxDepth::ProviderManaged) in its tool row, [`CodexProvider::tool_row`]).
pub type CodexProvider = OutOfProcess<CodexConfig>;

impl OutOfProcessAgent for CodexConfig {
    fn name(&self) -> &str {
        &self.name
    }

    /// Upstream's tool for it is `subagent_codex`.
    fn describe(&self) -> String {
        "Hands a self-contained coding task to Codex, which works in this \
            agent's working directory with its own tools. It cannot see this conversation, so the \
            prompt must say everything it needs to know. You get its final answer."
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

/// An open app-server connection: the process, its thread, and the turn in progress.
struct Connection {
    link: Link,
    next_id: AtomicU64,
    thread_id: Mutex<Option<String>>,
    /// The turn started and not yet completed, for `turn/interrupt`.
    turn_id: Mutex<Option<String>>,
}

/// What a turn has told so far.
#[derive(Default)]
struct Turn {
    /// The last agent message marked final, and the last one with no phase.
    final_answer: Option<String>,
    unmarked_answer: Option<String>,
    /// The last `error` notification: category and message.
    error: Option<(String, String)>,
    /// The turn's end: its status, and its error when it failed.
    completed: Option<(String, Option<Value>)>,
    /// A request nobody could answer: the run fails with it.
    unanswerable: Option<String>,
}

impl Connection {
    fn lock<T>(slot: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends request `method` and reads frames until its answer, handing everything else to
    /// `turn`. A JSON-RPC error is `Err` with its message.
    async fn call(&self, method: &str, params: Value, turn: &mut Turn) -> Result<Value, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({ "id": id, "method": method, "params": params });
        self.link
            .send(&request)
            .await
            .map_err(|e| format!("cannot send {method}: {e}"))?;
        loop {
            let frame = self.link.next().await?;
            if frame.get("method").is_none() && frame.get("id") == Some(&json!(id)) {
                return match frame.get("error") {
                    Some(error) => Err(format!("{method} was refused: {}", rpc_error(error))),
                    None => Ok(frame.get("result").cloned().unwrap_or(Value::Null)),
                };
            }
            self.handle(frame, turn).await;
        }
    }

    /// A notification or a server request that arrived while waiting for something else.
    async fn handle(&self, frame: Value, turn: &mut Turn) {
        let Some(method) = frame.get("method").and_then(Value::as_str) else {
            return; // An answer to a request nobody waits for any more.
        };
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        match frame.get("id") {
            Some(id) => self.answer(id.clone(), method, &params, turn).await,
            None => turn.notice(method, &params),
        }
    }

    /// Answers a server request as nobody can be asked: see [`unattended_answer`].
    async fn answer(&self, id: Value, method: &str, params: &Value, turn: &mut Turn) {
        let reply = match unattended_answer(method) {
            Some(result) => json!({ "id": id, "result": result }),
            None => {
                turn.unanswerable.get_or_insert_with(|| {
                    format!("Codex asked for {method}, which an unattended run cannot answer")
                });
                tracing::debug!(method, %params, "Codex asked what cannot be answered");
                json!({
                    "id": id,
                    "error": { "code": -32601, "message": format!("{method} is not supported by this client") },
                })
            }
        };
        // A product that went away is noticed by the next read.
        let _ = self.link.send(&reply).await;
    }

    /// The run: `turn/start` with the task, then frames until `turn/completed`.
    async fn run(&self, text: String, turn: &mut Turn) -> Result<(), String> {
        let thread = Self::lock(&self.thread_id).clone().unwrap_or_default();
        let params = json!({
            "threadId": thread,
            "input": [{ "type": "text", "text": text }],
        });
        let started = self.call("turn/start", params, turn).await?;
        let turn_id = started.pointer("/turn/id").and_then(Value::as_str);
        *Self::lock(&self.turn_id) = turn_id.map(str::to_owned);
        while turn.completed.is_none() && turn.unanswerable.is_none() {
            let frame = self.link.next().await?;
            self.handle(frame, turn).await;
        }
        if turn.completed.is_some() {
            // Nothing left to interrupt; a run failed by a request it could not answer keeps
            // the id, so that disposal interrupts the turn Codex is still in.
            Self::lock(&self.turn_id).take();
        }
        Ok(())
    }
}

impl Connected for Connection {
    fn link(&self) -> &Link {
        &self.link
    }

    /// Best effort: interrupts the turn in progress, if any.
    async fn interrupt(&self) {
        let thread = Self::lock(&self.thread_id).clone();
        let turn = Self::lock(&self.turn_id).take();
        if let (Some(thread), Some(turn)) = (thread, turn) {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let request = json!({
                "id": id,
                "method": "turn/interrupt",
                "params": { "threadId": thread, "turnId": turn },
            });
            let _ = self.link.send(&request).await;
        }
    }
}

impl Turn {
    /// Takes in a notification.
    fn notice(&mut self, method: &str, params: &Value) {
        match method {
            "item/completed" => {
                let item = &params["item"];
                if item["type"] == "agentMessage" {
                    let text = item["text"].as_str().unwrap_or_default().to_owned();
                    match item["phase"].as_str() {
                        Some("final_answer") => self.final_answer = Some(text),
                        None => self.unmarked_answer = Some(text),
                        Some(_) => {} // commentary and partial answers are not the answer
                    }
                }
            }
            "error" => {
                let error = &params["error"];
                self.error = Some((
                    category(&error["codexErrorInfo"]),
                    text_of(&error["message"]),
                ));
            }
            "turn/completed" => {
                let turn = &params["turn"];
                let status = turn["status"].as_str().unwrap_or("unknown").to_owned();
                let error = turn.get("error").filter(|e| !e.is_null()).cloned();
                self.completed = Some((status, error));
            }
            _ => {}
        }
    }

    /// The answer: the last final message, else the last unmarked one.
    fn answer(&self) -> Vec<ContentBlock> {
        self.final_answer
            .as_ref()
            .or(self.unmarked_answer.as_ref())
            .filter(|text| !text.trim().is_empty())
            .map(|text| vec![ContentBlock::text(text.as_str())])
            .unwrap_or_default()
    }

    /// How the turn ended, as a run's result.
    fn result(&self, who: &str) -> SubagentResult {
        let output = self.answer();
        let (stop_reason, diagnostic) = match &self.completed {
            _ if self.unanswerable.is_some() => (StopReason::Error, self.unanswerable.clone()),
            Some((status, _)) if status == "completed" => {
                if output.is_empty() {
                    let text = format!("{who} completed its turn without an answer");
                    (StopReason::Error, Some(text))
                } else {
                    (StopReason::Completed, None)
                }
            }
            Some((status, _)) if status == "interrupted" => (
                StopReason::Aborted,
                Some(format!("{who}'s turn was interrupted")),
            ),
            Some((status, error)) => {
                let (category, message) = match error {
                    Some(error) => (
                        category(&error["codexErrorInfo"]),
                        text_of(&error["message"]),
                    ),
                    None => self.error.clone().unwrap_or_else(|| {
                        ("other".to_owned(), format!("the turn ended {status}"))
                    }),
                };
                let reason = if category == "contextWindowExceeded" {
                    StopReason::MaxTokens
                } else {
                    StopReason::Error
                };
                let text = format!("{who} failed ({category}): {message}");
                (reason, Some(bound_diagnostic(&text)))
            }
            None => (
                StopReason::Error,
                Some(format!("{who} did not finish its turn")),
            ),
        };
        result(output, stop_reason, diagnostic)
    }
}

/// Codex's error category: `codexErrorInfo` is a name (`"contextWindowExceeded"`) or an object
/// whose one key is the name (`{"responseTooManyFailedAttempts": {...}}`).
fn category(info: &Value) -> String {
    match info {
        Value::String(name) => name.clone(),
        Value::Object(fields) => fields
            .keys()
            .next()
            .cloned()
            .unwrap_or_else(|| "other".to_owned()),
        _ => "other".to_owned(),
    }
}

/// A JSON-RPC error object for people.
fn rpc_error(error: &Value) -> String {
    match (error.get("message"), error.get("code")) {
        (Some(message), Some(code)) => format!("{} (code {code})", text_of(message)),
        _ => error.to_string(),
    }
}

/// The reason Codex is given when an approval is declined.
const DECLINED: &str = "declined: this run is unattended and nobody can approve it";

/// What an unattended client answers to server request `method`; `None` for a request it
/// cannot answer, which fails the run. Approvals are declined, not cancelled: a declined
/// command lets Codex go on and say what it could not do, where a cancel would end the turn
/// with no answer.
fn unattended_answer(method: &str) -> Option<Value> {
    Some(match method {
        "item/commandExecution/requestApproval" | "item/fileChange/requestApproval" => {
            json!({ "decision": "decline" })
        }
        "item/permissions/requestApproval" => json!({ "permissions": {}, "scope": "turn" }),
        "item/tool/requestUserInput" => json!({ "answers": {} }),
        "mcpServer/elicitation/request" => json!({ "action": "decline" }),
        "execCommandApproval" | "applyPatchApproval" => {
            json!({ "decision": { "denied": { "rejection": DECLINED } } })
        }
        _ => return None,
    })
}

/// The whole start: spawn, `initialize`, `initialized`, `thread/start`, then the run published.
async fn start(
    config: Arc<CodexConfig>,
    delegation: Delegation,
) -> Result<SubagentRun, SubagentError> {
    let Delegation {
        who,
        cwd,
        task,
        cancel,
    } = delegation;
    let cwd = cwd?;
    let link = Link::spawn(who, &config.process, &[OsString::from("app-server")], &cwd)?;
    let connection = Arc::new(Connection {
        link,
        next_id: AtomicU64::new(0),
        thread_id: Mutex::new(None),
        turn_id: Mutex::new(None),
    });
    // Frames that arrive before the turn (warnings, status changes) are read and dropped.
    let mut before = Turn::default();
    let stage = Mutex::new(Stage::Initialize);
    let handshake = async {
        let client = json!({ "name": "lineage", "version": env!("CARGO_PKG_VERSION") });
        connection
            .call("initialize", json!({ "clientInfo": client }), &mut before)
            .await?;
        connection
            .link
            .send(&json!({ "method": "initialized" }))
            .await
            .map_err(|e| format!("cannot send initialized: {e}"))?;
        *Connection::lock(&stage) = Stage::ThreadStart;
        let mut params = json!({
            "cwd": cwd,
            "ephemeral": true,
            "approvalPolicy": config.approval_policy.as_str(),
            "sandbox": config.sandbox.as_str(),
        });
        if let Some(model) = &config.model {
            params["model"] = json!(model);
        }
        let started = connection.call("thread/start", params, &mut before).await?;
        started
            .pointer("/thread/id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("thread/start answered without a thread id: {started}"))
    };
    let thread = connection
        .link
        .handshake(&config.process, &cancel, &stage, handshake)
        .await?;
    *Connection::lock(&connection.thread_id) = Some(thread);
    let run = {
        let connection = connection.clone();
        async move {
            let mut turn = Turn::default();
            let ran = tokio::select! {
                ran = connection.run(task, &mut turn) => ran,
                _ = cancel.cancelled() => {
                    connection.interrupt().await;
                    return Ok(result(turn.answer(), StopReason::Aborted, None));
                }
            };
            Ok(match ran {
                Ok(()) => turn.result(connection.link.who()),
                Err(what) => {
                    let text = connection.link.diagnostic(Stage::Turn, &what).await;
                    result(turn.answer(), StopReason::Error, Some(text))
                }
            })
        }
    };
    Ok(publish(PRODUCT, &config.name, &config.process, connection, run).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(status: &str, error: Value) -> Value {
        json!({ "turn": { "id": "t", "status": status, "error": error } })
    }

    #[test]
    fn the_answer_is_the_last_final_message_else_the_last_unmarked_one() {
        let mut turn = Turn::default();
        let message = |text: &str, phase: Value| json!({ "item": { "type": "agentMessage", "text": text, "phase": phase } });
        turn.notice("item/completed", &message("first", Value::Null));
        turn.notice(
            "item/completed",
            &message("thinking aloud", json!("commentary")),
        );
        turn.notice("item/completed", &message("second", Value::Null));
        assert_eq!(turn.answer(), vec![ContentBlock::text("second")]);
        turn.notice(
            "item/completed",
            &message("the answer", json!("final_answer")),
        );
        turn.notice("item/completed", &message("an afterthought", Value::Null));
        assert_eq!(turn.answer(), vec![ContentBlock::text("the answer")]);
        turn.notice("turn/completed", &completed("completed", Value::Null));
        assert_eq!(turn.result("Codex").stop_reason, StopReason::Completed);
    }

    #[test]
    fn a_context_window_failure_is_max_tokens_and_others_are_errors_with_their_category() {
        let failed = |info: Value| {
            let mut turn = Turn::default();
            let error = json!({ "message": "it broke", "codexErrorInfo": info });
            turn.notice("turn/completed", &completed("failed", error));
            turn.result("Codex (codex)")
        };
        let result = failed(json!("contextWindowExceeded"));
        assert_eq!(result.stop_reason, StopReason::MaxTokens);
        let result = failed(json!({ "responseTooManyFailedAttempts": { "httpStatusCode": 429 } }));
        assert_eq!(result.stop_reason, StopReason::Error);
        assert_eq!(
            result.diagnostic.as_deref(),
            Some("Codex (codex) failed (responseTooManyFailedAttempts): it broke")
        );
    }

    #[test]
    fn a_completed_turn_without_an_answer_and_an_interrupted_one_are_not_completions() {
        let mut turn = Turn::default();
        turn.notice("turn/completed", &completed("completed", Value::Null));
        assert_eq!(turn.result("Codex").stop_reason, StopReason::Error);
        let mut turn = Turn::default();
        turn.notice("turn/completed", &completed("interrupted", Value::Null));
        assert_eq!(turn.result("Codex").stop_reason, StopReason::Aborted);
    }

    #[test]
    fn approvals_are_declined_and_unknown_requests_unanswered() {
        assert_eq!(
            unattended_answer("item/commandExecution/requestApproval"),
            Some(json!({ "decision": "decline" }))
        );
        assert_eq!(
            unattended_answer("mcpServer/elicitation/request"),
            Some(json!({ "action": "decline" }))
        );
        assert_eq!(unattended_answer("item/tool/call"), None);
        assert_eq!(unattended_answer("account/chatgptAuthTokens/refresh"), None);
    }
}
