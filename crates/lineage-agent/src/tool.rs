//! Tools: the [`Tool`] trait, what a call returns, and the per-agent [`Toolset`] with its filter.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use lineage_log::{
    CallId, ContentBlock, Message, SessionId, StepNo, Text, ToolError, ToolFilter, TurnNo,
};

use crate::{Agent, AgentError, Cancellation, ToolSchema};

/// A boxed, sendable future: what trait methods that must stay object-safe return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The error code of a call to a tool the agent does not have or its filter hides.
pub const TOOL_NOT_AVAILABLE: &str = "TOOL_NOT_AVAILABLE";
/// The error code of a call whose arguments are not a JSON document.
pub const INVALID_ARGUMENTS: &str = "INVALID_ARGUMENTS";
/// The error code of a call that was never dispatched because its turn was cancelled first.
pub const ABORTED_BEFORE_DISPATCH: &str = "ABORTED_BEFORE_DISPATCH";
/// The error code of a call whose tool panicked.
pub const TOOL_PANICKED: &str = "TOOL_PANICKED";

/// What a tool call runs with.
#[derive(Clone)]
pub struct ToolContext {
    /// The exact agent that made the call.
    pub agent: Arc<Agent>,
    /// Fires when the calling turn is cancelled. A tool should settle promptly when it fires; the
    /// turn waits for every started call to settle.
    pub cancel: Cancellation,
    /// The call's id, as the model chose it.
    pub call_id: CallId,
    /// The calling turn.
    pub turn: TurnNo,
    /// The calling step.
    pub step: StepNo,
}

impl ToolContext {
    /// The calling session.
    pub fn session(&self) -> SessionId {
        self.agent.id()
    }
}

/// A tool the model can call.
pub trait Tool: Send + Sync + 'static {
    /// The name the model calls it by; unique among an agent's tools.
    fn name(&self) -> &str;
    /// What it does and when to use it, for the model.
    fn description(&self) -> &str;
    /// A JSON Schema of its input.
    fn input_schema(&self) -> serde_json::Value;
    /// Whether this call may run alongside other calls of the same step. Calls that are not run
    /// alone, in model order. The default is `false`: a tool must opt in to parallelism.
    fn parallel_safe(&self, _arguments: &serde_json::Value) -> bool {
        false
    }
    /// Guidance for the system prompt, shown while the tool is visible to the model (so it
    /// leaves with the tool when the tool unmounts). None by default.
    fn guidance(&self) -> Option<&str> {
        None
    }
    /// Whether the tool is mounted now. An unmounted tool is hidden from the model and refused
    /// like a filtered one; a tool that depends on something registered later (a delegation
    /// provider, say) mounts and unmounts with it. The default is always mounted.
    fn available(&self) -> bool {
        true
    }
    /// Runs the call. Failures are results (see [`ToolOutput::error`]), never panics.
    fn call(&self, ctx: ToolContext, arguments: serde_json::Value) -> BoxFuture<'_, ToolOutput>;
}

/// A call's result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    /// What the model reads.
    pub content: Vec<ContentBlock>,
    /// Whether the call failed.
    pub is_error: bool,
    /// A failure's name and code, for programs.
    pub error: Option<ToolError>,
    /// Ends the turn after this step (unless more input for the next step is already waiting).
    pub concludes_turn: bool,
    /// Messages that join the next step of the turn, after every result of this step.
    pub contexts: Vec<Message>,
}

impl ToolOutput {
    /// A successful text result.
    pub fn text(text: impl Into<Text>) -> Self {
        ToolOutput {
            content: vec![ContentBlock::text(text)],
            ..ToolOutput::default()
        }
    }

    /// A failed result: `text` for the model, `name` and `code` for programs.
    pub fn error(name: &str, code: &str, text: impl Into<Text>) -> Self {
        ToolOutput {
            content: vec![ContentBlock::text(text)],
            is_error: true,
            error: Some(ToolError {
                name: name.into(),
                code: code.into(),
            }),
            ..ToolOutput::default()
        }
    }

    /// The same result, ending the turn after its step.
    pub fn concluding(mut self) -> Self {
        self.concludes_turn = true;
        self
    }

    /// The same result, with `message` joining the next step.
    pub fn with_context(mut self, message: Message) -> Self {
        self.contexts.push(message);
        self
    }
}

/// An agent's tools and its filter. The filter hides tools from the model and refuses them when
/// called anyway; a filter that names a tool the set does not have is refused when the set is
/// built, so a typo cannot silently widen or narrow what an agent may do.
#[derive(Clone, Default)]
pub struct Toolset {
    tools: Vec<Arc<dyn Tool>>,
    filter: Option<ToolFilter>,
}

impl std::fmt::Debug for Toolset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolset")
            .field(
                "tools",
                &self.tools.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .field("filter", &self.filter)
            .finish()
    }
}

