//! The delegation harness (feature `subagent`): one registry whose model routes each request by
//! model name to its own scripted model (so a parent and its children are scripted separately), a
//! subagent runtime over it, and a provider with canned outcomes.
//!
//! `use lineage_testkit::subagent::*` brings along the agent-level helpers that do not depend on
//! the agent harness ([`FnTool`], [`user`], [`within`], …) and the log readers of [`crate::read`];
//! its [`Harness`] is this module's, and [`tool_results`] gives full [`Answer`]s.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lineage_agent::{
    Agent, AgentEvent, AgentOptions, AgentSpec, Agents, BoxFuture, ChunkStream, CreateAgent, Model,
    ModelRequest, Response, ScriptedModel, Tool,
};
use lineage_log::{ContentBlock, Event, Message, MessageSource, SessionId};
use lineage_store::Store;
use lineage_subagent::{
    Capabilities, ChildOptions, ContinuableRequest, ForkProvider, Lifecycle, ListenerId, Provider,
    ResolvedStart, SpawnProvider, StartRequest, StopReason, SubagentError, SubagentResult,
    SubagentRun, SubagentRuntime,
};
use tempfile::TempDir;
use tokio::sync::mpsc::{self, UnboundedReceiver};

pub use crate::agent::{FnTool, drain, lock, plain_tool, run_turn, user, within};
pub use crate::read::*;

/// The tool results of `events`, in order (the same as [`tool_answers`]).
pub fn tool_results(events: &[Event]) -> Vec<Answer> {
    tool_answers(events)
}

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
    /// The scripted model for `name`: the same one for every call with the same name.
    pub fn model(&self, name: &str) -> Arc<ScriptedModel> {
        lock(&self.routes)
            .entry(name.to_owned())
            .or_insert_with(|| ScriptedModel::new([]))
            .clone()
    }
}

impl Router {
    /// Appends `responses` to the script of the model for `name`.
    pub fn script(&self, name: &str, responses: impl IntoIterator<Item = Response>) {
        self.model(name).push(responses);
    }
}

impl Model for Router {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let model = self.model(request.model.as_str());
        model.stream(request)
    }
}

/// A registry and a subagent runtime over a fresh store file in a temporary directory, whose
/// model is a [`Router`]. The directory (and so the file) lives as long as the harness.
pub struct Harness {
    /// The temporary directory holding `agents.lineage`.
    pub dir: TempDir,
    /// The store over `dir/agents.lineage`, shared with `agents`.
    pub store: Store,
    /// The model of every agent of `agents`, parents and children alike.
    pub router: Arc<Router>,
    /// The registry.
    pub agents: Agents,
    /// The runtime over `agents`.
    pub runtime: SubagentRuntime,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
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

    /// A fresh agent with `spec`; panics if the registry refuses it.
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
    /// The ids of the stored sessions.
    pub stored: BTreeSet<SessionId>,
    /// The ids of the resident agents.
    pub live: BTreeSet<SessionId>,
}

/// Options naming the scripted endpoint and the [`PARENT`] model, 1024 tokens, depth 0.
pub fn parent_options() -> AgentOptions {
    AgentOptions {
        endpoint: Some("scripted".into()),
        model: Some(PARENT.into()),
        max_tokens: Some(1024),
        subagent_depth: 0,
    }
}

/// A spec with [`parent_options`] and `tools`.
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

/// A continuable request from `parent` to do `prompt`, labelled `<model> job`, whose child asks
/// `model`.
pub fn continuable(parent: &Arc<Agent>, model: &str, prompt: &str) -> ContinuableRequest {
    ContinuableRequest {
        agent_options: ChildOptions {
            model: Some(model.into()),
            ..ChildOptions::default()
        },
        ..ContinuableRequest::new(parent.clone(), format!("{model} job"), prompt)
    }
}

/// Receives `events` (see [`within`]) until a message whose source matches `pred` enters the
/// agent's inbox, and returns that message; the events before it are dropped. Panics if the
/// stream ends first.
pub async fn inbox_inserted(
    events: &mut UnboundedReceiver<AgentEvent>,
    pred: impl Fn(&MessageSource) -> bool,
) -> Message {
    within(async {
        loop {
            match events.recv().await {
                Some(AgentEvent::InboxInserted { message, .. }) if pred(&message.source) => {
                    return message;
                }
                Some(_) => {}
                None => panic!("the agent's event stream ended"),
            }
        }
    })
    .await
}

