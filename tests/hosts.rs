//! Many hosts on one shared store (PostgreSQL, on a private server the tests start): at most one
//! host keeps a session resident at a time, and a host whose session was taken over stops without
//! writing into the new holder's log. Each `Host` here opens its own `Store`, so each is a holder
//! of its own, as separate processes are.

use std::sync::Arc;

use std::time::{Duration, Instant};

use lineage::agent::{
    Cancellation, CreateAgent, DiagnosticKind, Gate, LEASE_EVENT, RegistryEvent, Response,
};
use lineage::log::{
    ContentBlock, Event, EventBody, Message, MessageSource, SessionId, TurnEndReason,
};
use lineage::store::{Store, StoreOptions};
use lineage::subagent::Host;
use lineage_testkit::postgres::postgres;
use lineage_testkit::process::{Helper, after_marker, helper_command, report_line, wait_for_line};
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

// ----- host processes ---------------------------------------------------------------------------

/// Names the database a host process serves; a multi-process test re-run with it is that host.
const URL_VAR: &str = "LINEAGE_HOSTS_URL";
/// The host's lease time, in milliseconds.
const TTL_VAR: &str = "LINEAGE_HOSTS_TTL_MS";
/// The lease time of the multi-process tests: short, so a dead host is replaced quickly.
const TTL: Duration = Duration::from_millis(1000);

fn options(ttl: Duration) -> StoreOptions {
    StoreOptions {
        lease_ttl: ttl,
        ..StoreOptions::default()
    }
}

/// The models of a host process: the lead answers `ok`; a child on `hang` never answers (its turn
/// stays open); a child on `echo` answers `done`.
fn host_router() -> Arc<Router> {
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..1000).map(|_| Response::text("ok")));
    router.script("hang", (0..100).map(|_| Response::hang()));
    router.script("echo", (0..1000).map(|_| Response::text("done")));
    router
}

/// If this process is a host process (see [`HostProcess`]), serves it and returns `true`.
async fn serve_if_host() -> bool {
    let Ok(url) = std::env::var(URL_VAR) else {
        return false;
    };
    let ttl = std::env::var(TTL_VAR)
        .ok()
        .and_then(|t| t.parse().ok())
        .map_or(TTL, Duration::from_millis);
    serve_host(&url, ttl).await;
    true
}

