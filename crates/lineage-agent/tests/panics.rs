//! Panics in host code end the turn, never the agent: a model that panics when asked, while its
//! stream is read or when its stream is dropped, and a pre-step hook that panics (in the call or in
//! its future) or fails, and a tool method the driver calls itself (`input_schema`,
//! `parallel_safe`). Each turn ends `error` with a stable code and the panic's message, the log
//! stays balanced, and the agent goes idle, serves the next message and can be disposed.
//!
//! Time is paused and every wait is bounded, so a regression fails instead of hanging: the limit
//! is only reached once every task is blocked.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_core::Stream;
use lineage_agent::{
    Agent, AgentSpec, AgentStatus, Agents, BoxFuture, ChunkStream, CreateAgent, Gate, HOOK_FAILED,
    HOOK_PANICKED, HookError, Hooks, MODEL_PANICKED, Model, ModelRequest, PreStep, PreStepDecision,
    Queued, Response, ScriptedModel, ToolOutput,
};
use lineage_log::{Event, EventBody, EventKind, InboxTarget, Message, StreamChunk, TurnEndReason};
use lineage_store::Store;
use lineage_testkit::agent::*;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a faulty model panics.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// In `Model::stream` itself, before any stream exists.
    InStream,
    /// On the first poll of the stream it returns.
    OnFirstPoll,
    /// After two chunks of a text block.
    MidStream,
    /// When the stream, finished normally, is dropped.
    OnDrop,
}

/// A model whose first requests panic as its faults say, then answers from a script.
struct Faulty {
    faults: Mutex<VecDeque<Fault>>,
    script: Arc<ScriptedModel>,
}

impl Model for Faulty {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let Some(fault) = lock(&self.faults).pop_front() else {
            return self.script.stream(request);
        };
        match fault {
            Fault::InStream => panic!("the adapter broke while starting the request"),
            fault => Box::pin(FaultyStream {
                fault,
                chunks: VecDeque::from(text_prefix()),
                polled: false,
            }),
        }
    }
}

fn text_prefix() -> Vec<StreamChunk> {
    vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: lineage_log::BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "half an ans".into(),
        },
    ]
}

struct FaultyStream {
    fault: Fault,
    chunks: VecDeque<StreamChunk>,
    polled: bool,
}

impl Stream for FaultyStream {
    type Item = Result<StreamChunk, lineage_agent::ModelError>;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let first = !self.polled;
        self.polled = true;
        match self.fault {
            Fault::OnFirstPoll if first => panic!("the adapter broke on its first poll"),
            Fault::MidStream | Fault::OnDrop => match self.chunks.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(chunk))),
                None if matches!(self.fault, Fault::MidStream) => {
                    panic!("the adapter broke mid-stream")
                }
                None => Poll::Ready(None),
            },
            _ => Poll::Ready(None),
        }
    }
}

impl Drop for FaultyStream {
    fn drop(&mut self) {
        if matches!(self.fault, Fault::OnDrop) && !std::thread::panicking() {
            panic!("the adapter broke while its stream was dropped");
        }
    }
}

/// An agent over a store in `dir`, asking a model that panics as `faults` say and then plays
/// `script`.
async fn faulty_agent(
    dir: &tempfile::TempDir,
    faults: impl IntoIterator<Item = Fault>,
    script: impl IntoIterator<Item = Response>,
) -> (Store, Arc<ScriptedModel>, Arc<Agent>) {
    let store = Store::open(dir.path().join("agents.lineage")).expect("the store opens");
    let scripted = ScriptedModel::new(script);
    let model = Arc::new(Faulty {
        faults: Mutex::new(faults.into_iter().collect()),
        script: scripted.clone(),
    });
    let agents = Agents::new(store.clone(), model);
    let agent = agents
        .create(CreateAgent::fresh(spec()))
        .await
        .expect("the agent is created");
    (store, scripted, agent)
}

/// The code and message of a turn that ended `error`.
fn error_of(reason: &TurnEndReason) -> (String, String) {
    match reason {
        TurnEndReason::Error(e) => (e.code.to_string(), e.message.to_string()),
        other => panic!("expected an error turn end, got {other:?}"),
    }
}

