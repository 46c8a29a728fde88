//! End to end, through the facade: a host process is killed while its continuable child is in
//! the middle of a turn. A new process opens the same store with no provider registered; the
//! parent's `send_message` resumes the child from its log alone: the torn turn is closed as
//! interrupted, the child keeps its depth, policy and descriptor, runs the new message, settles,
//! and the parent gets the notice.

use std::sync::Arc;

use lineage::agent::{AgentOptions, AgentSpec, Agents, Cancellation, CreateAgent, Response};
use lineage::log::{
    ContentBlock, EventBody, Message, MessageSource, SessionId, TurnEndReason, fold_descriptor,
};
use lineage::store::Store;
use lineage::subagent::{ChildOptions, ContinuableRequest, SpawnProvider, SubagentRuntime};
use lineage_testkit::process::{crash_after_report, helper_job, report_line, rerun_this_test};
use lineage_testkit::read::{text_lines, turn_ends};
use lineage_testkit::subagent::{Router, settled_notice};

fn lead_spec() -> AgentSpec {
    AgentSpec {
        options: AgentOptions {
            endpoint: Some("scripted".into()),
            model: Some("lead".into()),
            max_tokens: Some(512),
            subagent_depth: 0,
        },
        ..AgentSpec::default()
    }
}

/// The host (the crash test re-run with the store's path as its job): a lead with one continuable
/// child whose model never answers. It prints both ids once the child's request is in flight,
/// then waits to be killed.
async fn host_until_killed(path: &str) {
    let store = Store::open(path).expect("the host opens the store");
    let model = Arc::new(Router::default());
    model.script("worker", [Response::hang()]);
    model.script("lead", [Response::text("on it")]);
    let agents = Agents::new(store, model.clone());
    let runtime = SubagentRuntime::new(agents.clone());
    runtime
        .register_provider(Arc::new(SpawnProvider::new()))
        .expect("spawn registers");
    let lead = agents
        .create(CreateAgent::fresh(lead_spec()))
        .await
        .expect("the lead is created");
    // The lead works a turn first, as a parent delegating from its own turn would have.
    lead.followup(Message::user_text("index the archive", MessageSource::User))
        .expect("the prompt is accepted");
    lead.when_idle().await;
    let request = ContinuableRequest {
        agent_options: ChildOptions {
            model: Some("worker".into()),
            ..ChildOptions::default()
        },
        ..ContinuableRequest::new(lead.clone(), "long job", "index the archive")
    };
    let started = runtime
        .start_continuable("spawn", request)
        .await
        .expect("the child starts");
    model.model("worker").wait_for_requests(1).await;
    report_line(&format!("reached {} {}", lead.id(), started.child));
    std::future::pending::<()>().await;
}

/// Runs the host (the calling test re-run) until its child is mid-turn, kills it, and returns
/// the lead's and child's ids.
fn crash_host(path: &std::path::Path) -> (SessionId, SessionId) {
    let reached = crash_after_report(&mut rerun_this_test(path), "reached ");
    let mut parts = reached
        .split_whitespace()
        .map(|p| p.parse().expect("an id"));
    (parts.next().expect("lead"), parts.next().expect("child"))
}

#[tokio::test]
async fn a_child_torn_by_a_crash_is_resumed_by_its_parents_message_without_its_provider() {
    if let Some(path) = helper_job() {
        return host_until_killed(&path).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.lineage");
    let (lead_id, child_id) = crash_host(&path);

    // A new process: same file, no provider.
    let store = Store::open(&path).expect("the store opens after the crash");
    let model = Arc::new(Router::default());
    model.script("worker", [Response::text("indexed 12 files")]);
    model.script("lead", [Response::text("thanks")]);
    let agents = Agents::new(store.clone(), model.clone());
    let runtime = SubagentRuntime::new(agents.clone());
    let lead = agents.resume(lead_id, lead_spec()).await.unwrap();
    let mut lead_events = lead.subscribe();
    runtime
        .followup(
            &lead,
            child_id,
            vec![ContentBlock::text("how far did you get?")],
            MessageSource::Coordinator { sender: lead_id },
            &Cancellation::new(),
        )
        .await
        .expect("the message is accepted");
    let child = agents.get(child_id).expect("the child is resident again");
    assert_eq!(child.delegation_depth(), 1);

    // The notice reaches the lead once the child has answered and settled.
    let notice = settled_notice(&mut lead_events).await;
    assert!(text_lines(&notice).contains("indexed 12 files"));
    lead.when_idle().await;
    store.flush_all().unwrap();

    let events = store.read_from(child_id, 0).unwrap();
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Interrupted, TurnEndReason::Completed]
    );
    let asked: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserMessage(m) => Some(text_lines(m)),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ["index the archive", "how far did you get?"]);
    let descriptor = fold_descriptor(&events).expect("the descriptor survives");
    assert_eq!(descriptor.label.as_deref(), Some("long job"));
    assert_eq!(descriptor.model.as_deref(), Some("worker"));
    let pinned = events
        .iter()
        .filter(|e| matches!(e.body, EventBody::ApprovalPolicy(_)))
        .count();
    assert_eq!(pinned, 1, "the policy was captured once, at creation");
    assert!(store.verify().unwrap().is_ok());
}
