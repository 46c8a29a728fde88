//! A continuable child keeps the agent options it was born with (model endpoint, model, token
//! limit) when a follow-up resumes it cold, after the host restarted, whether the options were
//! given in its request or inherited from its parent.
//!
//! Deterministic: time is paused and the tests wait on the runtime's own lifecycle events.

use lineage_agent::{ModelRequest, Response};
use lineage_subagent::{ChildOptions, ContinuableRequest};
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;

/// Starts a continuable child with `options` (its model is `worker`), lets it settle, restarts
/// the host, sends the child a follow-up and returns the child's model requests: the one before
/// the restart and the one after it.
async fn requests_across_a_restart(options: ChildOptions) -> (ModelRequest, ModelRequest) {
    let (_dir, path) = host_store();
    let (parent_id, child_id, before) = {
        let (router, agents, runtime) = reopen_with_spawn(&path);
        router.model("worker").push([Response::text("first")]);
        router.model(PARENT).push([Response::text("ok")]);
        let parent = fresh_parent(&agents).await;
        let (_, mut life) = listen(&runtime);
        let request = ContinuableRequest {
            agent_options: options,
            ..ContinuableRequest::new(parent.clone(), "worker job", "do it")
        };
        let started = runtime.start_continuable("spawn", request).await.unwrap();
        child_end(&mut life, started.child).await;
        within(parent.when_idle()).await;
        shut_down(&runtime, &agents).await;
        let before = router.model("worker").requests().remove(0);
        (parent.id(), started.child, before)
    };
    let (router, agents, runtime) = reopen(&path);
    router.model("worker").push([Response::text("second")]);
    router.model(PARENT).push([Response::text("ok")]);
    let parent = resumed_parent(&agents, parent_id).await;
    let (_, mut life) = listen(&runtime);
    send(&runtime, &parent, child_id, "again").await.unwrap();
    within(router.model("worker").wait_for_requests(1)).await;
    let after = router.model("worker").requests().remove(0);
    child_end(&mut life, child_id).await;
    shut_down(&runtime, &agents).await;
    (before, after)
}

#[tokio::test(start_paused = true)]
async fn a_child_given_a_token_limit_keeps_it_and_its_provider_after_a_cold_resume() {
    let (before, after) = requests_across_a_restart(ChildOptions {
        endpoint: Some("other".into()),
        model: Some("worker".into()),
        max_tokens: Some(77),
    })
    .await;
    assert_eq!(before.max_tokens, Some(77));
    assert_eq!(before.endpoint.as_str(), "other");
    assert_eq!(
        after.max_tokens,
        Some(77),
        "the resumed request keeps the limit"
    );
    assert_eq!(after.endpoint.as_str(), "other");
    assert_eq!(after.model.as_str(), "worker");
}

#[tokio::test(start_paused = true)]
async fn a_child_that_inherited_its_parents_token_limit_keeps_it_after_a_cold_resume() {
    let (before, after) = requests_across_a_restart(ChildOptions {
        model: Some("worker".into()),
        ..ChildOptions::default()
    })
    .await;
    let parent = parent_options();
    assert_eq!(before.max_tokens, parent.max_tokens);
    assert_eq!(
        after.max_tokens, parent.max_tokens,
        "the resumed request keeps the inherited limit"
    );
    assert_eq!(Some(after.endpoint.as_str()), parent.endpoint.as_deref());
    assert_eq!(after.model.as_str(), "worker");
}
