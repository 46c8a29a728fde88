//! Teardown failures of continuable children are real and visible: a child whose disposal fails
//! (its final flush) settles as failed, its parent gets the "failed" notice, the teardown reports
//! `ACTIVATION_TEARDOWN_FAILED`, and every such best-effort failure, an undelivered notice
//! included, reaches the registry's watchers as a diagnostic. A one-shot run whose child's final
//! flush fails keeps its result, and its disposal reports the failure.
//!
//! Deterministic: time is paused and child models are held by gates.

use std::sync::Arc;

use lineage_agent::{Agent, Diagnostic, DiagnosticKind, Gate, RegistryEvent, Response};
use lineage_log::{ApprovalPolicy, Event, EventBody, PolicySource};
use lineage_store::StoreError;
use lineage_subagent::{ContinuableStarted, ErrorCode, Lifecycle, StopReason};
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;
use tokio::sync::mpsc::UnboundedReceiver;

fn broken_disk(agent: &Agent) {
    agent.fail_final_flush(Some(Box::new(|| StoreError::Unavailable {
        reason: "the disk is gone".into(),
    })));
}

/// The diagnostics the registry's watchers have received so far.
fn diagnostics(watch: &mut UnboundedReceiver<RegistryEvent>) -> Vec<Diagnostic> {
    drain(watch)
        .into_iter()
        .filter_map(|e| match e {
            RegistryEvent::Diagnostic(d) => Some(d),
            _ => None,
        })
        .collect()
}

async fn end_of(life: &mut UnboundedReceiver<Lifecycle>) -> StopReason {
    within(async {
        loop {
            match life.recv().await {
                Some(Lifecycle::End { stop_reason, .. }) => return stop_reason,
                Some(_) => {}
                None => panic!("the lifecycle stream ended"),
            }
        }
    })
    .await
}

/// Starts a continuable child of `parent` asking the `worker` model, and returns it once its first
/// request waits for the returned gate, which releases the answer `answer`.
async fn child_waiting(
    h: &Harness,
    parent: &Arc<Agent>,
    answer: &str,
) -> (ContinuableStarted, Arc<Agent>, Gate) {
    let gate = gated_text(&h.model("worker"), answer);
    let started = spawn_continuable(&h.runtime, parent, "worker", "work").await;
    let child = h.agents.get(started.child).expect("the child is live");
    h.model("worker").wait_for_requests(1).await;
    (started, child, gate)
}

#[tokio::test(start_paused = true)]
async fn a_settled_child_whose_final_flush_fails_settles_failed_with_the_failed_notice() {
    let h = Harness::new();
    h.parent_model().push([Response::text("noted")]);
    let parent = h.parent().await;
    let mut parent_events = parent.subscribe();
    let mut watch = h.agents.subscribe();
    let (_, mut life) = listen(&h.runtime);
    let (started, child, gate) = child_waiting(&h, &parent, "the answer is 42").await;
    broken_disk(&child);
    gate.open();

    let notice = text_lines(&settled_notice(&mut parent_events).await);
    assert_eq!(
        notice,
        format!(
            "Background subagent {} failed before it finished.\nIt left no closing message.",
            started.child
        )
    );
    assert_eq!(end_of(&mut life).await, StopReason::Error);
    within(parent.when_idle()).await;
    assert!(!h.runtime.is_resident(started.child));
    assert!(
        h.agents.get(started.child).is_none(),
        "disposed all the same"
    );

    let seen = diagnostics(&mut watch);
    let kinds: Vec<(lineage_log::SessionId, DiagnosticKind)> =
        seen.iter().map(|d| (d.agent, d.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (started.child, DiagnosticKind::FinalFlushFailed),
            (started.child, DiagnosticKind::TeardownFailed),
        ],
        "{seen:?}"
    );
    assert!(
        seen[1].reason.contains("the disk is gone"),
        "{}",
        seen[1].reason
    );
    assert!(
        seen[1].reason.contains(&started.child.to_string()),
        "{}",
        seen[1].reason
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_reports_activation_teardown_failed_when_a_childs_disposal_fails() {
    let h = Harness::new();
    let parent = h.parent().await;
    let (started, child, _gate) = child_waiting(&h, &parent, "never sent").await;
    broken_disk(&child);
    let error = refusal(within(h.runtime.drain()).await);
    assert_eq!(error.code(), ErrorCode::ActivationTeardownFailed);
    assert!(
        error.to_string().contains(&started.child.to_string()),
        "{error}"
    );
    assert!(error.to_string().contains("the disk is gone"), "{error}");
    assert!(h.agents.get(started.child).is_none());
    assert!(!h.runtime.is_resident(started.child));
}

#[tokio::test(start_paused = true)]
async fn an_undelivered_settlement_notice_is_a_diagnostic_for_its_parent() {
    let h = Harness::new();
    let parent = h.parent().await;
    let mut watch = h.agents.subscribe();
    let (_, mut life) = listen(&h.runtime);
    let (started, _, gate) = child_waiting(&h, &parent, "the answer is 42").await;
    // Another writer appends to the parent's session behind its back: the parent's next append
    // (the notice) is refused by the store, and the parent, whose log the store no longer
    // holds, stops and leaves the registry.
    let seq = parent.events().len() as u64;
    let foreign = EventBody::from(ApprovalPolicy {
        policy: "never".into(),
        source: PolicySource::Own,
    });
    h.store
        .append(parent.id(), &[Event::new(seq, 0, foreign)])
        .unwrap();
    gate.open();
    assert_eq!(end_of(&mut life).await, StopReason::Completed);

    let seen = diagnostics(&mut watch);
    match seen.as_slice() {
        [stopped, d] => {
            assert_eq!(
                (stopped.agent, stopped.kind),
                (parent.id(), DiagnosticKind::LogAheadOfStore)
            );
            assert_eq!(
                (d.agent, d.kind),
                (parent.id(), DiagnosticKind::NoticeUndelivered)
            );
            assert!(
                d.reason.contains(&started.child.to_string()),
                "{}",
                d.reason
            );
        }
        other => panic!("expected the parent stopped and the notice undelivered, got {other:?}"),
    }
    within(parent.when_idle()).await;
    let _ = within(parent.shut_down()).await;
    assert!(h.agents.get(parent.id()).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_run_whose_final_flush_fails_keeps_its_result_and_fails_its_disposal() {
    let h = Harness::new();
    let gate = gated_text(&h.child_model(), "the answer is 42");
    let parent = h.parent().await;
    let run = within(h.runtime.start("spawn", request(&parent, "task")))
        .await
        .expect("the run starts");
    let child = run.local_agent().expect("the child runs here").clone();
    within(h.child_model().wait_for_requests(1)).await;
    broken_disk(&child);
    gate.open();
    let result = within(run.result()).await.expect("the run has a result");
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.text(), "the answer is 42");
    for _ in 0..2 {
        let error = refusal(within(run.dispose()).await);
        assert_eq!(error.code(), ErrorCode::AgentFailure);
        assert!(error.to_string().contains("the disk is gone"), "{error}");
        assert!(
            error.to_string().contains(&child.id().to_string()),
            "{error}"
        );
    }
    assert!(h.agents.get(child.id()).is_none(), "disposed all the same");
}