/// Sends `prompt` and waits until the agent is idle again after its turn failed; returns the log
/// and the failure's code and message.
async fn a_failed_turn(agent: &Arc<Agent>, prompt: &Message) -> (Vec<Event>, String, String) {
    agent.followup(prompt.clone()).unwrap();
    within(agent.when_idle()).await;
    assert_eq!(agent.status(), AgentStatus::Idle);
    let events = agent.events();
    let (code, message) = error_of(&turn_ends(&events)[0]);
    (events, code, message)
}

/// An agent of `h` whose pre-step hook acts out `acts`, one a step, in order.
async fn hooked(h: &Harness, acts: impl IntoIterator<Item = Act>) -> Arc<Agent> {
    h.agent_with(AgentSpec {
        hooks: Some(ScriptedHook::new(acts)),
        ..spec()
    })
    .await
}

/// Sends "second" after a first turn that failed and gave its input back: the parked input runs
/// in a turn of its own, then "second" in another, both completed. Returns the log.
async fn the_parked_input_then_the_next_prompt_complete(agent: &Arc<Agent>) -> Vec<Event> {
    run_turn(agent, "second").await;
    let events = agent.events();
    assert_eq!(
        turn_ends(&events)[1..],
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    events
}

/// The model-fault case: the first turn ends `MODEL_PANICKED` naming the panic, the log is
/// balanced and stored, the agent is idle, a second message runs a normal turn whose request
/// carries the first prompt, and disposal returns.
async fn a_model_fault_ends_only_its_turn(fault: Fault, panic_message: &str) -> Vec<EventKind> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, scripted, agent) = faulty_agent(&dir, [fault], [Response::text("fine")]).await;
    run_turn(&agent, "first").await;
    assert_eq!(agent.status(), AgentStatus::Idle);
    let events = agent.events();
    let ends = turn_ends(&events);
    assert_eq!(ends.len(), 1);
    let (code, message) = error_of(&ends[0]);
    assert_eq!(code, MODEL_PANICKED);
    assert!(
        message.contains(panic_message),
        "the error carries the panic's message: {message:?}"
    );
    assert!(
        message.contains(&agent.id().to_string()),
        "the error names the agent: {message:?}"
    );
    assert_balanced(&events);
    let first_turn: Vec<EventKind> = events.iter().map(|e| e.kind()).collect();

    run_turn(&agent, "second").await;
    let events = agent.events();
    assert_eq!(turn_ends(&events)[1..], [TurnEndReason::Completed]);
    assert_eq!(assistant_texts(&events), ["fine"]);
    let asked = scripted.requests();
    assert_eq!(asked.len(), 1);
    let texts: Vec<String> = asked[0].messages.iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["first", "second"]);
    assert_balanced(&events);
    within(agent.dispose()).await;
    assert_stored(&store, &agent);
    first_turn
}

