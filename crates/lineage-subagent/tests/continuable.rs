//! Continuable children: acceptance, settlement and its notice, follow-ups to running, waiting and
//! settled children, cold resume after a restart, interrupt, report, drains and refusals.
//!
//! Every test is deterministic: time is paused, child models are held by gates, and tests wait on
//! agents' own events, never on sleeps.

use std::sync::Arc;

use lineage_agent::{Agent, AgentStatus, Cancellation, Gate, Response};
use lineage_log::{
    AbortCause, ContentBlock, DescriptorMode, EventBody, MessageSource, PolicySource, SandboxMode,
    SessionId, TurnEndReason, fold_descriptor, fold_policy,
};
use lineage_subagent::tools::ReportSetup;
use lineage_subagent::{
    Authority, ContinuableRequest, ErrorCode, Lifecycle, ListingRow, ReportDelivery, StopReason,
};
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;
use tokio::sync::mpsc::UnboundedReceiver;

fn is_notice(source: &MessageSource) -> bool {
    matches!(source, MessageSource::SubagentSettled { .. })
}

fn is_report(source: &MessageSource) -> bool {
    matches!(source, MessageSource::SubagentReport { .. })
}

/// Checks that a report by `agent`, delivered as `delivery`, is refused as unauthorized.
fn assert_report_refused(h: &Harness, agent: &Arc<Agent>, delivery: ReportDelivery) {
    let content = vec![ContentBlock::text("x")];
    let report = h
        .runtime
        .report(agent, content, delivery, &Cancellation::new());
    assert_eq!(refusal(report).code(), ErrorCode::Unauthorized);
}

/// A parent answering "ok", listened to, with its continuable child `worker` started on "one"
/// and answering with `answers`; returns the parent, the lifecycle and the child's agent.
async fn parent_of_a_worker(
    h: &Harness,
    answers: impl IntoIterator<Item = Response>,
) -> (Arc<Agent>, UnboundedReceiver<Lifecycle>, Arc<Agent>) {
    h.model("worker").push(answers);
    h.parent_model().push([Response::text("ok")]);
    let parent = h.parent().await;
    let (_, life) = listen(&h.runtime);
    let started = spawn_continuable(&h.runtime, &parent, "worker", "one").await;
    let child = h.agents.get(started.child).expect("the child is live");
    (parent, life, child)
}

/// Waits until `agent` is idle and checks that its one turn was aborted for `cause`.
async fn assert_aborted_once(agent: &Arc<Agent>, cause: AbortCause) {
    within(agent.when_idle()).await;
    assert_eq!(
        turn_ends(&agent.events()),
        [TurnEndReason::Aborted { cause }]
    );
}

