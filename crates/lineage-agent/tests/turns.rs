//! The turn loop, as specified: event order, tools, steering, inject, cancellation at every point
//! of a turn, the wake latch, keep-inbox parking, and how turns end.
//!
//! Every test is deterministic: time is paused, models are scripted and held by gates, and tests
//! wait on the agent's own events, never on sleeps.

mod common;

use common::{streaming, texts, turn_numbers};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lineage_agent::{
    ABORTED_BEFORE_DISPATCH, Agent, AgentEvent, AgentSpec, AgentStatus, BoxFuture, Gate, HookError,
    Hooks, INVALID_ARGUMENTS, ModelError, NO_MODEL, PreStep, PreStepDecision, Queued, Response,
    SCRIPT_EXHAUSTED, TOOL_NOT_AVAILABLE, ToolOutput,
};
use lineage_log::{AbortCause, EventBody, EventKind, InboxTarget, Text, ToolFilter, TurnEndReason};
use lineage_testkit::agent::*;
use tokio::sync::mpsc::UnboundedReceiver;

fn aborted(cause: AbortCause) -> TurnEndReason {
    TurnEndReason::Aborted { cause }
}

/// A harness whose model makes `calls` (id, tool, arguments) in one step, then answers with
/// `then`.
fn calling(calls: &[(&str, &str, &str)], then: impl IntoIterator<Item = Response>) -> Harness {
    Harness::new(std::iter::once(Response::tool_calls(None, calls)).chain(then))
}

#[tokio::test(start_paused = true)]
async fn a_simple_turn_writes_its_events_in_order() {
    let h = Harness::new([Response::text("hi")]);
    let agent = h.agent().await;
    let mut rx = agent.subscribe();
    let prompt = user("hello");
    agent.followup(prompt.clone()).unwrap();
    // A waking send on an idle agent opens the turn and claims before it returns.
    assert_eq!(
        kinds(&agent.events()),
        ["inbox/spliced", "turn/start", "inbox/spliced"]
    );
    assert_eq!(agent.status(), AgentStatus::Running);
    agent.when_idle().await;
    let events = agent.events();
    let mut expected = vec![
        "inbox/spliced",
        "turn/start",
        "inbox/spliced",
        "step/start",
        "user/message",
    ];
    expected.extend(["assistant/chunk"; 6]); // block start, 2 deltas, block end, usage, finish
    expected.extend(["assistant/message", "step/end", "turn/end"]);
    assert_eq!(kinds(&events), expected);
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
    assert_eq!(assistant_texts(&events), ["hi"]);
    let EventBody::InboxSpliced(claim) = &events[2].body else {
        panic!("the claim is a splice")
    };
    assert_eq!((claim.removed, claim.canceled), (1, false));
    // The request carried exactly the history at dispatch, and the store mirrors the log.
    let requests = h.model.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].messages, vec![prompt.clone()]);
    assert_eq!(requests[0].max_tokens, Some(1024));
    assert_stored(&h.store, &agent);
    // Observers saw the insert, the claim (with the message and the turn) and one status pair.
    let mut seen = Vec::new();
    while let Ok(event) = rx.try_recv() {
        seen.push(event);
    }
    assert!(seen.iter().any(|e| matches!(e,
        AgentEvent::InboxInserted { message, target: InboxTarget::NextTurn, .. } if message.id == prompt.id)));
    assert!(seen.iter().any(|e| matches!(e,
        AgentEvent::InboxClaimed { message, turn: 1, .. } if message.id == prompt.id)));
    let statuses: Vec<_> = seen
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Status { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(statuses, [AgentStatus::Running, AgentStatus::Idle]);
    let appended = seen
        .iter()
        .filter(|e| matches!(e, AgentEvent::Appended { .. }))
        .count();
    assert_eq!(appended, events.len(), "every event is published");
}

