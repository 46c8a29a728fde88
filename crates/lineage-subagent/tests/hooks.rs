//! Continuable children take turn-loop hooks, from their request or from setup contributions, at
//! creation and at every later activation, cold resumes included: a step the hook refuses ends the
//! turn `blocked`, and the child settles declining the task (stop reason `refusal`, a "declined"
//! notice to its parent).
//!
//! Deterministic: time is paused and tests wait on lifecycle events, never on sleeps.

use std::sync::Arc;

use lineage_agent::{
    Agent, Agents, BoxFuture, HookError, Hooks, PreStep, PreStepDecision, Response,
};
use lineage_log::{MessageSource, SessionId, TurnEndReason};
use lineage_subagent::{
    ContinuableRequest, ContinuableSetup, Installed, Lifecycle, StopReason, SubagentRuntime,
};
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;
use tokio::sync::mpsc::UnboundedReceiver;

/// Refuses any step whose input mentions "forbidden".
struct Gatekeeper;

impl Hooks for Gatekeeper {
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        Box::pin(async move {
            if step.messages.iter().any(|m| m.text().contains("forbidden")) {
                Ok(PreStepDecision::Reject)
            } else {
                Ok(PreStepDecision::Enter(step.messages))
            }
        })
    }
}

/// Installs the gatekeeper in every continuable child.
struct GatekeeperSetup;

impl ContinuableSetup for GatekeeperSetup {
    fn install(&self, _: &SubagentRuntime, _: SessionId) -> Installed {
        Installed {
            hooks: Some(Arc::new(Gatekeeper)),
            ..Installed::default()
        }
    }
}

/// A host over the store at `path`: spawn registered, the gatekeeper contributed.
fn host(path: &std::path::Path) -> (Arc<Router>, Agents, SubagentRuntime) {
    let (router, agents, runtime) = reopen_with_spawn(path);
    runtime.register_continuable_setup(Arc::new(GatekeeperSetup));
    (router, agents, runtime)
}

/// Sends `text` to `child` as `parent` and returns why the activation it starts stopped.
async fn settles(
    runtime: &SubagentRuntime,
    parent: &Arc<Agent>,
    life: &mut UnboundedReceiver<Lifecycle>,
    child: SessionId,
    text: &str,
) -> StopReason {
    send(runtime, parent, child, text).await.unwrap();
    stop_of(&child_end(life, child).await)
}

/// The texts of the settlement notices `parent` has received.
fn notices(agents: &Agents, parent: SessionId) -> Vec<String> {
    let parent = agents.get(parent).expect("the parent is live");
    parent
        .events()
        .iter()
        .filter_map(|e| match &e.body {
            lineage_log::EventBody::InboxSpliced(s) => Some(s.inserted.clone()),
            _ => None,
        })
        .flatten()
        .filter(|m| matches!(m.source, MessageSource::SubagentSettled { .. }))
        .map(|m| m.text())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_contributed_hook_refuses_a_childs_turn_before_and_after_a_cold_resume() {
    let (_dir, path) = host_store();
    let (parent_id, child) = {
        let (router, agents, runtime) = host(&path);
        router.model(PARENT).push([Response::text("ok")]);
        let parent = fresh_parent(&agents).await;
        let (_, mut life) = listen(&runtime);
        let started =
            spawn_continuable(&runtime, &parent, "worker", "do the forbidden thing").await;
        assert_eq!(
            stop_of(&child_end(&mut life, started.child).await),
            StopReason::Refusal
        );
        within(parent.when_idle()).await;
        assert!(
            router.model("worker").requests().is_empty(),
            "the model was never asked"
        );
        let notices = notices(&agents, parent.id());
        assert!(
            notices.iter().any(|n| n.contains("declined")),
            "the parent hears that the child declined: {notices:?}"
        );
        shut_down(&runtime, &agents).await;
        (parent.id(), started.child)
    };

    // A new process: the contribution is registered again, and the resumed child gets its hook.
    let (router, agents, runtime) = host(&path);
    router
        .model(PARENT)
        .push([Response::text("ok"), Response::text("ok")]);
    router.model("worker").push([Response::text("done it")]);
    let parent = resumed_parent(&agents, parent_id).await;
    let (_, mut life) = listen(&runtime);
    let forbidden = settles(
        &runtime,
        &parent,
        &mut life,
        child,
        "now the forbidden part",
    )
    .await;
    assert_eq!(forbidden, StopReason::Refusal);
    assert!(router.model("worker").requests().is_empty());
    let fine = settles(&runtime, &parent, &mut life, child, "now something fine").await;
    assert_eq!(fine, StopReason::Completed);
    assert_eq!(router.model("worker").requests().len(), 1);

    let events = agents.store().read_from(child, 0).unwrap();
    assert_eq!(
        turn_ends(&events),
        [
            TurnEndReason::Blocked,
            TurnEndReason::Blocked,
            TurnEndReason::Completed
        ]
    );
    assert_balanced(&events);
    shut_down(&runtime, &agents).await;
}

#[tokio::test(start_paused = true)]
async fn hooks_given_with_the_request_apply_to_every_activation_of_the_child() {
    let (_dir, path) = host_store();
    let (router, agents, runtime) = reopen_with_spawn(&path);
    router.model(PARENT).push([
        Response::text("ok"),
        Response::text("ok"),
        Response::text("ok"),
    ]);
    router.model("worker").push([Response::text("done it")]);
    let parent = fresh_parent(&agents).await;
    let (_, mut life) = listen(&runtime);
    let request = ContinuableRequest {
        hooks: Some(Arc::new(Gatekeeper)),
        ..continuable(&parent, "worker", "the forbidden thing")
    };
    let child = runtime
        .start_continuable("spawn", request)
        .await
        .unwrap()
        .child;
    assert_eq!(
        stop_of(&child_end(&mut life, child).await),
        StopReason::Refusal
    );
    // Settled and torn down: each follow-up activates the child again, with the same hooks.
    for (text, stop) in [
        ("the forbidden thing, again", StopReason::Refusal),
        ("something fine", StopReason::Completed),
    ] {
        let stopped = settles(&runtime, &parent, &mut life, child, text).await;
        assert_eq!(stopped, stop, "{text}");
    }
    assert_eq!(router.model("worker").requests().len(), 1);
    within(parent.when_idle()).await;
    let declined = notices(&agents, parent.id())
        .iter()
        .filter(|n| n.contains("declined"))
        .count();
    assert_eq!(declined, 2, "one declined notice per refused epoch");
    shut_down(&runtime, &agents).await;
}