/// A host process: reads commands on stdin and reports on stdout.
///
/// - `lead` makes a lead agent: `lead <id>`;
/// - `start <lead> <model>` starts a continuable child on `<model>`: `child <id>`;
/// - `resume <lead>`: `resumed <lead>` or `refused <lead> <error>`;
/// - `dispose <id>`: `gone <id>`;
/// - `prompt <lead> <text…>` gives the lead a prompt without waiting: `prompted <lead>` or
///   `refused <lead> <error>`;
/// - `followup <lead> <child> <text…>` (concurrently with later commands): `accepted <child>
///   <message> <ms>` or `refused <child> <error>`.
///
/// It also reports `fenced <id>` when an agent of its was fenced off, and `disposed <id>`.
async fn serve_host(url: &str, ttl: Duration) {
    use std::io::BufRead;
    let store = Store::open_with(url, options(ttl)).expect("the host opens the database");
    let host = Arc::new(Host::new(store, host_router()).expect("the host starts"));
    let mut registry = host.agents.subscribe();
    tokio::spawn(async move {
        while let Some(event) = registry.recv().await {
            match event {
                RegistryEvent::Diagnostic(d) if d.kind == DiagnosticKind::Fenced => {
                    report_line(&format!("fenced {}", d.agent));
                }
                RegistryEvent::Disposed { agent, .. } => report_line(&format!("disposed {agent}")),
                _ => {}
            }
        }
    });
    let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    report_line(&format!("host {}", host.store.holder()));
    let id = |word: &str| -> SessionId { word.parse().expect("an id") };
    while let Some(line) = commands.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["lead"] => {
                let lead = host
                    .agents
                    .create(CreateAgent::fresh(parent_spec(vec![])))
                    .await
                    .expect("the lead is created");
                report_line(&format!("lead {}", lead.id()));
            }
            ["start", lead, model] => {
                let lead = host.agents.get(id(lead)).expect("the lead is live here");
                let started = host
                    .subagents
                    .start_continuable("spawn", continuable(&lead, model, "first job"))
                    .await
                    .expect("the child starts");
                report_line(&format!("child {}", started.child));
            }
            ["resume", lead] => match host.resume(id(lead), parent_spec(vec![])).await {
                Ok(_) => report_line(&format!("resumed {lead}")),
                Err(e) => report_line(&format!("refused {lead} {e}")),
            },
            ["dispose", agent] => {
                host.agents.dispose(id(agent)).await;
                report_line(&format!("gone {agent}"));
            }
            ["prompt", lead, ..] => {
                let text = words[2..].join(" ");
                let sent = host
                    .agents
                    .get(id(lead))
                    .ok_or_else(|| "not live here".to_owned())
                    .and_then(|agent| {
                        agent
                            .followup(Message::user_text(text, MessageSource::User))
                            .map_err(|e| e.to_string())
                    });
                match sent {
                    Ok(()) => report_line(&format!("prompted {lead}")),
                    Err(e) => report_line(&format!("refused {lead} {e}")),
                }
            }
            ["followup", lead, child, ..] => {
                let (host, lead, child) = (host.clone(), id(lead), id(child));
                let text = words[3..].join(" ");
                tokio::spawn(async move {
                    let started = Instant::now();
                    let Some(lead) = host.agents.get(lead) else {
                        return report_line(&format!("refused {child} the lead is not live here"));
                    };
                    let sent = host
                        .subagents
                        .followup(
                            &lead,
                            child,
                            vec![ContentBlock::text(text)],
                            MessageSource::Coordinator { sender: lead.id() },
                            &Cancellation::new(),
                        )
                        .await;
                    match sent {
                        Ok(message) => report_line(&format!(
                            "accepted {child} {message} {}",
                            started.elapsed().as_millis()
                        )),
                        Err(e) => report_line(&format!("refused {child} {e}")),
                    }
                });
            }
            _ => report_line(&format!("unknown command {line:?}")),
        }
    }
}

/// A host process run by a test, which talks to it line by line.
struct HostProcess {
    helper: Helper,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    holder: String,
}

impl HostProcess {
    /// Starts the host process `test` re-runs itself as.
    fn start(test: &str, url: &str) -> HostProcess {
        let mut command = helper_command(test);
        command
            .env(URL_VAR, url)
            .env(TTL_VAR, TTL.as_millis().to_string())
            .stdin(std::process::Stdio::piped());
        let mut helper = Helper::spawn(&mut command);
        let stdin = helper.0.stdin.take().expect("piped stdin");
        let lines = helper.lines();
        let holder = wait_for_line(&lines, |l| after_marker(l, "host ").map(str::to_owned));
        HostProcess {
            helper,
            stdin,
            lines,
            holder,
        }
    }

    fn send(&mut self, command: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{command}").expect("the host reads its commands");
    }

    /// Sends `command` and waits for the line starting with `marker`; returns the rest of it.
    fn ask(&mut self, command: &str, marker: &str) -> String {
        self.send(command);
        self.expect(marker)
    }

    fn expect(&mut self, marker: &str) -> String {
        wait_for_line(&self.lines, |l| after_marker(l, marker).map(str::to_owned))
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.helper.0.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} failed");
    }
}