#[tokio::test(start_paused = true)]
async fn a_model_that_panics_inside_stream_ends_the_turn_with_model_panicked() {
    let kinds = a_model_fault_ends_only_its_turn(
        Fault::InStream,
        "the adapter broke while starting the request",
    )
    .await;
    // The step closes with the failure as its stream's finish, as an adapter error would.
    let at = kinds
        .iter()
        .position(|k| *k == EventKind::StepStart)
        .unwrap();
    assert_eq!(
        kinds[at..],
        [
            EventKind::StepStart,
            EventKind::UserMessage,
            EventKind::AssistantChunk,
            EventKind::StepEnd,
            EventKind::TurnEnd
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_model_that_panics_on_its_first_poll_ends_the_turn_with_model_panicked() {
    a_model_fault_ends_only_its_turn(Fault::OnFirstPoll, "the adapter broke on its first poll")
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_model_that_panics_mid_stream_keeps_its_chunks_and_ends_the_turn() {
    let kinds =
        a_model_fault_ends_only_its_turn(Fault::MidStream, "the adapter broke mid-stream").await;
    let chunks = kinds
        .iter()
        .filter(|k| **k == EventKind::AssistantChunk)
        .count();
    assert_eq!(
        chunks, 3,
        "the two chunks it gave, then the failure's finish"
    );
    assert!(!kinds.contains(&EventKind::AssistantMessage));
}

#[tokio::test(start_paused = true)]
async fn a_model_stream_that_panics_when_dropped_does_not_stop_the_agent() {
    // The stream ended without a finish chunk, so the step completed; only the drop panicked.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_store, _scripted, agent) =
        faulty_agent(&dir, [Fault::OnDrop], [Response::text("fine")]).await;
    run_turn(&agent, "first").await;
    run_turn(&agent, "second").await;
    let events = agent.events();
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    assert_eq!(assistant_texts(&events), ["half an ans", "fine"]);
    assert_balanced(&events);
    within(agent.dispose()).await;
}

/// What a scripted hook does at one call.
#[derive(Clone, Debug)]
enum Act {
    /// Enters the step unchanged.
    Pass,
    /// Panics in `pre_step` itself.
    PanicInCall,
    /// Panics when its future is polled.
    PanicInFuture,
    /// Fails with this message.
    Fail(&'static str),
}

/// A hook that plays its acts in order, one per call, then passes.
struct ScriptedHook {
    acts: Mutex<VecDeque<Act>>,
}

impl ScriptedHook {
    fn new(acts: impl IntoIterator<Item = Act>) -> Arc<Self> {
        Arc::new(ScriptedHook {
            acts: Mutex::new(acts.into_iter().collect()),
        })
    }
}

impl Hooks for ScriptedHook {
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        let act = lock(&self.acts).pop_front().unwrap_or(Act::Pass);
        match act {
            Act::Pass => Box::pin(async move { Ok(PreStepDecision::Enter(step.messages)) }),
            Act::Fail(message) => Box::pin(async move { Err(HookError::new(message)) }),
            Act::PanicInCall => panic!("the hook broke when called"),
            Act::PanicInFuture => Box::pin(async move {
                tokio::task::yield_now().await;
                panic!("the hook broke while it ran")
            }),
        }
    }
}

/// The hook-panic case: the first turn ends `HOOK_PANICKED` naming the panic before any step
/// opened; its prompt goes back to the front of `next-turn`, so the next wake runs it, and then the
/// second message runs in its own turn.
async fn a_hook_panic_ends_only_its_turn(act: Act, panic_message: &str) {
    let h = Harness::new([Response::text("one"), Response::text("two")]);
    let agent = hooked(&h, [act]).await;
    let first = user("first");
    let (events, code, message) = a_failed_turn(&agent, &first).await;
    assert_eq!(code, HOOK_PANICKED);
    assert!(
        message.contains(panic_message),
        "the error carries the panic's message: {message:?}"
    );
    assert!(!events.iter().any(|e| e.kind() == EventKind::StepStart));
    assert_balanced(&events);
    assert_eq!(agent.pending(InboxTarget::NextTurn), vec![first]);

    let events = the_parked_input_then_the_next_prompt_complete(&agent).await;
    assert_eq!(user_texts(&events), ["first", "second"]);
    assert_eq!(assistant_texts(&events), ["one", "two"]);
    assert_balanced(&events);
    within(agent.dispose()).await;
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_pre_step_hook_that_panics_when_called_ends_the_turn_with_hook_panicked() {
    a_hook_panic_ends_only_its_turn(Act::PanicInCall, "the hook broke when called").await;
}

#[tokio::test(start_paused = true)]
async fn a_pre_step_hook_whose_future_panics_ends_the_turn_with_hook_panicked() {
    a_hook_panic_ends_only_its_turn(Act::PanicInFuture, "the hook broke while it ran").await;
}

/// Where each `step/start` of the log falls: (turn, step).
fn steps(agent: &Agent) -> Vec<(u32, u32)> {
    agent.with_events(|events| {
        events
            .iter()
            .filter_map(|e| match &e.body {
                EventBody::StepStart(s) => Some((s.turn, s.step)),
                _ => None,
            })
            .collect()
    })
}

#[tokio::test(start_paused = true)]
async fn a_pre_step_hook_that_fails_ends_the_turn_and_keeps_its_input_for_the_next_wake() {
    let h = Harness::new([Response::text("one"), Response::text("two")]);
    let agent = hooked(&h, [Act::Fail("the policy service is down")]).await;
    let context = user("context");
    let first = user("first");
    agent.inject(context.clone()).unwrap();
    let (events, code, message) = a_failed_turn(&agent, &first).await;
    assert_eq!(code, HOOK_FAILED);
    assert_eq!(
        message,
        format!(
            "agent {}: the pre-step hook of turn 1 step 1 failed: the policy service is down",
            agent.id()
        )
    );
    assert!(steps(&agent).is_empty(), "no step opened");
    assert_balanced(&events);
    // The claimed input is back where it came from, parked until the next waking send.
    assert_eq!(agent.pending(InboxTarget::NextStep), vec![context]);
    assert_eq!(agent.pending(InboxTarget::NextTurn), vec![first]);

    let events = the_parked_input_then_the_next_prompt_complete(&agent).await;
    assert_eq!(user_texts(&events), ["context", "first", "second"]);
    let asked = h.model.requests();
    let texts: Vec<String> = asked[0].messages.iter().map(|m| m.text()).collect();
    assert_eq!(
        texts,
        ["context", "first"],
        "the next turn sees the kept input"
    );
    assert_balanced(&events);
    within(agent.dispose()).await;
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_steer_claimed_by_a_failing_pre_step_joins_the_next_turn() {
    let gate = Gate::new();
    let tool = {
        let gate = gate.clone();
        FnTool::new("wait", move |_, _| {
            let gate = gate.clone();
            async move {
                gate.wait().await;
                ToolOutput::text("waited")
            }
        })
    };
    let h = Harness::new([
        Response::tool_call("c1", "wait", "{}"),
        Response::text("after the steer"),
    ]);
    let agent = h
        .agent_with(AgentSpec {
            hooks: Some(ScriptedHook::new([Act::Pass, Act::Fail("not now")])),
            ..spec_with_tools(vec![tool])
        })
        .await;
    let mut rx = agent.subscribe();
    agent.followup(user("start")).unwrap();
    within(wait_appended(&mut rx, EventKind::ToolCall)).await;
    let steer = user("also consider this");
    agent.steer(steer.clone()).unwrap();
    gate.open();
    within(agent.when_idle()).await;
    let events = agent.events();
    let (code, _) = error_of(&turn_ends(&events)[0]);
    assert_eq!(code, HOOK_FAILED);
    assert_eq!(steps(&agent), [(1, 1)], "step 2 never opened");
    assert_balanced(&events);
    assert_eq!(agent.pending(InboxTarget::NextStep), vec![steer.clone()]);

    run_turn(&agent, "second").await;
    let events = agent.events();
    assert_eq!(turn_ends(&events)[1..], [TurnEndReason::Completed]);
    assert_eq!(
        user_texts(&events),
        ["start", "also consider this", "second"]
    );
    let asked = h.model.requests();
    let last: Vec<String> = asked[1].messages.iter().map(|m| m.text()).collect();
    assert_eq!(last[last.len() - 2..], ["also consider this", "second"]);
    assert_balanced(&events);
    within(agent.dispose()).await;
}

#[tokio::test(start_paused = true)]
async fn a_pre_step_hook_that_fails_in_a_cancelled_turn_ends_it_aborted_and_keeps_nothing() {
    let h = Harness::new([]);
    let hook = Arc::new(CancellingHook);
    let agent = h
        .agent_with(AgentSpec {
            hooks: Some(hook),
            ..spec()
        })
        .await;
    run_turn(&agent, "first").await;
    let events = agent.events();
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Aborted {
            cause: lineage_log::AbortCause::User
        }]
    );
    assert!(
        !agent.has_pending(),
        "claimed input of a cancelled turn is dropped"
    );
    assert_balanced(&events);
    within(agent.dispose()).await;
}

/// A hook that cancels its own turn (keeping the inbox), then fails.
struct CancellingHook;

impl Hooks for CancellingHook {
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        Box::pin(async move {
            step.agent
                .cancel(lineage_log::AbortCause::User, Queued::Keep)
                .expect("the cancel is logged");
            Err(HookError::new("cancelled under me"))
        })
    }
}

/// Which of its methods a brittle tool panics in, the first time it is asked.
#[derive(Clone, Copy, Debug)]
enum Brittle {
    /// `input_schema`, read for every model request.
    Schema,
    /// `parallel_safe`, asked before its call is dispatched.
    ParallelSafe,
}

struct BrittleTool {
    brittle: Brittle,
    tripped: std::sync::atomic::AtomicBool,
}

impl BrittleTool {
    fn trip(&self, now: Brittle) {
        if std::mem::discriminant(&now) == std::mem::discriminant(&self.brittle)
            && !self.tripped.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("the tool broke in {now:?}");
        }
    }
}

impl lineage_agent::Tool for BrittleTool {
    fn name(&self) -> &str {
        "brittle"
    }
    fn description(&self) -> &str {
        "a tool that breaks once"
    }
    fn input_schema(&self) -> serde_json::Value {
        self.trip(Brittle::Schema);
        serde_json::json!({"type": "object"})
    }
    fn parallel_safe(&self, _: &serde_json::Value) -> bool {
        self.trip(Brittle::ParallelSafe);
        false
    }
    fn call(
        &self,
        _: lineage_agent::ToolContext,
        _: serde_json::Value,
    ) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async { ToolOutput::text("done") })
    }
}

