//! Many hosts on one shared store (PostgreSQL, on a private server the tests start): at most one
//! host keeps a session resident at a time, and a host whose session was taken over stops without
//! writing into the new holder's log. Each `Host` here opens its own `Store`, so each is a holder
//! of its own, as separate processes are.

use std::sync::Arc;

use std::time::{Duration, Instant};

use lineage::agent::{
    Cancellation, CreateAgent, DiagnosticKind, Gate, LEASE_EVENT, RegistryEvent, Response,
    ScriptedCall, ToolOutput,
};
use lineage::log::{
    ContentBlock, Event, EventBody, Message, MessageSource, SessionId, TurnEndReason,
};
use lineage::store::{Store, StoreOptions};
use lineage::subagent::Authority;
use lineage::subagent::Host;
use lineage_testkit::postgres::postgres;
use lineage_testkit::process::{Helper, after_marker, helper_command, report_line, wait_for_line};
use lineage_testkit::read::{assert_balanced, notice_sender, settled_notices, user_texts};
use lineage_testkit::subagent::{FnTool, PARENT, Router, continuable, parent_spec};

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

/// A host whose keeper does not renew its leases within a test (they last an hour): a test that
/// expires them ([`expire_lease`], [`expire_leases`]) so acts as the host's pause past them, and
/// no renewal of that host revives them before another host takes them over.
fn paused_host(url: &str, router: &Arc<Router>) -> Host {
    let store = Store::open_with(url, options(Duration::from_secs(3600)))
        .expect("the host opens the database");
    Host::new(store, router.clone()).expect("the host starts")
}

/// A host whose keeper never renews during a test (see [`paused_host`]), a lead on it, and the
/// lead's continuable child on `model`, started with "first job".
async fn paused_lead_with_child(
    url: &str,
    router: &Arc<Router>,
    model: &str,
) -> (Host, Arc<lineage::agent::Agent>, SessionId) {
    let a = paused_host(url, router);
    let lead = fresh_lead(&a).await;
    let child = a
        .subagents
        .start_continuable("spawn", continuable(&lead, model, "first job"))
        .await
        .unwrap()
        .child;
    (a, lead, child)
}

/// On `agents` (a registry with no `Host`, so it serves no mail: a follow-up posted to its
/// agents waits unclaimed), a lead with a continuable child on model `c` started with "first
/// job", the lead then let go for another host to take; the runtime, the lead's id, the child.
async fn lead_let_go_with_child(
    agents: &lineage::agent::Agents,
) -> (lineage::subagent::SubagentRuntime, SessionId, SessionId) {
    let runtime = lineage::subagent::SubagentRuntime::new(agents.clone());
    runtime
        .register_provider(Arc::new(lineage::subagent::SpawnProvider::new()))
        .unwrap();
    let lead = agents
        .create(CreateAgent::fresh(parent_spec(vec![])))
        .await
        .unwrap();
    let lead_id = lead.id();
    let child = runtime
        .start_continuable("spawn", continuable(&lead, "c", "first job"))
        .await
        .unwrap()
        .child;
    lead.when_idle().await;
    agents.dispose(lead_id).await;
    (runtime, lead_id, child)
}

/// A new lead on `host`, with no tools of its own.
async fn fresh_lead(host: &Host) -> Arc<lineage::agent::Agent> {
    host.agents
        .create(CreateAgent::fresh(parent_spec(vec![])))
        .await
        .unwrap()
}

/// Asserts that every session of `store` verifies without a problem.
fn assert_verifies(store: &Store) {
    assert!(
        store
            .verify()
            .unwrap()
            .sessions
            .iter()
            .all(|s| s.problems.is_empty())
    );
}

/// The messages `event` splices into an inbox: none unless it is an `inbox/spliced`.
fn spliced_in(event: &Event) -> &[Message] {
    match &event.body {
        EventBody::InboxSpliced(s) => &s.inserted,
        _ => &[],
    }
}

/// The payloads of the custom records of type `type_name` in `events`, in log order.
fn custom_payloads(events: &[Event], type_name: &str) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Custom(c) if c.type_name.as_str() == type_name => {
                Some(serde_json::from_str(c.payload.as_str()).unwrap())
            }
            _ => None,
        })
        .collect()
}

