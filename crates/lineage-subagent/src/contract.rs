//! The provider contract: what a delegation provider can do, what a start request asks for, and
//! the run it hands back.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lineage_agent::{Agent, Agents, BoxFuture, Cancellation};
use lineage_log::{ContentBlock, Event, SessionId, SubagentDescriptor, Text, ToolFilter};
use tokio::sync::watch;

use crate::SubagentError;

/// The options of a one-shot start a provider supports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// A structured result checked against a JSON Schema.
    pub output_schema: bool,
    /// A maximum delegation depth.
    pub depth_limit: bool,
    /// A tool filter for the child.
    pub tool_filter: bool,
    /// A persona for the child.
    pub persona: bool,
}

impl Capabilities {
    /// Every capability.
    pub const ALL: Capabilities = Capabilities {
        output_schema: true,
        depth_limit: true,
        tool_filter: true,
        persona: true,
    };

    /// No capability.
    pub const NONE: Capabilities = Capabilities {
        output_schema: false,
        depth_limit: false,
        tool_filter: false,
        persona: false,
    };

    /// Whether `capability` is supported.
    pub fn supports(&self, capability: Capability) -> bool {
        match capability {
            Capability::OutputSchema => self.output_schema,
            Capability::DepthLimit => self.depth_limit,
            Capability::ToolFilter => self.tool_filter,
            Capability::Persona => self.persona,
        }
    }
}

/// One start-time capability, named in [`crate::ErrorCode::UnsupportedCapability`] errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// `output_schema`.
    OutputSchema,
    /// `depth_limit` (the request's `max_depth`).
    DepthLimit,
    /// `tool_filter`.
    ToolFilter,
    /// `persona`.
    Persona,
}

impl Capability {
    /// The capability's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Capability::OutputSchema => "output_schema",
            Capability::DepthLimit => "depth_limit",
            Capability::ToolFilter => "tool_filter",
            Capability::Persona => "persona",
        }
    }
}

/// Model options a request may set for its child; unset fields inherit the parent's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChildOptions {
    /// The child's model endpoint.
    pub endpoint: Option<Text>,
    /// The child's model.
    pub model: Option<Text>,
    /// The child's output-token limit per request.
    pub max_tokens: Option<u32>,
}

/// A request to start a child.
#[derive(Clone)]
pub struct StartRequest {
    /// The delegating agent: the exact live `Arc`.
    pub parent: Arc<Agent>,
    /// The child's task.
    pub prompt: Vec<ContentBlock>,
    /// A label for people.
    pub label: Option<Text>,
    /// The caller's cancellation: when it fires, the child is cancelled too.
    pub cancel: Cancellation,
    /// Model options for the child.
    pub agent_options: ChildOptions,
    /// An object-rooted JSON Schema the child's structured result must match.
    pub output_schema: Option<serde_json::Value>,
    /// The deepest delegation depth the child may have.
    pub max_depth: Option<u32>,
    /// Which of the parent's tools the child may use.
    pub tool_filter: Option<ToolFilter>,
    /// A persona that replaces the host's for the child.
    pub persona: Option<Text>,
}

impl StartRequest {
    /// A request from `parent` to do `prompt`, with nothing else set and a fresh cancellation.
    pub fn new(parent: Arc<Agent>, prompt: impl Into<Text>) -> Self {
        StartRequest {
            parent,
            prompt: vec![ContentBlock::text(prompt)],
            label: None,
            cancel: Cancellation::new(),
            agent_options: ChildOptions::default(),
            output_schema: None,
            max_depth: None,
            tool_filter: None,
            persona: None,
        }
    }
}

impl std::fmt::Debug for StartRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartRequest")
            .field("parent", &self.parent.id())
            .field("label", &self.label)
            .field("agent_options", &self.agent_options)
            .field("max_depth", &self.max_depth)
            .field("tool_filter", &self.tool_filter)
            .finish_non_exhaustive()
    }
}

