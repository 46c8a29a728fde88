//! The model-facing tools of continuable delegation, driven by the parent's (or the child's)
//! scripted model: `subagent` in continuable mode, `send_message`, `interrupt_agent`,
//! `list_agents` and `report`, plus the per-child ordering of follow-ups they rely on.
//!
//! Every test is deterministic: time is paused, models are held by gates, and tests wait on
//! agents' and the runtime's own events, never on sleeps.

use std::sync::Arc;
use std::time::Duration;

use lineage_agent::{
    Agent, AgentStatus, Cancellation, Gate, INVALID_ARGUMENTS, Queued, Response,
    TOOL_NOT_AVAILABLE, ToolOutput,
};
use lineage_log::{
    AbortCause, ContentBlock, DescriptorMode, Event, EventBody, Header, MessageId, MessageSource,
    SessionId, ToolFilter, TurnEndReason, fold_descriptor, with_log_facts,
};
use lineage_subagent::tools::{
    BackgroundMode, InterruptAgentTool, ListAgentsTool, REPORT_GUIDANCE, ReportSetup,
    SendMessageTool, SubagentTool, SubagentToolConfig,
};
use lineage_subagent::{
    Capabilities, ChildOptions, ContinuableRequest, DiagnosticReason, ErrorCode, Lifecycle,
    ListingRow, ReportDelivery, SetupId, SpawnProvider, StartRequest, SubagentError,
};
use lineage_testkit::continuation::*;
use lineage_testkit::ev::fresh_lineage;
use lineage_testkit::subagent::*;
use serde_json::{Value, json};
use tokio::sync::mpsc::{self};
use tokio::task::JoinHandle;

/// Child options naming the model `model`.
fn model_options(model: &str) -> ChildOptions {
    ChildOptions {
        model: Some(model.into()),
        ..ChildOptions::default()
    }
}

/// Starts a continuable child through the runtime (not through a tool) and returns its id.
async fn start(h: &Harness, request: ContinuableRequest) -> SessionId {
    within(h.runtime.start_continuable("spawn", request))
        .await
        .expect("the continuable child starts")
        .child
}

fn text(s: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::text(s)]
}

fn coordinator(agent: &Agent) -> MessageSource {
    MessageSource::Coordinator { sender: agent.id() }
}

/// A scripted step calling `tool` several times at once: `(call id, arguments)`.
fn calls(tool: &str, list: &[(&str, Value)]) -> Response {
    let raw: Vec<(&str, String)> = list
        .iter()
        .map(|(id, args)| (*id, args.to_string()))
        .collect();
    let borrowed: Vec<(&str, &str, &str)> = raw
        .iter()
        .map(|(id, args)| (*id, tool, args.as_str()))
        .collect();
    Response::tool_calls(None, &borrowed)
}

/// How many `subagent/start` edges of `child` are in `events`.
fn starts_of(events: &[Lifecycle], child: SessionId) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Lifecycle::Start(info) if info.child == child))
        .count()
}

/// The user messages of `events` as (id, text, source).
fn user_messages(events: &[Event]) -> Vec<(MessageId, String, MessageSource)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserMessage(m) => Some((m.id, m.text(), m.source.clone())),
            _ => None,
        })
        .collect()
}

/// The `subagent` tool over `spawn` in continuable mode, its children asking the `child` model;
/// `run_in_background` says whether it offers that switch.
fn continuable_spawn_tool(h: &Harness, run_in_background: bool) -> Arc<SubagentTool> {
    SubagentTool::new(
        &h.runtime,
        SubagentToolConfig {
            background: BackgroundMode::Continuable,
            run_in_background,
            agent_options: child_options(),
            ..SubagentToolConfig::new("spawn")
        },
    )
    .expect("the tool is created")
}

/// A continuable request from `parent` whose child, asking `model`, may use none of its
/// parent's tools.
fn toolless(parent: &Arc<Agent>, model: &str, prompt: &str) -> ContinuableRequest {
    ContinuableRequest {
        tool_filter: Some(ToolFilter {
            allow: Some(Vec::new()),
            deny: None,
        }),
        ..continuable(parent, model, prompt)
    }
}

/// Registers the `report` setup, delivering at the parent's next step.
fn register_report(h: &Harness) -> SetupId {
    h.runtime
        .register_continuable_setup(ReportSetup::new(ReportDelivery::NextStep))
}

/// The tool `slow`, which says when it is entered and then, ignoring cancellation, waits for the
/// returned gate; and the receiver of its entries.
fn slow_tool() -> (Arc<FnTool>, Gate, mpsc::UnboundedReceiver<()>) {
    let gate = Gate::new();
    let (entered_tx, entered_rx) = mpsc::unbounded_channel::<()>();
    let slow = {
        let gate = gate.clone();
        FnTool::new("slow", move |_, _| {
            let gate = gate.clone();
            let entered = entered_tx.clone();
            async move {
                let _ = entered.send(());
                gate.wait().await;
                ToolOutput::text("slow done")
            }
        })
    };
    (slow, gate, entered_rx)
}

