//! Chaos on a shared store: four host processes on one real PostgreSQL (the test process's private
//! server), each through a TCP proxy of its own that the test controls, under a seeded schedule
//! of faults: connections reset, stalled, black-holed (left half-open) and cut right after a
//! COMMIT; hosts killed with SIGKILL (and started again) and paused with SIGSTOP past their lease
//! (then continued); the server restarted fast and immediate. Meanwhile leads and continuable
//! children spread over the hosts, follow-ups go to children from their lead's host (each with a
//! text of its own, so it can be counted in the child's log), and leads move between hosts.
//!
//! What it asserts, each with the seed in the failure: no host command waits longer than
//! [`COMMAND_BOUND`] (each command's wall time is measured in the host process that ran it);
//! every follow-up reported accepted is in its child's log exactly once and runs in a turn; none
//! reported refused is delivered; every lead lost to a fault is served again by another host
//! within [`FAILOVER_BOUND`]; no zombie (once the faults heal, `resume` works on every host that
//! lost a lead); fencing tokens strictly increase per log; every log verifies. A figures line
//! closes the run (RELIABILITY.md, *Chaos on a shared store*).
//!
//! `LINEAGE_CHAOS_SECONDS` sets how long faults are injected (60 s by default; the whole test then
//! takes under three minutes), `LINEAGE_CHAOS_SEED` replays a schedule. The harness itself cannot
//! hang: every wait is bounded, and every host process is killed at the end (or when a failure
//! unwinds past it).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use lineage::agent::Cancellation;
use lineage::agent::{CreateAgent, LEASE_EVENT, RegistryEvent, Response, ScriptedCall, ToolOutput};
use lineage::log::{ContentBlock, Event, EventBody, Message, MessageSource, SessionId};
use lineage::store::{Store, StoreOptions};
use lineage::subagent::Host;
use lineage_testkit::postgres::{Shutdown, postgres};
use lineage_testkit::process::{Helper, after_marker, helper_command, report_line};
use lineage_testkit::proxy::{Cut, Proxy};
use lineage_testkit::subagent::{FnTool, PARENT, Router, continuable, parent_spec};

const TEST: &str = "four_hosts_on_one_database_under_faults_keep_their_promises";
/// Names the database URL (through its proxy) a host process serves.
const URL_VAR: &str = "LINEAGE_CHAOS_URL";
const HOSTS: usize = 4;
/// The hosts' lease time: short, so a lost host is replaced quickly.
const TTL: Duration = Duration::from_secs(2);
/// The longest a host command may take: the engine's call deadline is 15 s and its connect
/// timeout 5 s, and a command makes a few calls.
const COMMAND_BOUND: Duration = Duration::from_secs(30);
/// How long after a host lost a lead (killed, paused, black-holed) another host must serve it.
const FAILOVER_BOUND: Duration = Duration::from_secs(60);
/// How long the end of the run waits for what is still under way (answers, the children's turns).
const SETTLE_BOUND: Duration = Duration::from_secs(35);

// ----- the host process -------------------------------------------------------------------------

/// The lead's spec: its children inherit `pause`, a tool that answers after 200 ms (or when the
/// turn is cancelled), so follow-ups queue behind running turns.
fn lead_spec() -> lineage::agent::AgentSpec {
    let pause = FnTool::new("pause", |ctx, _| async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => ToolOutput::text("rested"),
            _ = ctx.cancel.cancelled() => ToolOutput::text("stopped"),
        }
    });
    parent_spec(vec![pause])
}

/// The lead answers `ok`; a child on `work` calls `pause`, then answers `done`, turn by turn.
fn router() -> Arc<Router> {
    const PAUSE: ScriptedCall<'static> = ("p", "pause", "{}");
    let router = Arc::new(Router::default());
    router.script(PARENT, (0..20_000).map(|_| Response::text("ok")));
    router.script(
        "work",
        (0..20_000).flat_map(|_| [Response::tool_calls(None, &[PAUSE]), Response::text("done")]),
    );
    router
}

