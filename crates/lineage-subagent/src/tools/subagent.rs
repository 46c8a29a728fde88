//! The `subagent` tool: how a model delegates. One instance per configuration, bound to one
//! provider by name; it mounts while that provider is registered.

use std::sync::Arc;

use lineage_agent::{BoxFuture, INVALID_ARGUMENTS, Tool, ToolContext, ToolOutput};
use lineage_log::{ContentBlock, Text, ToolError, ToolFilter};
use serde_json::{Value, json};

use super::{object_schema, refused};
use crate::runtime::Mount;
use crate::{
    ChildOptions, ContinuableRequest, ErrorCode, Provider, StartRequest, StopReason, SubagentError,
    SubagentResult, SubagentRuntime,
};

/// How deep the children this tool starts may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxDepth {
    /// At most this absolute delegation depth; `0` forbids delegating at all.
    Limit(u32),
    /// No limit from the tool: the provider manages its own recursion budget.
    ProviderManaged,
}

impl Default for MaxDepth {
    fn default() -> Self {
        MaxDepth::Limit(3)
    }
}

/// What a delegation runs as when it goes to the background.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackgroundMode {
    /// No background runs: every call waits for a one-shot child.
    #[default]
    OneShot,
    /// A continuable child, by default: the call returns its durable id at once, the runtime
    /// tells the parent when it settles, and `send_message` continues it.
    Continuable,
}

/// How a `subagent` tool is set up.
#[derive(Clone, Debug)]
pub struct SubagentToolConfig {
    /// The provider it delegates to.
    pub provider: String,
    /// The name the model calls it by (default `subagent`).
    pub tool_name: String,
    /// What background runs are (default one-shot: none).
    pub background: BackgroundMode,
    /// Whether the model may choose with `run_in_background` (default true; only offered in
    /// continuable mode).
    pub run_in_background: bool,
    /// Model options for the children.
    pub agent_options: ChildOptions,
    /// A persona for the children.
    pub persona: Option<Text>,
    /// Which tools the children may use.
    pub tool_filter: Option<ToolFilter>,
    /// How deep the children may be (default 3).
    pub max_depth: MaxDepth,
    /// What the tool tells the model it does, in place of the words for a fresh or a forked
    /// child (an out-of-process provider's agent is neither); how the call returns is added.
    pub description: Option<String>,
}

impl SubagentToolConfig {
    /// A tool named `subagent` delegating to `provider`, with the defaults.
    pub fn new(provider: impl Into<String>) -> Self {
        SubagentToolConfig {
            provider: provider.into(),
            tool_name: "subagent".into(),
            background: BackgroundMode::OneShot,
            run_in_background: true,
            agent_options: ChildOptions::default(),
            persona: None,
            tool_filter: None,
            max_depth: MaxDepth::default(),
            description: None,
        }
    }

    /// This row with continuable children ([`BackgroundMode::Continuable`]).
    pub fn continuable(self) -> Self {
        SubagentToolConfig {
            background: BackgroundMode::Continuable,
            ..self
        }
    }

    /// This row with its children on `model` (the other child options unchanged).
    pub fn child_model(mut self, model: impl Into<Text>) -> Self {
        self.agent_options.model = Some(model.into());
        self
    }

    /// The row of an out-of-process provider's agent: a one-shot tool named `tool_name`
    /// delegating to `provider`, its depth left to the provider ([`MaxDepth::ProviderManaged`]),
    /// described to the model as `description`.
    pub fn out_of_process(
        provider: impl Into<String>,
        tool_name: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        SubagentToolConfig {
            tool_name: tool_name.into(),
            background: BackgroundMode::OneShot,
            max_depth: MaxDepth::ProviderManaged,
            description: Some(description.into()),
            ..SubagentToolConfig::new(provider)
        }
    }

    /// The in-process rows a host usually offers: `subagent`, a fresh continuable child
    /// (`spawn`), and `subagent_fork`, a continuable child that sees the conversation (`fork`).
    /// An out-of-process provider brings its own row.
    pub fn in_process_rows() -> Vec<SubagentToolConfig> {
        vec![
            SubagentToolConfig {
                background: BackgroundMode::Continuable,
                ..SubagentToolConfig::new(crate::SpawnProvider::NAME)
            },
            SubagentToolConfig {
                tool_name: "subagent_fork".into(),
                background: BackgroundMode::Continuable,
                ..SubagentToolConfig::new(crate::ForkProvider::NAME)
            },
        ]
    }
}

