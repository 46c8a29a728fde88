//! Many hosts on one shared store (PostgreSQL, on a private server the tests start): at most one
//! host keeps a session resident at a time, and a host whose session was taken over stops without
//! writing into the new holder's log. Each `Host` here opens its own `Store`, so each is a holder
//! of its own, as separate processes are.

use std::sync::Arc;

use lineage::agent::{CreateAgent, DiagnosticKind, LEASE_EVENT, RegistryEvent, Response};
use lineage::log::{Event, EventBody, SessionId};
use lineage::store::Store;
use lineage::subagent::Host;
use lineage_testkit::postgres::postgres;
use lineage_testkit::read::assert_balanced;
use lineage_testkit::subagent::{PARENT, Router, parent_spec};

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