/// The fencing tokens of the `lineage.agent/lease` records in `events`, in log order, with the
/// holder each names.
fn tenures(events: &[Event]) -> Vec<(String, u64)> {
    custom_payloads(events, LEASE_EVENT)
        .iter()
        .map(|v| {
            (
                v["holder"].as_str().unwrap().to_owned(),
                v["fence"].as_u64().unwrap(),
            )
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
    let lead = fresh_lead(&a).await;
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
    assert_verifies(&b.store);
}

/// Sends `text` from `lead` to its child `child`, as a coordinating parent does.
async fn follow_up(
    host: &Host,
    lead: &Arc<lineage::agent::Agent>,
    child: SessionId,
    text: impl Into<String>,
) -> Result<lineage::log::MessageId, lineage::subagent::SubagentError> {
    host.subagents
        .followup(
            lead,
            child,
            vec![ContentBlock::text(text.into())],
            MessageSource::Coordinator { sender: lead.id() },
            &Cancellation::new(),
        )
        .await
}

/// Polls `done` until it holds; the hosts work on their own threads and the database's clock.
async fn eventually(what: &str, done: impl FnMut() -> bool) {
    poll(Duration::from_millis(10), done, || {
        format!("{what} did not happen within 30 s")
    })
    .await;
}

/// Polls `done` every `every` until it holds; fails saying `failure` once 30 s have passed.
async fn poll(every: Duration, mut done: impl FnMut() -> bool, failure: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{}", failure());
        tokio::time::sleep(every).await;
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
    let lead = fresh_lead(&a).await;
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
    let id = follow_up(&b, &lead_b, child, "second job")
        .await
        .expect("the follow-up is accepted by the host that keeps the child");
    let latency = sent_at.elapsed();
    eprintln!("follow-up across hosts accepted in {latency:?}");
    let on_a = a.agents.get(child).expect("the child is still on A");
    assert!(on_a.with_events(|events| {
        events
            .iter()
            .any(|e| spliced_in(e).iter().any(|m| m.id == id))
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
    assert_verifies(&b.store);
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
/// stays open); a child on `work` calls `pause` (a tool that takes a little while) and answers
/// `done`, by turns; a child on `relay` hangs in its first turn, and in its second reports to
/// its parent, then answers `relayed`.
fn host_router() -> Arc<Router> {
    const PAUSE: ScriptedCall<'static> = ("p", "pause", "{}");
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..5000).map(|_| Response::text("ok")));
    router.script("hang", (0..100).map(|_| Response::hang()));
    router.script(
        "work",
        (0..5000).flat_map(|_| [Response::tool_calls(None, &[PAUSE]), Response::text("done")]),
    );
    const REPORT: ScriptedCall<'static> = ("r", "report", r#"{"output":"halfway there"}"#);
    router.script(
        "relay",
        [
            Response::hang(),
            Response::tool_calls(None, &[REPORT]),
            Response::text("relayed"),
            Response::text("relayed again"),
        ],
    );
    router
}

/// The lead's spec in a host process: its children inherit `pause`, which answers after 250 ms
/// (or when the turn is cancelled).
fn host_lead_spec() -> lineage::agent::AgentSpec {
    let pause = FnTool::new("pause", |ctx, _| async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(250)) => ToolOutput::text("rested"),
            _ = ctx.cancel.cancelled() => ToolOutput::text("stopped"),
        }
    });
    parent_spec(vec![pause])
}

/// A new database for a multi-process test, or `None` when this process is one of its host
/// processes, which has then been served.
async fn database_unless_host() -> Option<String> {
    if serve_if_host().await {
        return None;
    }
    Some(postgres().create_database())
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
/// - `interrupt <lead> <child>`: `interrupted <child>` or `refused <child> <error>`;
/// - `dispose <id>`: `gone <id>`;
/// - `prompt <lead> <text…>` gives the lead a prompt without waiting: `prompted <lead>` or
///   `refused <lead> <error>`;
/// - `followup <lead> <child> <token>` sends the one-word text `<token>` (concurrently with later
///   commands): `followup-accepted <token> <message> <ms>` or `followup-refused <token> <error>`.
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
                    .create(CreateAgent::fresh(host_lead_spec()))
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
            ["resume", lead] => {
                let resumed = host.resume(id(lead), host_lead_spec()).await;
                report_done(resumed.map(drop), format!("resumed {lead}"), lead);
            }
            ["interrupt", lead, child] => {
                let sent = host
                    .agents
                    .get(id(lead))
                    .ok_or_else(|| "the lead is not live here".to_owned())
                    .and_then(|lead| {
                        host.subagents
                            .interrupt(id(child), &Authority::Ancestor(lead))
                            .map_err(|e| e.to_string())
                    });
                report_done(sent, format!("interrupted {child}"), child);
            }
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
                report_done(sent, format!("prompted {lead}"), lead);
            }
            ["followup", lead, child, token] => {
                let (host, lead, child, token) =
                    (host.clone(), id(lead), id(child), token.to_owned());
                tokio::spawn(async move {
                    let started = Instant::now();
                    let Some(lead) = host.agents.get(lead) else {
                        return report_line(&format!(
                            "followup-refused {token} the lead is not live here"
                        ));
                    };
                    let sent = follow_up(&host, &lead, child, token.clone()).await;
                    match sent {
                        Ok(message) => report_line(&format!(
                            "followup-accepted {token} {message} {}",
                            started.elapsed().as_millis()
                        )),
                        Err(e) => report_line(&format!("followup-refused {token} {e}")),
                    }
                });
            }
            _ => report_line(&format!("unknown command {line:?}")),
        }
    }
}

/// Reports `done` when a command on `subject` went through, else that it was refused and why.
fn report_done<E: std::fmt::Display>(result: Result<(), E>, done: String, subject: &str) {
    match result {
        Ok(()) => report_line(&done),
        Err(e) => report_line(&format!("refused {subject} {e}")),
    }
}

/// A host process run by a test, which talks to it line by line.
struct HostProcess {
    helper: Helper,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    /// Lines read and not asked for yet, in order.
    unread: Vec<String>,
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
            unread: Vec::new(),
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

    /// The rest of the first line, read or to come, holding `marker`; the lines before it that
    /// do not hold it are kept for later questions.
    fn expect(&mut self, marker: &str) -> String {
        self.expect_where(|l| after_marker(l, marker).map(str::to_owned))
    }

    /// [`Self::expect`] with the first line, read or to come, that `pick` takes.
    fn expect_where<T>(&mut self, mut pick: impl FnMut(&str) -> Option<T>) -> T {
        if let Some((at, value)) = self
            .unread
            .iter()
            .enumerate()
            .find_map(|(at, l)| pick(l).map(|v| (at, v)))
        {
            self.unread.remove(at);
            return value;
        }
        let unread = &mut self.unread;
        wait_for_line(&self.lines, |l| match pick(l) {
            Some(value) => Some(value),
            None => {
                unread.push(l.to_owned());
                None
            }
        })
    }

