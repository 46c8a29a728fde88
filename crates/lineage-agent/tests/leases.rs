//! Agents on a store that many hosts share (PostgreSQL, on a private server the tests start):
//! an agent whose lease is lost leaves its registry at once, with a diagnostic, whether it was
//! writing or idle, and a resume on its host then works; an agent whose log the store does not
//! hold stops instead of refusing every later write. Two `Store`s on one database are two hosts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lineage_agent::{
    Agent, AgentError, Agents, CreateAgent, DiagnosticKind, LEASE_EVENT, RegistryEvent, Response,
    ScriptedModel,
};
use lineage_log::{Event, EventBody, SessionId};
use lineage_store::{LeaseLoss, Store, StoreError, StoreOptions};
use lineage_testkit::agent::{spec, user};
use lineage_testkit::postgres::postgres;
use lineage_testkit::proxy::{Cut, Proxy};
use tokio::sync::mpsc::UnboundedReceiver;

/// Makes every live lease in the database expire now, as if its holder had stopped renewing it
/// a lease's time ago.
fn expire_leases(url: &str) {
    postgres().psql(
        url,
        "UPDATE lineage_leases SET expires_at = now() - interval '1 second' WHERE holder IS NOT NULL",
    );
}

/// `url` with its port replaced by `port`: the same database through a proxy.
fn through(url: &str, port: u16) -> String {
    let (authority, database) = url.rsplit_once('/').expect("a database URL");
    let (host, _) = authority.rsplit_once(':').expect("a port");
    format!("{host}:{port}/{database}")
}

fn with_ttl(ttl: Duration) -> StoreOptions {
    StoreOptions {
        lease_ttl: ttl,
        ..StoreOptions::default()
    }
}

/// A registry over `store` whose model answers `ok` to every request.
fn registry(store: &Store) -> Agents {
    Agents::new(
        store.clone(),
        ScriptedModel::new((0..100).map(|_| Response::text("ok"))),
    )
}

/// Polls `done` every 5 ms until it holds or `bound` passes; says how long it took.
async fn within(bound: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < bound, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

/// The registry events received so far.
fn drain(rx: &mut UnboundedReceiver<RegistryEvent>) -> Vec<RegistryEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// The diagnostic of `kind` about `id` among `events`.
fn diagnostic(events: &[RegistryEvent], id: SessionId, kind: DiagnosticKind) -> Option<String> {
    events.iter().find_map(|e| match e {
        RegistryEvent::Diagnostic(d) if d.agent == id && d.kind == kind => Some(d.reason.clone()),
        _ => None,
    })
}

/// The fencing tokens of the `lineage.agent/lease` records in `events`, in log order.
fn tenures(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Custom(c) if c.type_name.as_str() == LEASE_EVENT => {
                let payload: serde_json::Value = serde_json::from_str(c.payload.as_str()).unwrap();
                payload["fence"].as_u64()
            }
            _ => None,
        })
        .collect()
}

/// How many turns of `events` ended.
fn answers(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e.body, EventBody::TurnEnd(_)))
        .count()
}

async fn run_turn(agent: &Arc<Agent>, text: &str) {
    agent.followup(user(text)).expect("the prompt is accepted");
    tokio::time::timeout(Duration::from_secs(30), agent.when_idle())
        .await
        .expect("the turn ends");
}