/// The policy a parent fixes on its child, captured synchronously when the delegation is asked
/// for, so a later switch of the parent does not reach the child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelegatedPolicy {
    /// The parent's explicit sandbox override, if it has one (never a host default).
    pub sandbox: Option<Text>,
    /// The approval policy pinned on the child: approvals are never asked for.
    pub approval: Text,
}

/// A validated start request, as a provider receives it.
#[derive(Clone, Debug)]
pub struct ResolvedStart {
    /// The request.
    pub request: StartRequest,
    /// The child's descriptor (mode one-shot, the provider's name, the label).
    pub descriptor: SubagentDescriptor,
    /// The parent's policy, captured when the delegation was asked for.
    pub policy: DelegatedPolicy,
    /// The registry the parent lives in, where the child is created.
    pub agents: Agents,
}

/// A request to prepare a continuable child (see [`PrepareContinuable`]).
#[derive(Clone)]
pub struct ContinuableCreate {
    /// The id reserved for the child.
    pub child: SessionId,
    /// The delegating agent.
    pub parent: Arc<Agent>,
}

/// What a continuable child starts from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContinuableSpec {
    /// Where to fork the parent: the inclusive seq of the last `turn/end` of its completed-turn
    /// prefix. `None` starts the child fresh.
    pub fork_at: Option<u64>,
}

/// A provider's continuable support. Its presence ([`Provider::continuable`]) is the capability.
pub trait PrepareContinuable: Send + Sync {
    /// Decides the child's seed. Called synchronously when the delegation is asked for, so what
    /// it captures from the parent is the parent as it was then.
    fn prepare(&self, request: &ContinuableCreate) -> Result<ContinuableSpec, SubagentError>;
}

/// A delegation provider: creates children for a parent.
pub trait Provider: Send + Sync + 'static {
    /// The name delegations select it by.
    fn name(&self) -> &str;
    /// The one-shot options it supports: by default none of them (a child outside the process
    /// takes only the prompt).
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }
    /// Whether its child sees the parent's conversation (a fork) or starts fresh (a spawn). It
    /// only shapes how the delegation tool describes itself. By default a child starts fresh.
    fn inherits_parent_context(&self) -> bool {
        false
    }
    /// Starts a one-shot child. Called synchronously at delegation time: anything the provider
    /// reads from the parent before returning the future is the parent as it was then.
    fn start(
        &self,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>>;
    /// Its continuable support, if any.
    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        None
    }
}

/// How a child's run ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The child finished its task.
    Completed,
    /// The child was cancelled.
    Aborted,
    /// The child failed.
    Error,
    /// The child ran out of output tokens.
    MaxTokens,
    /// The child declined the task (a hook or policy blocked it).
    Refusal,
    /// A budget in force (the child's own, or one that binds its delegation tree) reached a
    /// limit.
    Budget,
    /// A reason this version does not know, from another provider; treated as a failure.
    Other(Text),
}

impl StopReason {
    /// The reason's name.
    pub fn as_str(&self) -> &str {
        match self {
            StopReason::Completed => "completed",
            StopReason::Aborted => "aborted",
            StopReason::Error => "error",
            StopReason::MaxTokens => "max-tokens",
            StopReason::Refusal => "refusal",
            StopReason::Budget => "budget",
            StopReason::Other(other) => other,
        }
    }