/// Spawns the teardown of `parent`'s child `child` and checks that it is blocked (see
/// [`still_blocked`]).
async fn blocked_teardown(
    h: &Harness,
    parent: &Arc<Agent>,
    child: SessionId,
) -> JoinHandle<Result<(), SubagentError>> {
    let mut teardown = tokio::spawn({
        let (runtime, parent) = (h.runtime.clone(), parent.clone());
        async move { runtime.drain_children(&parent, &[child]).await }
    });
    assert!(still_blocked(&mut teardown).await);
    teardown
}

// ----- the `subagent` tool in continuable mode ---------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_subagent_tool_starts_a_continuable_child_and_returns_its_id_at_once() {
    let h = Harness::new();
    let tool = continuable_spawn_tool(&h, true);
    let gate = gated_text(&h.child_model(), "the survey is done");
    h.parent_model().push([
        call(
            "c1",
            "subagent",
            json!({"description": "survey the code", "prompt": "list every module"}),
        ),
        Response::text("it is running"),
        Response::text("noted"),
    ]);
    let parent = h.parent_with(parent_spec(vec![tool])).await;
    let (_, mut life) = listen(&h.runtime);
    run_turn(&parent, "delegate the survey").await;

    // The parent's turn is over while the child's first model request is still held.
    let child = h.only_child(&parent);
    h.child_model().wait_for_requests(1).await;
    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 1);
    assert_ok(&results[0]);
    assert_eq!(
        results[0].text,
        format!("Started subagent {child}. You will get a notice when it settles.")
    );
    assert!(h.runtime.is_resident(child));
    let agent = h.agents.get(child).expect("the child is live");
    assert_eq!(agent.status(), AgentStatus::Running);
    assert!(turn_ends(&agent.events()).is_empty());
    assert_eq!(h.child_model().requests()[0].messages.len(), 1);

    // The parent's model was offered the background switch.
    let schema = offered(&h.parent_model().requests()[0], "subagent");
    assert_eq!(schema["properties"]["run_in_background"]["type"], "boolean");
    assert_eq!(schema["required"], json!(["description", "prompt"]));

    // The child is continuable, labelled with the description, and asks the configured model.
    let descriptor = fold_descriptor(&agent.events())
        .cloned()
        .expect("a descriptor");
    assert_eq!(descriptor.mode, DescriptorMode::Continuable);
    assert_eq!(descriptor.label.as_deref(), Some("survey the code"));
    assert_eq!(descriptor.model.as_deref(), Some(CHILD));
    assert_eq!(user_texts(&agent.events()), ["list every module"]);

    gate.open();
    child_end(&mut life, child).await;
    within(parent.when_idle()).await;
    // The notice of the settled child reached the parent, which ran one more turn for it.
    assert_eq!(turn_ends(&parent.events()).len(), 2);
    assert!(
        user_messages(&parent.events())
            .iter()
            .any(|(_, _, source)| matches!(source,
                MessageSource::SubagentSettled { sender, .. } if *sender == child))
    );
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn run_in_background_false_waits_for_a_one_shot_child_and_returns_its_text() {
    let h = Harness::new();
    let tool = continuable_spawn_tool(&h, true);
    h.child_model().push([Response::text("2 + 2 = 4")]);
    h.parent_model().push([
        call(
            "c1",
            "subagent",
            json!({"description": "add", "prompt": "add 2 and 2", "run_in_background": false}),
        ),
        Response::text("it said 4"),
    ]);
    let parent = h.parent_with(parent_spec(vec![tool])).await;
    run_turn(&parent, "add them").await;

    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 1);
    assert_ok(&results[0]);
    assert_eq!(results[0].text, "2 + 2 = 4");
    // The child ran before the parent's second step, which saw its answer.
    let requests = h.parent_model().requests();
    assert_eq!(requests.len(), 2);
    assert!(
        format!("{:?}", requests[1].messages.last()).contains("2 + 2 = 4"),
        "{:?}",
        requests[1].messages
    );
    // A one-shot child: not resident, disposed, and stored as one-shot.
    let child = h.only_child(&parent);
    assert!(!h.runtime.is_resident(child));
    assert!(h.agents.get(child).is_none());
    let stored = h.stored(child);
    let descriptor = fold_descriptor(&stored).expect("a descriptor");
    assert_eq!(descriptor.mode, DescriptorMode::OneShot);
    assert_eq!(user_texts(&stored), ["add 2 and 2"]);
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_tool_with_run_in_background_disabled_does_not_offer_it_and_refuses_true() {
    let h = Harness::new();
    let tool = continuable_spawn_tool(&h, false);
    h.parent_model().push([
        calls(
            "subagent",
            &[
                (
                    "c1",
                    json!({"description": "x", "prompt": "y", "run_in_background": true}),
                ),
                (
                    "c2",
                    json!({"description": "x", "prompt": "y", "run_in_background": "yes"}),
                ),
            ],
        ),
        Response::text("ok"),
    ]);
    let parent = h.parent_with(parent_spec(vec![tool])).await;
    let before = h.footprint();
    run_turn(&parent, "try it").await;

    let schema = offered(&h.parent_model().requests()[0], "subagent");
    let properties = schema["properties"].as_object().expect("properties");
    assert!(
        !properties.contains_key("run_in_background"),
        "the switch is not offered: {schema}"
    );
    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 2);
    assert_error(&results[0], INVALID_ARGUMENTS);
    assert_error(&results[1], INVALID_ARGUMENTS);
    // Nothing was started.
    assert!(h.children(&parent).is_empty());
    assert!(h.child_model().requests().is_empty());
    let after = h.footprint();
    assert_eq!(after.live, before.live);
    assert!(
        after
            .stored
            .iter()
            .all(|id| before.stored.contains(id) || *id == parent.id()),
        "no session was created: {after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn continuable_mode_refuses_a_provider_that_cannot_continue_whichever_comes_first() {
    let h = Harness::new();
    let continuable_config = |provider: &str, name: &str| SubagentToolConfig {
        background: BackgroundMode::Continuable,
        tool_name: name.into(),
        ..SubagentToolConfig::new(provider)
    };

    // The provider first: the tool is refused.
    h.runtime
        .register_provider(CannedProvider::new("remote", Capabilities::ALL))
        .unwrap();
    let refused = SubagentTool::new(&h.runtime, continuable_config("remote", "remote_agent"));
    assert_eq!(refusal(refused).code(), ErrorCode::UnsupportedCapability);
    // A one-shot tool for the same provider is fine.
    let one_shot = SubagentTool::new(&h.runtime, SubagentToolConfig::new("remote")).unwrap();
    assert!(lineage_agent::Tool::available(one_shot.as_ref()));

    // The tool first: it waits unmounted, and the provider is refused.
    let waiting = SubagentTool::new(&h.runtime, continuable_config("later", "later_agent"))
        .expect("a tool may wait for its provider");
    assert!(!lineage_agent::Tool::available(waiting.as_ref()));
    let refused = h
        .runtime
        .register_provider(CannedProvider::new("later", Capabilities::ALL));
    assert_eq!(refusal(refused).code(), ErrorCode::UnsupportedCapability);
    assert!(h.runtime.provider("later").is_none());
    assert!(!lineage_agent::Tool::available(waiting.as_ref()));
    // A provider that can continue registers under that name, and the tool mounts.
    h.runtime
        .register_provider(Arc::new(SpawnProvider::named("later")))
        .unwrap();
    assert!(lineage_agent::Tool::available(waiting.as_ref()));
}