#[tokio::test(start_paused = true)]
async fn a_tool_result_reaches_the_next_request() {
    let h = Harness::new([
        Response::tool_call("c1", "echo", r#"{"x":1}"#),
        Response::text("done"),
    ]);
    let agent = h.agent_with(spec_with_tools(vec![echo()])).await;
    run_turn(&agent, "use the tool").await;
    let events = agent.events();
    let kinds = kinds(&events);
    let at = kinds.iter().position(|k| *k == "tool/call").unwrap();
    assert_eq!(
        kinds[at - 1..at + 5],
        [
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end",
            "step/start",
            "assistant/chunk"
        ]
    );
    assert_eq!(
        tool_results(&events),
        [("c1".into(), r#"{"x":1}"#.into(), None)]
    );
    let requests = h.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].tools.len(), 1);
    let second = &requests[1].messages;
    assert_eq!(second.len(), 3, "prompt, assistant tool call, tool result");
    assert_eq!(
        second[2].source,
        lineage_log::MessageSource::Tool {
            call_id: "c1".into()
        }
    );
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
    assert_balanced(&events);
    assert_stored(&h.store, &agent);
}

/// A harness whose model calls the tool `wait` and then answers "done", and its agent,
/// subscribed to, in a turn on "start" held in that call until `gate` opens.
async fn waiting_in_a_tool(gate: &Gate) -> (Harness, Arc<Agent>, UnboundedReceiver<AgentEvent>) {
    let h = Harness::new([
        Response::tool_call("c1", "wait", "{}"),
        Response::text("done"),
    ]);
    let gate = gate.clone();
    let wait = FnTool::new("wait", move |_, _| {
        let gate = gate.clone();
        async move {
            gate.wait().await;
            ToolOutput::text("waited")
        }
    });
    let agent = h.agent_with(spec_with_tools(vec![wait])).await;
    let mut rx = agent.subscribe();
    agent.followup(user("start")).unwrap();
    wait_appended(&mut rx, EventKind::ToolCall).await;
    (h, agent, rx)
}

#[tokio::test(start_paused = true)]
async fn the_store_never_repairs_a_session_under_its_live_agent() {
    let gate = Gate::new();
    let (h, agent, _rx) = waiting_in_a_tool(&gate).await;
    assert!(h.store.is_owned(agent.id()));
    // Mid-turn: a load elsewhere in the host is refused instead of closing the turn.
    match h.store.load(agent.id()) {
        Err(lineage_store::StoreError::LiveTurnOpen { session }) => assert_eq!(session, agent.id()),
        other => panic!("expected LiveTurnOpen, got {other:?}"),
    }
    assert_eq!(h.store.inspect(agent.id()).unwrap().closers, 3);
    gate.open();
    agent.when_idle().await;
    let events = agent.events();
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
    assert_balanced(&events);
    assert_stored(&h.store, &agent);
    agent.dispose().await;
    assert!(!h.store.is_owned(agent.id()), "disposal ends the ownership");
    assert_eq!(h.store.load(agent.id()).unwrap().closers, 0);
}

#[tokio::test(start_paused = true)]
async fn a_steer_joins_the_next_step_of_the_running_turn() {
    let gate = Gate::new();
    let (h, agent, _rx) = waiting_in_a_tool(&gate).await;
    let steer = user("also consider this");
    agent.steer(steer.clone()).unwrap();
    assert_eq!(agent.pending(InboxTarget::NextStep), vec![steer.clone()]);
    gate.open();
    agent.when_idle().await;
    let events = agent.events();
    let step2 = events
        .iter()
        .position(|e| matches!(&e.body, EventBody::StepStart(s) if s.step == 2))
        .unwrap();
    assert!(matches!(&events[step2 + 1].body, EventBody::UserMessage(m) if m.id == steer.id));
    let second = &h.model.requests()[1].messages;
    assert_eq!(
        second.last(),
        Some(&steer),
        "the steer follows the tool result"
    );
    assert_eq!(turn_ends(&events).len(), 1, "no new turn");
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn an_idle_inject_waits_for_a_wake_and_comes_before_the_prompt() {
    let h = Harness::new([Response::text("ok")]);
    let agent = h.agent().await;
    agent.inject(user("context")).unwrap();
    agent.when_idle().await;
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert_eq!(kinds(&agent.events()), ["inbox/spliced"]);
    run_turn(&agent, "prompt").await;
    assert_eq!(user_texts(&agent.events()), ["context", "prompt"]);
}

#[tokio::test(start_paused = true)]
async fn a_running_inject_is_claimed_at_the_next_step_after_the_results() {
    let gate = Gate::new();
    let (_h, agent, _rx) = waiting_in_a_tool(&gate).await;
    agent.inject(user("late context")).unwrap();
    gate.open();
    agent.when_idle().await;
    let events = agent.events();
    let kinds = kinds(&events);
    let result = kinds.iter().position(|k| *k == "tool/result").unwrap();
    let injected = events
        .iter()
        .position(|e| matches!(&e.body, EventBody::UserMessage(m) if m.text() == "late context"))
        .unwrap();
    assert!(injected > result);
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
}

#[tokio::test(start_paused = true)]
async fn n_followups_run_as_n_turns_in_order_under_one_running_status() {
    let h = Harness::new(["1", "2", "3"].map(Response::text));
    let agent = h.agent().await;
    let mut rx = agent.subscribe();
    for text in ["a", "b", "c"] {
        agent.followup(user(text)).unwrap();
    }
    agent.when_idle().await;
    let events = agent.events();
    assert_eq!(user_texts(&events), ["a", "b", "c"]);
    assert_eq!(assistant_texts(&events), ["1", "2", "3"]);
    assert_eq!(turn_numbers(&events), [1, 2, 3]);
    assert_eq!(statuses(&mut rx), [AgentStatus::Running, AgentStatus::Idle]);
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_right_after_the_wake_closes_the_turn_without_a_step() {
    let h = Harness::new([Response::text("never")]);
    let agent = h.agent().await;
    agent.followup(user("x")).unwrap();
    // The prompt was claimed synchronously: keeping the inbox keeps nothing.
    agent.cancel(AbortCause::User, Queued::Keep).unwrap();
    agent.when_idle().await;
    let events = agent.events();
    assert_eq!(
        kinds(&events),
        ["inbox/spliced", "turn/start", "inbox/spliced", "turn/end"]
    );
    assert_eq!(turn_ends(&events), [aborted(AbortCause::User)]);
    assert!(!agent.has_pending());
    assert!(h.model.requests().is_empty());
    assert_balanced(&events);
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_mid_stream_keeps_the_interrupted_prefix() {
    let h = Harness::new([Response::hang()]);
    let (agent, mut rx) = streaming(&h, "x").await;
    wait_appended(&mut rx, EventKind::AssistantChunk).await;
    agent.cancel(AbortCause::User, Queued::Discard).unwrap();
    agent.when_idle().await;
    let events = agent.events();
    let tail: Vec<_> = kinds(&events).into_iter().rev().take(3).collect();
    assert_eq!(tail, ["turn/end", "step/end", "assistant/message"]);
    let interrupted = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::AssistantMessage(m) => Some(m),
            _ => None,
        })
        .unwrap();
    assert!(interrupted.interrupted);
    assert_eq!(interrupted.message.text(), "partial");
    assert_eq!(turn_ends(&events), [aborted(AbortCause::User)]);
    assert_balanced(&events);
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_during_tools_drains_started_calls_and_answers_unstarted_ones() {
    let h = calling(&[("c1", "until_cancelled", "{}"), ("c2", "echo", "{}")], []);
    let (started_tx, started) = tokio::sync::mpsc::unbounded_channel::<()>();
    let until_cancelled = FnTool::new("until_cancelled", move |ctx, _| {
        let started_tx = started_tx.clone();
        async move {
            let _ = started_tx.send(());
            ctx.cancel.cancelled().await;
            ToolOutput::text("stopped cleanly")
        }
    });
    let agent = h
        .agent_with(spec_with_tools(vec![until_cancelled, echo()]))
        .await;
    agent.followup(user("x")).unwrap();
    let mut started = started;
    started.recv().await.expect("the first call's body starts");
    agent.cancel(AbortCause::Parent, Queued::Discard).unwrap();
    agent.when_idle().await;
    let events = agent.events();
    assert_eq!(
        tool_results(&events),
        [
            ("c1".into(), "stopped cleanly".into(), None),
            (
                "c2".into(),
                "This tool call did not run: its turn was cancelled before it started.".into(),
                Some(ABORTED_BEFORE_DISPATCH.into())
            ),
        ]
    );
    let tail: Vec<_> = kinds(&events).into_iter().rev().take(5).collect();
    assert_eq!(
        tail,
        [
            "turn/end",
            "step/end",
            "tool/result",
            "tool/call",
            "tool/result"
        ]
    );
    assert_eq!(turn_ends(&events), [aborted(AbortCause::Parent)]);
    assert_balanced(&events);
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_while_calls_are_flushed_before_dispatch_keeps_their_bodies_from_running() {
    let h = calling(&[("c1", "effect", "{}"), ("c2", "effect", "{}")], []);
    let ran = Arc::new(AtomicUsize::new(0));
    let effect = {
        let ran = ran.clone();
        FnTool::parallel("effect", move |_, _| {
            let ran = ran.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                ToolOutput::text("it happened")
            }
        })
    };
    let agent = h.agent_with(spec_with_tools(vec![effect])).await;
    let mut rx = agent.subscribe();
    agent.followup(user("x")).unwrap();
    // Both calls are recorded, and the driver is flushing them before it dispatches: cancel now.
    wait_appended(&mut rx, EventKind::ToolCall).await;
    agent.cancel(AbortCause::User, Queued::Discard).unwrap();
    agent.when_idle().await;
    assert_eq!(ran.load(Ordering::SeqCst), 0, "no body ran");
    let events = agent.events();
    let not_run = "This tool call did not run: its turn was cancelled before it started.";
    assert_eq!(
        tool_results(&events),
        [
            (
                "c1".into(),
                not_run.into(),
                Some(ABORTED_BEFORE_DISPATCH.into())
            ),
            (
                "c2".into(),
                not_run.into(),
                Some(ABORTED_BEFORE_DISPATCH.into())
            ),
        ]
    );
    assert_eq!(turn_ends(&events), [aborted(AbortCause::User)]);
    assert_balanced(&events);
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_from_inside_a_tool_ends_the_turn_before_the_next_step() {
    let h = Harness::new([
        Response::tool_call("c1", "stop_me", "{}"),
        Response::text("never"),
    ]);
    let stop_me = FnTool::new("stop_me", |ctx, _| async move {
        ctx.agent
            .cancel(
                AbortCause::Hook {
                    reason: "policy".into(),
                },
                Queued::Discard,
            )
            .unwrap();
        ToolOutput::text("asked to stop")
    });
    let agent = h.agent_with(spec_with_tools(vec![stop_me])).await;
    run_turn(&agent, "x").await;
    let events = agent.events();
    assert_eq!(h.model.requests().len(), 1, "no second step");
    assert_eq!(
        turn_ends(&events),
        [aborted(AbortCause::Hook {
            reason: "policy".into()
        })]
    );
    assert_eq!(tool_results(&events)[0].1, "asked to stop");
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn the_first_cause_wins() {
    let h = Harness::new([Response::hang()]);
    let (agent, _rx) = streaming(&h, "x").await;
    agent.cancel(AbortCause::User, Queued::Keep).unwrap();
    agent.cancel(AbortCause::Parent, Queued::Keep).unwrap();
    agent.dispose().await;
    assert_eq!(turn_ends(&agent.events()), [aborted(AbortCause::User)]);
    assert!(h.agents.get(agent.id()).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_that_keeps_queued_work_parks_it_until_the_next_waking_send() {
    let h = Harness::new([
        Response::hang(),
        Response::text("for b"),
        Response::text("for c"),
    ]);
    let agent = h.agent().await;
    agent.followup(user("a")).unwrap();
    h.model.wait_for_requests(1).await;
    agent.followup(user("b")).unwrap();
    agent.cancel(AbortCause::User, Queued::Keep).unwrap();
    agent.when_idle().await;
    // b was queued before the cancel: it is parked, not run.
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert_eq!(texts(&agent.pending(InboxTarget::NextTurn)), ["b"]);
    assert_eq!(turn_ends(&agent.events()), [aborted(AbortCause::User)]);
    // The next waking send runs the parked work first.
    run_turn(&agent, "c").await;
    let events = agent.events();
    assert_eq!(user_texts(&events), ["a", "b", "c"]);
    assert_eq!(
        turn_ends(&events),
        [
            aborted(AbortCause::User),
            TurnEndReason::Completed,
            TurnEndReason::Completed
        ]
    );
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn run_pending_runs_parked_work_without_a_send_and_does_nothing_when_none_is_parked() {
    let h = Harness::new([Response::hang(), Response::text("for b")]);
    let agent = h.agent().await;
    assert!(!agent.run_pending(), "nothing pending: no turn");
    assert!(turn_ends(&agent.events()).is_empty());
    agent.followup(user("a")).unwrap();
    h.model.wait_for_requests(1).await;
    agent.followup(user("b")).unwrap();
    agent.cancel(AbortCause::User, Queued::Keep).unwrap();
    agent.when_idle().await;
    assert_eq!(texts(&agent.pending(InboxTarget::NextTurn)), ["b"]);
    assert!(agent.run_pending());
    agent.when_idle().await;
    let events = agent.events();
    assert_eq!(user_texts(&events), ["a", "b"]);
    assert_eq!(
        turn_ends(&events),
        [aborted(AbortCause::User), TurnEndReason::Completed]
    );
    assert!(!agent.has_pending());
    assert!(!agent.run_pending());
    assert_eq!(turn_ends(&agent.events()).len(), 2, "no empty turn");
    assert_balanced(&agent.events());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_that_discards_queued_work_does_so_durably() {
    let h = Harness::new([Response::hang()]);
    let agent = h.agent().await;
    let mut rx = agent.subscribe();
    agent.followup(user("a")).unwrap();
    h.model.wait_for_requests(1).await;
    let queued = user("b");
    agent.followup(queued.clone()).unwrap();
    agent.cancel(AbortCause::User, Queued::Discard).unwrap();
    agent.when_idle().await;
    assert!(!agent.has_pending());
    let discarded = wait_for(&mut rx, |e| matches!(e, AgentEvent::InboxDiscarded { .. })).await;
    assert!(
        matches!(discarded, AgentEvent::InboxDiscarded { message, .. } if message.id == queued.id)
    );
    let cancelled = agent.events().iter().any(|e| {
        matches!(&e.body, EventBody::InboxSpliced(s) if s.canceled && s.removed == 1 && s.target == InboxTarget::NextTurn)
    });
    assert!(cancelled, "the discard is in the log");
    assert_eq!(turn_ends(&agent.events()).len(), 1);
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_wake_during_the_cancel_window_is_latched_and_replayed_after_turn_end() {
    let h = Harness::new([Response::hang(), Response::text("for b")]);
    let agent = h.agent().await;
    let mut rx = agent.subscribe();
    agent.followup(user("a")).unwrap();
    h.model.wait_for_requests(1).await;
    agent.cancel(AbortCause::User, Queued::Discard).unwrap();
    // The driver has not closed turn 1 yet: this send cannot join it and is latched.
    agent.steer(user("b")).unwrap();
    assert_eq!(
        agent.pending(InboxTarget::NextTurn).len(),
        1,
        "redirected to next-turn"
    );
    agent.when_idle().await; // follows the replacement driver
    let events = agent.events();
    assert_eq!(user_texts(&events), ["a", "b"]);
    assert_eq!(
        turn_ends(&events),
        [aborted(AbortCause::User), TurnEndReason::Completed]
    );
    let turn_end_1 = events
        .iter()
        .position(|e| e.kind() == EventKind::TurnEnd)
        .unwrap();
    let turn_start_2 = events
        .iter()
        .rposition(|e| e.kind() == EventKind::TurnStart)
        .unwrap();
    assert!(turn_end_1 < turn_start_2);
    assert_eq!(
        statuses(&mut rx),
        [
            AgentStatus::Running,
            AgentStatus::Idle,
            AgentStatus::Running,
            AgentStatus::Idle
        ]
    );
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn max_tokens_is_sticky_for_the_rest_of_the_turn() {
    let gate = Gate::new();
    let h = Harness::new([
        Response::max_tokens("cut of").gated(&gate),
        Response::text("fine"),
    ]);
    let agent = h.agent().await;
    agent.followup(user("a")).unwrap();
    h.model.wait_for_requests(1).await;
    agent.inject(user("more")).unwrap();
    gate.open();
    agent.when_idle().await;
    let events = agent.events();
    assert_eq!(
        h.model.requests().len(),
        2,
        "the injected input ran a second step"
    );
    assert_eq!(turn_ends(&events), [TurnEndReason::MaxTokens]);
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn model_failures_end_the_turn_with_an_error_and_the_agent_carries_on() {
    let h = Harness::new([
        Response::error("RATE_LIMITED", "slow down"),
        Response::text("ok"),
    ]);
    let agent = h.agent().await;
    run_turn(&agent, "a").await;
    run_turn(&agent, "b").await;
    // The script is now exhausted: the adapter failure becomes an error finish too.
    run_turn(&agent, "c").await;
    let ends = turn_ends(&agent.events());
    let codes: Vec<String> = ends
        .iter()
        .map(|r| match r {
            TurnEndReason::Error(e) => e.code.to_string(),
            TurnEndReason::Completed => "completed".into(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(codes, ["RATE_LIMITED", "completed", SCRIPT_EXHAUSTED]);
    let finishes = agent
        .events()
        .iter()
        .filter(|e| matches!(&e.body, EventBody::AssistantChunk(c) if matches!(c.chunk, lineage_log::StreamChunk::Finish { .. })))
        .count();
    assert_eq!(finishes, 3, "every failure is logged as a finish chunk");
    assert_balanced(&agent.events());
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_failure_keeps_its_status_retry_after_and_request_id_in_the_turn_error() {
    let failure = ModelError {
        status: Some(429),
        retry_after_ms: Some(2_000),
        request_id: Some("req-7".into()),
        ..ModelError::new("RATE_LIMIT", "slow down")
    };
    let h = Harness::new([Response::Fail(failure.clone())]);
    let agent = h.agent().await;
    run_turn(&agent, "a").await;
    match &turn_ends(&agent.events())[..] {
        [TurnEndReason::Error(e)] => assert_eq!(**e, failure.into_turn_error()),
        other => panic!("expected the endpoint's failure, got {other:?}"),
    }
    assert_balanced(&agent.events());
}

#[tokio::test(start_paused = true)]
async fn an_agent_without_a_model_fails_its_turn_with_no_model() {
    let h = Harness::new([]);
    let agent = h.agent_with(AgentSpec::default()).await;
    run_turn(&agent, "a").await;
    match &turn_ends(&agent.events())[..] {
        [TurnEndReason::Error(e)] => assert_eq!(e.code, NO_MODEL),
        other => panic!("expected a NO_MODEL error, got {other:?}"),
    }
}

struct RejectAll;

impl Hooks for RejectAll {
    fn pre_step(&self, _: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        Box::pin(async { Ok(PreStepDecision::Reject) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_rejected_pre_step_blocks_the_turn_and_the_input_never_enters_history() {
    let h = Harness::new([]);
    let agent = h
        .agent_with(AgentSpec {
            hooks: Some(Arc::new(RejectAll)),
            ..spec()
        })
        .await;
    agent.followup(user("forbidden")).unwrap();
    run_turn(&agent, "parked").await;
    let events = agent.events();
    assert_eq!(turn_ends(&events), [TurnEndReason::Blocked]);
    assert!(user_texts(&events).is_empty());
    assert_eq!(
        agent.pending(InboxTarget::NextTurn).len(),
        1,
        "later work parks"
    );
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn filtered_unknown_and_malformed_calls_get_error_results_without_running() {
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = {
        let ran = ran.clone();
        FnTool::new("secret", move |_, _| {
            ran.fetch_add(1, Ordering::SeqCst);
            async { ToolOutput::text("ran") }
        })
    };
    let h = calling(
        &[
            ("c1", "secret", "{}"),
            ("c2", "nope", "{}"),
            ("c3", "echo", "{oops"),
        ],
        [Response::text("done")],
    );
    let agent = h
        .agent_with(AgentSpec {
            tool_filter: Some(ToolFilter {
                allow: None,
                deny: Some(vec![Text::from("secret")]),
            }),
            ..spec_with_tools(vec![counted, echo()])
        })
        .await;
    run_turn(&agent, "x").await;
    let codes: Vec<_> = tool_results(&agent.events())
        .into_iter()
        .map(|(_, _, code)| code)
        .collect();
    assert_eq!(
        codes,
        [
            Some(TOOL_NOT_AVAILABLE.to_string()),
            Some(TOOL_NOT_AVAILABLE.to_string()),
            Some(INVALID_ARGUMENTS.to_string())
        ]
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let visible: Vec<_> = h.model.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(visible, ["echo"], "the filter hides the denied tool");
    assert_balanced(&agent.events());
}

#[tokio::test(start_paused = true)]
async fn a_concluding_result_ends_the_turn_and_contexts_join_the_next_step() {
    let h = Harness::new([
        Response::tool_call("c1", "note", "{}"),
        Response::tool_call("c2", "finish", "{}"),
    ]);
    let note = FnTool::new("note", |_, _| async {
        ToolOutput::text("noted").with_context(user("a note for the next step"))
    });
    let finish = FnTool::new("finish", |_, _| async {
        ToolOutput::text("finished").concluding()
    });
    let agent = h.agent_with(spec_with_tools(vec![note, finish])).await;
    run_turn(&agent, "x").await;
    let events = agent.events();
    assert_eq!(
        h.model.requests().len(),
        2,
        "the concluding result ends the turn"
    );
    let second = &h.model.requests()[1].messages;
    assert_eq!(
        second.last().map(|m| m.text()),
        Some("a note for the next step".into())
    );
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn parallel_calls_run_together_up_to_the_limit_and_commit_in_model_order() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let gates: Vec<Gate> = (0..3).map(|_| Gate::new()).collect();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let tool = {
        let (in_flight, most, gates) = (in_flight.clone(), most.clone(), gates.clone());
        FnTool::parallel("fetch", move |_, args| {
            let (in_flight, most, started_tx) =
                (in_flight.clone(), most.clone(), started_tx.clone());
            let i = args["i"].as_u64().unwrap() as usize;
            let gate = gates[i].clone();
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                started_tx.send(i).unwrap();
                gate.wait().await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                ToolOutput::text(format!("result {i}"))
            }
        })
    };
    let h = calling(
        &[
            ("c0", "fetch", r#"{"i":0}"#),
            ("c1", "fetch", r#"{"i":1}"#),
            ("c2", "fetch", r#"{"i":2}"#),
        ],
        [Response::text("done")],
    );
    let agent = h
        .agent_with(AgentSpec {
            max_parallel_tools: 2,
            ..spec_with_tools(vec![tool])
        })
        .await;
    agent.followup(user("x")).unwrap();
    // The first two run together; the third waits for a slot.
    let mut first_two = [started.recv().await.unwrap(), started.recv().await.unwrap()];
    first_two.sort();
    assert_eq!(first_two, [0, 1]);
    // The later call finishes first; its result still waits for the earlier one's.
    gates[1].open();
    gates[2].open();
    gates[0].open();
    assert_eq!(started.recv().await, Some(2));
    agent.when_idle().await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "never more than the limit at once"
    );
    let ids: Vec<_> = tool_results(&agent.events())
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    assert_eq!(ids, ["c0", "c1", "c2"], "results commit in model order");
    assert_balanced(&agent.events());
}

#[tokio::test(start_paused = true)]
async fn exclusive_calls_run_alone() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let make = |name: &'static str, parallel: bool| {
        let (in_flight, most) = (in_flight.clone(), most.clone());
        let call = move |_, _| {
            let (in_flight, most) = (in_flight.clone(), most.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                ToolOutput::text(name)
            }
        };
        if parallel {
            FnTool::parallel(name, call)
        } else {
            FnTool::new(name, call)
        }
    };
    let h = calling(
        &[
            ("c0", "read", "{}"),
            ("c1", "write", "{}"),
            ("c2", "read", "{}"),
        ],
        [Response::text("done")],
    );
    let agent = h
        .agent_with(spec_with_tools(vec![
            make("read", true),
            make("write", false),
        ]))
        .await;
    run_turn(&agent, "x").await;
    assert_eq!(most.load(Ordering::SeqCst), 1);
    assert_eq!(tool_results(&agent.events()).len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_system_prompt_carries_the_persona_and_runtime_context() {
    let h = Harness::new([Response::text("ok")]);
    let agent = h
        .agent_with(AgentSpec {
            persona: Some("You are a careful reviewer.".into()),
            context: vec!["Your scope was fixed when you were created.".into()],
            ..spec()
        })
        .await;
    run_turn(&agent, "x").await;
    let system = &h.model.requests()[0].system;
    assert!(
        system.starts_with("You are a careful reviewer."),
        "{system}"
    );
    assert!(
        system.contains("- Your scope was fixed when you were created."),
        "{system}"
    );
}

/// A tool that mounts and unmounts with a switch, like a delegation tool with its provider.
struct Switched {
    mounted: Arc<std::sync::atomic::AtomicBool>,
}

impl lineage_agent::Tool for Switched {
    fn name(&self) -> &str {
        "switched"
    }
    fn description(&self) -> &str {
        "a tool that comes and goes"
    }
    fn input_schema(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    fn available(&self) -> bool {
        self.mounted.load(Ordering::SeqCst)
    }
    fn call(
        &self,
        _: lineage_agent::ToolContext,
        _: serde_json::Value,
    ) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async { ToolOutput::text("ran") })
    }
}

#[tokio::test(start_paused = true)]
async fn an_unmounted_tool_is_hidden_and_refused_until_it_mounts() {
    let h = Harness::new([
        Response::tool_call("c1", "switched", "{}"),
        Response::text("done"),
        Response::tool_call("c2", "switched", "{}"),
        Response::text("done"),
    ]);
    let mounted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tool = Arc::new(Switched {
        mounted: mounted.clone(),
    });
    let agent = h.agent_with(spec_with_tools(vec![tool])).await;
    run_turn(&agent, "first").await;
    mounted.store(true, Ordering::SeqCst);
    run_turn(&agent, "second").await;
    let requests = h.model.requests();
    assert!(requests[0].tools.is_empty(), "hidden while unmounted");
    assert_eq!(requests[2].tools.len(), 1, "visible once mounted");
    let results = tool_results(&agent.events());
    assert_eq!(results[0].2.as_deref(), Some(TOOL_NOT_AVAILABLE));
    assert_eq!(
        (results[1].1.as_str(), results[1].2.as_deref()),
        ("ran", None)
    );
    // The allowed set hands an unmounted tool on all the same.
    assert_eq!(agent.toolset().allowed().count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_host_records_policy_and_custom_events_but_not_runtime_events() {
    let h = Harness::new([]);
    let agent = h.agent().await;
    let seq = agent
        .record(lineage_log::SandboxMode {
            mode: "read-only".into(),
            source: lineage_log::PolicySource::Own,
        })
        .unwrap();
    assert_eq!(seq, 0);
    let refused = agent.record(lineage_log::TurnStart { turn: 1 });
    assert!(matches!(
        refused,
        Err(lineage_agent::AgentError::NotRecordable {
            kind: "turn/start",
            ..
        })
    ));
    assert_eq!(kinds(&agent.events()), ["sandbox/mode"]);
    agent.flush().await.unwrap();
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_host_custom_event_must_carry_strict_json() {
    let h = Harness::new([]);
    let agent = h.agent().await;
    let custom = |payload: &str| lineage_log::Custom {
        type_name: "budget/spent".into(),
        payload: payload.into(),
        ignorable: true,
    };
    assert_eq!(agent.record(custom(r#"{"cents": 12}"#)).unwrap(), 0);
    for payload in [r#"{"cents": NaN}"#, r#"{"cents": -0}"#, "twelve"] {
        match agent.record(custom(payload)) {
            Err(lineage_agent::AgentError::Log {
                source: lineage_log::LogError::InvalidEvent { seq: 1, reason, .. },
                ..
            }) => assert!(reason.contains("strict JSON"), "{payload:?}: {reason}"),
            other => panic!("{payload:?}: expected the event at seq 1 refused, got {other:?}"),
        }
    }
    assert_eq!(kinds(&agent.events()), ["custom"]);
    agent.flush().await.unwrap();
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn changes_count_status_and_inbox_changes_without_copying_events() {
    let h = Harness::new([Response::text("hi")]);
    let agent = h.agent().await;
    let mut changes = agent.changes();
    agent.inject(user("context")).unwrap();
    assert!(changes.has_changed().unwrap(), "an insert is a change");
    changes.borrow_and_update();
    agent.followup(user("go")).unwrap();
    // The insert, running and the claims happen before `followup` returns; going idle is
    // one more change.
    let before = *changes.borrow_and_update();
    agent.when_idle().await;
    assert_eq!(*changes.borrow(), before + 1, "going idle");
    let after = *changes.borrow_and_update();
    agent
        .record(lineage_log::SandboxMode {
            mode: "read-only".into(),
            source: lineage_log::PolicySource::Own,
        })
        .unwrap();
    assert_eq!(*changes.borrow(), after, "other events are not changes");
}