    /// Every line read so far or waiting to be, without blocking.
    fn drain(&mut self) -> Vec<String> {
        self.unread.extend(self.lines.try_iter());
        std::mem::take(&mut self.unread)
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
    poll(Duration::from_millis(20), free, || {
        format!("the lease of {session} never ran out")
    })
    .await;
}

/// In a new database, host process A (the process `test` re-runs itself as) with a lead that
/// started a child on `model` (`hang` or `relay`, so the child stays mid-turn and resident on A),
/// then let the lead go: another host can take the lead over while the child stays with A.
/// Returns the database, A, the lead and the child; `None` when this process is a host process
/// (served by then).
async fn child_left_on_host_a(
    test: &str,
    model: &str,
) -> Option<(String, HostProcess, SessionId, SessionId)> {
    let url = database_unless_host().await?;
    let mut a = HostProcess::start(test, &url);
    let lead: SessionId = a.ask("lead", "lead ").parse().unwrap();
    let child: SessionId = a
        .ask(&format!("start {lead} {model}"), "child ")
        .parse()
        .unwrap();
    a.ask(&format!("dispose {lead}"), &format!("gone {lead}"));
    Some((url, a, lead, child))
}

/// Host B, in this test's process: a store of its own on `url`, with the lease time of the host
/// processes, answering from `router`, and the lead `lead` resumed there.
async fn host_b_taking(
    url: &str,
    router: Arc<Router>,
    lead: SessionId,
) -> (Host, Arc<lineage::agent::Agent>) {
    let store = Store::open_with(url, options(TTL)).unwrap();
    let b = Host::new(store, router).unwrap();
    let lead_b = b.resume(lead, parent_spec(vec![])).await.unwrap();
    (b, lead_b)
}

const KILLED: &str = "a_host_killed_while_its_child_is_mid_turn_is_replaced_by_the_next_follow_up";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_while_its_child_is_mid_turn_is_replaced_by_the_next_follow_up() {
    let Some((url, mut a, lead, child)) = child_left_on_host_a(KILLED, "hang").await else {
        return;
    };

    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    router.script("hang", [Response::text("resumed here, and done")]);
    let (b, lead_b) = host_b_taking(&url, router.clone(), lead).await;

    // A dies with the child mid-turn; B's next follow-up waits out A's lease and takes over.
    a.helper.kill();
    let killed_at = Instant::now();
    follow_up(&b, &lead_b, child, "after the crash")
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
    let Some(url) = database_unless_host().await else {
        return;
    };
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

    // A wakes up and its lead is given a prompt: its first write is refused (whether A's own
    // renewal found the lease lost first or the database refused the write), and it stops.
    a.signal("-CONT");
    a.send(&format!("prompt {lead} a question for the stale A"));
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

// ----- a randomized stress ----------------------------------------------------------------------

const STRESS: &str = "three_hosts_under_kills_and_moves_deliver_every_accepted_message_once";

/// A small deterministic generator (xorshift64*), so a failing run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// A follow-up the driver sent, and what the sending host said of it.
#[derive(Debug)]
struct Sent {
    child: SessionId,
    /// The host it was sent to, and that host process's generation (a new one after each kill).
    host: (usize, usize),
    /// `Some(Ok(message id, ms))` once accepted, `Some(Err(_))` once refused; `None` while
    /// unanswered (for good, if its host was killed first).
    answer: Option<Result<(String, u64), String>>,
}

/// Records what `lines` say of the follow-ups in `sent` (keyed by their tokens).
fn read_answers(lines: Vec<String>, sent: &mut std::collections::HashMap<String, Sent>) {
    for line in lines {
        if let Some(rest) = after_marker(&line, "followup-accepted ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let entry = sent.get_mut(words[0]).expect("a follow-up the driver sent");
            entry.answer = Some(Ok((words[1].to_owned(), words[2].parse().unwrap())));
        } else if let Some(rest) = after_marker(&line, "followup-refused ") {
            let (token, why) = rest.split_once(' ').unwrap_or((rest, ""));
            let entry = sent.get_mut(token).expect("a follow-up the driver sent");
            entry.answer = Some(Err(why.to_owned()));
        }
    }
}

#[test]
fn three_hosts_under_kills_and_moves_deliver_every_accepted_message_once() {
    if std::env::var(URL_VAR).is_ok() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(serve_if_host());
        return;
    }
    let seed = std::env::var("LINEAGE_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!(
        "stress seed {seed} (LINEAGE_STRESS_SEED replays it; LINEAGE_STRESS_ROUNDS sets its length)"
    );
    let mut rng = Rng(seed);
    let url = postgres().create_database();
    let mut hosts: Vec<HostProcess> = (0..3).map(|_| HostProcess::start(STRESS, &url)).collect();
    let mut generation = [0usize; 3];

    // Each host starts a lead with two children; leads move and hosts die from here on.
    struct Lead {
        id: SessionId,
        at: usize,
        children: Vec<SessionId>,
    }
    let mut leads = Vec::new();
    for (at, host) in hosts.iter_mut().enumerate() {
        let id: SessionId = host.ask("lead", "lead ").parse().unwrap();
        let children = (0..2)
            .map(|_| {
                host.ask(&format!("start {id} work"), "child ")
                    .parse()
                    .unwrap()
            })
            .collect();
        leads.push(Lead { id, at, children });
    }
    let mut sent = std::collections::HashMap::new();
    let (mut kills, mut moves, mut interrupts) = (0, 0, 0);
    let rounds = std::env::var("LINEAGE_STRESS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(60);
    for round in 0..rounds {
        let lead = rng.below(leads.len());
        let (id, at) = (leads[lead].id, leads[lead].at);
        match rng.below(20) {
            // A follow-up from the lead's host to one of its children, wherever that child is.
            0..=12 => {
                let child = leads[lead].children[rng.below(2)];
                let token = format!("message-{round}");
                hosts[at].send(&format!("followup {id} {child} {token}"));
                let host = (at, generation[at]);
                sent.insert(
                    token,
                    Sent {
                        child,
                        host,
                        answer: None,
                    },
                );
            }
            13 | 14 => {
                let child = leads[lead].children[rng.below(2)];
                hosts[at].send(&format!("interrupt {id} {child}"));
                interrupts += 1;
            }
            // The lead moves to another host; its children stay where they are.
            15..=17 => {
                let to = (at + 1 + rng.below(2)) % 3;
                hosts[at].ask(&format!("dispose {id}"), &format!("gone {id}"));
                resume_until_granted(&mut hosts[to], id);
                leads[lead].at = to;
                moves += 1;
            }
            // A host dies; a new process takes its place, and its leads are resumed elsewhere.
            _ => {
                let dead = rng.below(3);
                read_answers(hosts[dead].drain(), &mut sent);
                hosts[dead].helper.kill();
                read_answers(hosts[dead].drain(), &mut sent);
                kills += 1;
                generation[dead] += 1;
                hosts[dead] = HostProcess::start(STRESS, &url);
                for lead in leads.iter_mut().filter(|l| l.at == dead) {
                    let to = rng.below(3);
                    resume_until_granted(&mut hosts[to], lead.id);
                    lead.at = to;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20 + rng.below(60) as u64));
    }

    // Every follow-up sent to a host still running is answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for host in hosts.iter_mut() {
            read_answers(host.drain(), &mut sent);
        }
        let waiting = sent
            .values()
            .filter(|s| s.answer.is_none() && generation[s.host.0] == s.host.1)
            .count();
        if waiting == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} follow-ups were never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The children finish the turns they were given, then every host stops at once.
    std::thread::sleep(Duration::from_millis(500));
    for host in hosts.iter_mut() {
        host.helper.kill();
    }

    let store = Store::open_read_only(&url).unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "every log verifies: {report:?}");
    let mut sessions: Vec<SessionId> = leads.iter().map(|l| l.id).collect();
    sessions.extend(leads.iter().flat_map(|l| l.children.iter().copied()));
    for session in &sessions {
        let tenures = tenures(&store.read_from(*session, 0).unwrap());
        assert!(
            tenures.windows(2).all(|w| w[0].1 < w[1].1),
            "the fencing tokens of {session} grow strictly, tenure by tenure: {tenures:?}"
        );
    }
    let (mut lost, mut duplicated, mut claimed) = (0, 0, 0);
    let mut latencies = Vec::new();
    for (token, sent) in &sent {
        let log = store.read_from(sent.child, 0).unwrap();
        let inserted: Vec<&Message> = log
            .iter()
            .flat_map(spliced_in)
            .filter(|m| m.text() == *token)
            .collect();
        match &sent.answer {
            Some(Ok((id, ms))) => {
                latencies.push(*ms);
                let once = inserted.iter().filter(|m| m.id.to_string() == *id).count();
                if once == 0 {
                    lost += 1;
                }
                if inserted.len() > 1 {
                    duplicated += 1;
                }
                let taken = log.iter().any(
                    |e| matches!(&e.body, EventBody::UserMessage(m) if m.id.to_string() == *id),
                );
                claimed += usize::from(taken);
            }
            // Refused, or its host died first: it reached the child at most once.
            _ => {
                if inserted.len() > 1 {
                    duplicated += 1;
                }
            }
        }
    }
    latencies.sort_unstable();
    let accepted = latencies.len();
    let median = latencies.get(accepted / 2).copied().unwrap_or(0);
    let max = latencies.last().copied().unwrap_or(0);
    let refused = sent
        .values()
        .filter(|s| matches!(s.answer, Some(Err(_))))
        .count();
    eprintln!(
        "stress: 3 hosts, {kills} kills, {moves} lead moves, {interrupts} interrupts; {} follow-ups: \
         {accepted} accepted ({claimed} claimed into a turn, the rest pending in the child's \
         inbox), {refused} refused, {} unanswered (their host was killed); lost {lost}, \
         duplicated {duplicated}; acceptance latency median {median} ms, max {max} ms",
        sent.len(),
        sent.len() - accepted - refused,
    );
    assert_eq!((lost, duplicated), (0, 0));
    assert!(accepted > 0, "some follow-ups were accepted");
}