/// Waits until no host holds `session`'s lease live (its holder stopped renewing it).
async fn until_free(store: &Store, session: SessionId) {
    let free = || {
        store
            .lease(session)
            .unwrap()
            .is_none_or(|lease| !lease.is_live())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !free() {
        assert!(
            Instant::now() < deadline,
            "the lease of {session} never ran out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const KILLED: &str = "a_host_killed_while_its_child_is_mid_turn_is_replaced_by_the_next_follow_up";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_while_its_child_is_mid_turn_is_replaced_by_the_next_follow_up() {
    if serve_if_host().await {
        return;
    }
    let url = postgres().create_database();
    let mut a = HostProcess::start(KILLED, &url);
    let lead: SessionId = a.ask("lead", "lead ").parse().unwrap();
    let child: SessionId = a
        .ask(&format!("start {lead} hang"), "child ")
        .parse()
        .unwrap();
    // The lead moves here (host B); the child stays on A, mid-turn.
    assert_eq!(a.ask(&format!("dispose {lead}"), "gone "), lead.to_string());

    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    router.script("hang", [Response::text("resumed here, and done")]);
    let store = Store::open_with(&url, options(TTL)).unwrap();
    let b = Host::new(store, router.clone()).unwrap();
    let lead_b = b.resume(lead, parent_spec(vec![])).await.unwrap();

    // A dies with the child mid-turn; B's next follow-up waits out A's lease and takes over.
    a.helper.kill();
    let killed_at = Instant::now();
    b.subagents
        .followup(
            &lead_b,
            child,
            vec![ContentBlock::text("after the crash")],
            MessageSource::Coordinator { sender: lead },
            &Cancellation::new(),
        )
        .await
        .expect("the follow-up takes the child over");
    let takeover = killed_at.elapsed();
    eprintln!("the follow-up took the child over {takeover:?} after the kill");
    assert!(b.subagents.is_resident(child) || !settled_notices(&lead_b.events()).is_empty());

    eventually("the lead hears of the child", || {
        settled_notices(&lead_b.events())
            .iter()
            .any(|n| notice_sender(n) == child)
    })
    .await;
    let log = stored(&url, child);
    assert_balanced(&log);
    assert_eq!(user_texts(&log), ["first job", "after the crash"]);
    let ends = lineage_testkit::read::turn_ends(&log);
    assert_eq!(
        ends,
        [TurnEndReason::Interrupted, TurnEndReason::Completed],
        "A's torn turn was repaired by B, then B ran the follow-up"
    );
    let tenures = tenures(&log);
    assert_eq!(tenures.len(), 2, "{tenures:?}");
    assert_eq!(tenures[0].0, a.holder);
    assert!(tenures[0].1 < tenures[1].1);
    assert!(b.store.verify().unwrap().is_ok());
}

const PAUSED: &str = "a_paused_host_whose_lease_was_taken_over_fails_its_next_write_and_stops";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_host_whose_lease_was_taken_over_fails_its_next_write_and_stops() {
    if serve_if_host().await {
        return;
    }
    let url = postgres().create_database();
    let mut a = HostProcess::start(PAUSED, &url);
    let lead: SessionId = a.ask("lead", "lead ").parse().unwrap();
    assert_eq!(
        a.ask(&format!("prompt {lead} hello"), "prompted "),
        lead.to_string()
    );
    let store = Store::open_with(&url, options(TTL)).unwrap();
    eventually("A's turn is durable", || {
        !lineage_testkit::read::turn_ends(&store.inspect(lead).unwrap().events).is_empty()
    })
    .await;

    // A is paused; its lease runs out, and B takes the lead over and works with it.
    a.signal("-STOP");
    until_free(&store, lead).await;
    let router = Arc::new(Router::default());
    router.script(PARENT, [Response::text("B's answer")]);
    let b = Host::new(store, router).unwrap();
    let lead_b = b.resume(lead, parent_spec(vec![])).await.unwrap();
    b.run(&lead_b, "a question for B").await.unwrap();
    let before = stored(&url, lead);

    // A wakes up and its lead is given a prompt: its first write is refused, and it stops.
    a.signal("-CONT");
    assert_eq!(
        a.ask(
            &format!("prompt {lead} a question for the stale A"),
            "prompted "
        ),
        lead.to_string()
    );
    assert_eq!(a.expect("fenced "), lead.to_string());
    assert_eq!(a.expect("disposed "), lead.to_string());

    let after = stored(&url, lead);
    assert_eq!(after, before, "the log is as B left it");
    assert!(!user_texts(&after).iter().any(|t| t.contains("stale")));
    let tenures = tenures(&after);
    assert_eq!(
        tenures.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(),
        [a.holder.as_str(), &b.store.holder().to_string()]
    );
    assert!(tenures[0].1 < tenures[1].1);
    assert!(b.store.verify().unwrap().is_ok());
}
