//! After a crash, nobody is forgotten: a resumed parent gets one settlement notice for each
//! continuable child that a crash stopped mid-turn, with what the child wrote, exactly once,
//! whatever moment of the recovery a second crash interrupts.
//!
//! A crash is a copy of the store file taken while two children are mid-turn (after the writer's
//! last commit, as a SIGKILL would leave it); `tests/crash_notices.rs` at the top kills a real
//! host process.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lineage_agent::{Agent, AgentSpec, Response, ScriptedCall, ToolOutput};
use lineage_log::{EventBody, InboxTarget, Message, MessageSource, SessionId, TurnEndReason};
use lineage_store::Store;
use lineage_subagent::Host;
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;
use tokio::sync::mpsc;

/// The lead's spec: a `wait` tool (inherited by its children) that says when it was called and
/// returns only when its turn is cancelled.
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

/// A store at `dir/crashed.lineage` as a crash leaves it: a lead and two continuable children,
/// `a` waiting in a tool call after writing "checked 3 of 5 files", `b` waiting for its model.
/// Returns the lead's and the children's ids.
async fn crashed_store(dir: &Path) -> (PathBuf, SessionId, SessionId, SessionId) {
    let live = dir.join("live.lineage");
    let router = Arc::new(Router::default());
    const CALL: ScriptedCall<'static> = ("c1", "wait", "{}");
    router.script(
        "a",
        [Response::tool_calls(Some("checked 3 of 5 files"), &[CALL])],
    );
    router.script("b", [Response::hang()]);
    let host = Host::new(Store::open(&live).unwrap(), router.clone()).unwrap();
    let (called, mut calls) = mpsc::unbounded_channel();
    let lead = host
        .agents
        .create(lineage_agent::CreateAgent::fresh(lead_spec(Some(called))))
        .await
        .unwrap();
    // The lead works a turn first, as a parent delegating from its own turn would have.
    router.script(PARENT, [Response::text("two jobs to start")]);
    host.run(&lead, "survey and index the files").await.unwrap();
    let a = spawn_continuable(&host.subagents, &lead, "a", "survey the files")
        .await
        .child;
    let b = spawn_continuable(&host.subagents, &lead, "b", "index them")
        .await
        .child;
    // Both are mid-turn, and everything up to here is durable: the log is flushed before a
    // model request and before tools run.
    within(calls.recv()).await.expect("a calls wait");
    within(router.model("b").wait_for_requests(1)).await;
    let crashed = dir.join("crashed.lineage");
    std::fs::copy(&live, &crashed).expect("the store file is copied");
    let lead_id = lead.id();
    drop(lead);
    host.close().await.unwrap();
    (crashed, lead_id, a, b)
}

fn copy(from: &Path, to: &Path) -> PathBuf {
    std::fs::copy(from, to).expect("the store file is copied");
    to.to_path_buf()
}

fn host(path: &Path) -> Host {
    Host::new(Store::open(path).unwrap(), Arc::new(Router::default())).unwrap()
}

/// The settlement notices in `lead`'s log, each once per insertion.
fn notices(lead: &Agent) -> Vec<Message> {
    lead.with_events(settled_notices)
}

