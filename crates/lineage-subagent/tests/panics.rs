//! Children whose model panics: a continuable child settles as failed, its parent gets the notice,
//! the child serves the next message and drains; a one-shot child returns an error result.
//!
//! Time is paused and every wait is bounded (`within`), so a regression fails instead of hanging.

use std::sync::Arc;

use lineage_agent::Response;
use lineage_log::TurnEndReason;
use lineage_subagent::StopReason;
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;
use tokio::sync::Notify;

const WORKER: &str = "worker";

/// A response whose request panics inside `Model::stream`, as a broken adapter would.
fn panicking() -> Response {
    Response::compute(|_| panic!("the worker's adapter broke"))
}

fn error_code(reason: &TurnEndReason) -> String {
    match reason {
        TurnEndReason::Error(e) => e.code.to_string(),
        other => panic!("expected an error turn end, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_continuable_child_whose_model_panics_settles_failed_and_its_parent_is_told() {
    let h = Harness::new();
    h.model(WORKER)
        .push([panicking(), Response::text("second try worked")]);
    h.parent_model()
        .push([Response::text("noted"), Response::text("noted again")]);
    let parent = h.parent().await;
    let mut parent_events = parent.subscribe();
    let (_, mut life) = listen(&h.runtime);
    let started = within(spawn_continuable(&h.runtime, &parent, WORKER, "do the job")).await;

    let text = text_blocks(&settled_notice(&mut parent_events).await);
    assert_eq!(
        text[0],
        format!(
            "Background subagent {} failed before it finished.",
            started.child
        )
    );
    assert_eq!(
        stop_of(&settled(&h.runtime, &mut life, started.child).await),
        StopReason::Error
    );
    within(parent.when_idle()).await;
    let stored = h.stored(started.child);
    assert_balanced(&stored);
    assert_eq!(
        turn_ends(&stored)
            .iter()
            .map(error_code)
            .collect::<Vec<_>>(),
        ["MODEL_PANICKED"]
    );

    // The settled child takes the next message and runs a normal turn.
    within(send(&h.runtime, &parent, started.child, "try again"))
        .await
        .unwrap();
    let text = text_blocks(&settled_notice(&mut parent_events).await);
    assert_eq!(
        text[0],
        format!(
            "Background subagent {} finished; it will do nothing more unless you message it \
             again.",
            started.child
        )
    );
    assert_eq!(
        stop_of(&settled(&h.runtime, &mut life, started.child).await),
        StopReason::Completed
    );
    let stored = h.stored(started.child);
    assert_eq!(user_texts(&stored), ["do the job", "try again"]);
    assert_eq!(turn_ends(&stored)[1..], [TurnEndReason::Completed]);
    assert_balanced(&stored);

    within(parent.when_idle()).await;
    within(h.runtime.drain()).await.unwrap();
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_continuable_child_whose_model_panics_does_not_hold_up_a_drain() {
    let h = Harness::new();
    let asked = Arc::new(Notify::new());
    let signal = asked.clone();
    h.model(WORKER).push([Response::compute(move |_| {
        signal.notify_one();
        panic!("the worker's adapter broke")
    })]);
    let parent = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let started = within(spawn_continuable(&h.runtime, &parent, WORKER, "do the job")).await;
    // The drain starts once the child's model has panicked.
    within(asked.notified()).await;
    within(h.runtime.drain()).await.unwrap();
    assert_eq!(
        stop_of(&settled(&h.runtime, &mut life, started.child).await),
        StopReason::Error
    );
    assert_balanced(&h.stored(started.child));
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_child_whose_model_panics_returns_an_error_result() {
    let h = Harness::new();
    h.child_model().push([panicking()]);
    let parent = h.parent().await;
    let run = within(h.runtime.start("spawn", request(&parent, "child task")))
        .await
        .unwrap();
    let result = within(run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    let diagnostic = result.diagnostic.expect("a failed run says why");
    assert!(
        diagnostic.starts_with("MODEL_PANICKED: ") && diagnostic.contains("adapter broke"),
        "the diagnostic names the panic: {diagnostic:?}"
    );
    assert_balanced(&run.local_agent().unwrap().events());
    within(run.dispose()).await.unwrap();
    h.assert_verified();
}