/// A host process: reads `<n> <verb> <args…>` on stdin and runs each command on a task of its
/// own (so one stuck command delays no other), answering `ok <n> <ms> <result>` or
/// `err <n> <ms> <code> <message>`, `<ms>` being the command's wall time here. Verbs: `lead`
/// (a new lead: its id), `start <lead>` (a continuable child on `work`: its id), `resume <lead>`,
/// `dispose <id>`, `followup <lead> <child> <text>` (the message id). It also reports
/// `fenced <id>` and `disposed <id>` from its registry.
async fn serve_host(url: &str) {
    use std::io::BufRead;
    let opened = Instant::now();
    let options = StoreOptions {
        lease_ttl: TTL,
        ..StoreOptions::default()
    };
    let store = match Store::open_with(url, options) {
        Ok(store) => store,
        Err(e) => {
            report_line(&format!("open-failed {} {e}", opened.elapsed().as_millis()));
            return;
        }
    };
    let host = Arc::new(Host::new(store, router()).expect("the host starts"));
    let mut registry = host.agents.subscribe();
    tokio::spawn(async move {
        while let Some(event) = registry.recv().await {
            match event {
                RegistryEvent::Diagnostic(d) => {
                    report_line(&format!("diagnostic {} {:?} {}", d.agent, d.kind, d.reason));
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
    report_line(&format!(
        "host {} {}",
        host.store.holder(),
        opened.elapsed().as_millis()
    ));
    while let Some(line) = commands.recv().await {
        let host = host.clone();
        tokio::spawn(async move {
            let words: Vec<&str> = line.split_whitespace().collect();
            let started = Instant::now();
            let result = run_command(&host, &words[1..]).await;
            let ms = started.elapsed().as_millis();
            match result {
                Ok(value) => report_line(&format!("ok {} {ms} {value}", words[0])),
                Err((code, message)) => {
                    let message = message.replace('\n', " ");
                    report_line(&format!("err {} {ms} {code} {message}", words[0]));
                }
            }
        });
    }
}

/// Runs one command; `Err((code, message))` on a refusal or failure (`-` when it has no code).
async fn run_command(host: &Host, words: &[&str]) -> Result<String, (String, String)> {
    let id = |word: &str| -> SessionId { word.parse().expect("a session id") };
    let plain = |e: &dyn std::fmt::Display| ("-".to_owned(), e.to_string());
    let live = |agent: &str| {
        host.agents
            .get(id(agent))
            .ok_or_else(|| ("-".to_owned(), format!("{agent} is not live here")))
    };
    match words {
        ["lead"] => host
            .agents
            .create(CreateAgent::fresh(lead_spec()))
            .await
            .map(|lead| lead.id().to_string())
            .map_err(|e| plain(&e)),
        ["start", lead] => {
            let lead = live(lead)?;
            host.subagents
                .start_continuable("spawn", continuable(&lead, "work", "first job"))
                .await
                .map(|started| started.child.to_string())
                .map_err(|e| (e.code().to_string(), e.to_string()))
        }
        ["resume", lead] => host
            .resume(id(lead), lead_spec())
            .await
            .map(|lead| lead.id().to_string())
            .map_err(|e| plain(&e)),
        ["dispose", agent] => {
            host.agents.dispose(id(agent)).await;
            Ok(String::new())
        }
        ["followup", lead, child, text] => {
            let lead = live(lead)?;
            host.subagents
                .followup(
                    &lead,
                    id(child),
                    vec![ContentBlock::text(text.to_string())],
                    MessageSource::Coordinator { sender: lead.id() },
                    &Cancellation::new(),
                )
                .await
                .map(|message| message.to_string())
                .map_err(|e| (e.code().to_string(), e.to_string()))
        }
        _ => Err(("-".to_owned(), format!("unknown command {words:?}"))),
    }
}

// ----- the driver -------------------------------------------------------------------------------

/// A small deterministic generator (xorshift64*), so a schedule replays from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    Kill,
    Stop,
    BlackHole,
    Stall,
    Reset,
    CutAfterCommit,
    RestartFast,
    RestartImmediate,
}

const FAULTS: [Fault; 8] = [
    Fault::Kill,
    Fault::Stop,
    Fault::BlackHole,
    Fault::Stall,
    Fault::Reset,
    Fault::CutAfterCommit,
    Fault::RestartFast,
    Fault::RestartImmediate,
];

/// A running host process, talked to line by line.
struct HostProcess {
    helper: Helper,
    stdin: std::process::ChildStdin,
    lines: Receiver<String>,
}

/// One of the hosts: its proxy, its process (a new one after each kill), and the lasting fault
/// it is under, with when that fault ends.
struct Slot {
    proxy: Proxy,
    url: String,
    process: Option<HostProcess>,
    generation: usize,
    fault: Option<(Fault, Instant)>,
}

impl Slot {
    fn healthy(&self) -> bool {
        self.process.is_some() && self.fault.is_none()
    }
}

/// What a command sent to a host was for.
#[derive(Clone, Debug)]
enum Purpose {
    Lead,
    Start(usize),
    /// A lead taken up by this host after `since` (a move, or its host lost it to `cause`).
    Resume {
        lead: usize,
        since: Instant,
        cause: Option<Fault>,
    },
    /// The first half of a move: the lead's host lets it go.
    MoveAway(usize),
    /// The zombie check: a host that lost the lead resumes it once the faults healed.
    Revisit(usize),
    Dispose,
    Followup(String),
}

struct Pending {
    host: usize,
    generation: usize,
    verb: String,
    purpose: Purpose,
    sent: Instant,
    /// The host was paused while this was under way: its wait includes the pause.
    excused: bool,
}

/// Where a lead is: served on a host, or on its way to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Host(usize),
    Moving,
    /// Nobody took it up within the bound.
    Lost,
}

struct Lead {
    id: SessionId,
    at: At,
    children: Vec<SessionId>,
    /// Hosts (and their generation) that lost it to a fault while they kept running.
    lost_by: Vec<(usize, usize)>,
}

/// What the sending host said of a follow-up.
#[derive(Debug)]
enum Answer {
    Accepted(String),
    Refused(String),
    /// The sender said it cannot know whether the message was delivered.
    Unknown(String),
}

struct Sent {
    child: SessionId,
    answer: Option<Answer>,
}

/// A resume to be retried until some host grants it.
struct Takeover {
    lead: usize,
    since: Instant,
    cause: Option<Fault>,
    lost_host: Option<usize>,
    /// The host asked last, and when, while its answer is awaited.
    in_flight: Option<(usize, Instant)>,
    next_try: Instant,
    last_refusal: String,
}

struct Chaos {
    rng: Rng,
    database: String,
    slots: Vec<Slot>,
    pending: HashMap<u64, Pending>,
    next_command: u64,
    leads: Vec<Lead>,
    sent: HashMap<String, Sent>,
    takeovers: Vec<Takeover>,
    faults: HashMap<Fault, usize>,
    /// Each answered command's wall time in its host, with what it was.
    waits: Vec<(u64, String)>,
    failovers: Vec<Duration>,
    /// Every broken promise seen, in words.
    failures: Vec<String>,
    zombies: usize,
    diagnostics: Vec<String>,
}

/// Whether a follow-up's error says its outcome is unknown (it may have been delivered), rather
/// than that it was refused (it never will be).
fn outcome_unknown(code: &str, message: &str) -> bool {
    let text = format!("{code} {message}").to_lowercase();
    text.contains("outcome_unknown") || text.contains("outcome unknown")
}

impl Chaos {
    fn start_host(&mut self, at: usize) {
        for attempt in 1..=5 {
            let mut command = helper_command(TEST);
            command
                .env(URL_VAR, &self.slots[at].url)
                .stdin(std::process::Stdio::piped());
            let mut helper = Helper::spawn(&mut command);
            let stdin = helper.0.stdin.take().expect("piped stdin");
            let lines = helper.lines();
            let deadline = Instant::now() + COMMAND_BOUND;
            let mut opened = None;
            while opened.is_none() && Instant::now() < deadline {
                match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(line) => {
                        if let Some(rest) = after_marker(&line, "host ") {
                            opened = Some(Ok(rest.to_owned()));
                        } else if let Some(why) = after_marker(&line, "open-failed ") {
                            opened = Some(Err(why.to_owned()));
                        }
                    }
                    Err(_) => break,
                }
            }
            match opened {
                Some(Ok(rest)) => {
                    let ms: u64 = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
                    self.waits.push((ms, format!("open on host {at}")));
                    self.slots[at].process = Some(HostProcess {
                        helper,
                        stdin,
                        lines,
                    });
                    self.slots[at].generation += 1;
                    return;
                }
                Some(Err(why)) => {
                    eprintln!(
                        "chaos: host {at} could not open the store (attempt {attempt}): {why}"
                    );
                    std::thread::sleep(Duration::from_millis(500));
                }
                None => {
                    self.failures.push(format!(
                        "host {at} did not open the store within {COMMAND_BOUND:?}"
                    ));
                    return;
                }
            }
        }
        self.failures
            .push(format!("host {at} could not open the store in 5 attempts"));
    }

    /// Sends `verb` to host `at`; `false` when it has no process.
    fn send(&mut self, at: usize, verb: String, purpose: Purpose) -> bool {
        let n = self.next_command;
        self.next_command += 1;
        let Some(process) = self.slots[at].process.as_mut() else {
            return false;
        };
        if writeln!(process.stdin, "{n} {verb}").is_err() {
            return false;
        }
        let generation = self.slots[at].generation;
        self.pending.insert(
            n,
            Pending {
                host: at,
                generation,
                verb,
                purpose,
                sent: Instant::now(),
                excused: false,
            },
        );
        true
    }

    /// Reads every line the hosts printed so far and acts on it.
    fn read_lines(&mut self) {
        for at in 0..self.slots.len() {
            let lines: Vec<String> = match &self.slots[at].process {
                Some(process) => process.lines.try_iter().collect(),
                None => continue,
            };
            for line in lines {
                self.on_line(at, &line);
            }
        }
    }

    fn on_line(&mut self, at: usize, line: &str) {
        if let Some(rest) = after_marker(line, "diagnostic ") {
            self.diagnostics.push(format!("host {at}: {rest}"));
            return;
        }
        if let Some(agent) = after_marker(line, "disposed ") {
            // A lead that left its host's registry without a move (fenced off, lost): it is
            // taken up again, by any host.
            let Ok(agent) = agent.parse::<SessionId>() else {
                return;
            };
            // (A lead the driver moves is marked moving before it is let go.)
            if let Some(lead) = self.leads.iter().position(|l| l.id == agent)
                && self.leads[lead].at == At::Host(at)
            {
                self.leads[lead].at = At::Moving;
                self.takeover(lead, None, Some(at));
            }
            return;
        }
        let (ok, rest) = if let Some(rest) = after_marker(line, "ok ") {
            (true, rest)
        } else if let Some(rest) = after_marker(line, "err ") {
            (false, rest)
        } else {
            return;
        };
        let mut words = rest.splitn(3, ' ');
        let (Some(n), Some(ms)) = (words.next(), words.next()) else {
            return;
        };
        let (Ok(n), Ok(ms)) = (n.parse::<u64>(), ms.parse::<u64>()) else {
            return;
        };
        let value = words.next().unwrap_or("").trim().to_owned();
        let Some(pending) = self.pending.remove(&n) else {
            return;
        };
        if !pending.excused {
            self.waits
                .push((ms, format!("{} on host {}", pending.verb, pending.host)));
        }
        match (pending.purpose, ok) {
            (Purpose::Lead, true) => self.leads.push(Lead {
                id: value.parse().unwrap(),
                at: At::Host(at),
                children: Vec::new(),
                lost_by: Vec::new(),
            }),
            (Purpose::Start(lead), true) => self.leads[lead].children.push(value.parse().unwrap()),
            (Purpose::Resume { lead, since, cause }, true) => {
                self.leads[lead].at = At::Host(at);
                if cause.is_some() {
                    self.failovers.push(since.elapsed());
                }
                self.takeovers.retain(|t| t.lead != lead);
            }
            (Purpose::Resume { lead, .. }, false) => {
                if let Some(t) = self.takeovers.iter_mut().find(|t| t.lead == lead) {
                    t.in_flight = None;
                    t.next_try = Instant::now() + Duration::from_millis(100);
                    t.last_refusal = value;
                }
            }
            (Purpose::MoveAway(lead), _) => self.takeover(lead, None, None),
            (Purpose::Revisit(lead), true) => {
                self.leads[lead].at = At::Host(at);
            }
            (Purpose::Revisit(lead), false) => {
                self.zombies += 1;
                let id = self.leads[lead].id;
                self.failures.push(format!(
                    "host {at}, which lost lead {id} to a fault, cannot resume it once the \
                     faults healed (a zombie?): {value}"
                ));
            }
            (Purpose::Followup(token), ok) => {
                let answer = if ok {
                    Answer::Accepted(value)
                } else {
                    let (code, message) = value.split_once(' ').unwrap_or((&value, ""));
                    if outcome_unknown(code, message) {
                        Answer::Unknown(value)
                    } else {
                        Answer::Refused(value)
                    }
                };
                self.sent.get_mut(&token).unwrap().answer = Some(answer);
            }
            (purpose, false) => {
                self.diagnostics
                    .push(format!("host {at}: {purpose:?} refused: {value}"));
            }
            (Purpose::Dispose, true) => {}
        }
    }

    /// Starts taking `lead` up on another host (retried until granted or the bound passes).
    fn takeover(&mut self, lead: usize, cause: Option<Fault>, lost_host: Option<usize>) {
        self.takeovers.retain(|t| t.lead != lead);
        self.takeovers.push(Takeover {
            lead,
            since: Instant::now(),
            cause,
            lost_host,
            in_flight: None,
            next_try: Instant::now(),
            last_refusal: String::new(),
        });
    }

    /// Sends the takeovers' next resumes; fails the ones past the bound.
    fn drive_takeovers(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        for i in 0..self.takeovers.len() {
            let t = &self.takeovers[i];
            if now.duration_since(t.since) > FAILOVER_BOUND {
                due.push((i, None));
                continue;
            }
            // A host that does not answer within the bound is given up on (its wait is reported
            // as overdue), and another is asked.
            if let Some((host, asked)) = t.in_flight
                && asked.elapsed() > COMMAND_BOUND
            {
                self.takeovers[i].in_flight = None;
                self.takeovers[i].lost_host = Some(host);
            }
            let t = &self.takeovers[i];
            if t.in_flight.is_none() && t.next_try <= now {
                let candidates: Vec<usize> = (0..self.slots.len())
                    .filter(|&h| self.slots[h].healthy() && Some(h) != t.lost_host)
                    .collect();
                if !candidates.is_empty() {
                    let pick = candidates[self.rng.below(candidates.len() as u64) as usize];
                    due.push((i, Some(pick)));
                }
            }
        }
        for (i, pick) in due.iter().rev() {
            let (lead, since, cause) = {
                let t = &self.takeovers[*i];
                (t.lead, t.since, t.cause)
            };
            match pick {
                None => {
                    let t = self.takeovers.remove(*i);
                    self.leads[lead].at = At::Lost;
                    self.failures.push(format!(
                        "lead {} was not served again within {FAILOVER_BOUND:?} after {} \
                         (last refusal: {})",
                        self.leads[lead].id,
                        cause.map_or("a move".to_owned(), |c| format!("{c:?}")),
                        t.last_refusal
                    ));
                }
                Some(host) => {
                    let verb = format!("resume {}", self.leads[lead].id);
                    let purpose = Purpose::Resume { lead, since, cause };
                    if self.send(*host, verb, purpose) {
                        self.takeovers[*i].in_flight = Some((*host, Instant::now()));
                    }
                }
            }
        }
    }

    /// The leads host `at` serves now, taken up elsewhere: the host lost them to `fault`. The
    /// takeovers it was answering are tried elsewhere too (its answers still count, when they
    /// come).
    fn fail_over(&mut self, at: usize, fault: Fault, keeps_running: bool) {
        let answering: Vec<usize> = self
            .pending
            .values()
            .filter(|p| p.host == at)
            .filter_map(|p| match p.purpose {
                Purpose::Resume { lead, .. } => Some(lead),
                _ => None,
            })
            .collect();
        for t in self.takeovers.iter_mut() {
            if answering.contains(&t.lead) {
                t.in_flight = None;
                t.lost_host = Some(at);
            }
        }
        let generation = self.slots[at].generation;
        for lead in 0..self.leads.len() {
            if self.leads[lead].at == At::Host(at) {
                self.leads[lead].at = At::Moving;
                if keeps_running {
                    self.leads[lead].lost_by.push((at, generation));
                }
                self.takeover(lead, Some(fault), Some(at));
            }
        }
    }

    fn inject(&mut self, fault: Fault) {
        let healthy: Vec<usize> = (0..self.slots.len())
            .filter(|&h| self.slots[h].healthy())
            .collect();
        // Two hosts stay healthy, so the leads always have somewhere to go.
        let lasting = matches!(fault, Fault::Kill | Fault::Stop | Fault::BlackHole);
        if healthy.len() <= 2 && lasting {
            return;
        }
        let Some(&at) = healthy.get(self.rng.below(healthy.len().max(1) as u64) as usize) else {
            return;
        };
        *self.faults.entry(fault).or_default() += 1;
        let now = Instant::now();
        match fault {
            Fault::Kill => {
                self.read_lines();
                if let Some(mut process) = self.slots[at].process.take() {
                    process.helper.kill();
                }
                // What it was doing for the driver is gone with it: a takeover it was answering
                // is tried elsewhere, a lead it was letting go is taken up elsewhere.
                let lost: Vec<u64> = self
                    .pending
                    .iter()
                    .filter(|(_, p)| p.host == at)
                    .map(|(n, _)| *n)
                    .collect();
                for n in lost {
                    match self.pending.remove(&n).map(|p| p.purpose) {
                        Some(Purpose::Resume { lead, .. }) => {
                            for t in self.takeovers.iter_mut().filter(|t| t.lead == lead) {
                                t.in_flight = None;
                            }
                        }
                        Some(Purpose::MoveAway(lead)) => self.takeover(lead, None, None),
                        _ => {}
                    }
                }
                self.fail_over(at, fault, false);
                self.start_host(at);
            }
            Fault::Stop => {
                self.signal(at, "-STOP");
                for p in self.pending.values_mut().filter(|p| p.host == at) {
                    p.excused = true;
                }
                self.slots[at].fault = Some((fault, now + self.rng.millis(5_000, 8_000)));
                self.fail_over(at, fault, true);
            }
            Fault::BlackHole => {
                self.slots[at].proxy.black_hole();
                self.slots[at].fault = Some((fault, now + self.rng.millis(4_000, 10_000)));
                self.fail_over(at, fault, true);
                // A write through the dead path: it must fail (or succeed after the heal)
                // within the bound, like any command.
                self.send(at, "lead".to_owned(), Purpose::Lead);
            }
            Fault::Stall => {
                self.slots[at].proxy.stall();
                self.slots[at].fault = Some((fault, now + self.rng.millis(300, 1_200)));
            }
            Fault::Reset => self.slots[at].proxy.reset(),
            Fault::CutAfterCommit => self.slots[at]
                .proxy
                .cut_next(Cut::AnswerTo(b"COMMIT".to_vec())),
            Fault::RestartFast | Fault::RestartImmediate => {
                let how = if fault == Fault::RestartFast {
                    Shutdown::Fast
                } else {
                    Shutdown::Immediate
                };
                let down = self.rng.millis(0, 2_000);
                postgres().restart(how, down);
            }
        }
    }

    fn signal(&self, at: usize, signal: &str) {
        if let Some(process) = &self.slots[at].process {
            let status = std::process::Command::new("kill")
                .args([signal, &process.helper.0.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(status.success(), "kill {signal} failed");
        }
    }

    /// Ends the lasting faults whose time has come (all of them with `all`).
    fn heal(&mut self, all: bool) {
        let now = Instant::now();
        for at in 0..self.slots.len() {
            let Some((fault, until)) = self.slots[at].fault else {
                continue;
            };
            if !all && until > now {
                continue;
            }
            match fault {
                Fault::Stop => self.signal(at, "-CONT"),
                _ => self.slots[at].proxy.heal(),
            }
            self.slots[at].fault = None;
        }
    }

    /// One step of the workload: mostly a follow-up to a child from its lead's host, sometimes a
    /// new child or a lead's move to another host.
    fn work(&mut self, step: u64) {
        let served: Vec<(usize, usize)> = (0..self.leads.len())
            .filter_map(|l| match self.leads[l].at {
                At::Host(h) if self.slots[h].process.is_some() => Some((l, h)),
                _ => None,
            })
            .filter(|&(_, h)| !matches!(self.slots[h].fault, Some((Fault::Stop, _))))
            .collect();
        if served.is_empty() {
            return;
        }
        let (lead, at) = served[self.rng.below(served.len() as u64) as usize];
        let id = self.leads[lead].id;
        match self.rng.below(20) {
            0..=15 if !self.leads[lead].children.is_empty() => {
                let children = &self.leads[lead].children;
                let child = children[self.rng.below(children.len() as u64) as usize];
                let token = format!("followup-{step}-{}", self.rng.below(1 << 30));
                if self.send(
                    at,
                    format!("followup {id} {child} {token}"),
                    Purpose::Followup(token.clone()),
                ) {
                    self.sent.insert(
                        token,
                        Sent {
                            child,
                            answer: None,
                        },
                    );
                }
            }
            16 if self.leads[lead].children.len() < 3 => {
                self.send(at, format!("start {id}"), Purpose::Start(lead));
            }
            17 if self.slots.iter().filter(|s| s.healthy()).count() > 1 => {
                self.leads[lead].at = At::Moving;
                self.send(at, format!("dispose {id}"), Purpose::MoveAway(lead));
            }
            _ => {}
        }
    }

    /// Whether a command sent for a purpose `which` picks is still unanswered (on a host that
    /// runs).
    fn waiting_for(&self, which: impl Fn(&Purpose) -> bool) -> bool {
        self.pending
            .values()
            .any(|p| p.generation == self.slots[p.host].generation && which(&p.purpose))
    }

    /// Commands unanswered past the bound on a host that kept running and was not paused.
    fn overdue(&self) -> Vec<String> {
        self.pending
            .values()
            .filter(|p| {
                !p.excused
                    && p.generation == self.slots[p.host].generation
                    && p.sent.elapsed() > COMMAND_BOUND
            })
            .map(|p| {
                format!(
                    "`{}` on host {} unanswered after {:?}",
                    p.verb,
                    p.host,
                    p.sent.elapsed()
                )
            })
            .collect()
    }

    /// Reads lines and drives takeovers until `done` holds or `bound` passes; `false` then.
    fn settle(&mut self, bound: Duration, mut done: impl FnMut(&Chaos) -> bool) -> bool {
        let deadline = Instant::now() + bound;
        loop {
            self.read_lines();
            self.drive_takeovers();
            if done(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The fencing tokens of the lease records in `events`, in log order.
fn tokens(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Custom(c) if c.type_name.as_str() == LEASE_EVENT => {
                let v: serde_json::Value = serde_json::from_str(c.payload.as_str()).ok()?;
                v["fence"].as_u64()
            }
            _ => None,
        })
        .collect()
}

/// The messages `event` splices into an inbox.
fn spliced_in(event: &Event) -> &[Message] {
    match &event.body {
        EventBody::InboxSpliced(s) => &s.inserted,
        _ => &[],
    }
}

fn percentile(sorted: &[Duration], p: usize) -> String {
    if sorted.is_empty() {
        return "-".to_owned();
    }
    let at = ((sorted.len() - 1) * p).div_ceil(100);
    format!("{} ms", sorted[at].as_millis())
}

#[test]
fn four_hosts_on_one_database_under_faults_keep_their_promises() {
    if let Ok(url) = std::env::var(URL_VAR) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(serve_host(&url));
        return;
    }
    let seed = std::env::var("LINEAGE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let seconds: u64 = std::env::var("LINEAGE_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    eprintln!(
        "chaos seed {seed}, {seconds} s of faults (LINEAGE_CHAOS_SEED replays the schedule, \
         LINEAGE_CHAOS_SECONDS sets its length)"
    );
    let server = postgres();
    let database = server.create_database();
    let name = database.rsplit('/').next().unwrap().to_owned();
    let slots = (0..HOSTS)
        .map(|_| {
            let proxy = Proxy::start(server.port());
            let url = format!("postgres://lineage@127.0.0.1:{}/{name}", proxy.port());
            Slot {
                proxy,
                url,
                process: None,
                generation: 0,
                fault: None,
            }
        })
        .collect();
    let mut chaos = Chaos {
        rng: Rng(seed),
        database,
        slots,
        pending: HashMap::new(),
        next_command: 0,
        leads: Vec::new(),
        sent: HashMap::new(),
        takeovers: Vec::new(),
        faults: HashMap::new(),
        waits: Vec::new(),
        failovers: Vec::new(),
        failures: Vec::new(),
        zombies: 0,
        diagnostics: Vec::new(),
    };
    for at in 0..HOSTS {
        chaos.start_host(at);
    }
    // A lead on each host, with two children each, before the faults begin.
    for at in 0..HOSTS {
        chaos.send(at, "lead".to_owned(), Purpose::Lead);
    }
    let ready = chaos.settle(COMMAND_BOUND, |c| c.leads.len() == HOSTS);
    assert!(
        ready,
        "seed {seed}: the leads were not created: {:?}",
        chaos.failures
    );
    for _ in 0..2 {
        for lead in 0..HOSTS {
            let At::Host(at) = chaos.leads[lead].at else {
                continue;
            };
            let verb = format!("start {}", chaos.leads[lead].id);
            chaos.send(at, verb, Purpose::Start(lead));
        }
        let started = chaos.settle(COMMAND_BOUND, |c| c.pending.is_empty());
        assert!(started, "seed {seed}: the children were not started");
    }

    // The chaos: a fault every 1.5 to 4 s, the workload in between.
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut next_fault = Instant::now() + Duration::from_secs(1);
    let mut step = 0;
    while Instant::now() < end {
        chaos.read_lines();
        chaos.heal(false);
        if Instant::now() >= next_fault {
            let fault = FAULTS[chaos.rng.below(FAULTS.len() as u64) as usize];
            chaos.inject(fault);
            next_fault = Instant::now() + chaos.rng.millis(1_500, 4_000);
        }
        chaos.drive_takeovers();
        chaos.work(step);
        step += 1;
        let pause = chaos.rng.millis(20, 120);
        std::thread::sleep(pause);
    }

    // The faults heal; what was under way finishes.
    chaos.heal(true);
    let settled = chaos.settle(SETTLE_BOUND, |c| {
        c.takeovers.is_empty()
            && c.pending
                .values()
                .all(|p| p.generation != c.slots[p.host].generation)
    });
    let overdue = chaos.overdue();
    if !settled {
        chaos.failures.push(format!(
            "{} commands and {} takeovers still under way {SETTLE_BOUND:?} after the faults \
             healed; overdue: {overdue:?}",
            chaos.pending.len(),
            chaos.takeovers.len()
        ));
    } else if !overdue.is_empty() {
        chaos
            .failures
            .push(format!("overdue commands: {overdue:?}"));
    }

    // No zombie: each host that lost a lead to a fault (and kept running) takes it up again
    // once its current host lets it go.
    let mut stuck = Vec::new();
    for lead in 0..chaos.leads.len() {
        let revisits: Vec<usize> = chaos.leads[lead]
            .lost_by
            .iter()
            .filter(|(h, g)| chaos.slots[*h].generation == *g && !stuck.contains(h))
            .map(|(h, _)| *h)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for old in revisits {
            let id = chaos.leads[lead].id;
            if let At::Host(now) = chaos.leads[lead].at {
                if now == old {
                    continue;
                }
                chaos.leads[lead].at = At::Moving;
                chaos.send(now, format!("dispose {id}"), Purpose::Dispose);
                chaos.settle(COMMAND_BOUND, |c| {
                    !c.waiting_for(|p| matches!(p, Purpose::Dispose))
                });
            }
            chaos.send(old, format!("resume {id}"), Purpose::Revisit(lead));
            let answered = chaos.settle(COMMAND_BOUND, |c| {
                !c.waiting_for(|p| matches!(p, Purpose::Revisit(l) if *l == lead))
            });
            if !answered {
                // Asked no more: its commands do not return.
                stuck.push(old);
                chaos.zombies += 1;
                chaos.failures.push(format!(
                    "host {old} did not answer a resume of {id} within {COMMAND_BOUND:?}"
                ));
            }
        }
    }

    // Every child still takes a follow-up from its lead, and every accepted one runs.
    for lead in 0..chaos.leads.len() {
        let At::Host(at) = chaos.leads[lead].at else {
            continue;
        };
        let id = chaos.leads[lead].id;
        for child in chaos.leads[lead].children.clone() {
            let token = format!("last-{child}");
            chaos.send(
                at,
                format!("followup {id} {child} {token}"),
                Purpose::Followup(token.clone()),
            );
            chaos.sent.insert(
                token,
                Sent {
                    child,
                    answer: None,
                },
            );
        }
    }
    chaos.settle(SETTLE_BOUND, |c| {
        !c.waiting_for(|p| matches!(p, Purpose::Followup(t) if t.starts_with("last-")))
    });
    for (token, sent) in &chaos.sent {
        if token.starts_with("last-") && !matches!(sent.answer, Some(Answer::Accepted(_))) {
            chaos.failures.push(format!(
                "once the faults healed, a follow-up to {} was not accepted: {:?}",
                sent.child, sent.answer
            ));
        }
    }
    let overdue = chaos.overdue();
    if !overdue.is_empty() {
        chaos
            .failures
            .push(format!("overdue at the end: {overdue:?}"));
    }

    // The children run what they accepted (bounded), then every host stops.
    let store = Store::open_read_only(&chaos.database).expect("the store opens");
    let accepted: Vec<(SessionId, String)> = chaos
        .sent
        .values()
        .filter_map(|s| match &s.answer {
            Some(Answer::Accepted(id)) => Some((s.child, id.clone())),
            _ => None,
        })
        .collect();
    let ran = |store: &Store| -> usize {
        let mut logs = HashMap::new();
        accepted
            .iter()
            .filter(|(child, id)| {
                let log = logs
                    .entry(*child)
                    .or_insert_with(|| store.read_from(*child, 0).unwrap_or_default());
                log.iter().any(
                    |e| matches!(&e.body, EventBody::UserMessage(m) if m.id.to_string() == *id),
                )
            })
            .count()
    };
    let deadline = Instant::now() + SETTLE_BOUND;
    while ran(&store) < accepted.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    let stranded = accepted.len() - ran(&store);
    for slot in &mut chaos.slots {
        if let Some(mut process) = slot.process.take() {
            process.helper.kill();
        }
    }

    // The logs: every one verifies, tokens only grow, each follow-up is where its answer says.
    let report = store.verify().expect("the store verifies");
    for session in report.sessions.iter().filter(|s| !s.problems.is_empty()) {
        chaos
            .failures
            .push(format!("a log does not verify: {session:?}"));
    }
    let mut sessions: Vec<SessionId> = chaos.leads.iter().map(|l| l.id).collect();
    sessions.extend(chaos.leads.iter().flat_map(|l| l.children.iter().copied()));
    let mut logs = HashMap::new();
    for session in &sessions {
        let events = store.read_from(*session, 0).unwrap_or_default();
        let tokens = tokens(&events);
        if !tokens.windows(2).all(|w| w[0] < w[1]) {
            chaos.failures.push(format!(
                "the fencing tokens of {session} do not grow strictly, tenure by tenure: \
                 {tokens:?}"
            ));
        }
        logs.insert(*session, events);
    }
    let (mut once, mut missing, mut duplicated, mut refused_delivered) = (0, 0, 0, 0);
    let (mut accepted_n, mut refused_n, mut unknown_n, mut unanswered_n) = (0, 0, 0, 0);
    for (token, sent) in &chaos.sent {
        let inserted: Vec<&Message> = logs[&sent.child]
            .iter()
            .flat_map(spliced_in)
            .filter(|m| m.text() == *token)
            .collect();
        if inserted.len() > 1 {
            duplicated += 1;
            chaos.failures.push(format!(
                "follow-up {token} is in {}'s log {} times ({:?})",
                sent.child,
                inserted.len(),
                sent.answer
            ));
        }
        match &sent.answer {
            Some(Answer::Accepted(id)) => {
                accepted_n += 1;
                match inserted.iter().filter(|m| m.id.to_string() == *id).count() {
                    0 => {
                        missing += 1;
                        chaos.failures.push(format!(
                            "follow-up {token} ({id}) was accepted and is not in {}'s log",
                            sent.child
                        ));
                    }
                    1 if inserted.len() == 1 => once += 1,
                    _ => {}
                }
            }
            Some(Answer::Refused(why)) => {
                refused_n += 1;
                if !inserted.is_empty() {
                    refused_delivered += 1;
                    chaos.failures.push(format!(
                        "follow-up {token} was refused ({why}) and is in {}'s log",
                        sent.child
                    ));
                }
            }
            Some(Answer::Unknown(why)) => {
                unknown_n += 1;
                chaos
                    .diagnostics
                    .push(format!("follow-up {token}: outcome unknown: {why}"));
            }
            None => unanswered_n += 1,
        }
    }
    if stranded > 0 {
        chaos.failures.push(format!(
            "{stranded} accepted follow-ups never ran in a turn within {SETTLE_BOUND:?} of the end"
        ));
    }
    let over: Vec<&(u64, String)> = chaos
        .waits
        .iter()
        .filter(|(ms, _)| *ms > COMMAND_BOUND.as_millis() as u64)
        .collect();
    if !over.is_empty() {
        chaos.failures.push(format!(
            "{} host commands waited longer than {COMMAND_BOUND:?}: {:?}",
            over.len(),
            over.iter().take(10).collect::<Vec<_>>()
        ));
    }
    // The longest wait, unanswered commands included (counted until now).
    let unanswered = chaos
        .pending
        .values()
        .filter(|p| !p.excused && p.generation == chaos.slots[p.host].generation)
        .map(|p| {
            let waited = p.sent.elapsed().as_millis() as u64;
            (waited, format!("{} on host {}, unanswered", p.verb, p.host))
        });
    let longest = chaos
        .waits
        .iter()
        .cloned()
        .chain(unanswered)
        .max()
        .unwrap_or_default();
    let mut failovers = chaos.failovers.clone();
    failovers.sort();
    let mut faults: Vec<_> = chaos.faults.iter().collect();
    faults.sort();
    let faults: Vec<String> = faults.iter().map(|(f, n)| format!("{f:?} {n}")).collect();
    let cuts: u64 = chaos.slots.iter().map(|s| s.proxy.cuts()).sum();
    eprintln!(
        "chaos figures: seed {seed}; {HOSTS} hosts, {seconds} s, {} leads, {} children; faults: \
         {} ({cuts} commits cut); follow-ups sent {} / accepted {accepted_n} / refused \
         {refused_n} / outcome unknown {unknown_n} / unanswered {unanswered_n}; \
         exactly once {once}, missing {missing}, duplicated {duplicated}, refused but delivered \
         {refused_delivered}, accepted but never run {stranded}; zombies {zombies}; longest \
         command wait {} ms ({}); {} waits over {COMMAND_BOUND:?}; failover p50 {} / p90 {} / \
         max {} ({} failovers)",
        chaos.leads.len(),
        sessions.len() - chaos.leads.len(),
        faults.join(", "),
        chaos.sent.len(),
        longest.0,
        longest.1,
        over.len(),
        percentile(&failovers, 50),
        percentile(&failovers, 90),
        percentile(&failovers, 100),
        failovers.len(),
        zombies = chaos.zombies,
    );
    for diagnostic in chaos.diagnostics.iter().take(40) {
        eprintln!("chaos: {diagnostic}");
    }
    assert!(
        chaos.failures.is_empty(),
        "seed {seed} (LINEAGE_CHAOS_SEED={seed} replays it): {} broken promises:\n{}",
        chaos.failures.len(),
        chaos.failures.join("\n")
    );
}
