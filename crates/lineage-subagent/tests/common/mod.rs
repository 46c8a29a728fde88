//! Shared harness for the delegation tests: a store in a temporary directory, one registry whose
//! model routes each request by model name to its own scripted model (so a parent and its children
//! are scripted separately), a subagent runtime, a provider with canned outcomes, tools built from
//! closures, and readers of logs.

#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lineage_agent::{
    Agent, AgentOptions, AgentSpec, Agents, BoxFuture, ChunkStream, CreateAgent, Model,
    ModelRequest, ScriptedModel, Tool, ToolContext, ToolOutput,
};
use lineage_log::{
    ContentBlock, Event, EventBody, Message, MessageSource, SessionId, TurnEndReason, check_seed,
    is_balanced,
};
use lineage_store::Store;
use lineage_subagent::{
    Capabilities, ChildOptions, ForkProvider, Lifecycle, ListenerId, Provider, ResolvedStart,
    SpawnProvider, StartRequest, StopReason, SubagentError, SubagentResult, SubagentRun,
    SubagentRuntime,
};
use tempfile::TempDir;
use tokio::sync::mpsc::{self, UnboundedReceiver};

/// The model name parents ask.
pub const PARENT: &str = "parent";
/// The model name children ask (set through their child options).
pub const CHILD: &str = "child";

/// A model that hands each request to the scripted model registered under the request's model
/// name, creating an empty one (whose requests fail with `SCRIPT_EXHAUSTED`) for a name it has
/// not seen.
#[derive(Default)]
pub struct Router {
    routes: Mutex<HashMap<String, Arc<ScriptedModel>>>,
}

impl Router {
    /// The scripted model for `name`.
    pub fn model(&self, name: &str) -> Arc<ScriptedModel> {
        lock(&self.routes)
            .entry(name.to_owned())
            .or_insert_with(|| ScriptedModel::new([]))
            .clone()
    }
}

impl Model for Router {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let model = self.model(request.model.as_str());
        model.stream(request)
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Harness {
    pub dir: TempDir,
    pub store: Store,
    pub router: Arc<Router>,
    pub agents: Agents,
    pub runtime: SubagentRuntime,
}

impl Harness {
    /// A harness whose runtime has no provider registered.
    pub fn bare() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path().join("agents.lineage")).expect("the store opens");
        let router = Arc::new(Router::default());
        let agents = Agents::new(store.clone(), router.clone());
        let runtime = SubagentRuntime::new(agents.clone());
        Harness {
            dir,
            store,
            router,
            agents,
            runtime,
        }
    }

    /// A harness with the `spawn` and `fork` providers registered.
    pub fn new() -> Self {
        let h = Self::bare();
        h.runtime
            .register_provider(Arc::new(SpawnProvider::new()))
            .expect("spawn registers");
        h.runtime
            .register_provider(Arc::new(ForkProvider::new()))
            .expect("fork registers");
        h
    }

    /// The scripted model for `name`.
    pub fn model(&self, name: &str) -> Arc<ScriptedModel> {
        self.router.model(name)
    }

    /// The parents' scripted model.
    pub fn parent_model(&self) -> Arc<ScriptedModel> {
        self.model(PARENT)
    }

    /// The children's scripted model.
    pub fn child_model(&self) -> Arc<ScriptedModel> {
        self.model(CHILD)
    }

    /// A fresh top-level parent asking the `parent` model, with no tools.
    pub async fn parent(&self) -> Arc<Agent> {
        self.parent_with(parent_spec(Vec::new())).await
    }

    pub async fn parent_with(&self, spec: AgentSpec) -> Arc<Agent> {
        self.agents
            .create(CreateAgent::fresh(spec))
            .await
            .expect("the parent is created")
    }

    /// The stored sessions and the live agents, to compare before and after a refusal.
    pub fn footprint(&self) -> Footprint {
        self.store.flush_all().expect("the store flushes");
        Footprint {
            stored: self
                .store
                .list()
                .expect("the store lists")
                .into_iter()
                .map(|info| info.header.id)
                .collect(),
            live: self.agents.list().iter().map(|a| a.id()).collect(),
        }
    }

    /// The stored children of `parent`.
    pub fn children(&self, parent: &Agent) -> Vec<SessionId> {
        self.store.flush_all().expect("the store flushes");
        self.store.children(parent.id()).expect("children list")
    }

    /// The only stored child of `parent`.
    pub fn only_child(&self, parent: &Agent) -> SessionId {
        match self.children(parent).as_slice() {
            [child] => *child,
            other => panic!("expected one child, found {other:?}"),
        }
    }

    /// Every stored event of `session`.
    pub fn stored(&self, session: SessionId) -> Vec<Event> {
        self.store.flush_all().expect("the store flushes");
        self.store
            .read_from(session, 0)
            .expect("the session is stored")
    }

    /// Asserts that every stored session verifies.
    pub fn assert_verified(&self) {
        self.store.flush_all().expect("the store flushes");
        let report = self.store.verify().expect("verify runs");
        assert!(
            report.is_ok(),
            "the store verifies: {:?}",
            report.failures().collect::<Vec<_>>()
        );
    }
}

