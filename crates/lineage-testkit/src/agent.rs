//! The agent harness (feature `agent`): a store in a temporary directory, a scripted model and a
//! registry over them, tools built from closures, and waits on an agent's event stream.
//!
//! `use lineage_testkit::agent::*` brings the log readers of [`crate::read`] along.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lineage_agent::{
    Agent, AgentEvent, AgentOptions, AgentSpec, AgentStatus, Agents, BoxFuture, CreateAgent,
    Response, ScriptedModel, Tool, ToolContext, ToolOutput,
};
use lineage_log::{Event, EventKind, Header, Message, MessageSource, SessionId};
use lineage_store::Store;
use tempfile::TempDir;
use tokio::sync::mpsc::UnboundedReceiver;

pub use crate::read::*;

/// A registry over a fresh store file in a temporary directory, whose model is one scripted
/// model. The directory (and so the file) lives as long as the harness.
pub struct Harness {
    /// The temporary directory holding `agents.lineage`.
    pub dir: TempDir,
    /// The store over `dir/agents.lineage`, shared with `agents`.
    pub store: Store,
    /// The model every agent of `agents` asks.
    pub model: Arc<ScriptedModel>,
    /// The registry.
    pub agents: Agents,
}

impl Harness {
    /// A harness whose model answers with `script`, one response per request, in order.
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

    /// A fresh agent with [`spec`].
    pub async fn agent(&self) -> Arc<Agent> {
        self.agent_with(spec()).await
    }

    /// A fresh agent with `spec`; panics if the registry refuses it.
    pub async fn agent_with(&self, spec: AgentSpec) -> Arc<Agent> {
        self.agents
            .create(CreateAgent::fresh(spec))
            .await
            .expect("the agent is created")
    }
}

/// A spec with [`options`] and no tools.
pub fn spec() -> AgentSpec {
    AgentSpec {
        options: options(),
        ..AgentSpec::default()
    }
}

/// Options naming the scripted endpoint and `test-model`, 1024 tokens, depth 0.
pub fn options() -> AgentOptions {
    AgentOptions {
        endpoint: Some("scripted".into()),
        model: Some("test-model".into()),
        max_tokens: Some(1024),
        subagent_depth: 0,
    }
}

/// [`spec`] with `tools`.
pub fn spec_with_tools(tools: Vec<Arc<dyn Tool>>) -> AgentSpec {
    AgentSpec { tools, ..spec() }
}

/// A fresh agent with [`spec`] whose header names `id` (created at a fixed time), for tests that
/// need to know or reuse the id before the agent exists.
pub fn fresh_with_id(id: SessionId) -> CreateAgent {
    let mut create = CreateAgent::fresh(spec());
    create.header = Header::new(id, 1_780_000_000_000);
    create
}

/// A user-typed text message.
pub fn user(text: &str) -> Message {
    Message::user_text(text, MessageSource::User)
}

/// The display names of the agent's events from index `from` on (none when `from` is past the
/// end).
pub fn kinds_from(agent: &Agent, from: usize) -> Vec<&'static str> {
    agent.with_events(|events| kinds(&events[from.min(events.len())..]))
}

/// The tool results of `events` as `(call id, text, error code)`, in order (see
/// [`tool_answers`] for the full answers).
pub fn tool_results(events: &[Event]) -> Vec<(String, String, Option<String>)> {
    tool_answers(events)
        .into_iter()
        .map(|a| (a.call, a.text, a.code))
        .collect()
}

/// Asserts the store holds exactly the agent's events.
pub fn assert_stored(store: &Store, agent: &Agent) {
    let stored = store
        .read_from(agent.id(), 0)
        .expect("the session is stored");
    assert_eq!(stored, agent.events(), "the store mirrors the agent's log");
}

/// Receives events until `pred` matches one, returning it; the others are dropped. Panics if the
/// stream ends first.
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

/// Waits until the agent appends an event of `kind`, and returns that event.
pub async fn wait_appended(rx: &mut UnboundedReceiver<AgentEvent>, kind: EventKind) -> Event {
    match wait_for(
        rx,
        |e| matches!(e, AgentEvent::Appended { event, .. } if event.kind() == kind),
    )
    .await
    {
        AgentEvent::Appended { event, .. } => event,
        _ => unreachable!("wait_for returns only an event its predicate matched"),
    }
}

/// Every status the stream has reported so far, in order, without waiting; other events are
/// dropped.
pub fn statuses(rx: &mut UnboundedReceiver<AgentEvent>) -> Vec<AgentStatus> {
    drain(rx)
        .into_iter()
        .filter_map(|event| match event {
            AgentEvent::Status { status, .. } => Some(status),
            _ => None,
        })
        .collect()
}

/// The items received so far, in order, without waiting.
pub fn drain<T>(rx: &mut UnboundedReceiver<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Ok(event) = rx.try_recv() {
        out.push(event);
    }
    out
}

/// Locks `m`, taking the data even if a panicking test thread poisoned it (the assertion that
/// panicked is the failure to report, not the poison).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends `text` as a turn and waits (see [`within`]) until the agent is idle again.
pub async fn run_turn(agent: &Arc<Agent>, text: &str) {
    agent.followup(user(text)).expect("the prompt is accepted");
    within(agent.when_idle()).await;
}

/// Awaits `f`, failing the test instead of hanging when it cannot finish. Meant for paused time:
/// the hour-long limit is then reached only when every task is blocked, so it never times a
/// healthy wait.
pub async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(3600), f)
        .await
        .expect("the awaited operation finishes (everything is blocked otherwise)")
}

type ToolFn =
    dyn Fn(ToolContext, serde_json::Value) -> BoxFuture<'static, ToolOutput> + Send + Sync;

/// A tool whose call is a closure: description `a test tool`, schema `{"type": "object"}`, and
/// parallel-safe only when built with [`FnTool::parallel`].
pub struct FnTool {
    name: &'static str,
    parallel: bool,
    call: Box<ToolFn>,
}

impl FnTool {
    /// A tool `name` that runs `call` and is not parallel-safe.
    pub fn new<F, Fut>(name: &'static str, call: F) -> Arc<Self>
    where
        F: Fn(ToolContext, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutput> + Send + 'static,
    {
        Self::build(name, false, call)
    }

    /// A tool `name` that runs `call` and is parallel-safe for every argument.
    pub fn parallel<F, Fut>(name: &'static str, call: F) -> Arc<Self>
    where
        F: Fn(ToolContext, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutput> + Send + 'static,
    {
        Self::build(name, true, call)
    }

    fn build<F, Fut>(name: &'static str, parallel: bool, call: F) -> Arc<Self>
    where
        F: Fn(ToolContext, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutput> + Send + 'static,
    {
        Arc::new(FnTool {
            name,
            parallel,
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

/// A tool `echo` that answers with its arguments, as JSON text.
pub fn echo() -> Arc<dyn Tool> {
    FnTool::new("echo", |_, args| async move {
        ToolOutput::text(args.to_string())
    })
}

/// A tool named `name` that answers `ok`.
pub fn plain_tool(name: &'static str) -> Arc<dyn Tool> {
    FnTool::new(name, |_, _| async { ToolOutput::text("ok") })
}