/// Asks `host` to resume `lead` until the lease of the host that had it lets it (a killed host's
/// runs out).
fn resume_until_granted(host: &mut HostProcess, lead: SessionId) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (resumed, refused) = (format!("resumed {lead}"), format!("refused {lead} "));
    loop {
        host.send(&format!("resume {lead}"));
        let refusal = host.expect_where(|l| {
            if l.contains(&resumed) {
                Some(None)
            } else {
                after_marker(l, &refused).map(|why| Some(why.to_owned()))
            }
        });
        let Some(why) = refusal else {
            return;
        };
        assert!(
            why.contains("held by another host"),
            "resume of {lead} refused: {why}"
        );
        assert!(Instant::now() < deadline, "{lead} was never free to resume");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_that_cannot_be_delivered_is_discarded_with_an_event_in_its_recipients_log() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    let a = host(&url, &router);
    let lead = fresh_lead(&a).await;
    let stranger = SessionId::new();
    let message = Message::user_text(
        "a follow-up for an agent that is no child",
        MessageSource::User,
    );
    let followup = serde_json::json!({ "kind": "followup", "message": message });
    let pieces = [
        followup.to_string().into_bytes(),
        b"not mail at all".to_vec(),
    ];
    let mut ids = Vec::new();
    for body in pieces {
        let mail = lineage::store::Mail {
            id: lineage::log::MessageId::new().as_uuid(),
            recipient: lead.id(),
            sender: stranger,
            body,
        };
        ids.push(mail.id.to_string());
        assert!(a.store.post(&mail).unwrap());
    }
    eventually("the mail is taken out", || {
        a.store.mail_for(&[lead.id()]).unwrap().is_empty()
    })
    .await;
    let events = stored(&url, lead.id());
    let mut discarded = Vec::new();
    for v in custom_payloads(&events, lineage::subagent::MAIL_DISCARDED_EVENT) {
        assert_eq!(v["sender"], stranger.to_string());
        assert!(!v["reason"].as_str().unwrap().is_empty());
        discarded.push(v["mail"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        discarded, ids,
        "each piece is discarded once, with an event"
    );
    assert!(lead.pending(lineage::log::InboxTarget::NextTurn).is_empty());
}

const RESIDENT: &str = "a_child_resident_in_one_host_process_takes_a_follow_up_sent_from_another";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_resident_in_one_host_process_takes_a_follow_up_sent_from_another() {
    let Some((url, _a, lead, child)) = child_left_on_host_a(RESIDENT, "hang").await else {
        return;
    };

    let (b, lead_b) = host_b_taking(&url, Arc::new(Router::default()), lead).await;
    let mut latencies = Vec::new();
    for n in 0..5 {
        let sent_at = Instant::now();
        let id = follow_up(&b, &lead_b, child, format!("job {n} from host B"))
            .await
            .expect("host A takes the follow-up into the child's inbox");
        latencies.push(sent_at.elapsed());
        // A made it durable in the child's log before it took the mail out.
        let inserted = stored(&url, child)
            .iter()
            .filter(|e| spliced_in(e).iter().any(|m| m.id == id))
            .count();
        assert_eq!(inserted, 1, "follow-up {n} is in the child's log once");
    }
    assert!(
        !b.subagents.is_resident(child),
        "the child stayed with host A"
    );
    eprintln!("follow-ups from host B to a child on host A accepted in {latencies:?}");
    assert!(b.store.mail_for(&[child]).unwrap().is_empty());
}

const RELAYED: &str = "an_interrupt_a_report_and_a_notice_cross_hosts_by_mail";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_a_report_and_a_notice_cross_hosts_by_mail() {
    let Some((url, a, lead, child)) = child_left_on_host_a(RELAYED, "relay").await else {
        return;
    };
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    let (b, lead_b) = host_b_taking(&url, router, lead).await;

    // A follow-up queues behind the child's hanging turn on A; B's interrupt ends that turn
    // there (the queued work stays parked), and the next follow-up wakes the child: it reports,
    // then settles.
    follow_up(&b, &lead_b, child, "then report").await.unwrap();
    b.subagents
        .interrupt(child, &Authority::Ancestor(lead_b.clone()))
        .expect("the interrupt is posted to the host that keeps the child");
    follow_up(&b, &lead_b, child, "go on").await.unwrap();
    eventually("the report and the notice reach the lead on B", || {
        let events = lead_b.events();
        let reported = events.iter().flat_map(spliced_in).any(
            |m| matches!(m.source, MessageSource::SubagentReport { sender } if sender == child),
        );
        reported && !settled_notices(&events).is_empty()
    })
    .await;
    let log = stored(&url, child);
    // The parked follow-up and the waking one ran in one turn or two.
    let ends = lineage_testkit::read::turn_ends(&log);
    assert_eq!(
        ends[0],
        TurnEndReason::Aborted {
            cause: lineage::log::AbortCause::Parent
        }
    );
    assert!(
        (2..=3).contains(&ends.len()) && ends[1..].iter().all(|e| *e == TurnEndReason::Completed),
        "{ends:?}"
    );
    assert_eq!(user_texts(&log), ["first job", "then report", "go on"]);
    let notices = settled_notices(&lead_b.events());
    assert_eq!(notices.len(), 1);
    assert_eq!(notice_sender(&notices[0]), child);
    // A piece is taken out once its delivery is durable, a moment after the lead holds it.
    eventually("every delivered piece is taken out of the mailbox", || {
        b.store.mail_for(&[child, lead]).unwrap().is_empty()
    })
    .await;
    drop(a);
}

// ----- takeovers: accepted input runs, notices go by mail, ids deliver once ---------------------

/// Makes the lease of `session` expire now, as if its holder had stopped renewing it.
fn expire_lease(url: &str, session: SessionId) {
    postgres().psql(
        url,
        &format!(
            "UPDATE lineage_leases SET expires_at = now() - interval '1 second' \
             WHERE session = '{session}'"
        ),
    );
}

/// How many times `events` splice the message `id` into an inbox.
fn spliced_count(events: &[Event], id: lineage::log::MessageId) -> usize {
    events
        .iter()
        .flat_map(spliced_in)
        .filter(|m| m.id == id)
        .count()
}

/// How many user messages with id `id` (claimed into a turn) `events` hold.
fn claimed_count(events: &[Event], id: lineage::log::MessageId) -> usize {
    events
        .iter()
        .filter(|e| matches!(&e.body, EventBody::UserMessage(m) if m.id == id))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_taking_over_from_a_paused_one_runs_the_follow_ups_its_child_had_queued() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    // A's turn never answers (A is paused in it); the three queued follow-ups are answered on B.
    let never = Gate::new();
    router.script(
        "q",
        [
            Response::text("A's answer, never given").gated(&never),
            Response::text("answer 1"),
            Response::text("answer 2"),
            Response::text("answer 3"),
        ],
    );
    let (a, lead, child) = paused_lead_with_child(&url, &router, "q").await;
    router.model("q").wait_for_requests(1).await;
    let mut queued = Vec::new();
    for n in 1..=3 {
        let id = follow_up(&a, &lead, child, format!("follow-up {n}"))
            .await
            .expect("the child on A accepts the follow-up behind its turn");
        queued.push(id);
    }

    // A is paused past its leases; B resumes the lead, finds the child's holder gone, and runs
    // what the child had accepted.
    expire_leases(&url);
    let b = host(&url, &router);
    let lead_b = b.resume(lead.id(), parent_spec(vec![])).await.unwrap();
    eventually("the lead on B hears of the child", || {
        settled_notices(&lead_b.events())
            .iter()
            .any(|n| notice_sender(n) == child)
    })
    .await;
    eventually("the child is torn down on B", || {
        !b.subagents.is_resident(child)
    })
    .await;

    let log = stored(&url, child);
    assert_balanced(&log);
    assert_eq!(
        user_texts(&log),
        ["first job", "follow-up 1", "follow-up 2", "follow-up 3"]
    );
    for id in &queued {
        assert_eq!(claimed_count(&log, *id), 1, "follow-up {id} ran once");
    }
    let answers = lineage_testkit::read::assistant_texts(&log);
    for answer in ["answer 1", "answer 2", "answer 3"] {
        let times = answers.iter().filter(|a| a.as_str() == answer).count();
        assert_eq!(times, 1, "{answer:?} once in {answers:?}");
    }
    assert_eq!(
        lineage_testkit::read::turn_ends(&log),
        [
            TurnEndReason::Interrupted,
            TurnEndReason::Completed,
            TurnEndReason::Completed,
            TurnEndReason::Completed
        ],
        "A's torn turn closed by B, then one turn per follow-up"
    );
    let tenures = tenures(&log);
    assert_eq!(tenures.len(), 2, "{tenures:?}");
    assert_eq!(tenures[1].0, b.store.holder().to_string());
    assert!(tenures[0].1 < tenures[1].1);
    assert_eq!(
        settled_notices(&lead_b.events()).len(),
        2,
        "the crash's notice, then the settled child's"
    );
    assert_verifies(&b.store);
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_notice_reaches_its_parent_by_mail_on_the_host_that_took_the_parent_over() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    let gate = Gate::new();
    router.script("g", [Response::text("g is done").gated(&gate)]);
    let (a, lead, child) = paused_lead_with_child(&url, &router, "g").await;
    lead.when_idle().await;

    // The lead's lease runs out on A (its child's does not) and B takes the lead over; A's
    // registry may still hold its stale lead.
    expire_lease(&url, lead.id());
    let b = host(&url, &router);
    let lead_b = b.resume(lead.id(), parent_spec(vec![])).await.unwrap();
    assert!(a.subagents.is_resident(child), "the child stays with A");

    // The child settles on A: its notice goes by mail to the lead on B.
    gate.open();
    eventually("the lead on B hears of the child", || {
        !settled_notices(&lead_b.events()).is_empty()
    })
    .await;
    eventually("the child is torn down on A", || {
        !a.subagents.is_resident(child)
    })
    .await;
    eventually("the notice is taken out of the mailbox", || {
        b.store.mail_for(&[lead.id()]).unwrap().is_empty()
    })
    .await;
    let notices = settled_notices(&stored(&url, lead.id()));
    assert_eq!(notices.len(), 1, "in the lead's log once: {notices:?}");
    assert_eq!(notice_sender(&notices[0]), child);
    assert!(
        settled_notices(&lead.events()).is_empty(),
        "the stale lead on A was not handed the notice"
    );
    assert_verifies(&b.store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_id_sent_twice_across_hosts_arrives_once_and_a_withdrawn_one_never() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    let gate = Gate::new();
    router.script(
        "c",
        [
            Response::text("c's first turn").gated(&gate),
            Response::text("c's second turn"),
            Response::text("c's third turn"),
        ],
    );
    // Host A serves no mail until told to: a follow-up posted to it waits, unclaimed.
    let store_a = Store::open(&url).unwrap();
    let agents_a = lineage::agent::Agents::new(store_a, router.clone());
    let (runtime_a, lead_id, child) = lead_let_go_with_child(&agents_a).await;
    let b = host(&url, &router);
    let lead_b = b.agents.resume(lead_id, parent_spec(vec![])).await.unwrap();
    let request = |text: &str, id| lineage::subagent::FollowupRequest {
        message_id: Some(id),
        ..lineage::subagent::FollowupRequest::new(lead_b.clone(), child, text)
    };

    // Cancelled while its mail waits: taken back, refused, and never delivered later.
    let withdrawn = lineage::log::MessageId::new();
    let cancelled = {
        let sending = request("withdrawn, then retried", withdrawn);
        let cancel = sending.cancel.clone();
        let sender = b.subagents.clone();
        let sent = tokio::spawn(async move { sender.send_followup(&sending).await });
        eventually("the follow-up's mail is posted", || {
            !b.store.mail_for(&[child]).unwrap().is_empty()
        })
        .await;
        cancel.cancel(lineage::log::AbortCause::User);
        sent.await.unwrap()
    };
    let error = cancelled.expect_err("the follow-up is refused");
    assert_eq!(
        error.code(),
        lineage::subagent::ErrorCode::Cancelled,
        "{error}"
    );
    assert!(b.store.mail_for(&[child]).unwrap().is_empty(), "withdrawn");

    // A serves mail from now on: the same id twice arrives once.
    let _serving = runtime_a.serve_mail().unwrap();
    let twice = lineage::log::MessageId::new();
    for _ in 0..2 {
        let sent = b
            .subagents
            .send_followup(&request("sent twice", twice))
            .await;
        assert_eq!(sent.unwrap(), twice);
    }
    assert!(!b.subagents.is_resident(child), "the child stayed on A");
    // A retry of the refused id is a new delivery, once.
    let retried = b
        .subagents
        .send_followup(&request("withdrawn, then retried", withdrawn))
        .await;
    assert_eq!(retried.unwrap(), withdrawn);

    gate.open();
    eventually("the lead on B hears of the child", || {
        !settled_notices(&lead_b.events()).is_empty()
    })
    .await;
    let log = stored(&url, child);
    assert_eq!(
        user_texts(&log),
        ["first job", "sent twice", "withdrawn, then retried"]
    );
    assert_eq!(spliced_count(&log, twice), 1);
    assert_eq!(spliced_count(&log, withdrawn), 1, "the retry only");
    assert_balanced(&log);
}

/// `url` with the role `role` instead of the test server's own (it trusts every local role).
fn as_role(url: &str, role: &str) -> String {
    url.replacen(
        &format!("://{}@", lineage_testkit::postgres::ROLE),
        &format!("://{role}@"),
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_whose_wait_fails_is_refused_only_once_its_mail_is_taken_back() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    let gate = Gate::new();
    router.script(
        "c",
        [
            Response::text("c's first turn").gated(&gate),
            Response::text("c's second turn"),
        ],
    );
    // Host A keeps the child and serves no mail until told to: posted mail waits, unclaimed.
    let agents_a = lineage::agent::Agents::new(Store::open(&url).unwrap(), router.clone());
    // The sender's host runs as a role of its own, so that the test can take away what it may
    // read of the mailbox while the follow-up waits.
    postgres().psql(
        &url,
        "CREATE ROLE sender LOGIN; GRANT ALL ON SCHEMA public TO sender; \
         GRANT ALL ON ALL TABLES IN SCHEMA public TO sender; \
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO sender",
    );
    let (runtime_a, lead_id, child) = lead_let_go_with_child(&agents_a).await;
    let b = host(&as_role(&url, "sender"), &router);
    let lead_b = b.agents.resume(lead_id, parent_spec(vec![])).await.unwrap();
    let request = |text: &str, id| lineage::subagent::FollowupRequest {
        message_id: Some(id),
        ..lineage::subagent::FollowupRequest::new(lead_b.clone(), child, text)
    };
    let mail_of = |id: lineage::log::MessageId| {
        Store::open_read_only(&url)
            .unwrap()
            .mail_for(&[child])
            .unwrap()
            .iter()
            .any(|m| m.id == id.as_uuid())
    };

    // The sender may not post: it finds that its mail is not there, nor in the child's log,
    // and it is refused.
    postgres().psql(
        &url,
        "REVOKE ALL ON SEQUENCE lineage_mailbox_posted_seq FROM sender",
    );
    let unposted = lineage::log::MessageId::new();
    let error = b
        .subagents
        .send_followup(&request("never posted", unposted))
        .await
        .expect_err("the follow-up is refused");
    assert_eq!(
        error.code(),
        lineage::subagent::ErrorCode::NotResumable,
        "{error}"
    );
    assert!(!mail_of(unposted));
    postgres().psql(
        &url,
        "GRANT ALL ON SEQUENCE lineage_mailbox_posted_seq TO sender",
    );

    // The sender may post, and may take its mail back, but not look at the mailbox: its wait
    // fails, its mail is taken back, and then it is refused.
    postgres().psql(
        &url,
        "REVOKE SELECT ON lineage_mailbox FROM sender; \
         GRANT SELECT (id, claimed_by) ON lineage_mailbox TO sender",
    );
    let refused = lineage::log::MessageId::new();
    let error = b
        .subagents
        .send_followup(&request("refused", refused))
        .await
        .expect_err("the follow-up is refused");
    assert_eq!(
        error.code(),
        lineage::subagent::ErrorCode::NotResumable,
        "{error}"
    );
    assert!(!mail_of(refused), "refused only once taken back");

    // It may post but neither look nor take back: the outcome is unknown, and the mail stays.
    postgres().psql(&url, "REVOKE DELETE ON lineage_mailbox FROM sender");
    let unknown = lineage::log::MessageId::new();
    let error = b
        .subagents
        .send_followup(&request("outcome unknown", unknown))
        .await
        .expect_err("the follow-up's outcome is unknown");
    assert_eq!(
        error.code(),
        lineage::subagent::ErrorCode::OutcomeUnknown,
        "{error}"
    );
    assert!(error.to_string().contains("same message id"), "{error}");
    assert!(mail_of(unknown), "{error}");

    // The database answers again and A serves its mail: the caller's retry of the unknown one
    // is accepted, and the child has it once; the refused one never arrives.
    postgres().psql(&url, "GRANT SELECT, DELETE ON lineage_mailbox TO sender");
    let _serving = runtime_a.serve_mail().unwrap();
    let retried = b
        .subagents
        .send_followup(&request("outcome unknown", unknown))
        .await;
    assert_eq!(retried.unwrap(), unknown);
    gate.open();
    eventually("the lead on B hears of the child", || {
        !settled_notices(&lead_b.events()).is_empty()
    })
    .await;
    let log = stored(&url, child);
    assert_eq!(user_texts(&log), ["first job", "outcome unknown"]);
    assert_eq!(spliced_count(&log, unknown), 1);
    assert_eq!(spliced_count(&log, refused), 0);
    assert_eq!(spliced_count(&log, unposted), 0);
}

/// `url` through a proxy listening on `port`.
fn through(url: &str, port: u16) -> String {
    let (authority, database) = url.rsplit_once('/').expect("a database URL");
    let (host, _) = authority.rsplit_once(':').expect("a port");
    format!("{host}:{port}/{database}")
}

/// Makes nobody the holder of `session`'s lease, as its holder's release would.
fn release_lease(url: &str, session: SessionId) {
    postgres().psql(
        url,
        &format!(
            "UPDATE lineage_leases SET holder = NULL, expires_at = NULL WHERE session = '{session}'"
        ),
    );
}

/// A child whose host A serves no mail, and a lead on a host B opened through `proxy` (the lead
/// left A for B): a follow-up from B to the child is posted and waits, unclaimed.
struct MailWaits {
    url: String,
    router: Arc<Router>,
    gate: Gate,
    runtime_a: lineage::subagent::SubagentRuntime,
    child: SessionId,
    b: Host,
    lead_b: Arc<lineage::agent::Agent>,
}

async fn mail_waits(proxy: Option<&lineage_testkit::proxy::Proxy>) -> MailWaits {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    let gate = Gate::new();
    router.script(
        "c",
        [
            Response::text("c's first turn").gated(&gate),
            Response::text("c's second turn"),
        ],
    );
    // A's leases last an hour: its keeper does not renew them within the test.
    let store_a = Store::open_with(&url, options(Duration::from_secs(3600))).unwrap();
    let agents_a = lineage::agent::Agents::new(store_a, router.clone());
    let (runtime_a, lead_id, child) = lead_let_go_with_child(&agents_a).await;
    let b_url = proxy.map_or(url.clone(), |proxy| through(&url, proxy.port()));
    let b = host(&b_url, &router);
    let lead_b = b.agents.resume(lead_id, parent_spec(vec![])).await.unwrap();
    MailWaits {
        url,
        router,
        gate,
        runtime_a,
        child,
        b,
        lead_b,
    }
}

impl MailWaits {
    fn request(
        &self,
        text: &str,
        id: lineage::log::MessageId,
    ) -> lineage::subagent::FollowupRequest {
        lineage::subagent::FollowupRequest {
            message_id: Some(id),
            ..lineage::subagent::FollowupRequest::new(self.lead_b.clone(), self.child, text)
        }
    }

    fn mail_of(&self, id: lineage::log::MessageId) -> bool {
        Store::open_read_only(&self.url)
            .unwrap()
            .mail_for(&[self.child])
            .unwrap()
            .iter()
            .any(|m| m.id == id.as_uuid())
    }
}

/// A sender that takes its mail back when nobody holds the child, and loses the answer, does
/// not report the follow-up accepted: the mail is gone and the child's log lacks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_whose_mail_was_taken_back_with_the_answer_lost_is_refused_not_accepted() {
    use lineage_testkit::proxy::{Cut, Proxy};
    let proxy = Proxy::start(postgres().port());
    let w = mail_waits(Some(&proxy)).await;
    let id = lineage::log::MessageId::new();
    let sending = w.request("taken back", id);
    let sender = w.b.subagents.clone();
    let sent = tokio::spawn(async move { sender.send_followup(&sending).await });
    eventually("the follow-up's mail is posted", || w.mail_of(id)).await;
    // B's next statement naming the mail is its taking the mail back: its answer is lost.
    proxy.cut_next(Cut::AnswerTo(id.as_uuid().as_bytes().to_vec()));
    release_lease(&w.url, w.child);
    let error = sent
        .await
        .unwrap()
        .expect_err("a follow-up nobody delivered is not accepted");
    assert_eq!(proxy.cuts(), 1, "{error}");
    assert_eq!(
        error.code(),
        lineage::subagent::ErrorCode::NotResumable,
        "{error}"
    );
    assert!(!w.mail_of(id));
    assert_eq!(spliced_count(&stored(&w.url, w.child), id), 0);
    drop((w.gate, w.router, w.runtime_a));
}

/// Counts in `post_attempts` every post of mail, even one that posts nothing (its id waits
/// already), so a test sees when a sender has posted.
fn count_post_attempts(url: &str) {
    postgres().psql(
        url,
        "CREATE TABLE post_attempts (id uuid); \
         CREATE FUNCTION count_post() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN INSERT INTO post_attempts VALUES (NEW.id); RETURN NEW; END $$; \
         CREATE TRIGGER count_post BEFORE INSERT ON lineage_mailbox \
         FOR EACH ROW EXECUTE FUNCTION count_post()",
    );
}

fn post_attempts(url: &str) -> usize {
    postgres()
        .psql(url, "SELECT count(*) FROM post_attempts")
        .trim()
        .parse()
        .expect("a count")
}

/// Two senders of one message id: the second's post finds the first's mail and posts nothing;
/// the first is cancelled and takes the mail back. The second is not told its follow-up was
/// delivered until the child's log holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sender_of_one_id_is_accepted_only_once_the_child_has_it() {
    let w = mail_waits(None).await;
    count_post_attempts(&w.url);
    let id = lineage::log::MessageId::new();
    let first = w.request("one message", id);
    let cancel_first = first.cancel.clone();
    let sender = w.b.subagents.clone();
    let first = tokio::spawn(async move { sender.send_followup(&first).await });
    eventually("the first sender's mail is posted", || w.mail_of(id)).await;
    let second = w.request("one message", id);
    let sender = w.b.subagents.clone();
    let second = tokio::spawn(async move { sender.send_followup(&second).await });
    eventually("the second sender has posted", || {
        post_attempts(&w.url) == 2
    })
    .await;
    cancel_first.cancel(lineage::log::AbortCause::User);
    let error = first.await.unwrap().expect_err("the first is cancelled");
    assert_eq!(
        error.code(),
        lineage::subagent::ErrorCode::Cancelled,
        "{error}"
    );
    let _serving = w.runtime_a.serve_mail().unwrap();
    assert_eq!(second.await.unwrap().unwrap(), id);
    assert_eq!(spliced_count(&stored(&w.url, w.child), id), 1);
    w.gate.open();
    eventually("the lead on B hears of the child", || {
        !settled_notices(&w.lead_b.events()).is_empty()
    })
    .await;
    let log = stored(&w.url, w.child);
    assert_eq!(user_texts(&log), ["first job", "one message"]);
    assert_balanced(&log);
}

/// A follow-up cancelled while the child's host has claimed its mail is not reported accepted:
/// the sender waits on, and when that host lets the child go without delivering it, takes the
/// mail back and reports the follow-up cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_cancelled_while_claimed_waits_for_the_claimant_and_is_never_stranded() {
    let w = mail_waits(None).await;
    let id = lineage::log::MessageId::new();
    let sending = w.request("claimed", id);
    let cancel = sending.cancel.clone();
    let sender = w.b.subagents.clone();
    let sent = tokio::spawn(async move { sender.send_followup(&sending).await });
    eventually("the follow-up's mail is posted", || w.mail_of(id)).await;
    // A claims the mail, as its mail server does before delivering it, and stops there.
    postgres().psql(
        &w.url,
        "UPDATE lineage_mailbox m SET claimed_by = l.holder FROM lineage_leases l \
         WHERE l.session = m.recipient",
    );
    cancel.cancel(lineage::log::AbortCause::User);
    // A lets the child go without delivering the mail: its claim lapses.
    release_lease(&w.url, w.child);
    let error = sent
        .await
        .unwrap()
        .expect_err("a follow-up nobody delivered is not accepted");
    assert_eq!(
        error.code(),
        lineage::subagent::ErrorCode::Cancelled,
        "{error}"
    );
    assert!(!w.mail_of(id), "taken back");
    assert_eq!(spliced_count(&stored(&w.url, w.child), id), 0);
    drop((w.gate, w.router, w.runtime_a, w.lead_b));
}

/// A follow-up the child's host accepted behind a running turn, and made durable, then that
/// host stopped: the sender's retry with the same id finds the child cold, with the message
/// queued in its log, and resumes it to run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_follow_up_queued_by_a_host_that_stopped_resumes_the_child_to_run_it() {
    let w = mail_waits(None).await;
    let _serving = w.runtime_a.serve_mail().unwrap();
    w.router.model("c").wait_for_requests(1).await;
    let id = lineage::log::MessageId::new();
    let sent = w.b.subagents.send_followup(&w.request("queued", id)).await;
    assert_eq!(sent.unwrap(), id);
    assert_eq!(
        spliced_count(&stored(&w.url, w.child), id),
        1,
        "queued on A"
    );
    assert_eq!(
        claimed_count(&stored(&w.url, w.child), id),
        0,
        "behind A's turn"
    );
    // A stops (its first turn never ends): its lease on the child runs out.
    expire_lease(&w.url, w.child);
    let retried = w.b.subagents.send_followup(&w.request("queued", id)).await;
    assert_eq!(retried.unwrap(), id);
    eventually("the retried follow-up runs on B", || {
        claimed_count(&stored(&w.url, w.child), id) == 1
    })
    .await;
    eventually("the lead on B hears of the child", || {
        !settled_notices(&w.lead_b.events()).is_empty()
    })
    .await;
    let log = stored(&w.url, w.child);
    assert_eq!(user_texts(&log), ["first job", "queued"]);
    assert_eq!(spliced_count(&log, id), 1);
    assert_balanced(&log);
    drop(w.gate);
}