/// A panic in a tool method the driver calls itself ends the turn `TURN_PANICKED`, with what the
/// step left open closed as crash repair would close it; the next message runs a normal turn.
async fn a_tool_method_panic_ends_only_its_turn(
    brittle: Brittle,
    script: Vec<Response>,
) -> Vec<lineage_log::Event> {
    let h = Harness::new(script);
    let tool = Arc::new(BrittleTool {
        brittle,
        tripped: Default::default(),
    });
    let agent = h.agent_with(spec_with_tools(vec![tool])).await;
    run_turn(&agent, "first").await;
    assert_eq!(agent.status(), AgentStatus::Idle);
    let events = agent.events();
    let (code, message) = error_of(&turn_ends(&events)[0]);
    assert_eq!(code, lineage_agent::TURN_PANICKED);
    assert!(
        message.contains(&format!("the tool broke in {brittle:?}")),
        "the error carries the panic's message: {message:?}"
    );
    assert_balanced(&events);

    run_turn(&agent, "second").await;
    let events = agent.events();
    assert_eq!(turn_ends(&events)[1..], [TurnEndReason::Completed]);
    assert_eq!(assistant_texts(&events).last().unwrap(), "after");
    assert_balanced(&events);
    within(agent.dispose()).await;
    assert_stored(&h.store, &agent);
    events
}

#[tokio::test(start_paused = true)]
async fn a_tool_whose_schema_panics_ends_the_turn_before_the_model_is_asked() {
    let events =
        a_tool_method_panic_ends_only_its_turn(Brittle::Schema, vec![Response::text("after")])
            .await;
    let first_end = events
        .iter()
        .position(|e| e.kind() == EventKind::TurnEnd)
        .unwrap();
    assert!(
        !events[..first_end]
            .iter()
            .any(|e| e.kind() == EventKind::AssistantChunk),
        "the model was not asked in the first turn"
    );
    assert_eq!(events[first_end - 1].kind(), EventKind::StepEnd);
}

#[tokio::test(start_paused = true)]
async fn a_tool_whose_parallel_safe_panics_ends_the_turn_with_its_call_answered() {
    let events = a_tool_method_panic_ends_only_its_turn(
        Brittle::ParallelSafe,
        vec![
            Response::tool_call("c1", "brittle", "{}"),
            Response::text("after"),
        ],
    )
    .await;
    // The call never started: crash repair's answer for it, then the step's end.
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "c1");
    assert_eq!(results[0].2.as_deref(), Some(lineage_log::TOOL_NOT_STARTED));
}