// ----- send_message ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn send_message_delivers_a_coordinator_turn_and_refuses_unknown_malformed_and_foreign_ids() {
    let h = Harness::new();
    let gate = Gate::new();
    h.model("worker").push([
        Response::text("first done").gated(&gate),
        Response::text("second done"),
    ]);
    h.model("other").push([Response::hang()]);
    let parent = h
        .parent_with(parent_spec(vec![SendMessageTool::new(&h.runtime)]))
        .await;
    let stranger = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let child = start(&h, continuable(&parent, "worker", "first task")).await;
    let foreign = start(&h, continuable(&stranger, "other", "other task")).await;
    h.model("worker").wait_for_requests(1).await;
    h.model("other").wait_for_requests(1).await;

    let unknown = SessionId::new();
    h.parent_model().push([
        calls(
            "send_message",
            &[
                (
                    "s1",
                    json!({"subagent_id": child.to_string(), "message": "second task"}),
                ),
                (
                    "s2",
                    json!({"subagent_id": unknown.to_string(), "message": "hello?"}),
                ),
                (
                    "s3",
                    json!({"subagent_id": "child-number-one", "message": "hello?"}),
                ),
                (
                    "s4",
                    json!({"subagent_id": foreign.to_string(), "message": "not yours"}),
                ),
            ],
        ),
        Response::text("sent"),
        Response::text("noted"),
    ]);
    run_turn(&parent, "keep it busy").await;
    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 4);
    assert_ok(&results[0]);
    assert!(
        results[0].text.contains(&child.to_string()),
        "{:?}",
        results[0]
    );
    assert_error(&results[1], ErrorCode::NotResumable.as_str());
    assert_error(&results[2], INVALID_ARGUMENTS);
    assert_error(&results[3], ErrorCode::Unauthorized.as_str());
    // The foreign child got nothing.
    let foreign_agent = h.agents.get(foreign).unwrap();
    assert!(!foreign_agent.has_pending());
    assert_eq!(user_texts(&foreign_agent.events()), ["other task"]);

    // The delivered message is the child's next turn, from the parent as coordinator.
    gate.open();
    child_end(&mut life, child).await;
    let stored = h.stored(child);
    assert_eq!(turn_ends(&stored).len(), 2);
    let messages = user_messages(&stored);
    assert_eq!(messages.len(), 2);
    let (id, second, source) = &messages[1];
    assert_eq!(second, "second task");
    assert_eq!(*source, coordinator(&parent));
    assert_eq!(
        results[0].text,
        format!("Message {id} is queued as the next turn of subagent {child}.")
    );
    assert_eq!(h.model("worker").requests().len(), 2);
    within(parent.when_idle()).await;
    within(h.runtime.drain()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn send_message_under_one_message_id_delivers_once_however_often_it_is_sent() {
    let h = Harness::new();
    let gate = Gate::new();
    h.model("worker").push([
        Response::text("first done").gated(&gate),
        Response::text("second done"),
    ]);
    let parent = h
        .parent_with(parent_spec(vec![SendMessageTool::new(&h.runtime)]))
        .await;
    let (_, mut life) = listen(&h.runtime);
    let child = start(&h, continuable(&parent, "worker", "first task")).await;
    h.model("worker").wait_for_requests(1).await;
    let named = |message: &str, id: serde_json::Value| json!({"subagent_id": child.to_string(), "message": message, "message_id": id});
    h.parent_model().push([
        calls(
            "send_message",
            &[
                ("s1", named("second task", json!("job-2"))),
                ("s2", named("second task", json!("job-2"))),
                ("s3", named("bad id", json!(7))),
            ],
        ),
        Response::text("sent"),
        Response::text("noted"),
    ]);
    run_turn(&parent, "keep it busy").await;
    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 3);
    assert_ok(&results[0]);
    assert_eq!(
        results[0].text, results[1].text,
        "the same message, accepted twice"
    );
    assert_error(&results[2], INVALID_ARGUMENTS);

    gate.open();
    child_end(&mut life, child).await;
    let messages = user_messages(&h.stored(child));
    let texts: Vec<&str> = messages.iter().map(|(_, text, _)| text.as_str()).collect();
    assert_eq!(texts, ["first task", "second task"], "delivered once");
    within(parent.when_idle()).await;
    within(h.runtime.drain()).await.unwrap();
}