/// A child's report to its parent's object on the child's host, after another host took the
/// parent's session over (the object does not know yet: it was idle), reaches the parent on
/// that other host, by mail, once its refused flush shows the object is not the parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_handed_to_a_parent_taken_over_unknown_to_its_host_reaches_the_new_holder() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    let gate = Gate::new();
    router.script("g", [Response::text("g is done").gated(&gate)]);
    let (a, lead, child) = paused_lead_with_child(&url, &router, "g").await;
    lead.when_idle().await;
    expire_lease(&url, lead.id());
    let b = host(&url, &router);
    let lead_b = b.resume(lead.id(), parent_spec(vec![])).await.unwrap();
    assert!(!lead.is_fenced(), "the stale lead on A does not know yet");

    let child_agent = a.agents.get(child).expect("the child is live on A");
    let id = a
        .subagents
        .report(
            &child_agent,
            vec![ContentBlock::text("half way")],
            lineage::subagent::ReportDelivery::Quiet,
            &Cancellation::new(),
        )
        .expect("the report is handed to the lead on A");
    eventually("the report reaches the lead on B", || {
        spliced_count(&lead_b.events(), id) == 1
    })
    .await;
    eventually("the report is durable in the lead's log", || {
        spliced_count(&stored(&url, lead.id()), id) == 1
    })
    .await;
    gate.open();
    assert_verifies(&b.store);
}

