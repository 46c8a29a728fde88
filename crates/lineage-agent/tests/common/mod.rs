//! Shared test harness: a store in a temporary directory, a scripted model, a registry, tools
//! built from closures, and readers of the log.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;

use lineage_agent::{
    Agent, AgentEvent, AgentOptions, AgentSpec, AgentStatus, Agents, BoxFuture, CreateAgent,
    Response, ScriptedModel, Tool, ToolContext, ToolOutput,
};
use lineage_log::{
    ContentBlock, Event, EventBody, EventKind, Message, MessageSource, TurnEndReason, check_seed,
    is_balanced,
};
use lineage_store::Store;
use tempfile::TempDir;
use tokio::sync::mpsc::UnboundedReceiver;

pub struct Harness {
    pub dir: TempDir,
    pub store: Store,
    pub model: Arc<ScriptedModel>,
    pub agents: Agents,
}

impl Harness {
    pub fn new(script: impl IntoIterator<Item = Response>) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path().join("agents.lineage")).expect("the store opens");
        let model = ScriptedModel::new(script);
        let agents = Agents::new(store.clone(), model.clone());
        Harness {
            dir,
            store,
            model,
            agents,
        }
    }

    pub async fn agent(&self) -> Arc<Agent> {
        self.agent_with(spec()).await
    }

    pub async fn agent_with(&self, spec: AgentSpec) -> Arc<Agent> {
        self.agents
            .create(CreateAgent::fresh(spec))
            .await
            .expect("the agent is created")
    }
}

/// A spec naming the scripted model.
pub fn spec() -> AgentSpec {
    AgentSpec {
        options: options(),
        ..AgentSpec::default()
    }
}

pub fn options() -> AgentOptions {
    AgentOptions {
        endpoint: Some("scripted".into()),
        model: Some("test-model".into()),
        max_tokens: Some(1024),
        subagent_depth: 0,
    }
}

pub fn spec_with_tools(tools: Vec<Arc<dyn Tool>>) -> AgentSpec {
    AgentSpec { tools, ..spec() }
}

pub fn user(text: &str) -> Message {
    Message::user_text(text, MessageSource::User)
}

/// The display names of `events`.
pub fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().name()).collect()
}

/// The display names of the agent's events from `from` on.
pub fn kinds_from(agent: &Agent, from: usize) -> Vec<&'static str> {
    agent.with_events(|events| kinds(&events[from.min(events.len())..]))
}

pub fn turn_ends(events: &[Event]) -> Vec<TurnEndReason> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TurnEnd(end) => Some(end.reason.clone()),
            _ => None,
        })
        .collect()
}

/// The texts of the user messages that entered the history, in order.
pub fn user_texts(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserMessage(m) => Some(m.text()),
            _ => None,
        })
        .collect()
}

/// The texts of the assistant messages, in order.
pub fn assistant_texts(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AssistantMessage(m) => Some(m.message.text()),
            _ => None,
        })
        .collect()
}

/// The tool results: (call id, text, error code), in order.
pub fn tool_results(events: &[Event]) -> Vec<(String, String, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolResult(r) => {
                let (call, text) = match r.message.content.as_slice() {
                    [
                        ContentBlock::ToolResult {
                            tool_call_id,
                            content,
                            ..
                        },
                    ] => (
                        tool_call_id.to_string(),
                        content
                            .iter()
                            .filter_map(|b| match b {
                                ContentBlock::Text { text } => Some(text.to_string()),
                                _ => None,
                            })
                            .collect::<String>(),
                    ),
                    _ => panic!("a tool result holds one tool-result block"),
                };
                Some((call, text, r.error.as_ref().map(|e| e.code.to_string())))
            }
            _ => None,
        })
        .collect()
}

/// Asserts the log keeps the seed contract (every event valid where it stands) and is balanced.
pub fn assert_balanced(events: &[Event]) {
    check_seed(events).expect("the log is valid");
    assert!(
        is_balanced(events),
        "the log ends with an open turn: {:?}",
        kinds(events)
    );
}

/// Asserts the store holds exactly the agent's events.
pub fn assert_stored(store: &Store, agent: &Agent) {
    let stored = store
        .read_from(agent.id(), 0)
        .expect("the session is stored");
    assert_eq!(stored, agent.events(), "the store mirrors the agent's log");
}

/// Receives events until `pred` matches one, returning it. Panics if the stream ends first.
pub async fn wait_for(
    rx: &mut UnboundedReceiver<AgentEvent>,
    mut pred: impl FnMut(&AgentEvent) -> bool,
) -> AgentEvent {
    loop {
        match rx.recv().await {
            Some(event) if pred(&event) => return event,
            Some(_) => {}
            None => panic!("the agent's event stream ended"),
        }
    }
}

/// Waits until the agent appends an event of `kind`.
pub async fn wait_appended(rx: &mut UnboundedReceiver<AgentEvent>, kind: EventKind) -> Event {
    match wait_for(
        rx,
        |e| matches!(e, AgentEvent::Appended { event, .. } if event.kind() == kind),
    )
    .await
    {
        AgentEvent::Appended { event, .. } => event,
        _ => unreachable!(),
    }
}

/// Every status the stream has reported so far (without waiting).
pub fn statuses(rx: &mut UnboundedReceiver<AgentEvent>) -> Vec<AgentStatus> {
    let mut out = Vec::new();
    while let Ok(event) = rx.try_recv() {
        if let AgentEvent::Status { status, .. } = event {
            out.push(status);
        }
    }
    out
}

type ToolFn =
    dyn Fn(ToolContext, serde_json::Value) -> BoxFuture<'static, ToolOutput> + Send + Sync;

/// A tool whose call is a closure.
pub struct FnTool {
    name: &'static str,
    parallel: bool,
    call: Box<ToolFn>,
}

impl FnTool {
    pub fn new<F, Fut>(name: &'static str, call: F) -> Arc<Self>
    where
        F: Fn(ToolContext, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutput> + Send + 'static,
    {
        Arc::new(FnTool {
            name,
            parallel: false,
            call: Box::new(move |ctx, args| Box::pin(call(ctx, args))),
        })
    }

    pub fn parallel<F, Fut>(name: &'static str, call: F) -> Arc<Self>
    where
        F: Fn(ToolContext, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutput> + Send + 'static,
    {
        Arc::new(FnTool {
            name,
            parallel: true,
            call: Box::new(move |ctx, args| Box::pin(call(ctx, args))),
        })
    }
}

impl Tool for FnTool {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        "a test tool"
    }

    fn input_schema(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }

    fn parallel_safe(&self, _: &serde_json::Value) -> bool {
        self.parallel
    }

    fn call(&self, ctx: ToolContext, arguments: serde_json::Value) -> BoxFuture<'_, ToolOutput> {
        (self.call)(ctx, arguments)
    }
}

/// A tool that answers with its arguments, as text.
pub fn echo() -> Arc<dyn Tool> {
    FnTool::new("echo", |_, args| async move {
        ToolOutput::text(args.to_string())
    })
}