/// The `subagent` tool.
pub struct SubagentTool {
    runtime: SubagentRuntime,
    config: SubagentToolConfig,
    /// The description for a spawn-like provider, then for a fork-like one.
    descriptions: [String; 2],
    /// The system-prompt guidance of background delegation.
    guidance: String,
}

impl std::fmt::Debug for SubagentTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentTool")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

const SPAWN_DESCRIPTION: &str = "Hands a self-contained task to a subagent: a separate agent with \
its own context, so focused work (research, a scoped change, an analysis) does not fill this \
conversation. You get its result, not its intermediate steps. It cannot see this conversation, so \
the prompt must say everything it needs to know.";

const FORK_DESCRIPTION: &str = "Hands a task to a subagent that starts from this conversation: it \
sees every completed turn so far, but not the turn in progress. Use it for work that builds on \
what has been said (a follow-up analysis, a review, a continuation) without spending this \
conversation's context on it. You get its result, not its intermediate steps.";

const WAITS: &str = " The call waits for the subagent and returns its result.";

const IN_BACKGROUND: &str = " By default it runs in the background: the call returns a durable \
subagent id at once and the child's conversation stays available for later turns. When the run \
settles, the runtime sends you a notice with its outcome and its last message, and `send_message` \
starts another turn of the same conversation. Start independent delegations together in one \
message and keep working while they run; set `run_in_background` to false only when your next \
step needs the result.";

const AS_JOB: &str = " The call waits for the result by default. Set `run_in_background` to \
true to start it as a background job and get its id at once: `job_output` collects its result \
(or tells whether it is still running) and `job_kill` stops it. You are also told when it ends.";

const JOB_PARAM: &str = "Whether to start a background job and return its id at once (default \
false). Collect the result with `job_output`; stop the job with `job_kill`.";

const BACKGROUND_PARAM: &str = "Whether to run in the background and return a durable subagent \
id at once (the default). Set false to wait for the result when your next step depends on it.";

const SPAWN_PROMPT: &str = "The whole task for the subagent. It does not see this conversation, \
so include everything it needs.";

const FORK_PROMPT: &str = "The task for the subagent. It already sees this conversation's \
completed turns, so build on them and say only what is new.";

const LABEL: &str = "A short description of the task (three to five words), shown to people.";

impl SubagentTool {
    /// A tool over `runtime` set up by `config`. Refused when its tool filter names neither
    /// allowed nor denied tools, or when its provider is already registered and cannot work
    /// with it; while it lives, registering a provider it cannot work with is refused too.
    pub fn new(
        runtime: &SubagentRuntime,
        config: SubagentToolConfig,
    ) -> Result<Arc<Self>, SubagentError> {
        crate::birth::check_tool_filter(
            config.tool_filter.as_ref(),
            &format!("the {:?} tool", config.tool_name),
        )?;
        let suffix = match (config.background, config.run_in_background) {
            (BackgroundMode::Continuable, true) => IN_BACKGROUND,
            (BackgroundMode::OneShot, true) => AS_JOB,
            (_, false) => WAITS,
        };
        let tool = Arc::new(SubagentTool {
            runtime: runtime.clone(),
            descriptions: match &config.description {
                Some(own) => [format!("{own}{suffix}"), format!("{own}{suffix}")],
                None => [
                    format!("{SPAWN_DESCRIPTION}{suffix}"),
                    format!("{FORK_DESCRIPTION}{suffix}"),
                ],
            },
            guidance: format!(
                "Run `{0}` in the background by default: start independent delegations together \
                 in one message and keep working while they run. Set `run_in_background` to false \
                 only when your next step needs that subagent's result. When a background run \
                 settles, you get a notice with its outcome and its last message.",
                config.tool_name
            ),
            config,
        });
        if let Some(provider) = runtime.provider(&tool.config.provider) {
            tool.check(provider.as_ref())?;
        } else {
            tracing::info!(
                provider = %tool.config.provider,
                tool = %tool.config.tool_name,
                "the delegation tool will mount when its provider is registered"
            );
        }
        let mount: Arc<dyn Mount> = tool.clone();
        runtime.add_mount(Arc::downgrade(&mount));
        Ok(tool)
    }