// ----- interrupt_agent ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn interrupt_agent_stops_a_running_child_refuses_itself_and_accepts_absent_ids() {
    let h = Harness::new();
    h.model("worker").push([Response::hang()]);
    let parent = h
        .parent_with(parent_spec(vec![InterruptAgentTool::new(&h.runtime)]))
        .await;
    let (_, mut life) = listen(&h.runtime);
    let child = start(&h, continuable(&parent, "worker", "long job")).await;
    h.model("worker").wait_for_requests(1).await;
    let absent = SessionId::new();
    h.parent_model().push([
        calls(
            "interrupt_agent",
            &[
                ("i1", json!({"agent_id": child.to_string()})),
                ("i2", json!({"agent_id": parent.id().to_string()})),
                ("i3", json!({"agent_id": absent.to_string()})),
                ("i4", json!({"agent_id": 42})),
            ],
        ),
        Response::text("stopped it"),
        Response::text("noted"),
    ]);
    parent.followup(user("stop the job")).unwrap();
    let end = child_end(&mut life, child).await;
    within(parent.when_idle()).await;

    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 4);
    assert_ok(&results[0]);
    assert!(results[0].text.contains(&child.to_string()));
    assert_error(&results[1], ErrorCode::Unauthorized.as_str());
    assert_ok(&results[2]);
    assert!(results[2].text.contains(&absent.to_string()));
    assert_error(&results[3], INVALID_ARGUMENTS);
    // The child's turn ended aborted by its parent, and it settled as stopped.
    assert_eq!(
        turn_ends(&h.stored(child)),
        [TurnEndReason::Aborted {
            cause: AbortCause::Parent
        }]
    );
    match end {
        Lifecycle::End { stop_reason, .. } => {
            assert_eq!(stop_reason, lineage_subagent::StopReason::Aborted)
        }
        other => panic!("expected the end, got {other:?}"),
    }
    // The parent was not interrupted by its own call: its turn completed.
    assert_eq!(turn_ends(&parent.events())[0], TurnEndReason::Completed);
    h.assert_verified();
}