/// A child torn by its host's pause whose log holds only an injected (quiet) message is not
/// resumed to run a turn nobody asked for: it is closed, and its parent told of the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_child_holding_only_quiet_input_is_closed_not_resumed_into_a_turn() {
    let url = postgres().create_database();
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..10).map(|_| Response::text("ok")));
    let never = Gate::new();
    router.script(
        "q",
        [
            Response::text("A's answer, never given").gated(&never),
            Response::text("a turn nobody asked for"),
        ],
    );
    let (a, lead, child) = paused_lead_with_child(&url, &router, "q").await;
    router.model("q").wait_for_requests(1).await;
    let child_agent = a.agents.get(child).expect("the child is live on A");
    child_agent
        .inject(Message {
            id: lineage::log::MessageId::new(),
            role: lineage::log::Role::User,
            content: vec![ContentBlock::text("for the next step")],
            source: MessageSource::User,
        })
        .unwrap();
    child_agent.flush().await.unwrap();

    expire_leases(&url);
    let b = host(&url, &router);
    let lead_b = b.resume(lead.id(), parent_spec(vec![])).await.unwrap();
    eventually("the lead on B hears of the crash", || {
        !settled_notices(&lead_b.events()).is_empty()
    })
    .await;
    assert!(!b.subagents.is_resident(child), "not resumed");
    let log = stored(&url, child);
    assert_eq!(
        lineage_testkit::read::turn_ends(&log),
        [TurnEndReason::Interrupted],
        "closed, and no turn after"
    );
    assert_eq!(router.model("q").requests().len(), 1, "no model turn on B");
    drop((a, never));
}