    /// Whether the run succeeded: only `completed` does.
    pub fn is_success(&self) -> bool {
        *self == StopReason::Completed
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The most bytes a result's diagnostic holds.
pub const MAX_DIAGNOSTIC_BYTES: usize = 4096;

/// What a child's run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct SubagentResult {
    /// The child's final output (its last assistant message with content).
    pub output: Vec<ContentBlock>,
    /// The structured result, when the request asked for one and the child gave it.
    pub structured: Option<serde_json::Value>,
    /// Why the run failed, for people: at most [`MAX_DIAGNOSTIC_BYTES`].
    pub diagnostic: Option<String>,
    /// How the run ended.
    pub stop_reason: StopReason,
}

impl SubagentResult {
    /// The output's text blocks, joined.
    pub fn text(&self) -> String {
        output_text(&self.output)
    }
}

/// The text blocks of `output`, joined.
pub(crate) fn output_text(output: &[ContentBlock]) -> String {
    let mut text = String::new();
    for block in output {
        if let ContentBlock::Text { text: t } = block {
            text.push_str(t);
        }
    }
    text
}

/// `diagnostic` cut to [`MAX_DIAGNOSTIC_BYTES`] at a character boundary, with a marker when cut.
pub fn bound_diagnostic(diagnostic: &str) -> String {
    const MARK: &str = "\n[diagnostic truncated]";
    if diagnostic.len() <= MAX_DIAGNOSTIC_BYTES {
        return diagnostic.to_owned();
    }
    let mut end = MAX_DIAGNOSTIC_BYTES - MARK.len();
    while !diagnostic.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &diagnostic[..end])
}

/// The working directory of a child in another process: `configured`, else the delegating
/// agent's (its session's `cwd`). Either must be an absolute path to a directory: a child never
/// runs in the host's own working directory by accident. The error is a sentence for people.
pub fn child_working_directory(
    configured: Option<&Path>,
    parent: &Agent,
) -> Result<PathBuf, String> {
    let cwd = match (configured, &parent.header().cwd) {
        (Some(cwd), _) => cwd.to_path_buf(),
        (None, Some(cwd)) => PathBuf::from(cwd.as_str()),
        (None, None) => {
            return Err(format!(
                "agent {} has no working directory and the provider names none",
                parent.id()
            ));
        }
    };
    if !cwd.is_absolute() || !cwd.is_dir() {
        return Err(format!(
            "the working directory {} is not an absolute path to a directory",
            cwd.display()
        ));
    }
    Ok(cwd)
}

type RunOutcome = Option<Result<SubagentResult, SubagentError>>;
type DisposeFn = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), SubagentError>> + Send>;
type Disposal = watch::Receiver<Option<Result<(), SubagentError>>>;

struct RunInner {
    id: SessionId,
    local: Option<Arc<Agent>>,
    result: watch::Receiver<RunOutcome>,
    dispose: Mutex<Option<DisposeFn>>,
    disposed: Mutex<Option<Disposal>>,
}

/// A started child: its id, the local agent when it runs in this process, its result and its
/// disposal. Clones share the run.
#[derive(Clone)]
pub struct SubagentRun {
    inner: Arc<RunInner>,
}

impl std::fmt::Debug for SubagentRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentRun")
            .field("id", &self.inner.id)
            .field("local", &self.inner.local.is_some())
            .finish_non_exhaustive()
    }
}