fn assert_interrupted(store: &Store, child: SessionId) {
    store.flush_all().unwrap();
    let events = store.read_from(child, 0).unwrap();
    assert_eq!(turn_ends(&events), [TurnEndReason::Interrupted], "{child}");
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn a_resumed_parent_is_told_once_of_each_child_a_crash_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (crashed, lead_id, a, b) = crashed_store(dir.path()).await;

    let host1_router = Arc::new(Router::default());
    let host1 = Host::new(Store::open(&crashed).unwrap(), host1_router.clone()).unwrap();
    let lead = within(host1.resume(lead_id, lead_spec(None)))
        .await
        .unwrap();
    let told = notices(&lead);
    assert_eq!(told.len(), 2);
    let by = |child| {
        told.iter()
            .find(|m| notice_sender(m) == child)
            .map(text_lines)
            .expect("a notice for each child")
    };
    assert_eq!(
        by(a),
        format!(
            "Background subagent {a} was stopped by a crash before it finished.\nIts closing \
             message:\nchecked 3 of 5 files"
        )
    );
    assert_eq!(
        by(b),
        format!(
            "Background subagent {b} was stopped by a crash before it finished.\nIt left no \
             closing message."
        )
    );
    // Queued for the lead's next turn, not run: the host decides when the lead works.
    assert_eq!(turn_ends(&lead.events()), [TurnEndReason::Completed]);
    assert_eq!(lead.pending(InboxTarget::NextTurn).len(), 2);
    assert_interrupted(&host1.store, a);
    assert_interrupted(&host1.store, b);
    // The lead's next turn reads them.
    let router = host1_router;
    router.script(PARENT, [Response::text("both jobs stopped")]);
    within(host1.run(&lead, "how are the jobs?")).await.unwrap();
    let read: Vec<SessionId> = lead.with_events(|events| {
        events
            .iter()
            .filter_map(|e| match &e.body {
                EventBody::UserMessage(m) => Some(&**m),
                _ => None,
            })
            .filter(|m| matches!(m.source, MessageSource::SubagentSettled { .. }))
            .map(notice_sender)
            .collect()
    });
    assert_eq!(read.len(), 2);
    assert!(read.contains(&a) && read.contains(&b));
    drop(lead);
    host1.close().await.unwrap();

    // Restarted again: nobody is told twice.
    let host2 = host(&crashed);
    let lead = within(host2.resume(lead_id, lead_spec(None)))
        .await
        .unwrap();
    assert_eq!(notices(&lead).len(), 2);
    assert!(
        within(host2.subagents.recover_children(&lead))
            .await
            .unwrap()
            .is_empty()
    );
    drop(lead);
    host2.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_crash_after_a_notice_was_durable_but_before_its_child_was_closed_tells_nobody_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (crashed, lead_id, a, b) = crashed_store(dir.path()).await;
    let first = copy(&crashed, &dir.path().join("first.lineage"));
    let second = copy(&crashed, &dir.path().join("second.lineage"));

    // The notices a full recovery sends.
    let recovered = host(&first);
    let lead = within(recovered.resume(lead_id, lead_spec(None)))
        .await
        .unwrap();
    let notice_a = notices(&lead)
        .into_iter()
        .find(|m| notice_sender(m) == a)
        .expect("a's notice");
    drop(lead);
    recovered.close().await.unwrap();

    // The state a crash in the middle of recovery leaves: a's notice durable in the lead, both
    // children still torn.
    let torn = host(&second);
    let lead = within(torn.agents.resume(lead_id, lead_spec(None)))
        .await
        .unwrap();
    lead.send(notice_a, InboxTarget::NextTurn, false).unwrap();
    within(lead.flush()).await.unwrap();

    let told = within(torn.subagents.recover_children(&lead))
        .await
        .unwrap();
    assert_eq!(told, [b], "a was told already");
    let senders: Vec<SessionId> = notices(&lead).iter().map(notice_sender).collect();
    assert_eq!(senders.len(), 2);
    assert!(senders.contains(&a) && senders.contains(&b));
    assert_interrupted(&torn.store, a);
    assert_interrupted(&torn.store, b);
    drop(lead);
    torn.close().await.unwrap();
}

/// Every notice from `sender_id` that entered `events`' inbox.
fn notices_from(events: &[lineage_log::Event], sender_id: SessionId) -> usize {
    settled_notices(events)
        .iter()
        .filter(|m| notice_sender(m) == sender_id)
        .count()
}

/// Follows `child` up from `lead` on `host` and waits for its settlement notice.
async fn follow_up_and_settle(host: &Host, lead: &Arc<Agent>, child: SessionId) {
    let mut events = lead.subscribe();
    within(host.subagents.followup(
        lead,
        child,
        vec![lineage_log::ContentBlock::text("where are you?")],
        MessageSource::Coordinator { sender: lead.id() },
        &lineage_agent::Cancellation::new(),
    ))
    .await
    .expect("the follow-up is accepted");
    settled_notice(&mut events).await;
}

#[tokio::test(start_paused = true)]
async fn a_cold_resumed_child_is_told_once_of_its_own_child_a_crash_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.lineage");
    let crashed = dir.path().join("crashed.lineage");
    let (lead_id, a, a1) = {
        let router = Arc::new(Router::default());
        router.script(PARENT, [Response::text("one job to start")]);
        router.script("a", [Response::hang()]);
        router.script("a1", [Response::hang()]);
        let host = Host::new(Store::open(&live).unwrap(), router.clone()).unwrap();
        let lead = host
            .agents
            .create(lineage_agent::CreateAgent::fresh(lead_spec(None)))
            .await
            .unwrap();
        host.run(&lead, "survey the files").await.unwrap();
        let a = spawn_continuable(&host.subagents, &lead, "a", "survey them")
            .await
            .child;
        within(router.model("a").wait_for_requests(1)).await;
        let a_agent = host.agents.get(a).expect("a is resident");
        let a1 = spawn_continuable(&host.subagents, &a_agent, "a1", "the first half")
            .await
            .child;
        within(router.model("a1").wait_for_requests(1)).await;
        std::fs::copy(&live, &crashed).expect("the store file is copied");
        let lead_id = lead.id();
        drop((lead, a_agent));
        host.close().await.unwrap();
        (lead_id, a, a1)
    };

    for restart in 0..2 {
        let router = Arc::new(Router::default());
        router.script("a", [Response::text("resumed")]);
        let host = Host::new(Store::open(&crashed).unwrap(), router.clone()).unwrap();
        let lead = within(host.resume(lead_id, lead_spec(None))).await.unwrap();
        // The lead hears of a (torn) on the first restart only; a1 is a's child, not the lead's.
        assert_eq!(
            notices(&lead)
                .iter()
                .filter(|m| notice_sender(m) == a1)
                .count(),
            0
        );
        follow_up_and_settle(&host, &lead, a).await;
        host.store.flush_all().unwrap();
        let a_events = host.store.read_from(a, 0).unwrap();
        assert_eq!(notices_from(&a_events, a1), 1, "restart {restart}");
        assert_interrupted(&host.store, a1);
        drop(lead);
        host.close().await.unwrap();
    }
}