#[tokio::test(start_paused = true)]
async fn a_started_child_runs_settles_and_its_idle_parent_gets_one_notice_turn() {
    let h = Harness::new();
    let gate = gated_text(&h.model("worker"), "the answer is 42");
    h.parent_model().push([Response::text("noted")]);
    let parent = h.parent().await;
    let mut parent_events = parent.subscribe();
    let (_, mut life) = listen(&h.runtime);
    let started = spawn_continuable(&h.runtime, &parent, "worker", "find the answer").await;
    // Accepted, resident, and announced by `subagent/start` before any model request.
    assert!(h.runtime.is_resident(started.child));
    assert!(
        matches!(drain(&mut life).as_slice(), [Lifecycle::Start(info)] if info.child == started.child)
    );
    let child = h.agents.get(started.child).expect("the child is live");
    assert_eq!(child.delegation_depth(), 1);
    h.model("worker").wait_for_requests(1).await;
    gate.open();
    let notice = text_lines(&inbox_inserted(&mut parent_events, is_notice).await);
    assert_eq!(
        notice,
        format!(
            "Background subagent {} finished; it will do nothing more unless you message it \
             again.\nIts closing message:\nthe answer is 42",
            started.child
        )
    );
    match settled(&h.runtime, &mut life, started.child).await {
        Lifecycle::End {
            stop_reason,
            last_assistant_message,
            ..
        } => {
            assert_eq!(stop_reason, StopReason::Completed);
            assert_eq!(
                last_assistant_message,
                Some(vec![ContentBlock::text("the answer is 42")])
            );
        }
        other => panic!("expected the end, got {other:?}"),
    }
    within(parent.when_idle()).await;
    // The idle parent ran exactly one turn for the notice.
    assert_eq!(turn_ends(&parent.events()), [TurnEndReason::Completed]);
    assert_eq!(h.parent_model().requests().len(), 1);
    // The child is gone from memory but stored, with its identity in its own events.
    assert!(h.agents.get(started.child).is_none());
    let stored = h.stored(started.child);
    let descriptor = fold_descriptor(&stored).expect("a descriptor");
    assert_eq!(descriptor.mode, DescriptorMode::Continuable);
    assert_eq!(descriptor.label.as_deref(), Some("worker job"));
    assert_eq!(descriptor.model.as_deref(), Some("worker"));
    assert_eq!(user_texts(&stored), ["find the answer"]);
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_busy_parent_gets_the_notice_at_its_next_step_without_a_new_turn() {
    let h = Harness::new();
    let parent_gate = Gate::new();
    h.model("worker").push([Response::text("done")]);
    h.parent_model().push([
        Response::text("working").gated(&parent_gate),
        Response::text("saw the notice"),
    ]);
    let parent = h.parent().await;
    let mut parent_events = parent.subscribe();
    parent.followup(user("do your own work")).unwrap();
    let started = spawn_continuable(&h.runtime, &parent, "worker", "help").await;
    text_lines(&inbox_inserted(&mut parent_events, is_notice).await);
    assert_eq!(parent.status(), AgentStatus::Running);
    parent_gate.open();
    within(parent.when_idle()).await;
    let events = parent.events();
    // One turn, two steps: the notice joined the running turn.
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
    let requests = h.parent_model().requests();
    assert_eq!(requests.len(), 2);
    assert!(
        message_texts(&requests[1])
            .iter()
            .any(|t| t.contains(&started.child.to_string()))
    );
}

#[tokio::test(start_paused = true)]
async fn followups_queue_in_order_in_the_same_activation_and_the_caller_gets_ids() {
    let h = Harness::new();
    let gate = Gate::new();
    let answers = [
        Response::text("first").gated(&gate),
        Response::text("second"),
        Response::text("third"),
    ];
    let (parent, mut life, child) = parent_of_a_worker(&h, answers).await;
    assert_eq!(drain(&mut life).len(), 1, "subagent/start");
    h.model("worker").wait_for_requests(1).await;
    for text in ["two", "three"] {
        send(&h.runtime, &parent, child.id(), text).await.unwrap();
    }
    gate.open();
    settled(&h.runtime, &mut life, child.id()).await;
    // Same agent for every turn, one turn per message, in call order.
    let events = child.events();
    assert_eq!(user_texts(&events), ["one", "two", "three"]);
    assert_eq!(turn_ends(&events).len(), 3);
    // One activation epoch: no second `subagent/start`.
    assert!(drain(&mut life).is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_interrupt_keeps_queued_work_parked_until_the_next_send_which_runs_it_first() {
    let h = Harness::new();
    let answers = [
        Response::hang(),
        Response::text("did two"),
        Response::text("did three"),
    ];
    let (parent, mut life, child) = parent_of_a_worker(&h, answers).await;
    h.model("worker").wait_for_requests(1).await;
    send(&h.runtime, &parent, child.id(), "two").await.unwrap();
    let by_the_user = Authority::User {
        parent: parent.id(),
    };
    h.runtime.interrupt(child.id(), &by_the_user).unwrap();
    // The turn ended aborted by the user; "two" is parked, no model request for it, and the
    // same activation stays resident.
    assert_aborted_once(&child, AbortCause::User).await;
    assert_eq!(h.model("worker").requests().len(), 1);
    assert!(h.runtime.is_resident(child.id()));
    assert!(Arc::ptr_eq(&h.agents.get(child.id()).unwrap(), &child));
    send(&h.runtime, &parent, child.id(), "three")
        .await
        .unwrap();
    settled(&h.runtime, &mut life, child.id()).await;
    assert_eq!(user_texts(&child.events()), ["one", "two", "three"]);
    assert_eq!(h.model("worker").requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn interrupt_authority_is_checked_and_absent_targets_are_accepted_no_ops() {
    let h = Harness::new();
    h.model("a").push([Response::hang()]);
    h.model("b").push([Response::hang()]);
    let parent = h.parent().await;
    let a = spawn_continuable(&h.runtime, &parent, "a", "a").await;
    let b = spawn_continuable(&h.runtime, &parent, "b", "b").await;
    let agent_a = h.agents.get(a.child).unwrap();
    // A sibling is neither parent nor ancestor.
    let sibling = h
        .runtime
        .interrupt(b.child, &Authority::Ancestor(agent_a.clone()));
    assert_eq!(refusal(sibling).code(), ErrorCode::Unauthorized);
    // Self-interrupt and a stale ancestor are refused before the target is looked up.
    let itself = h
        .runtime
        .interrupt(a.child, &Authority::Ancestor(agent_a.clone()));
    assert_eq!(refusal(itself).code(), ErrorCode::Unauthorized);
    let stranger = h.parent().await;
    let not_parent = h.runtime.interrupt(
        a.child,
        &Authority::User {
            parent: stranger.id(),
        },
    );
    assert_eq!(refusal(not_parent).code(), ErrorCode::Unauthorized);
    // Unknown targets are accepted and change nothing.
    h.runtime
        .interrupt(SessionId::new(), &Authority::Ancestor(parent.clone()))
        .unwrap();
    // The real parent may.
    h.runtime
        .interrupt(a.child, &Authority::Ancestor(parent.clone()))
        .unwrap();
    assert_aborted_once(&agent_a, AbortCause::Parent).await;
    // A stale handle: the agent of a settled child, with the same id as no live agent.
    within(h.runtime.drain_children(&parent, &[a.child]))
        .await
        .unwrap();
    let stale = h.runtime.interrupt(b.child, &Authority::Ancestor(agent_a));
    assert_eq!(refusal(stale).code(), ErrorCode::Unauthorized);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_child_is_woken_in_the_same_activation() {
    let h = Harness::new();
    // A's first turn ends only once B is established under it: then A owns B when it ends.
    let a_gate = Gate::new();
    let b_gate = Gate::new();
    h.model("a").push([
        Response::text("started b").gated(&a_gate),
        Response::text("a again"),
        Response::text("b is done"),
    ]);
    h.model("b")
        .push([Response::text("b answer").gated(&b_gate)]);
    h.parent_model()
        .push([Response::text("ok"), Response::text("ok")]);
    let parent = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let a = spawn_continuable(&h.runtime, &parent, "a", "start b").await;
    let agent_a = h.agents.get(a.child).unwrap();
    let b = spawn_continuable(&h.runtime, &agent_a, "b", "work").await;
    assert_eq!(h.agents.get(b.child).unwrap().delegation_depth(), 2);
    a_gate.open();
    within(agent_a.when_idle()).await;
    // A finished its turn but owns B: it waits, resident, same agent.
    assert!(h.runtime.is_resident(a.child));
    send(&h.runtime, &parent, a.child, "more").await.unwrap();
    within(agent_a.when_idle()).await;
    assert!(Arc::ptr_eq(&h.agents.get(a.child).unwrap(), &agent_a));
    assert_eq!(user_texts(&agent_a.events()), ["start b", "more"]);
    // B settles first; A gets B's notice, runs, and then settles itself, child first.
    b_gate.open();
    let mut ends = Vec::new();
    within(async {
        while ends.len() < 2 {
            if let Some(Lifecycle::End { info, .. }) = life.recv().await {
                ends.push(info.child);
            }
        }
    })
    .await;
    assert_eq!(ends, [b.child, a.child]);
    let a_events = h.stored(a.child);
    assert!(
        a_events.iter().any(|e| matches!(&e.body, EventBody::UserMessage(m)
            if matches!(m.source, MessageSource::SubagentSettled { sender, .. } if sender == b.child))),
        "A's history holds B's notice"
    );
    let starts: Vec<_> = drain(&mut life);
    assert!(starts.is_empty(), "no second activation of A: {starts:?}");
}

#[tokio::test(start_paused = true)]
async fn reports_reach_the_direct_parent_only_from_live_continuable_children() {
    let h = Harness::new();
    h.runtime
        .register_continuable_setup(ReportSetup::new(ReportDelivery::NextStep));
    let gate = Gate::new();
    h.model("worker").push([
        Response::tool_call("r1", "report", r#"{"output":"halfway there"}"#),
        Response::text("finished").gated(&gate),
    ]);
    h.parent_model()
        .push([Response::text("thanks"), Response::text("ok")]);
    let parent = h.parent().await;
    let mut parent_events = parent.subscribe();
    let started = spawn_continuable(&h.runtime, &parent, "worker", "go").await;
    let report = text_lines(&inbox_inserted(&mut parent_events, is_report).await);
    assert_eq!(
        report,
        format!(
            "Background subagent {} reports:\nhalfway there",
            started.child
        )
    );
    // The report did not end the child's turn: it goes on to its second step.
    h.model("worker").wait_for_requests(2).await;
    assert!(h.runtime.is_resident(started.child));
    let child = h.agents.get(started.child).unwrap();
    // Only the report tool's own child may report: not the root, not a stale handle.
    assert_report_refused(&h, &parent, ReportDelivery::Quiet);
    gate.open();
    text_lines(&inbox_inserted(&mut parent_events, is_notice).await);
    assert_report_refused(&h, &child, ReportDelivery::Quiet);
    // A one-shot child cannot report either.
    h.child_model().push([Response::hang()]);
    let run = h
        .runtime
        .start("spawn", request(&parent, "one shot"))
        .await
        .unwrap();
    let one_shot = run.local_agent().unwrap().clone();
    assert_report_refused(&h, &one_shot, ReportDelivery::NextStep);
    run.dispose().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn quiet_reports_wait_in_the_parent_without_waking_it() {
    let h = Harness::new();
    h.runtime
        .register_continuable_setup(ReportSetup::new(ReportDelivery::Quiet));
    h.model("worker").push([
        Response::tool_call("r1", "report", r#"{"output":"fyi"}"#),
        Response::hang(),
    ]);
    let parent = h.parent().await;
    let mut parent_events = parent.subscribe();
    let started = spawn_continuable(&h.runtime, &parent, "worker", "go").await;
    text_lines(&inbox_inserted(&mut parent_events, is_report).await);
    assert_eq!(parent.status(), AgentStatus::Idle);
    assert!(parent.has_pending());
    assert!(h.parent_model().requests().is_empty());
    h.runtime
        .drain_children(&parent, &[started.child])
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn start_refusals_leave_no_activation_no_agent_and_no_session() {
    let h = Harness::new();
    let parent = h.parent().await;
    let before = h.footprint();
    let canned = CannedProvider::new("remote", lineage_subagent::Capabilities::ALL);
    h.runtime.register_provider(canned).unwrap();
    let cancelled = Cancellation::new();
    cancelled.cancel(AbortCause::User);
    let request = || continuable(&parent, "w", "x");
    let cases = [
        ("no provider", "nope", request(), ErrorCode::NoProvider),
        (
            "a provider without continuation",
            "remote",
            request(),
            ErrorCode::UnsupportedCapability,
        ),
        (
            "too deep",
            "spawn",
            ContinuableRequest {
                max_depth: Some(0),
                ..request()
            },
            ErrorCode::DepthExceeded,
        ),
        (
            "cancelled",
            "spawn",
            ContinuableRequest {
                cancel: cancelled,
                ..request()
            },
            ErrorCode::Cancelled,
        ),
        (
            "a taken child id",
            "spawn",
            ContinuableRequest {
                child: Some(parent.id()),
                ..request()
            },
            ErrorCode::DuplicateChild,
        ),
    ];
    for (case, provider, request, code) in cases {
        let refused = h.runtime.start_continuable(provider, request).await;
        assert_eq!(refusal(refused).code(), code, "{case}");
    }
    assert_eq!(h.footprint(), before);
    assert!(
        h.runtime
            .list_children(parent.id(), &lineage_agent::Cancellation::new())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn only_the_exact_live_parent_may_send_and_one_shot_or_unknown_children_are_not_resumable() {
    let h = Harness::new();
    h.model("worker").push([Response::hang()]);
    let parent = h.parent().await;
    let stranger = h.parent().await;
    let started = spawn_continuable(&h.runtime, &parent, "worker", "x").await;
    let not_parent = send(&h.runtime, &stranger, started.child, "hi").await;
    let error = refusal(not_parent);
    assert_eq!(error.code(), ErrorCode::Unauthorized);
    assert!(
        error.to_string().contains("another parent session"),
        "{error}"
    );
    let unknown = send(&h.runtime, &parent, SessionId::new(), "hi").await;
    assert_eq!(refusal(unknown).code(), ErrorCode::NotResumable);
    // A one-shot child, settled: it has no continuation state.
    h.child_model().push([Response::text("once")]);
    let once = one_shot_run(&h.runtime, request(&parent, "once")).await;
    let one_shot = send(&h.runtime, &parent, once, "again").await;
    let error = refusal(one_shot);
    assert_eq!(error.code(), ErrorCode::NotResumable);
    assert!(error.to_string().contains("do not"), "{error}");
    h.runtime
        .drain_children(&parent, &[started.child])
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_send_message_cold_resumes_the_child_from_its_log_alone() {
    let (_dir, path) = host_store();
    let (parent_id, child_id) = {
        let (router, agents, runtime) = reopen_with_spawn(&path);
        router
            .model("worker")
            .push([Response::text("first answer")]);
        router.model(PARENT).push([Response::text("ok")]);
        let parent = fresh_parent(&agents).await;
        parent
            .record(SandboxMode {
                mode: "read-only".into(),
                source: PolicySource::Own,
            })
            .unwrap();
        let (_, mut life) = listen(&runtime);
        let request = ContinuableRequest {
            persona: Some("a careful auditor".into()),
            tool_filter: Some(lineage_log::ToolFilter {
                allow: Some(Vec::new()),
                deny: None,
            }),
            ..continuable(&parent, "worker", "audit it")
        };
        let started = runtime.start_continuable("spawn", request).await.unwrap();
        settled(&runtime, &mut life, started.child).await;
        within(parent.when_idle()).await;
        shut_down(&runtime, &agents).await;
        (parent.id(), started.child)
    };
    // A new process: the provider is not registered.
    let (router, agents, runtime) = reopen(&path);
    assert!(runtime.providers().is_empty());
    router
        .model("worker")
        .push([Response::text("second answer")]);
    router.model(PARENT).push([Response::text("ok")]);
    let parent = resumed_parent(&agents, parent_id).await;
    let (_, mut life) = listen(&runtime);
    send(&runtime, &parent, child_id, "audit again")
        .await
        .unwrap();
    let child = agents.get(child_id).expect("the child is live again");
    assert_eq!(child.delegation_depth(), 1);
    let request = {
        router.model("worker").wait_for_requests(1).await;
        router.model("worker").requests().remove(0)
    };
    // Model, persona and filter come from the descriptor.
    assert_eq!(request.model.as_str(), "worker");
    assert!(request.system.contains("a careful auditor"));
    assert!(request.tools.is_empty());
    match settled(&runtime, &mut life, child_id).await {
        Lifecycle::End {
            info,
            last_assistant_message,
            ..
        } => {
            assert_eq!(info.provider.as_str(), "spawn");
            assert_eq!(
                last_assistant_message,
                Some(vec![ContentBlock::text("second answer")])
            );
        }
        other => panic!("expected the end, got {other:?}"),
    }
    let events = agents.store().read_from(child_id, 0).unwrap();
    // Policy was captured once, at creation; resume added nothing.
    let policy = fold_policy(&events);
    assert_eq!(policy.sandbox.map(|m| m.mode.as_str()), Some("read-only"));
    let policy_events = events
        .iter()
        .filter(|e| {
            matches!(
                e.body,
                EventBody::ApprovalPolicy(_) | EventBody::SandboxMode(_)
            )
        })
        .count();
    assert_eq!(policy_events, 2);
    let descriptors = events
        .iter()
        .filter(|e| matches!(e.body, EventBody::SubagentDescriptor(_)))
        .count();
    assert_eq!(descriptors, 1);
    assert_eq!(user_texts(&events), ["audit it", "audit again"]);
    assert!(agents.store().verify().unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn drains_tear_down_resident_children_leave_them_loadable_and_close_admission() {
    let h = Harness::new();
    h.model("a").push([Response::hang()]);
    h.model("b").push([Response::hang()]);
    h.model("c").push([Response::hang()]);
    let left = h.parent().await;
    let right = h.parent().await;
    let a = spawn_continuable(&h.runtime, &left, "a", "x").await;
    let agent_a = h.agents.get(a.child).unwrap();
    let b = spawn_continuable(&h.runtime, &agent_a, "b", "y").await;
    let c = spawn_continuable(&h.runtime, &right, "c", "z").await;
    within(h.runtime.drain_descendants(std::slice::from_ref(&left)))
        .await
        .unwrap();
    assert!(!h.runtime.is_resident(a.child) && !h.runtime.is_resident(b.child));
    assert!(h.runtime.is_resident(c.child), "another tree is untouched");
    let closed = h
        .runtime
        .start_continuable("spawn", continuable(&left, "a", "again"))
        .await;
    assert_eq!(refusal(closed).code(), ErrorCode::Draining);
    for id in [a.child, b.child] {
        let loaded = h.store.inspect(id).expect("a drained child stays loadable");
        assert!(lineage_log::is_balanced(&loaded.events));
    }
    within(h.runtime.drain()).await.unwrap();
    assert!(!h.runtime.is_resident(c.child));
    let closed = h
        .runtime
        .start_continuable("spawn", continuable(&right, "c", "again"))
        .await;
    assert_eq!(refusal(closed).code(), ErrorCode::Draining);
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn listing_comes_from_the_store_and_the_registry_in_pre_order() {
    let h = Harness::new();
    h.model("a").push([Response::hang()]);
    h.model("b").push([Response::text("b done")]);
    h.child_model().push([Response::text("one-shot done")]);
    let parent = h.parent().await;
    let a = spawn_continuable(&h.runtime, &parent, "a", "x").await;
    let agent_a = h.agents.get(a.child).unwrap();
    let once = one_shot_run(&h.runtime, request(&parent, "once")).await;
    let b = spawn_continuable(&h.runtime, &agent_a, "b", "y").await;
    let children = h
        .runtime
        .list_children(parent.id(), &lineage_agent::Cancellation::new())
        .await
        .unwrap();
    let ids: Vec<_> = children.iter().map(ListingRow::id).collect();
    assert_eq!(ids, [a.child, once]);
    match &children[0] {
        ListingRow::Child(row) => {
            assert_eq!(row.mode, DescriptorMode::Continuable);
            assert_eq!(row.label.as_deref(), Some("a job"));
            assert!(row.live && row.has_children);
        }
        other => panic!("expected a child row, got {other:?}"),
    }
    match &children[1] {
        ListingRow::Child(row) => assert!(row.mode == DescriptorMode::OneShot && !row.live),
        other => panic!("expected a child row, got {other:?}"),
    }
    let tree = h
        .runtime
        .list_descendants(parent.id(), &lineage_agent::Cancellation::new())
        .await
        .unwrap();
    let rows: Vec<_> = tree
        .iter()
        .map(|r| match r {
            ListingRow::Child(c) => (c.id, c.parent, c.depth),
            ListingRow::Diagnostic(d) => panic!("unexpected diagnostic {d:?}"),
        })
        .collect();
    assert_eq!(
        rows,
        [
            (a.child, parent.id(), 1),
            (b.child, a.child, 2),
            (once, parent.id(), 1)
        ]
    );
    h.runtime.drain().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_notice_landing_while_the_parent_runs_turn_after_turn_is_claimed_without_another_wake() {
    let h = Harness::new();
    let child_gate = gated_text(&h.model("worker"), "child answer");
    // The child is released while the parent answers its first turn, so it settles while the
    // parent closes that turn and opens the next one.
    let release = child_gate.clone();
    h.parent_model().push([
        Response::compute(move |_| {
            release.open();
            Response::text("first")
        }),
        Response::text("second"),
        Response::text("third"),
        Response::text("fourth"),
    ]);
    let parent = h.parent().await;
    let mut parent_events = parent.subscribe();
    let started = spawn_continuable(&h.runtime, &parent, "worker", "go").await;
    parent.followup(user("one")).unwrap();
    parent.followup(user("two")).unwrap();
    text_lines(&inbox_inserted(&mut parent_events, is_notice).await);
    within(parent.when_idle()).await;
    let events = parent.events();
    let notices: Vec<_> = events
        .iter()
        .filter(|e| matches!(&e.body, EventBody::UserMessage(m)
            if matches!(m.source, MessageSource::SubagentSettled { sender, .. } if sender == started.child)))
        .collect();
    assert_eq!(notices.len(), 1, "the notice entered the history once");
    assert!(!parent.has_pending(), "nothing is left parked");
    assert!(
        turn_ends(&events)
            .iter()
            .all(|r| *r == TurnEndReason::Completed)
    );
    assert_balanced(&events);
}