/// The next settlement notice (`MessageSource::SubagentSettled`) inserted into the inbox of the
/// agent whose `events` these are (see [`inbox_inserted`]).
pub async fn settled_notice(events: &mut UnboundedReceiver<AgentEvent>) -> Message {
    inbox_inserted(events, |source| {
        matches!(source, MessageSource::SubagentSettled { .. })
    })
    .await
}

/// Every lifecycle event received (see [`within`]) up to and including the next `subagent/end`
/// of `child`, in order; the last is that end. Panics if the stream ends first.
pub async fn until_end(
    life: &mut UnboundedReceiver<Lifecycle>,
    child: SessionId,
) -> Vec<Lifecycle> {
    within(async {
        let mut seen = Vec::new();
        loop {
            match life.recv().await {
                Some(event) => {
                    let done = matches!(&event, Lifecycle::End { info, .. } if info.child == child);
                    seen.push(event);
                    if done {
                        return seen;
                    }
                }
                None => panic!("the lifecycle stream ended before {child} ended"),
            }
        }
    })
    .await
}

/// The next `subagent/end` of `child` (always a `Lifecycle::End`); the events before it are
/// dropped (see [`until_end`]).
pub async fn child_end(life: &mut UnboundedReceiver<Lifecycle>, child: SessionId) -> Lifecycle {
    until_end(life, child)
        .await
        .pop()
        .expect("until_end returns at least the end")
}

/// The next `subagent/end` of `child` (see [`child_end`]), after which `runtime` no longer holds
/// the child resident: asserted, since a settled child leaves residency before its end is sent.
pub async fn settled(
    runtime: &SubagentRuntime,
    life: &mut UnboundedReceiver<Lifecycle>,
    child: SessionId,
) -> Lifecycle {
    let end = child_end(life, child).await;
    assert!(
        !runtime.is_resident(child),
        "{child} is still resident after its end"
    );
    end
}

/// The stop reason of a `subagent/end`; panics, naming the child, on a `subagent/start`.
pub fn stop_of(event: &Lifecycle) -> StopReason {
    match event {
        Lifecycle::End { stop_reason, .. } => stop_reason.clone(),
        Lifecycle::Start(info) => panic!("expected the end of {}, got its start", info.child),
    }
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

/// The names of the tools a model request offered.
pub fn tool_names(request: &ModelRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

/// The input schema a model request offered for tool `name`; panics naming the offered tools
/// when there is none.
pub fn offered(request: &ModelRequest, name: &str) -> serde_json::Value {
    request
        .tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("the request offers {name:?}: {:?}", tool_names(request)))
        .parameters
        .clone()
}

/// A scripted step calling tool `name` once, as call `id`, with `arguments`.
pub fn call(id: &str, name: &str, arguments: serde_json::Value) -> Response {
    Response::tool_call(id, name, &arguments.to_string())
}

/// Asserts that `answer` is an error result with `code`.
pub fn assert_error(answer: &Answer, code: &str) {
    assert!(answer.is_error, "expected an error result, got {answer:?}");
    assert_eq!(answer.code.as_deref(), Some(code), "{answer:?}");
}

/// Asserts that `answer` is a successful result.
pub fn assert_ok(answer: &Answer) {
    assert!(
        !answer.is_error,
        "expected a successful result, got {answer:?}"
    );
    assert_eq!(answer.code, None);
}

/// The texts of a model request's messages, in order.
pub fn message_texts(request: &ModelRequest) -> Vec<String> {
    request.messages.iter().map(Message::text).collect()
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
    /// What the run resolves with.
    pub result: Result<SubagentResult, SubagentError>,
    /// What disposing of the run returns.
    pub dispose: Result<(), SubagentError>,
}

impl Canned {
    /// A run that resolves with `result` and disposes cleanly.
    pub fn ok(result: SubagentResult) -> Self {
        Canned {
            result: Ok(result),
            dispose: Ok(()),
        }
    }
}

/// A provider that creates no agent: each start hands back a remote-style run (no local agent)
/// with the next canned outcome (a completed `canned answer` once they run out), and records what it
/// was asked and how many of its runs were disposed.
pub struct CannedProvider {
    name: String,
    capabilities: Capabilities,
    inherits: bool,
    outcomes: Mutex<VecDeque<Canned>>,
    started: Mutex<Vec<ResolvedStart>>,
    disposed: Arc<AtomicUsize>,
}

impl CannedProvider {
    /// A provider registered as `name`, declaring `capabilities`, that does not inherit the
    /// parent's context.
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

    /// Queues `outcome` for the next start.
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