// ----- list_agents -------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn list_agents_renders_statuses_omits_one_shots_and_keeps_corrupt_children_in_place() {
    let h = Harness::new();
    let parent = h
        .parent_with(parent_spec(vec![ListAgentsTool::new(&h.runtime)]))
        .await;
    let (_, mut life) = listen(&h.runtime);

    // Nothing yet.
    h.parent_model().push([
        call("l0", "list_agents", json!({})),
        Response::text("none yet"),
    ]);
    run_turn(&parent, "who is there?").await;
    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 1);
    assert_ok(&results[0]);
    assert_eq!(results[0].text, "(no subagents)");

    // d: settled and disposed, only stored.
    h.model("d").push([Response::text("d done")]);
    h.parent_model().push([Response::text("noted d")]);
    let d = start(&h, continuable(&parent, "d", "do d")).await;
    child_end(&mut life, d).await;
    within(parent.when_idle()).await;
    // a: running.
    h.model("a").push([Response::hang()]);
    let a = start(&h, continuable(&parent, "a", "do a")).await;
    // b: idle between turns, waiting on its own child c (running).
    let b_gate = gated_text(&h.model("b"), "b waits for c");
    h.model("c").push([Response::hang()]);
    let b = start(&h, continuable(&parent, "b", "do b")).await;
    let agent_b = h.agents.get(b).unwrap();
    let c = start(&h, continuable(&agent_b, "c", "do c")).await;
    b_gate.open();
    within(agent_b.when_idle()).await;
    assert!(h.runtime.is_resident(b));
    h.model("a").wait_for_requests(1).await;
    h.model("c").wait_for_requests(1).await;
    // e: a one-shot child.
    h.child_model().push([Response::text("once")]);
    let e = within(one_shot_run(&h.runtime, request(&parent, "do e"))).await;
    // f: a delegated child whose log has no descriptor.
    let f = SessionId::new();
    let lineage = fresh_lineage(parent.id(), 1);
    let header = with_log_facts(&Header::new(f, 1), Some(&lineage), true);
    assert_eq!(header.origin, Some(lineage_log::Origin::Subagent));
    // `import` refuses such a header; a session created first and then written has one.
    h.store.create(header).unwrap();
    h.store
        .append(f, &[Event::new(0, 0, lineage)])
        .expect("the corrupt child is written");

    // The runtime's listing keeps the corrupt child as a diagnostic beside its siblings.
    let rows = within(
        h.runtime
            .list_children(parent.id(), &lineage_agent::Cancellation::new()),
    )
    .await
    .unwrap();
    let mut ids: Vec<SessionId> = rows.iter().map(ListingRow::id).collect();
    ids.sort();
    let mut expected = vec![a, b, d, e, f];
    expected.sort();
    assert_eq!(ids, expected);
    let diagnostics: Vec<_> = rows
        .iter()
        .filter_map(|r| match r {
            ListingRow::Diagnostic(d) => Some(d),
            ListingRow::Child(_) => None,
        })
        .collect();
    assert_eq!(diagnostics.len(), 1, "{rows:?}");
    assert_eq!(diagnostics[0].id, f);
    assert_eq!(diagnostics[0].reason, DiagnosticReason::Corrupt);
    assert_eq!(diagnostics[0].parent, parent.id());

    h.parent_model().push([
        calls(
            "list_agents",
            &[
                ("l1", json!({})),
                ("l2", json!({"scope": "descendants"})),
                ("l3", json!({"scope": "everything"})),
            ],
        ),
        Response::text("listed"),
    ]);
    run_turn(&parent, "who is there now?").await;
    let results = tool_results(&parent.events());
    assert_eq!(results.len(), 4);
    let (children, descendants) = (&results[1], &results[2]);
    assert_ok(children);
    assert_ok(descendants);
    assert_error(&results[3], INVALID_ARGUMENTS);

    let sorted = |text: &str| {
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    let mut expected = vec![
        format!("{a} [running] \u{2014} a job"),
        format!("{b} [idle] \u{2014} b job"),
        format!("{d} [ready] \u{2014} d job"),
        format!("{f} [diagnostic: corrupt]"),
    ];
    expected.sort();
    assert_eq!(sorted(&children.text), expected, "{}", children.text);

    let p = parent.id();
    let mut expected = vec![
        format!("{a} [running] parent={p} depth=1 \u{2014} a job"),
        format!("{b} [idle] parent={p} depth=1 \u{2014} b job"),
        format!("{c} [running] parent={b} depth=2 \u{2014} c job"),
        format!("{d} [ready] parent={p} depth=1 \u{2014} d job"),
        format!("{f} [diagnostic: corrupt] parent={p} depth=1"),
    ];
    expected.sort();
    assert_eq!(sorted(&descendants.text), expected, "{}", descendants.text);
    // Pre-order: c comes right after its parent b.
    let lines: Vec<&str> = descendants.text.lines().collect();
    let at = |id: SessionId| {
        lines
            .iter()
            .position(|l| l.starts_with(&id.to_string()))
            .unwrap()
    };
    assert_eq!(at(c), at(b) + 1, "{}", descendants.text);
    // The one-shot child is omitted from both.
    assert!(!children.text.contains(&e.to_string()));
    assert!(!descendants.text.contains(&e.to_string()));

    within(h.runtime.drain()).await.unwrap();
}

