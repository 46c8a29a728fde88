//! A follow-up to a settled child whose cancellation fires while the child is being resumed is
//! refused as the follow-up's cancellation, with the cancellation's cause, and reaches nothing.
//!
//! Deterministic: time is paused; the cancellation fires from inside the resume (a setup
//! contribution, which every activation installs) or before the call.

use std::sync::{Arc, Mutex};

use lineage_agent::{Cancellation, Response};
use lineage_log::{AbortCause, SessionId};
use lineage_subagent::{
    ContinuableRequest, ContinuableSetup, ErrorCode, Installed, SubagentRuntime,
};
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;

/// Fires the armed cancellation when it is installed in a child, that is while the child is
/// being made resident.
#[derive(Default)]
struct CancelOnInstall {
    armed: Mutex<Option<(Cancellation, AbortCause)>>,
}

impl ContinuableSetup for CancelOnInstall {
    fn install(&self, _runtime: &SubagentRuntime, _child: SessionId) -> Installed {
        if let Some((cancel, cause)) = self.armed.lock().unwrap().take() {
            cancel.cancel(cause);
        }
        Installed::default()
    }
}

/// A parent with one settled continuable child; returns the harness pieces and the child.
async fn settled_child() -> (
    Harness,
    Arc<lineage_agent::Agent>,
    SessionId,
    Arc<CancelOnInstall>,
) {
    let h = Harness::new();
    let setup = Arc::new(CancelOnInstall::default());
    h.runtime.register_continuable_setup(setup.clone());
    h.router.model(CHILD).push([Response::text("done")]);
    h.router.model(PARENT).push([Response::text("ok")]);
    let parent = fresh_parent(&h.agents).await;
    let (_, mut life) = listen(&h.runtime);
    let request = ContinuableRequest {
        agent_options: child_options(),
        ..ContinuableRequest::new(parent.clone(), "job", "do it")
    };
    let started = h.runtime.start_continuable("spawn", request).await.unwrap();
    child_end(&mut life, started.child).await;
    within(parent.when_idle()).await;
    assert!(!h.runtime.is_resident(started.child));
    (h, parent, started.child, setup)
}

fn assert_followup_cancelled(
    error: &lineage_subagent::SubagentError,
    child: SessionId,
    cause: &AbortCause,
) {
    assert_eq!(error.code(), ErrorCode::Cancelled, "{error}");
    assert_eq!(error.cancel_cause(), Some(cause), "{error}");
    let text = error.to_string();
    assert!(text.contains("follow-up"), "{text}");
    assert!(text.contains(&child.to_string()), "{text}");
    assert!(!text.contains("published"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_followup_cancelled_while_its_child_is_resumed_is_refused_with_the_cause() {
    let (h, parent, child, setup) = settled_child().await;
    let cancel = Cancellation::new();
    let cause = AbortCause::Hook {
        reason: "the host is closing".into(),
    };
    *setup.armed.lock().unwrap() = Some((cancel.clone(), cause.clone()));
    let sent = send_cancellable(&h.runtime, &parent, child, "again", &cancel).await;
    let error = refusal(sent);
    assert_followup_cancelled(&error, child, &cause);
    assert!(setup.armed.lock().unwrap().is_none(), "the resume ran");
    // Nothing reached the child, and it is not left resident.
    assert!(!h.runtime.is_resident(child));
    let events = h.agents.store().read_from(child, 0).unwrap();
    assert_eq!(user_texts(&events), ["do it"]);
    h.runtime.drain().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_followup_cancelled_before_it_is_sent_is_refused_with_the_cause() {
    let (h, parent, child, setup) = settled_child().await;
    let cancel = Cancellation::new();
    cancel.cancel(AbortCause::User);
    // Armed with another cause: if the resume started, the error would say that one.
    let other = Cancellation::new();
    *setup.armed.lock().unwrap() = Some((other.clone(), AbortCause::Parent));
    let sent = send_cancellable(&h.runtime, &parent, child, "again", &cancel).await;
    let error = refusal(sent);
    assert_followup_cancelled(&error, child, &AbortCause::User);
    assert!(
        setup.armed.lock().unwrap().is_some(),
        "no resume was started"
    );
    assert!(!other.is_cancelled());
    assert!(!h.runtime.is_resident(child));
    let events = h.agents.store().read_from(child, 0).unwrap();
    assert_eq!(user_texts(&events), ["do it"]);
    h.runtime.drain().await.unwrap();
}