    /// The configuration.
    pub fn config(&self) -> &SubagentToolConfig {
        &self.config
    }

    /// Whether the model may choose to run in the background: as a continuable child, or as a
    /// one-shot background job.
    fn offers_background(&self) -> bool {
        self.config.run_in_background
    }

    fn continuable(&self) -> bool {
        self.config.background == BackgroundMode::Continuable
    }

    fn inherits(&self) -> bool {
        self.runtime
            .provider(&self.config.provider)
            .is_some_and(|p| p.inherits_parent_context())
    }

    fn request(&self, ctx: &ToolContext, label: &str, prompt: &str) -> StartRequest {
        StartRequest {
            label: Some(label.into()),
            cancel: ctx.cancel.clone(),
            agent_options: self.config.agent_options.clone(),
            max_depth: match self.config.max_depth {
                MaxDepth::Limit(n) => Some(n),
                MaxDepth::ProviderManaged => None,
            },
            tool_filter: self.config.tool_filter.clone(),
            persona: self.config.persona.clone(),
            ..StartRequest::new(ctx.agent.clone(), prompt)
        }
    }

    async fn background(&self, request: StartRequest) -> ToolOutput {
        if !self.continuable() {
            return match self.runtime.start_job(&self.config.provider, request).await {
                Ok(job) => ToolOutput::text(format!(
                    "Started background job {job}. Collect its result with `job_output`; you \
                     will also be told when it ends."
                )),
                Err(error) => refused(&error),
            };
        }
        let StartRequest {
            parent,
            prompt,
            label,
            cancel,
            agent_options,
            max_depth,
            tool_filter,
            persona,
            output_schema: _,
        } = request;
        let request = ContinuableRequest {
            parent,
            prompt,
            label: label.unwrap_or_default(),
            child: None,
            cancel,
            agent_options,
            max_depth,
            tool_filter,
            persona,
            hooks: None,
        };
        match self
            .runtime
            .start_continuable(&self.config.provider, request)
            .await
        {
            Ok(started) => ToolOutput::text(format!(
                "Started subagent {}. You will get a notice when it settles.",
                started.child
            )),
            Err(error) => refused(&error),
        }
    }

    async fn foreground(&self, request: StartRequest) -> ToolOutput {
        let run = match self.runtime.start(&self.config.provider, request).await {
            Ok(run) => run,
            Err(error) => return refused(&error),
        };
        let result = run.result().await;
        let disposed = run.dispose().await;
        match (result, disposed) {
            (Ok(result), Ok(())) => render(&result),
            (Err(result), Err(dispose)) => refused(&SubagentError::new(
                result.code(),
                format!("subagent run failed: {result}; dispose failed: {dispose}"),
            )),
            (Ok(result), Err(dispose)) => with_failed_disposal(render(&result), &dispose),
            (Err(error), Ok(())) => refused(&error),
        }
    }
}

/// `output`, the run's own report, followed by the news that disposing of the run failed. The
/// report is never replaced: a run that failed keeps its code, and one that completed keeps its
/// output but fails with the disposal's code.
fn with_failed_disposal(mut output: ToolOutput, dispose: &SubagentError) -> ToolOutput {
    let note = format!("Disposing of the subagent run failed afterwards: {dispose}");
    let mut text = String::new();
    for block in &output.content {
        if let ContentBlock::Text { text: t } = block {
            text.push_str(t);
        }
    }
    text.push('\n');
    text.push_str(&note);
    output.content = vec![ContentBlock::text(text)];
    if !output.is_error {
        output.is_error = true;
        output.error = Some(ToolError {
            name: "SubagentError".into(),
            code: dispose.code().as_str().into(),
        });
    }
    output
}