/// Resumes `id` on `agents`, asking again while another host holds it (bounded).
async fn resume_when_free(agents: &Agents, id: SessionId, bound: Duration) -> Arc<Agent> {
    let start = Instant::now();
    loop {
        match agents.resume(id, spec()).await {
            Ok(agent) => return agent,
            Err(AgentError::Store {
                source: StoreError::HeldElsewhere { .. },
                ..
            }) => {}
            Err(other) => panic!("resume failed: {other}"),
        }
        assert!(
            start.elapsed() < bound,
            "{id} was not free within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_whose_lease_another_host_took_leaves_its_registry_and_resumes_there_later() {
    let url = postgres().create_database();
    let ttl = Duration::from_millis(300);
    let (a, b) = (
        Store::open_with(&url, with_ttl(ttl)).unwrap(),
        Store::open(&url).unwrap(),
    );
    let (on_a, on_b) = (registry(&a), registry(&b));
    let agent = on_a
        .create(CreateAgent::fresh(spec()))
        .await
        .expect("created on A");
    let id = agent.id();
    run_turn(&agent, "hello").await;
    let mut events = on_a.subscribe();

    // A writes nothing more; its lease runs out and B takes the session over.
    expire_leases(&url);
    let on_b_agent = on_b.resume(id, spec()).await.expect("B takes it over");
    let took = within(ttl * 4, "A's registry lets the idle agent go", || {
        on_a.get(id).is_none()
    })
    .await;
    assert!(took < ttl * 4, "gone {took:?} after the takeover");
    let seen = drain(&mut events);
    let reason = diagnostic(&seen, id, DiagnosticKind::Fenced).expect("a diagnostic says why");
    assert!(reason.contains(&id.to_string()), "{reason}");
    assert!(
        seen.iter()
            .any(|e| matches!(e, RegistryEvent::Disposed { agent, .. } if *agent == id)),
        "{seen:?}"
    );
    assert!(agent.is_fenced());
    assert!(matches!(
        agent.followup(user("to the zombie")),
        Err(AgentError::Fenced { .. })
    ));

    // While B holds it A cannot resume it; once B lets go, A can, under a larger token.
    assert!(matches!(
        on_a.resume(id, spec()).await,
        Err(AgentError::Store {
            source: StoreError::HeldElsewhere { .. },
            ..
        })
    ));
    let b_fence = on_b_agent.lease_fence().unwrap();
    run_turn(&on_b_agent, "on B").await;
    on_b.dispose(id).await;
    let back = on_a.resume(id, spec()).await.expect("A resumes it");
    assert!(back.lease_fence().unwrap() > b_fence);
    run_turn(&back, "on A again").await;
    let stored = Store::open_read_only(&url)
        .unwrap()
        .read_from(id, 0)
        .unwrap();
    assert_eq!(answers(&stored), 3, "every turn ran once, on its holder");
    let fences = tenures(&stored);
    assert_eq!(fences.len(), 3, "{fences:?}");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    drop(back);
    on_a.dispose_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_database_goes_silent_stops_before_another_host_may_take_it_over() {
    let server = postgres();
    let url = server.create_database();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_millis(600);
    let a = Store::open_with(through(&url, proxy.port()), with_ttl(ttl)).unwrap();
    let b = Store::open(&url).unwrap();
    let (on_a, on_b) = (registry(&a), registry(&b));
    let lost: Arc<Mutex<Option<(LeaseLoss, Instant)>>> = Arc::default();
    let heard = lost.clone();
    a.watch_leases(move |_, loss| {
        heard.lock().unwrap().get_or_insert((loss, Instant::now()));
    });
    let agent = on_a.create(CreateAgent::fresh(spec())).await.unwrap();
    let id = agent.id();
    run_turn(&agent, "hello").await;
    let mut events = on_a.subscribe();

    // A's connections stay open and silent; B asks for the session all along.
    proxy.stall();
    let b_agent = resume_when_free(&on_b, id, ttl * 5).await;
    let b_first = Instant::now();
    let (loss, a_lost) = lost
        .lock()
        .unwrap()
        .clone()
        .expect("A's loss was announced");
    assert!(matches!(loss, LeaseLoss::Lapsed { .. }), "{loss:?}");
    assert!(
        a_lost < b_first,
        "A gave its lease up before B could take it ({:?} earlier)",
        b_first.saturating_duration_since(a_lost)
    );
    within(ttl, "A's registry lets the agent go", || {
        on_a.get(id).is_none()
    })
    .await;
    let reason =
        diagnostic(&drain(&mut events), id, DiagnosticKind::Fenced).expect("a diagnostic says why");
    assert!(
        reason.contains(&id.to_string()) && reason.contains("did not answer"),
        "{reason}"
    );
    run_turn(&b_agent, "on B").await;

    // The database answers again: A serves the session anew once B lets go.
    proxy.heal();
    on_b.dispose(id).await;
    let back = resume_when_free(&on_a, id, ttl * 5).await;
    run_turn(&back, "on A again").await;
    let stored = Store::open_read_only(&url)
        .unwrap()
        .read_from(id, 0)
        .unwrap();
    assert_eq!(answers(&stored), 3);
    let fences = tenures(&stored);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    on_a.dispose_all().await;
}

/// A flush whose `COMMIT` answer is lost: the agent either goes on with the store holding its
/// log exactly, or is gone from the registry; either way a follow-up afterwards runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_whose_commit_answer_is_lost_leaves_no_agent_ahead_of_the_store() {
    let server = postgres();
    let url = server.create_database();
    let proxy = Proxy::start(server.port());
    let a = Store::open(through(&url, proxy.port())).unwrap();
    let on_a = registry(&a);
    let agent = on_a.create(CreateAgent::fresh(spec())).await.unwrap();
    let id = agent.id();
    run_turn(&agent, "hello").await;

    proxy.cut_next(Cut::AnswerTo(b"COMMIT".to_vec()));
    // The turn's first flush meets the cut (its outcome then depends on the read-back).
    let _ = agent.followup(user("cut"));
    tokio::time::timeout(Duration::from_secs(30), agent.when_idle())
        .await
        .expect("the turn ends");
    assert_eq!(proxy.cuts(), 1, "a COMMIT's answer was lost");
    let reader = Store::open_read_only(&url).unwrap();
    let agent = match on_a.get(id) {
        Some(live) => {
            assert!(Arc::ptr_eq(&live, &agent));
            live.flush().await.expect("the live agent's log is durable");
            assert_eq!(live.events(), reader.read_from(id, 0).unwrap());
            live
        }
        None => on_a
            .resume(id, spec())
            .await
            .expect("resumed from the store"),
    };
    let before = answers(&agent.events());
    run_turn(&agent, "after the cut").await;
    agent.flush().await.unwrap();
    let stored = reader.read_from(id, 0).unwrap();
    assert_eq!(agent.events(), stored);
    assert_eq!(answers(&stored), before + 1, "the follow-up ran");
    on_a.dispose_all().await;
}

/// The store's log of a session moves under its agent (written by another host while the
/// agent's lease had run out, not yet taken over): the agent's next flush is refused as out of
/// sequence, and the agent stops and leaves the registry instead of refusing every later write;
/// a resume reloads what the store holds, and a follow-up runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_log_the_store_does_not_hold_stops_and_a_resume_reloads_it() {
    let url = postgres().create_database();
    let (a, b) = (Store::open(&url).unwrap(), Store::open(&url).unwrap());
    let on_a = registry(&a);
    let mut events = on_a.subscribe();
    let agent = on_a.create(CreateAgent::fresh(spec())).await.unwrap();
    let id = agent.id();
    run_turn(&agent, "hello").await;

    // B writes without a lease while A's has run out (its keeper renews only every few seconds).
    expire_leases(&url);
    let stored = b.load(id).unwrap().events;
    let note = Event::new(
        stored.len() as u64,
        0,
        EventBody::Custom(Box::new(lineage_log::Custom {
            type_name: "test/elsewhere".into(),
            payload: "{}".into(),
            ignorable: true,
        })),
    );
    b.append(id, &[note]).unwrap();

    let _ = agent.followup(user("now"));
    within(
        Duration::from_secs(30),
        "the agent leaves the registry",
        || on_a.get(id).is_none(),
    )
    .await;
    let seen = drain(&mut events);
    let reason = diagnostic(&seen, id, DiagnosticKind::LogAheadOfStore)
        .unwrap_or_else(|| panic!("a diagnostic says why: {seen:?}"));
    assert!(reason.contains(&id.to_string()), "{reason}");
    assert!(matches!(
        agent.followup(user("again")),
        Err(AgentError::LogAheadOfStore { .. })
    ));

    let back = on_a
        .resume(id, spec())
        .await
        .expect("resumed from the store");
    run_turn(&back, "after the reload").await;
    back.flush().await.unwrap();
    let stored = Store::open_read_only(&url)
        .unwrap()
        .read_from(id, 0)
        .unwrap();
    assert_eq!(back.events(), stored);
    assert!(stored.iter().any(
        |e| matches!(&e.body, EventBody::Custom(c) if c.type_name.as_str() == "test/elsewhere")
    ));
    assert_eq!(answers(&stored), 2);
    on_a.dispose_all().await;
}

/// An agent disposed of while its release cannot reach the database leaves its lease live; the
/// same host resuming it starts a new tenure all the same, with a larger token, and the log's
/// tenures only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_after_a_failed_release_records_a_larger_token() {
    let server = postgres();
    let url = server.create_database();
    let proxy = Proxy::start(server.port());
    let a = Store::open(through(&url, proxy.port())).unwrap();
    let on_a = registry(&a);
    let agent = on_a.create(CreateAgent::fresh(spec())).await.unwrap();
    let id = agent.id();
    run_turn(&agent, "hello").await;
    let first = agent.lease_fence().unwrap();

    // The release's parameters start with the session and the holder (16 bytes each, binary).
    let mut release = id.as_uuid().as_bytes().to_vec();
    release.extend_from_slice(&16u32.to_be_bytes());
    release.extend_from_slice(a.holder().as_bytes());
    proxy.cut_next(Cut::Before(release));
    on_a.dispose(id).await;
    assert_eq!(proxy.cuts(), 1, "the release never reached the database");
    let lease = a.lease(id).unwrap().unwrap();
    assert!(lease.is_live() && lease.holder == Some(a.holder()) && lease.fence == first);

    let back = on_a
        .resume(id, spec())
        .await
        .expect("resumed on the same host");
    assert!(back.lease_fence().unwrap() > first);
    run_turn(&back, "again").await;
    let fences = tenures(
        &Store::open_read_only(&url)
            .unwrap()
            .read_from(id, 0)
            .unwrap(),
    );
    assert_eq!(fences.len(), 2, "{fences:?}");
    assert!(fences[0] < fences[1], "{fences:?}");
    on_a.dispose_all().await;
}
