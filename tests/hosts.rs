//! Many hosts on one shared store (PostgreSQL, on a private server the tests start): at most one
//! host keeps a session resident at a time, and a host whose session was taken over stops without
//! writing into the new holder's log. Each `Host` here opens its own `Store`, so each is a holder
//! of its own, as separate processes are.

use std::sync::Arc;

use std::time::{Duration, Instant};

use lineage::agent::{
    Cancellation, CreateAgent, DiagnosticKind, Gate, LEASE_EVENT, RegistryEvent, Response,
};
use lineage::log::{ContentBlock, Event, EventBody, MessageSource, SessionId};
use lineage::store::Store;
use lineage::subagent::Host;
use lineage_testkit::postgres::postgres;
use lineage_testkit::read::{assert_balanced, notice_sender, settled_notices, user_texts};
use lineage_testkit::subagent::{PARENT, Router, continuable, parent_spec};

/// Makes every live lease in the database expire now, as if its holder had stopped renewing it
/// a lease's time ago.
fn expire_leases(url: &str) {
    postgres().psql(
        url,
        "UPDATE lineage_leases SET expires_at = now() - interval '1 second' WHERE holder IS NOT NULL",
    );
}

fn host(url: &str, router: &Arc<Router>) -> Host {
    Host::open(std::path::Path::new(url), router.clone()).expect("the host opens the database")
}

/// The fencing tokens of the `lineage.agent/lease` records in `events`, in log order, with the
/// holder each names.
fn tenures(events: &[Event]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Custom(c) if c.type_name.as_str() == LEASE_EVENT => {
                let v: serde_json::Value = serde_json::from_str(c.payload.as_str()).unwrap();
                Some((
                    v["holder"].as_str().unwrap().to_owned(),
                    v["fence"].as_u64().unwrap(),
                ))
            }
            _ => None,
        })
        .collect()
}

fn stored(url: &str, id: SessionId) -> Vec<Event> {
    Store::open_read_only(url)
        .unwrap()
        .inspect(id)
        .unwrap()
        .events
}

#[tokio::test]
async fn a_host_whose_session_was_taken_over_stops_its_agent_and_writes_nothing_more() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, [Response::text("first answer, from host A")]);
    let a = host(&url, &router);
    let mut a_events = a.agents.subscribe();
    let lead = a
        .agents
        .create(CreateAgent::fresh(parent_spec(vec![])))
        .await
        .unwrap();
    let id = lead.id();
    a.run(&lead, "first question").await.unwrap();

    // A stops renewing (paused, say); B resumes the lead after A's lease ran out.
    expire_leases(&url);
    let b = host(&url, &router);
    let on_b = b.agents.resume(id, parent_spec(vec![])).await.unwrap();
    let before = stored(&url, id);

    // A wakes up and gives its stale agent a prompt: the first flush is refused by the token.
    let _ = a.run(&lead, "a question for the stale host").await;
    lead.when_idle().await;
    assert!(lead.is_fenced());
    let fenced = loop {
        match a_events.recv().await.expect("A's registry reports") {
            RegistryEvent::Diagnostic(d) if d.kind == DiagnosticKind::Fenced => break d,
            _ => continue,
        }
    };
    assert_eq!(fenced.agent, id);
    loop {
        if let RegistryEvent::Disposed { agent, .. } = a_events.recv().await.unwrap()
            && agent == id
        {
            break;
        }
    }
    assert!(
        a.agents.get(id).is_none(),
        "the fenced agent left A's registry"
    );

    let after = stored(&url, id);
    assert_eq!(after, before, "nothing of A's stale turn reached the log");
    assert_balanced(&after);
    let tenures = tenures(&after);
    assert_eq!(tenures.len(), 2, "one record per tenure: {tenures:?}");
    assert_eq!(tenures[0].0, a.store.holder().to_string());
    assert_eq!(tenures[1].0, b.store.holder().to_string());
    assert!(tenures[0].1 < tenures[1].1, "tokens only grow: {tenures:?}");

    // B carries on.
    router.script(PARENT, [Response::text("second answer, from host B")]);
    let outcome = b.run(&on_b, "second question").await.unwrap();
    assert_eq!(outcome.text(), "second answer, from host B");
    assert!(
        b.store
            .verify()
            .unwrap()
            .sessions
            .iter()
            .all(|s| s.problems.is_empty())
    );
}

/// Polls `done` until it holds; the hosts work on their own threads and the database's clock.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_resident_on_one_host_takes_a_follow_up_from_its_parent_on_another() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    let gate = Gate::new();
    router.script(
        PARENT,
        [Response::text("started c"), Response::text("noted")],
    );
    router.script(
        "c",
        [
            Response::text("c's first turn").gated(&gate),
            Response::text("c's second turn"),
        ],
    );

    // Host A: the lead starts a continuable child, which stays resident on A, mid-turn.
    let a = host(&url, &router);
    let lead = a
        .agents
        .create(CreateAgent::fresh(parent_spec(vec![])))
        .await
        .unwrap();
    let lead_id = lead.id();
    let started = a
        .subagents
        .start_continuable("spawn", continuable(&lead, "c", "first job"))
        .await
        .unwrap();
    let child = started.child;
    lead.when_idle().await;
    // The lead moves to host B (A lets it go; its child stays with A).
    a.agents.dispose(lead_id).await;
    let b = host(&url, &router);
    let lead_b = b.agents.resume(lead_id, parent_spec(vec![])).await.unwrap();
    assert!(a.subagents.is_resident(child));

    // B's follow-up reaches the child on A by mail.
    let sent_at = Instant::now();
    let id = b
        .subagents
        .followup(
            &lead_b,
            child,
            vec![ContentBlock::text("second job")],
            MessageSource::Coordinator { sender: lead_id },
            &Cancellation::new(),
        )
        .await
        .expect("the follow-up is accepted by the host that keeps the child");
    let latency = sent_at.elapsed();
    eprintln!("follow-up across hosts accepted in {latency:?}");
    let on_a = a.agents.get(child).expect("the child is still on A");
    assert!(on_a.with_events(|events| {
        events.iter().any(|e| matches!(&e.body, EventBody::InboxSpliced(s) if s.inserted.iter().any(|m| m.id == id)))
    }));

    // The child runs both turns on A, settles, and its notice reaches the lead on B.
    gate.open();
    eventually("the lead on B hears of the child", || {
        !settled_notices(&lead_b.events()).is_empty()
    })
    .await;
    eventually("the child is torn down on A", || {
        !a.subagents.is_resident(child)
    })
    .await;
    let notices = settled_notices(&lead_b.events());
    assert_eq!(notices.len(), 1, "one notice: {notices:?}");
    assert_eq!(notice_sender(&notices[0]), child);

    let child_log = stored(&url, child);
    assert_eq!(
        user_texts(&child_log),
        ["first job", "second job"],
        "the follow-up entered the child once"
    );
    assert_balanced(&child_log);
    assert!(
        b.store.mail_for(&[child, lead_id]).unwrap().is_empty(),
        "no mail is left"
    );
    assert!(
        b.store
            .verify()
            .unwrap()
            .sessions
            .iter()
            .all(|s| s.problems.is_empty())
    );
}