// ----- report ------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn report_is_offered_only_inside_continuable_children_whatever_their_filter() {
    let h = Harness::new();
    register_report(&h);
    let parent = h.parent_with(parent_spec(vec![plain_tool("noop")])).await;
    h.parent_model().push([Response::text("hello")]);
    run_turn(&parent, "hi").await;
    // The root.
    assert_eq!(tool_names(&h.parent_model().requests()[0]), ["noop"]);

    // A one-shot child of the root.
    h.child_model().push([Response::text("once")]);
    within(one_shot_run(&h.runtime, request(&parent, "once"))).await;
    assert_eq!(tool_names(&h.child_model().requests()[0]), ["noop"]);

    // A continuable child that may use none of its parent's tools still has its own `report`.
    h.model("narrow").push([Response::hang()]);
    start(&h, toolless(&parent, "narrow", "work")).await;
    h.model("narrow").wait_for_requests(1).await;
    let narrow = h.model("narrow").requests();
    assert_eq!(tool_names(&narrow[0]), ["report"]);
    assert!(narrow[0].system.contains(REPORT_GUIDANCE));

    // An unfiltered continuable child has its parent's tools and `report`.
    h.model("wide").push([Response::hang()]);
    let wide = start(&h, continuable(&parent, "wide", "work")).await;
    h.model("wide").wait_for_requests(1).await;
    assert_eq!(
        tool_names(&h.model("wide").requests()[0]),
        ["noop", "report"]
    );
    let wide_agent = h.agents.get(wide).unwrap();

    // A one-shot child of that continuable child does not inherit its `report`.
    h.model("once").push([Response::text("once more")]);
    let once = StartRequest {
        agent_options: model_options("once"),
        ..StartRequest::new(wide_agent.clone(), "once more")
    };
    within(one_shot_run(&h.runtime, once)).await;
    assert_eq!(tool_names(&h.model("once").requests()[0]), ["noop"]);

    // A continuable grandchild gets its own `report`, once.
    h.model("deep").push([Response::hang()]);
    start(&h, continuable(&wide_agent, "deep", "work")).await;
    h.model("deep").wait_for_requests(1).await;
    assert_eq!(
        tool_names(&h.model("deep").requests()[0]),
        ["noop", "report"]
    );

    within(h.runtime.drain()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn removing_the_report_setup_unmounts_report_from_a_resident_child() {
    let h = Harness::new();
    let setup = register_report(&h);
    let gate = Gate::new();
    h.model("worker").push([
        call("r1", "report", json!({"output": "too late"})).gated(&gate),
        Response::text("done without reporting"),
        Response::text("resumed"),
    ]);
    h.parent_model()
        .push([Response::text("noted"), Response::text("noted again")]);
    let parent = h.parent_with(parent_spec(vec![plain_tool("noop")])).await;
    let (_, mut life) = listen(&h.runtime);
    let child = start(&h, toolless(&parent, "worker", "go")).await;
    h.model("worker").wait_for_requests(1).await;
    assert_eq!(tool_names(&h.model("worker").requests()[0]), ["report"]);

    // Removed while the child is resident, between its request and the call in its answer.
    assert!(h.runtime.remove_continuable_setup(setup));
    assert!(!h.runtime.remove_continuable_setup(setup));
    assert!(h.runtime.is_resident(child));
    gate.open();
    child_end(&mut life, child).await;

    let requests = h.model("worker").requests();
    assert_eq!(requests.len(), 2);
    assert!(
        tool_names(&requests[1]).is_empty(),
        "{:?}",
        tool_names(&requests[1])
    );
    let stored = h.stored(child);
    let results = tool_results(&stored);
    assert_eq!(results.len(), 1);
    assert_error(&results[0], TOOL_NOT_AVAILABLE);
    within(parent.when_idle()).await;
    // Nothing reached the parent as a report.
    assert!(
        !user_messages(&parent.events())
            .iter()
            .any(|(_, _, s)| matches!(s, MessageSource::SubagentReport { .. }))
    );

    // A later activation does not get it either.
    within(h.runtime.followup(
        &parent,
        child,
        text("again"),
        coordinator(&parent),
        &Cancellation::new(),
    ))
    .await
    .unwrap();
    child_end(&mut life, child).await;
    let requests = h.model("worker").requests();
    assert_eq!(requests.len(), 3);
    assert!(tool_names(&requests[2]).is_empty());
    assert!(!requests[2].system.contains(REPORT_GUIDANCE));
    within(parent.when_idle()).await;
}

// ----- per-child ordering ------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn concurrent_followups_to_one_child_each_become_one_turn_in_the_order_issued() {
    let h = Harness::new();
    let gate = Gate::new();
    h.model("worker").push([
        Response::text("did one"),
        Response::text("did two").gated(&gate),
        Response::text("did three"),
        Response::text("did four"),
    ]);
    h.parent_model()
        .push([Response::text("noted"), Response::text("noted again")]);
    let parent = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let child = start(&h, continuable(&parent, "worker", "one")).await;
    child_end(&mut life, child).await;
    within(parent.when_idle()).await;
    assert!(!h.runtime.is_resident(child));

    // Three follow-ups at once to the settled child: the first resumes it, the others queue
    // behind it on the child's lock.
    let cancel = Cancellation::new();
    let source = coordinator(&parent);
    let (two, three, four) = within(async {
        tokio::join!(
            h.runtime
                .followup(&parent, child, text("two"), source.clone(), &cancel),
            h.runtime
                .followup(&parent, child, text("three"), source.clone(), &cancel),
            h.runtime
                .followup(&parent, child, text("four"), source.clone(), &cancel),
        )
    })
    .await;
    let ids = [two.unwrap(), three.unwrap(), four.unwrap()];
    h.model("worker").wait_for_requests(2).await;
    gate.open();
    let epoch = until_end(&mut life, child).await;

    // One activation for all three, and it settled only once they had all run.
    assert_eq!(starts_of(&epoch, child), 1, "{epoch:?}");
    let stored = h.stored(child);
    assert_eq!(user_texts(&stored), ["one", "two", "three", "four"]);
    let stored_ids: Vec<MessageId> = user_messages(&stored)[1..]
        .iter()
        .map(|(id, _, _)| *id)
        .collect();
    assert_eq!(stored_ids, ids);
    assert_eq!(
        turn_ends(&stored),
        vec![TurnEndReason::Completed; 4],
        "one turn per message"
    );
    assert_eq!(h.model("worker").requests().len(), 4);
    within(parent.when_idle()).await;
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_refused_followup_does_not_block_the_next_one_to_the_same_child() {
    let h = Harness::new();
    let gate = Gate::new();
    h.model("worker").push([
        Response::text("did one"),
        Response::text("did welcome").gated(&gate),
        Response::text("did more"),
    ]);
    h.parent_model()
        .push([Response::text("noted"), Response::text("noted again")]);
    let parent = h.parent().await;
    let stranger = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let child = start(&h, continuable(&parent, "worker", "one")).await;
    child_end(&mut life, child).await;
    within(parent.when_idle()).await;

    // Interleaved: a stranger's attempt on the settled child, the parent's (which resumes it),
    // a stranger's attempt on the resident child, the parent's again.
    let cancel = Cancellation::new();
    let (intrusion, welcome, again, more) = within(async {
        tokio::join!(
            h.runtime.followup(
                &stranger,
                child,
                text("intrusion"),
                coordinator(&stranger),
                &cancel
            ),
            h.runtime.followup(
                &parent,
                child,
                text("welcome"),
                coordinator(&parent),
                &cancel
            ),
            h.runtime.followup(
                &stranger,
                child,
                text("intrusion again"),
                coordinator(&stranger),
                &cancel
            ),
            h.runtime
                .followup(&parent, child, text("more"), coordinator(&parent), &cancel),
        )
    })
    .await;
    assert_eq!(refusal(intrusion).code(), ErrorCode::Unauthorized);
    assert_eq!(refusal(again).code(), ErrorCode::Unauthorized);
    let ids = [welcome.unwrap(), more.unwrap()];
    gate.open();
    child_end(&mut life, child).await;

    let stored = h.stored(child);
    assert_eq!(user_texts(&stored), ["one", "welcome", "more"]);
    let stored_ids: Vec<MessageId> = user_messages(&stored)[1..]
        .iter()
        .map(|(id, _, _)| *id)
        .collect();
    assert_eq!(stored_ids, ids);
    assert_eq!(turn_ends(&stored).len(), 3);
    within(parent.when_idle()).await;
}

/// Whether `handle` is still unfinished once every other task has gone as far as it can (the
/// clock is paused, so the timeout fires only when everything is blocked).
async fn still_blocked<T>(handle: &mut JoinHandle<T>) -> bool {
    tokio::time::timeout(Duration::from_secs(60), handle)
        .await
        .is_err()
}

#[tokio::test(start_paused = true)]
async fn followups_to_different_children_do_not_wait_for_each_other() {
    let h = Harness::new();
    // `slow` ignores cancellation until its gate opens, so a teardown of the child that called it
    // (and a follow-up waiting on that teardown, under the child's lock) stays blocked.
    let (slow, slow_gate, mut entered_rx) = slow_tool();
    h.model("a")
        .push([call("t1", "slow", json!({})), Response::text("a again")]);
    h.model("b")
        .push([Response::text("b first"), Response::text("b second")]);
    h.parent_model()
        .push((0..6).map(|_| Response::text("noted")).collect::<Vec<_>>());
    let parent = h.parent_with(parent_spec(vec![slow])).await;
    let (_, mut life) = listen(&h.runtime);
    let a = start(&h, continuable(&parent, "a", "a first")).await;
    let b = start(&h, continuable(&parent, "b", "b first")).await;
    child_end(&mut life, b).await;
    within(entered_rx.recv()).await.unwrap();

    // Tear a down while its tool holds it, then follow up to it: that follow-up waits for the
    // teardown while holding a's lock.
    let teardown = blocked_teardown(&h, &parent, a).await;
    let mut to_a = tokio::spawn({
        let (runtime, parent) = (h.runtime.clone(), parent.clone());
        async move {
            let source = coordinator(&parent);
            runtime
                .followup(&parent, a, text("a second"), source, &Cancellation::new())
                .await
        }
    });
    assert!(still_blocked(&mut to_a).await);

    // Meanwhile b is resumed, runs and settles.
    within(h.runtime.followup(
        &parent,
        b,
        text("b second"),
        coordinator(&parent),
        &Cancellation::new(),
    ))
    .await
    .expect("b's follow-up does not wait for a");
    child_end(&mut life, b).await;
    assert_eq!(user_texts(&h.stored(b)), ["b first", "b second"]);
    assert!(!teardown.is_finished() && !to_a.is_finished());

    // Once a's tool returns, its teardown ends and the waiting follow-up resumes it.
    slow_gate.open();
    within(teardown).await.unwrap().unwrap();
    within(to_a).await.unwrap().unwrap();
    child_end(&mut life, a).await;
    child_end(&mut life, a).await;
    let stored = h.stored(a);
    assert_eq!(user_texts(&stored), ["a first", "a second"]);
    assert_eq!(
        turn_ends(&stored),
        [
            TurnEndReason::Aborted {
                cause: AbortCause::Parent
            },
            TurnEndReason::Completed
        ]
    );
    within(parent.when_idle()).await;
    h.assert_verified();
}

// ----- guidance, defaults and cancellation ----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn with_the_switch_disabled_an_omitted_switch_does_what_the_description_says() {
    let h = Harness::new();
    let tool = continuable_spawn_tool(&h, false);
    h.child_model().push([Response::text("the answer")]);
    h.parent_model().push([
        call("c1", "subagent", json!({"description": "x", "prompt": "y"})),
        Response::text("ok"),
        Response::text("noted"),
    ]);
    let parent = h.parent_with(parent_spec(vec![tool])).await;
    let (_, mut life) = listen(&h.runtime);
    run_turn(&parent, "go").await;
    let requests = h.parent_model().requests();
    let description = requests[0]
        .tools
        .iter()
        .find(|t| t.name == "subagent")
        .unwrap()
        .description
        .clone();
    let promises_to_wait = description.contains("The call waits for the subagent");
    let results = tool_results(&parent.events());
    let went_to_background = results[0].text.starts_with("Started subagent");
    assert_ne!(
        promises_to_wait, went_to_background,
        "description: {description:?}\nresult: {:?}",
        results[0]
    );
    child_end(&mut life, h.only_child(&parent)).await;
    within(parent.when_idle()).await;
}