impl Toolset {
    /// The tools `tools`, filtered by `filter`, for agent `agent` (named in errors).
    pub fn new(
        agent: SessionId,
        tools: Vec<Arc<dyn Tool>>,
        filter: Option<ToolFilter>,
    ) -> Result<Self, AgentError> {
        for (i, tool) in tools.iter().enumerate() {
            if tools[..i].iter().any(|t| t.name() == tool.name()) {
                return Err(AgentError::DuplicateTool {
                    agent,
                    name: tool.name().to_owned(),
                });
            }
        }
        if let Some(filter) = &filter {
            let named = filter.allow.iter().chain(filter.deny.iter()).flatten();
            for name in named {
                if !tools.iter().any(|t| t.name() == name.as_str()) {
                    return Err(AgentError::UnknownTool {
                        agent,
                        name: name.to_string(),
                    });
                }
            }
        }
        Ok(Toolset { tools, filter })
    }

    /// Whether the filter lets the model use `name`.
    pub fn allows(&self, name: &str) -> bool {
        let Some(filter) = &self.filter else {
            return true;
        };
        let allowed = filter
            .allow
            .as_ref()
            .is_none_or(|allow| allow.iter().any(|n| n.as_str() == name));
        let denied = filter
            .deny
            .as_ref()
            .is_some_and(|deny| deny.iter().any(|n| n.as_str() == name));
        allowed && !denied
    }

    /// The tools the filter lets through, mounted or not, in order: what an agent may hand on to
    /// an agent it delegates to, which can then only narrow it.
    pub fn allowed(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.iter().filter(|t| self.allows(t.name()))
    }

    /// The tools the model sees, in order: allowed and mounted.
    pub fn visible(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.allowed().filter(|t| t.available())
    }

    /// The schemas of the visible tools, in order.
    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.visible()
            .map(|t| ToolSchema {
                name: t.name().to_owned(),
                description: t.description().to_owned(),
                parameters: t.input_schema(),
            })
            .collect()
    }

    /// The guidance of the visible tools, in order.
    pub fn guidance(&self) -> Vec<&str> {
        self.visible().filter_map(|t| t.guidance()).collect()
    }

    /// The visible tool called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.visible().find(|t| t.name() == name)
    }

    /// The filter.
    pub fn filter(&self) -> Option<&ToolFilter> {
        self.filter.as_ref()
    }
}

/// The arguments of a call as JSON: an empty string is `{}`, anything else must parse.
pub(crate) fn parse_arguments(raw: &str) -> Result<serde_json::Value, String> {
    if raw.trim().is_empty() {
        return Ok(serde_json::Value::Object(serde_json::Map::new()));
    }
    serde_json::from_str(raw).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str);

    impl Tool for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            "test tool"
        }
        fn input_schema(&self) -> serde_json::Value {
            serde_json::json!({"type": "object"})
        }
        fn call(&self, _: ToolContext, _: serde_json::Value) -> BoxFuture<'_, ToolOutput> {
            Box::pin(async { ToolOutput::text("ok") })
        }
    }

    fn tools(names: &[&'static str]) -> Vec<Arc<dyn Tool>> {
        names
            .iter()
            .map(|n| Arc::new(Named(n)) as Arc<dyn Tool>)
            .collect()
    }

    fn names(set: &Toolset) -> Vec<&str> {
        set.visible().map(|t| t.name()).collect()
    }

    #[test]
    fn allow_and_deny_hide_tools_in_order() {
        let agent = SessionId::new();
        let filter = |allow: Option<&[&str]>, deny: Option<&[&str]>| ToolFilter {
            allow: allow.map(|a| a.iter().map(|n| Text::from(*n)).collect()),
            deny: deny.map(|d| d.iter().map(|n| Text::from(*n)).collect()),
        };
        let all = Toolset::new(agent, tools(&["a", "b", "c"]), None).unwrap();
        assert_eq!(names(&all), ["a", "b", "c"]);
        let allow = Toolset::new(
            agent,
            tools(&["a", "b", "c"]),
            Some(filter(Some(&["c", "a"]), None)),
        )
        .unwrap();
        assert_eq!(names(&allow), ["a", "c"]);
        assert!(allow.get("b").is_none());
        let both = Toolset::new(
            agent,
            tools(&["a", "b", "c"]),
            Some(filter(Some(&["a", "b"]), Some(&["b"]))),
        )
        .unwrap();
        assert_eq!(names(&both), ["a"]);
    }

    #[test]
    fn unknown_and_duplicate_names_are_refused_at_setup() {
        let agent = SessionId::new();
        let typo = ToolFilter {
            allow: None,
            deny: Some(vec![Text::from("shel")]),
        };
        match Toolset::new(agent, tools(&["shell"]), Some(typo)) {
            Err(AgentError::UnknownTool { name, .. }) => assert_eq!(name, "shel"),
            other => panic!("expected UnknownTool, got {other:?}"),
        }
        assert!(matches!(
            Toolset::new(agent, tools(&["a", "a"]), None),
            Err(AgentError::DuplicateTool { .. })
        ));
    }

    #[test]
    fn arguments_parse_as_json_with_empty_meaning_no_arguments() {
        assert_eq!(parse_arguments("").unwrap(), serde_json::json!({}));
        assert_eq!(
            parse_arguments(r#"{"a":1}"#).unwrap(),
            serde_json::json!({"a": 1})
        );
        assert!(parse_arguments("{not json").is_err());
    }
}
