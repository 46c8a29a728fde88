//! Follow-ups with a caller-chosen message id: the same id sent again reaches the child once,
//! whether the child is resident (running, or waiting on its turn) or settled and resumed cold,
//! and a retry of a delivered id is accepted. A refused follow-up never reaches the child.
//!
//! Deterministic: time is paused, the child's model is held by a gate, and the tests wait on the
//! runtime's own lifecycle events.

use std::sync::Arc;

use lineage_agent::{Agent, Cancellation, Gate, Response};
use lineage_log::{Event, EventBody, MessageId, SessionId};
use lineage_subagent::{ErrorCode, FollowupRequest};
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;

/// A follow-up from `parent` to `child` saying `text`, under the id `id`.
fn with_id(parent: &Arc<Agent>, child: SessionId, text: &str, id: MessageId) -> FollowupRequest {
    FollowupRequest {
        message_id: Some(id),
        ..FollowupRequest::new(parent.clone(), child, text)
    }
}

/// How many user messages with id `id` the log `events` holds (claimed into a turn).
fn user_messages_with(events: &[Event], id: MessageId) -> usize {
    events
        .iter()
        .filter(|e| matches!(&e.body, EventBody::UserMessage(m) if m.id == id))
        .count()
}

#[tokio::test(start_paused = true)]
async fn the_same_message_id_sent_twice_reaches_a_resident_child_once_and_a_settled_one_not_again()
{
    let h = Harness::new();
    let gate = Gate::new();
    h.model("worker").push([
        Response::text("first").gated(&gate),
        Response::text("did two"),
        Response::text("did three"),
    ]);
    h.parent_model().push((0..4).map(|_| Response::text("ok")));
    let parent = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let child = spawn_continuable(&h.runtime, &parent, "worker", "one")
        .await
        .child;
    h.model("worker").wait_for_requests(1).await;

    // Resident and running: the retry is accepted with the same id and queues nothing more.
    let two = MessageId::new();
    for _ in 0..2 {
        let sent = h
            .runtime
            .send_followup(&with_id(&parent, child, "two", two))
            .await;
        assert_eq!(sent.unwrap(), two);
    }
    gate.open();
    settled(&h.runtime, &mut life, child).await;
    assert_eq!(user_texts(&h.stored(child)), ["one", "two"]);
    assert_eq!(user_messages_with(&h.stored(child), two), 1);

    // One id is one message: other content under it is refused, resident or cold.
    let reused = h
        .runtime
        .send_followup(&with_id(&parent, child, "not two", two))
        .await
        .expect_err("other content under a delivered id is refused");
    assert_eq!(reused.code(), ErrorCode::MessageIdReused, "{reused}");

    // Settled: a retry of a delivered id is accepted, and does not resume the child for it.
    let again = h
        .runtime
        .send_followup(&with_id(&parent, child, "two", two))
        .await;
    assert_eq!(again.unwrap(), two);
    assert!(
        !h.runtime.is_resident(child),
        "not resumed for a message it has"
    );
    let reused = h
        .runtime
        .send_followup(&with_id(&parent, child, "not two", two))
        .await
        .expect_err("other content under a delivered id is refused");
    assert_eq!(reused.code(), ErrorCode::MessageIdReused, "{reused}");
    assert!(!h.runtime.is_resident(child), "not resumed for it");
    assert_eq!(user_messages_with(&h.stored(child), two), 1);

    // Cold: a new id resumes it; sending that id again once it settled delivers nothing more.
    let three = MessageId::new();
    let sent = h
        .runtime
        .send_followup(&with_id(&parent, child, "three", three))
        .await;
    assert_eq!(sent.unwrap(), three);
    settled(&h.runtime, &mut life, child).await;
    let retry = h
        .runtime
        .send_followup(&with_id(&parent, child, "three", three))
        .await;
    assert_eq!(retry.unwrap(), three);
    assert!(!h.runtime.is_resident(child));
    let log = h.stored(child);
    assert_eq!(user_texts(&log), ["one", "two", "three"]);
    assert_eq!(user_messages_with(&log, three), 1);
    assert_eq!(turn_ends(&log).len(), 3, "one turn per distinct message");
}

#[tokio::test(start_paused = true)]
async fn a_refused_follow_up_with_an_id_is_never_delivered_and_the_id_can_be_sent_afterwards() {
    let h = Harness::new();
    h.model("worker")
        .push([Response::text("first"), Response::text("did the retry")]);
    h.parent_model().push((0..4).map(|_| Response::text("ok")));
    let parent = h.parent().await;
    let (_, mut life) = listen(&h.runtime);
    let child = spawn_continuable(&h.runtime, &parent, "worker", "one")
        .await
        .child;
    settled(&h.runtime, &mut life, child).await;

    // Refused: to a child nobody knows, and cancelled before it was accepted.
    let unknown = h
        .runtime
        .send_followup(&with_id(
            &parent,
            SessionId::new(),
            "lost",
            MessageId::new(),
        ))
        .await;
    assert_eq!(refusal(unknown).code(), ErrorCode::NotResumable);
    let id = MessageId::new();
    let cancel = Cancellation::new();
    cancel.cancel(lineage_log::AbortCause::User);
    let cancelled = h
        .runtime
        .send_followup(&FollowupRequest {
            cancel,
            ..with_id(&parent, child, "retry me", id)
        })
        .await;
    assert_eq!(refusal(cancelled).code(), ErrorCode::Cancelled);
    assert!(!h.runtime.is_resident(child));
    assert_eq!(user_messages_with(&h.stored(child), id), 0);

    // The caller's retry under the same id is delivered, once.
    let retried = h
        .runtime
        .send_followup(&with_id(&parent, child, "retry me", id))
        .await;
    assert_eq!(retried.unwrap(), id);
    settled(&h.runtime, &mut life, child).await;
    let log = h.stored(child);
    assert_eq!(user_texts(&log), ["one", "retry me"]);
    assert_eq!(user_messages_with(&log, id), 1);
}