#[tokio::test(start_paused = true)]
async fn removing_the_report_setup_also_withdraws_its_guidance_from_a_resident_child() {
    let h = Harness::new();
    let setup = register_report(&h);
    let gate = Gate::new();
    h.model("worker").push([
        call("n1", "noop", json!({})).gated(&gate),
        Response::text("done"),
    ]);
    h.parent_model().push([Response::text("noted")]);
    let parent = h.parent_with(parent_spec(vec![plain_tool("noop")])).await;
    let (_, mut life) = listen(&h.runtime);
    let child = start(&h, continuable(&parent, "worker", "go")).await;
    h.model("worker").wait_for_requests(1).await;
    assert!(
        h.model("worker").requests()[0]
            .system
            .contains(REPORT_GUIDANCE)
    );
    assert!(h.runtime.remove_continuable_setup(setup));
    gate.open();
    child_end(&mut life, child).await;
    let requests = h.model("worker").requests();
    assert_eq!(tool_names(&requests[1]), ["noop"]);
    assert!(
        !requests[1].system.contains(REPORT_GUIDANCE),
        "the child is still told to call `report`, which it no longer has"
    );
    within(parent.when_idle()).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_turn_is_not_held_by_a_send_message_waiting_on_a_teardown() {
    let h = Harness::new();
    let (slow, slow_gate, mut entered_rx) = slow_tool();
    h.model("a").push([call("t1", "slow", json!({}))]);
    let parent = h
        .parent_with(parent_spec(vec![slow, SendMessageTool::new(&h.runtime)]))
        .await;
    let a = start(&h, continuable(&parent, "a", "a first")).await;
    within(entered_rx.recv()).await.unwrap();
    let teardown = blocked_teardown(&h, &parent, a).await;
    h.parent_model().push([call(
        "s1",
        "send_message",
        json!({"subagent_id": a.to_string(), "message": "more"}),
    )]);
    parent.followup(user("tell a more")).unwrap();
    h.parent_model().wait_for_requests(1).await;
    let mut idle = tokio::spawn({
        let parent = parent.clone();
        async move { parent.when_idle().await }
    });
    assert!(
        still_blocked(&mut idle).await,
        "send_message waits on a's teardown"
    );
    assert!(tool_results(&parent.events()).is_empty());
    parent.cancel(AbortCause::User, Queued::Discard).unwrap();
    let stopped = !still_blocked(&mut idle).await;
    slow_gate.open();
    within(teardown).await.unwrap().unwrap();
    within(parent.when_idle()).await;
    assert!(
        stopped,
        "the parent's cancelled turn waited for a's teardown to finish"
    );
    let results = tool_results(&parent.events());
    assert_error(&results[0], ErrorCode::Cancelled.as_str());
}
