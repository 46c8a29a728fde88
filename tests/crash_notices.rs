//! End to end, through the facade: a host process is killed while two continuable children are
//! mid-turn (one inside a tool call, one waiting for its model). The lead, resumed in a new
//! process, is told of each child once ("stopped by a crash", with what the child had written),
//! and a second restart tells it nothing again.

use std::sync::Arc;

use lineage::agent::{AgentSpec, CreateAgent, Response, ScriptedCall, ToolOutput};
use lineage::log::{InboxTarget, SessionId, TurnEndReason};
use lineage::store::Store;
use lineage::subagent::Host;
use lineage_testkit::process::{crash_after_report, helper_command, report_line};
use lineage_testkit::read::{
    assert_balanced, notice_sender, settled_notices, text_lines, turn_ends,
};
use lineage_testkit::subagent::{FnTool, PARENT, Router, continuable, parent_spec};
use tokio::sync::mpsc;

/// Names the store the host process writes; it makes this test's re-run the host.
const STORE_VAR: &str = "LINEAGE_CRASH_NOTICES_STORE";
const TEST: &str = "a_host_killed_with_two_children_mid_turn_tells_its_lead_once_of_each";

/// The lead's spec: a `wait` tool, inherited by the children, that says when it was called (the
/// log is durable before tools run) and settles only on cancellation.
fn lead_spec(called: Option<mpsc::UnboundedSender<()>>) -> AgentSpec {
    let wait = FnTool::new("wait", move |ctx, _| {
        if let Some(called) = &called {
            let _ = called.send(());
        }
        async move {
            ctx.cancel.cancelled().await;
            ToolOutput::text("stopped")
        }
    });
    parent_spec(vec![wait])
}

/// The host to kill: a lead that worked a turn, and two continuable children, `a` in a `wait`
/// call after writing a line, `b` waiting for its model. Prints the three ids once both children
/// are mid-turn (everything before a model request or a tool call is durable), then waits.
async fn host(path: &str) {
    let router = Arc::new(Router::default());
    router.script(PARENT, [Response::text("two jobs to start")]);
    const CALL: ScriptedCall<'static> = ("c1", "wait", "{}");
    router.script(
        "a",
        [Response::tool_calls(Some("checked 3 of 5 files"), &[CALL])],
    );
    router.script("b", [Response::hang()]);
    let host =
        Host::open(std::path::Path::new(path), router.clone()).expect("the host opens the store");
    let (called, mut calls) = mpsc::unbounded_channel();
    let lead = host
        .agents
        .create(CreateAgent::fresh(lead_spec(Some(called))))
        .await
        .expect("the lead is created");
    host.run(&lead, "survey and index the files")
        .await
        .expect("the lead works a turn");
    let mut children = Vec::new();
    for (model, task) in [("a", "survey the files"), ("b", "index them")] {
        let started = host
            .subagents
            .start_continuable("spawn", continuable(&lead, model, task))
            .await
            .expect("the child starts");
        children.push(started.child);
    }
    calls.recv().await.expect("a calls wait");
    router.model("b").wait_for_requests(1).await;
    report_line(&format!(
        "reached {} {} {}",
        lead.id(),
        children[0],
        children[1]
    ));
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn a_host_killed_with_two_children_mid_turn_tells_its_lead_once_of_each() {
    if let Ok(path) = std::env::var(STORE_VAR) {
        return host(&path).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.lineage");
    let reached = crash_after_report(helper_command(TEST).env(STORE_VAR, &path), "reached ");
    let ids: Vec<SessionId> = reached
        .split_whitespace()
        .map(|p| p.parse().expect("an id"))
        .collect();
    let [lead_id, a, b] = ids[..] else {
        panic!("three ids, got {reached:?}")
    };

    for restart in 1..=2 {
        let host = Host::open(&path, Arc::new(Router::default())).expect("the store opens");
        let lead = host.resume(lead_id, lead_spec(None)).await.unwrap();
        let told = settled_notices(&lead.events());
        assert_eq!(told.len(), 2, "restart {restart}: one notice per child");
        let text_of = |child| {
            told.iter()
                .find(|m| notice_sender(m) == child)
                .map(text_lines)
                .unwrap_or_else(|| panic!("restart {restart}: no notice for {child}"))
        };
        assert_eq!(
            text_of(a),
            format!(
                "Background subagent {a} was stopped by a crash before it finished.\nIts \
                 closing message:\nchecked 3 of 5 files"
            )
        );
        assert_eq!(
            text_of(b),
            format!(
                "Background subagent {b} was stopped by a crash before it finished.\nIt left \
                 no closing message."
            )
        );
        assert_eq!(
            lead.pending(InboxTarget::NextTurn).len(),
            2,
            "restart {restart}"
        );
        for child in [a, b] {
            let events = host.store.read_from(child, 0).unwrap();
            assert_eq!(turn_ends(&events), [TurnEndReason::Interrupted]);
            assert_balanced(&events);
        }
        drop(lead);
        host.close().await.unwrap();
        let store = Store::open(&path).unwrap();
        assert!(store.verify().unwrap().is_ok(), "restart {restart}");
    }
}