/// A finished run, as the model reads it: the output when it completed, otherwise why it did
/// not, its diagnostic and whatever it wrote before it stopped.
pub(crate) fn render(result: &SubagentResult) -> ToolOutput {
    let text = result.text();
    if result.stop_reason.is_success() {
        return ToolOutput::text(if text.is_empty() {
            "The subagent finished without a written answer.".to_owned()
        } else {
            text
        });
    }
    let mut message = match &result.stop_reason {
        StopReason::Aborted => "The subagent run was cancelled.".to_owned(),
        StopReason::Error => "The subagent run failed.".to_owned(),
        StopReason::MaxTokens => {
            "The subagent ran out of output tokens before it finished.".to_owned()
        }
        StopReason::Refusal => "The subagent declined the task.".to_owned(),
        StopReason::Budget => "The subagent reached its budget before it finished.".to_owned(),
        other => format!("The subagent run ended abnormally ({other})."),
    };
    if let Some(diagnostic) = &result.diagnostic {
        message.push_str("\nDiagnostic: ");
        message.push_str(diagnostic);
    }
    if !text.is_empty() {
        message.push_str("\nWhat it wrote before it stopped:\n");
        message.push_str(&text);
    }
    ToolOutput::error("SubagentRunFailed", result.stop_reason.as_str(), message)
}

impl Mount for SubagentTool {
    fn provider_name(&self) -> &str {
        &self.config.provider
    }

    fn check(&self, provider: &dyn Provider) -> Result<(), SubagentError> {
        if matches!(self.config.max_depth, MaxDepth::Limit(_))
            && !provider.capabilities().depth_limit
        {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!(
                    "the {:?} tool: provider {:?} cannot enforce a maximum depth (no depth_limit \
                     capability); configure MaxDepth::ProviderManaged to leave depth to the \
                     provider",
                    self.config.tool_name,
                    provider.name()
                ),
            ));
        }
        if self.config.background == BackgroundMode::Continuable && provider.continuable().is_none()
        {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!(
                    "the {:?} tool: provider {:?} cannot run continuable children",
                    self.config.tool_name,
                    provider.name()
                ),
            ));
        }
        Ok(())
    }
}

impl Tool for SubagentTool {
    fn name(&self) -> &str {
        &self.config.tool_name
    }

    fn description(&self) -> &str {
        &self.descriptions[usize::from(self.inherits())]
    }

    fn input_schema(&self) -> Value {
        let prompt = if self.inherits() {
            FORK_PROMPT
        } else {
            SPAWN_PROMPT
        };
        let mut schema = object_schema(
            json!({
                "description": {"type": "string", "description": LABEL},
                "prompt": {"type": "string", "description": prompt},
            }),
            &["description", "prompt"],
        );
        if self.offers_background() {
            let description = if self.continuable() {
                BACKGROUND_PARAM
            } else {
                JOB_PARAM
            };
            schema["properties"]["run_in_background"] =
                json!({"type": "boolean", "description": description});
        }
        schema
    }

    fn parallel_safe(&self, _: &Value) -> bool {
        true
    }

    fn guidance(&self) -> Option<&str> {
        (self.offers_background() && self.continuable()).then_some(self.guidance.as_str())
    }

    fn available(&self) -> bool {
        self.runtime
            .provider(&self.config.provider)
            .is_some_and(|p| self.check(p.as_ref()).is_ok())
    }

    fn call(&self, ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let text = |key: &str| {
                arguments
                    .get(key)
                    .and_then(Value::as_str)
                    .filter(|s| !s.trim().is_empty())
            };
            let (Some(label), Some(prompt)) = (text("description"), text("prompt")) else {
                return ToolOutput::error(
                    "SubagentError",
                    INVALID_ARGUMENTS,
                    "both `description` and `prompt` must be non-empty strings",
                );
            };
            // Without the switch on offer, every call waits, as the description says.
            let background = match arguments.get("run_in_background") {
                // By default a continuable child runs in the background; a one-shot run waits.
                None | Some(Value::Null) => self.offers_background() && self.continuable(),
                Some(Value::Bool(wanted)) if self.offers_background() || !wanted => *wanted,
                Some(Value::Bool(_)) => {
                    return ToolOutput::error(
                        "SubagentError",
                        INVALID_ARGUMENTS,
                        "this tool does not run subagents in the background",
                    );
                }
                Some(_) => {
                    return ToolOutput::error(
                        "SubagentError",
                        INVALID_ARGUMENTS,
                        "`run_in_background` must be true or false",
                    );
                }
            };
            let request = self.request(&ctx, label, prompt);
            if background {
                self.background(request).await
            } else {
                self.foreground(request).await
            }
        })
    }
}