/// A registry and runtime over the store file at `path`, as a new process builds them: no
/// provider registered.
pub fn reopen(path: &std::path::Path) -> (Arc<Router>, Agents, SubagentRuntime) {
    let store = Store::open(path).expect("the store reopens");
    let router = Arc::new(Router::default());
    let agents = Agents::new(store, router.clone());
    let runtime = SubagentRuntime::new(agents.clone());
    (router, agents, runtime)
}

/// What is stored and what is live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    pub stored: BTreeSet<SessionId>,
    pub live: BTreeSet<SessionId>,
}

pub fn parent_options() -> AgentOptions {
    AgentOptions {
        endpoint: Some("scripted".into()),
        model: Some(PARENT.into()),
        max_tokens: Some(1024),
        subagent_depth: 0,
    }
}

pub fn parent_spec(tools: Vec<Arc<dyn Tool>>) -> AgentSpec {
    AgentSpec {
        options: parent_options(),
        tools,
        ..AgentSpec::default()
    }
}

/// Child options naming the `child` model.
pub fn child_options() -> ChildOptions {
    ChildOptions {
        model: Some(CHILD.into()),
        ..ChildOptions::default()
    }
}

/// A request from `parent` to do `prompt`, its child asking the `child` model.
pub fn request(parent: &Arc<Agent>, prompt: &str) -> StartRequest {
    StartRequest {
        agent_options: child_options(),
        ..StartRequest::new(parent.clone(), prompt)
    }
}

pub fn user(text: &str) -> Message {
    Message::user_text(text, MessageSource::User)
}

/// Sends `text` as a turn and waits until the agent is idle again.
pub async fn run_turn(agent: &Arc<Agent>, text: &str) {
    agent.followup(user(text)).expect("the prompt is accepted");
    within(agent.when_idle()).await;
}

/// Awaits `f`, failing the test instead of hanging when it cannot finish. The clock is paused,
/// so the limit is reached only when every task is blocked: it never times a healthy wait.
pub async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(3600), f)
        .await
        .expect("the awaited operation finishes (everything is blocked otherwise)")
}

/// Expects `result` to be a refusal and returns it.
pub fn refusal<T: std::fmt::Debug>(result: Result<T, SubagentError>) -> SubagentError {
    match result {
        Ok(value) => panic!("expected a refusal, got {value:?}"),
        Err(error) => error,
    }
}

/// Every lifecycle event of `runtime` from now on.
pub fn listen(runtime: &SubagentRuntime) -> (ListenerId, UnboundedReceiver<Lifecycle>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let id = runtime.on_lifecycle(move |event| {
        let _ = tx.send(event.clone());
        Ok(())
    });
    (id, rx)
}

/// The events received so far, without waiting.
pub fn drain<T>(rx: &mut UnboundedReceiver<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Ok(event) = rx.try_recv() {
        out.push(event);
    }
    out
}

/// The display names of `events`.
pub fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().name()).collect()
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

/// One tool result: the call it answers, its text, whether it failed and its error code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub call: String,
    pub text: String,
    pub is_error: bool,
    pub code: Option<String>,
}