impl SubagentRun {
    /// A run of child `id` whose outcome is `result` (driven on its own task from now on) and
    /// whose teardown is `dispose` (called at most once).
    ///
    /// `result` resolves for every way the child itself can end, failures included; an `Err`
    /// means the infrastructure failed.
    pub fn new<R, D>(id: SessionId, local: Option<Arc<Agent>>, result: R, dispose: D) -> Self
    where
        R: Future<Output = Result<SubagentResult, SubagentError>> + Send + 'static,
        D: FnOnce() -> BoxFuture<'static, Result<(), SubagentError>> + Send + 'static,
    {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            tx.send_replace(Some(result.await));
        });
        SubagentRun {
            inner: Arc::new(RunInner {
                id,
                local,
                result: rx,
                dispose: Mutex::new(Some(Box::new(dispose))),
                disposed: Mutex::new(None),
            }),
        }
    }

    /// The child's id (its session id, for a local run).
    pub fn id(&self) -> SessionId {
        self.inner.id
    }

    /// The child agent, when it runs in this process.
    pub fn local_agent(&self) -> Option<&Arc<Agent>> {
        self.inner.local.as_ref()
    }

    /// Waits for the run's outcome. Every caller gets the same outcome.
    ///
    /// Cancel safety: safe to drop; the run goes on and a later call gets the same result. To stop
    /// the run, fire the start request's cancellation or call [`SubagentRun::dispose`].
    pub async fn result(&self) -> Result<SubagentResult, SubagentError> {
        // The sender is dropped only after sending, unless the task driving the result panicked.
        settled(self.inner.result.clone(), || {
            self.failure("the run stopped without a result")
        })
        .await
    }

    /// Tears the run down: cancels the child if it is still working, waits for it and for the
    /// result, and releases it. Idempotent: every caller shares the first disposal and its
    /// outcome, which is the teardown's (a failed result is reported by [`Self::result`]).
    ///
    /// Cancel safety: once started, the disposal is shared by every caller; dropping this future
    /// stops only the wait.
    pub async fn dispose(&self) -> Result<(), SubagentError> {
        let done = {
            let mut disposed = crate::lock(&self.inner.disposed);
            match &*disposed {
                Some(done) => done.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    *disposed = Some(rx.clone());
                    let dispose = crate::lock(&self.inner.dispose).take();
                    let mut result = self.inner.result.clone();
                    // On its own task, so a caller that stops waiting cannot leave it half done.
                    // The run is disposed once its teardown is done and its result is in.
                    tokio::spawn(async move {
                        let outcome = match dispose {
                            Some(dispose) => dispose().await,
                            None => Ok(()),
                        };
                        let _ = result.wait_for(Option::is_some).await;
                        tx.send_replace(Some(outcome));
                    });
                    rx
                }
            }
        };
        settled(done, || self.failure("disposal stopped without an outcome")).await
    }

    /// A failure of this run's machinery, `what` saying which.
    fn failure(&self, what: &str) -> SubagentError {
        SubagentError::new(
            crate::ErrorCode::AgentFailure,
            format!("subagent {}: {what}", self.inner.id),
        )
    }
}

/// The last `turn/end` of `events`: where a fork of them may start.
pub(crate) fn completed_boundary(events: &[Event]) -> Option<u64> {
    lineage_log::completed_turn_prefix(events)
        .last()
        .map(|event| event.seq)
}

/// The outcome `outcome` carries, once it carries one; `stopped()` when its sender is gone
/// without one (the task that was to send it panicked).
pub(crate) async fn settled<T: Clone>(
    mut outcome: watch::Receiver<Option<Result<T, SubagentError>>>,
    stopped: impl FnOnce() -> SubagentError,
) -> Result<T, SubagentError> {
    match outcome.wait_for(Option::is_some).await.as_deref() {
        Ok(Some(outcome)) => outcome.clone(),
        _ => Err(stopped()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_are_bounded_at_a_character_boundary() {
        assert_eq!(bound_diagnostic("short"), "short");
        let long = "é".repeat(3000); // 6000 bytes
        let bounded = bound_diagnostic(&long);
        assert!(bounded.len() <= MAX_DIAGNOSTIC_BYTES);
        assert!(bounded.ends_with("\n[diagnostic truncated]"));
        let exact = "a".repeat(MAX_DIAGNOSTIC_BYTES);
        assert_eq!(bound_diagnostic(&exact), exact);
    }

    #[test]
    fn only_completed_is_success() {
        assert!(StopReason::Completed.is_success());
        for reason in [
            StopReason::Aborted,
            StopReason::Error,
            StopReason::MaxTokens,
            StopReason::Refusal,
            StopReason::Budget,
            StopReason::Other("timeout".into()),
        ] {
            assert!(!reason.is_success(), "{reason}");
        }
        assert_eq!(StopReason::Other("timeout".into()).as_str(), "timeout");
    }
}