/// The tool results of `events`, in order.
pub fn tool_results(events: &[Event]) -> Vec<Answer> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolResult(r) => match r.message.content.as_slice() {
                [
                    ContentBlock::ToolResult {
                        tool_call_id,
                        content,
                        is_error,
                    },
                ] => Some(Answer {
                    call: tool_call_id.to_string(),
                    text: content
                        .iter()
                        .filter_map(|b| match b {
                            ContentBlock::Text { text } => Some(text.to_string()),
                            _ => None,
                        })
                        .collect(),
                    is_error: *is_error,
                    code: r.error.as_ref().map(|e| e.code.to_string()),
                }),
                _ => panic!("a tool result holds one tool-result block"),
            },
            _ => None,
        })
        .collect()
}

/// The names of the tools a model request offered.
pub fn tool_names(request: &ModelRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

/// The texts of a model request's messages, in order.
pub fn message_texts(request: &ModelRequest) -> Vec<String> {
    request.messages.iter().map(Message::text).collect()
}

/// Asserts the log keeps the seed contract and has no open turn.
pub fn assert_balanced(events: &[Event]) {
    check_seed(events).expect("the log is valid");
    assert!(
        is_balanced(events),
        "the log ends with an open turn: {:?}",
        kinds(events)
    );
}

type ToolFn =
    dyn Fn(ToolContext, serde_json::Value) -> BoxFuture<'static, ToolOutput> + Send + Sync;

/// A tool whose call is a closure.
pub struct FnTool {
    name: &'static str,
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

    fn call(&self, ctx: ToolContext, arguments: serde_json::Value) -> BoxFuture<'_, ToolOutput> {
        (self.call)(ctx, arguments)
    }
}

/// A tool named `name` that answers `ok`.
pub fn plain_tool(name: &'static str) -> Arc<dyn Tool> {
    FnTool::new(name, |_, _| async { ToolOutput::text("ok") })
}

/// A result that ended with `stop_reason`, `text` as output, and `diagnostic`.
pub fn result(stop_reason: StopReason, text: &str, diagnostic: Option<&str>) -> SubagentResult {
    SubagentResult {
        output: if text.is_empty() {
            Vec::new()
        } else {
            vec![ContentBlock::text(text)]
        },
        structured: None,
        diagnostic: diagnostic.map(str::to_owned),
        stop_reason,
    }
}

/// What a canned run resolves with and what its disposal returns.
pub struct Canned {
    pub result: Result<SubagentResult, SubagentError>,
    pub dispose: Result<(), SubagentError>,
}

impl Canned {
    pub fn ok(result: SubagentResult) -> Self {
        Canned {
            result: Ok(result),
            dispose: Ok(()),
        }
    }
}

/// A provider that creates no agent: each start hands back a remote-style run (no local agent)
/// with the next canned outcome, and records what it was asked.
pub struct CannedProvider {
    name: String,
    capabilities: Capabilities,
    inherits: bool,
    outcomes: Mutex<VecDeque<Canned>>,
    started: Mutex<Vec<ResolvedStart>>,
    disposed: Arc<AtomicUsize>,
}

impl CannedProvider {
    pub fn new(name: &str, capabilities: Capabilities) -> Arc<Self> {
        Arc::new(CannedProvider {
            name: name.to_owned(),
            capabilities,
            inherits: false,
            outcomes: Mutex::new(VecDeque::new()),
            started: Mutex::new(Vec::new()),
            disposed: Arc::new(AtomicUsize::new(0)),
        })
    }

    pub fn push(&self, outcome: Canned) {
        lock(&self.outcomes).push_back(outcome);
    }

    /// The starts it received, in order.
    pub fn started(&self) -> Vec<ResolvedStart> {
        lock(&self.started).clone()
    }

    /// How many of its runs were disposed.
    pub fn disposed(&self) -> usize {
        self.disposed.load(Ordering::SeqCst)
    }
}

impl Provider for CannedProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn inherits_parent_context(&self) -> bool {
        self.inherits
    }

    fn start(
        &self,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        lock(&self.started).push(request);
        let Canned { result, dispose } = lock(&self.outcomes).pop_front().unwrap_or(Canned {
            result: Ok(self::result(StopReason::Completed, "canned answer", None)),
            dispose: Ok(()),
        });
        let disposed = self.disposed.clone();
        Box::pin(async move {
            Ok(SubagentRun::new(
                SessionId::new(),
                None,
                async move { result },
                move || -> BoxFuture<'static, Result<(), SubagentError>> {
                    Box::pin(async move {
                        disposed.fetch_add(1, Ordering::SeqCst);
                        dispose
                    })
                },
            ))
        })
    }
}
