//! `lineage chat` as a process: the real binary against a loopback model server on 127.0.0.1
//! speaking Chat Completions, its store read back afterwards.
//!
//! The server answers requests in the order they arrive. When a continuable child starts (or
//! is resumed), the root's next step and the child's first step ask the model at the same time,
//! in either order; those two replies are therefore the same answer, so the story is the same
//! whichever arrives first, and every check below holds for both orders.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use lineage_log::{Event, EventBody, MessageSource, SessionId, TurnEndReason};
use lineage_store::Store;
use lineage_testkit::loopback::{LoopbackServer, Recorded, Reply, chat};
use lineage_testkit::read::{assert_balanced, assistant_texts, turn_ends, user_texts};
use serde_json::Value;

/// The fake key the tests hand the endpoint.
const KEY: &str = "sk-loopback-test-key-7f3a9c";

/// A working directory with a store path in it.
struct Place {
    dir: tempfile::TempDir,
}

impl Place {
    fn new() -> Place {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("work")).expect("work dir");
        Place { dir }
    }

    /// The directory `lineage chat` runs in.
    fn cwd(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("chat.lineage")
    }
}

/// Runs `lineage chat --store <store> <args>` in `place`'s working directory against `server`,
/// with `stdin` piped in (or none), and waits for it.
async fn lineage_chat(
    server: &LoopbackServer,
    place: &Place,
    args: &[&str],
    stdin: Option<&str>,
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lineage"));
    command
        .arg("chat")
        .arg("--store")
        .arg(place.store())
        .args(args)
        .current_dir(place.cwd())
        // Nothing from the test's own environment (a proxy, a real key) reaches the process.
        .env_clear()
        .env("LINEAGE_MODEL", "local:test-model")
        .env("LINEAGE_BASE_URL", format!("{}/v1", server.base_url()))
        .env("LINEAGE_WIRE", "chat")
        .env("LINEAGE_API_KEY", KEY)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = stdin.map(str::to_owned);
    // The server runs on this test's runtime: the process is waited for off it.
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("lineage runs");
        if let Some(input) = input {
            let mut pipe = child.stdin.take().expect("stdin piped");
            pipe.write_all(input.as_bytes()).expect("prompt written");
        }
        child.wait_with_output().expect("lineage ends")
    })
    .await
    .expect("the waiting task")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_ok(output: &Output) {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        stdout(output),
        stderr(output)
    );
}

/// The session id the chat printed first (`session: <id>`) on `text`.
fn printed_session(text: &str) -> SessionId {
    text.lines()
        .find_map(|l| l.strip_prefix("session: "))
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("no session line in:\n{text}"))
}

/// Every stored session of the store at `path`: (id, parent, events), in creation order.
fn sessions(path: &Path) -> Vec<(SessionId, Option<SessionId>, Vec<Event>)> {
    let store = Store::open_read_only(path).expect("the store opens");
    store
        .list()
        .expect("listed")
        .into_iter()
        .map(|info| {
            let events: Vec<Event> = store
                .scan(info.header.id, 0)
                .expect("scanned")
                .collect::<Result<_, _>>()
                .expect("read");
            assert_eq!(
                events.len() as u64,
                info.len,
                "no crash-repair closers: closed cleanly"
            );
            assert_balanced(&events);
            (info.header.id, info.header.parent, events)
        })
        .collect()
}

fn events_of(path: &Path, id: SessionId) -> Vec<Event> {
    sessions(path)
        .into_iter()
        .find(|s| s.0 == id)
        .map(|s| s.2)
        .unwrap_or_else(|| panic!("session {id} is stored"))
}

/// The request whose body mentions `needle`.
fn request_with<'a>(requests: &'a [Recorded], needle: &str) -> &'a Recorded {
    requests
        .iter()
        .find(|r| String::from_utf8_lossy(&r.body).contains(needle))
        .unwrap_or_else(|| panic!("no request mentions {needle:?}"))
}

/// The settlement notices in `events`' history, by sender.
fn notices_from(events: &[Event]) -> Vec<SessionId> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserMessage(m) => match m.source {
                MessageSource::SubagentSettled { sender, .. } => Some(sender),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_streams_its_answer_is_stored_and_exits_zero() {
    let server = LoopbackServer::start([chat::Script::new()
        .text("Hello")
        .text(", plover.")
        .stop()
        .reply()])
    .await
    .expect("server");
    let place = Place::new();

    let output = lineage_chat(&server, &place, &["Say hello"], None).await;

    assert_ok(&output);
    let out = stdout(&output);
    assert!(out.contains("Hello, plover."), "{out}");
    let root = printed_session(&out);
    let stored = sessions(&place.store());
    assert_eq!(stored.len(), 1, "one root session");
    let events = &stored[0].2;
    assert_eq!(stored[0].0, root);
    assert_eq!(user_texts(events), ["Say hello"]);
    assert_eq!(assistant_texts(events), ["Hello, plover."]);
    assert_eq!(turn_ends(events), [TurnEndReason::Completed]);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = requests[0].json().expect("a JSON request");
    assert_eq!(body["model"], "test-model");
    assert!(body.to_string().contains("Say hello"), "{body}");
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools offered")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    for tool in [
        "subagent",
        "subagent_fork",
        "send_message",
        "interrupt_agent",
        "list_agents",
        "read_file",
        "list_dir",
    ] {
        assert!(tools.contains(&tool), "{tool} in {tools:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_stdin_is_one_prompt() {
    let server = LoopbackServer::start([chat::text("Read you.")])
        .await
        .expect("server");
    let place = Place::new();

    let output = lineage_chat(&server, &place, &[], Some("line one\nline two\n")).await;

    assert_ok(&output);
    assert!(stdout(&output).contains("Read you."));
    let stored = sessions(&place.store());
    assert_eq!(user_texts(&stored[0].2), ["line one\nline two\n"]);
}

/// The first process of the delegation story: the root starts a continuable child, both
/// answer "All set.", the child's notice reaches the root, which answers "Noted.".
async fn delegate(place: &Place) -> (SessionId, SessionId) {
    let server = LoopbackServer::start([
        chat::tool_call(
            "call_1",
            "subagent",
            r#"{"description":"count files","prompt":"Count the files in the project.","run_in_background":true}"#,
        ),
        chat::text("All set."),
        chat::text("All set."),
        chat::text("Noted."),
    ])
    .await
    .expect("server");

    let output = lineage_chat(&server, place, &["Delegate the count"], None).await;

    assert_ok(&output);
    let out = stdout(&output);
    assert!(out.contains("tool: subagent"), "{out}");
    assert!(out.contains("notice in: "), "{out}");
    assert!(out.contains("Noted."), "{out}");
    assert_eq!(server.remaining(), 0, "every scripted reply was asked for");
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    // The child was asked its task.
    request_with(&requests, "Count the files in the project.");

    let root = printed_session(&out);
    let stored = sessions(&place.store());
    assert_eq!(stored.len(), 2, "the root and its child");
    let (child, parent, child_events) = stored
        .iter()
        .find(|s| s.0 != root)
        .cloned()
        .expect("a child");
    assert_eq!(parent, Some(root));
    assert_eq!(
        user_texts(&child_events),
        ["Count the files in the project."]
    );
    assert_eq!(assistant_texts(&child_events), ["All set."]);
    assert_eq!(turn_ends(&child_events), [TurnEndReason::Completed]);
    let root_events = events_of(&place.store(), root);
    assert_eq!(notices_from(&root_events), [child]);
    assert_eq!(
        assistant_texts(&root_events).last().map(String::as_str),
        Some("Noted.")
    );
    assert!(
        turn_ends(&root_events)
            .iter()
            .all(|r| *r == TurnEndReason::Completed)
    );
    (root, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuable_child_answers_and_the_root_hears_its_notice() {
    delegate(&Place::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_a_follow_up_cold_resumes_the_child_from_its_log() {
    let place = Place::new();
    let (root, child) = delegate(&place).await;
    let child_before = events_of(&place.store(), child);
    let root_before = events_of(&place.store(), root);

    // A new process resumes the root; its message to the child finds it not resident.
    let server = LoopbackServer::start([
        chat::tool_call(
            "call_2",
            "send_message",
            &format!(r#"{{"subagent_id":"{child}","message":"Count them again."}}"#),
        ),
        chat::text("Counted again."),
        chat::text("Counted again."),
        chat::text("Noted again."),
    ])
    .await
    .expect("server");
    let root_arg = root.to_string();
    let output = lineage_chat(
        &server,
        &place,
        &["--resume", &root_arg[..13], "Ask the child again"],
        None,
    )
    .await;

    assert_ok(&output);
    assert_eq!(
        printed_session(&stdout(&output)),
        root,
        "the same root, by a prefix"
    );
    assert_eq!(server.remaining(), 0);
    let stored = sessions(&place.store());
    assert_eq!(
        stored.len(),
        2,
        "no new session: the child itself was resumed"
    );
    let child_after = events_of(&place.store(), child);
    assert_eq!(
        &child_after[..child_before.len()],
        child_before.as_slice(),
        "the child's log continues where it ended"
    );
    assert_eq!(
        user_texts(&child_after),
        ["Count the files in the project.", "Count them again."]
    );
    assert_eq!(
        assistant_texts(&child_after),
        ["All set.", "Counted again."]
    );
    assert_eq!(
        turn_ends(&child_after),
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    // The child's request (the one with the follow-up as a user message) carried its first
    // conversation, read back from its log.
    let requests = server.requests();
    let resumed = requests
        .iter()
        .filter_map(Recorded::json)
        .find(|body| {
            body["messages"].as_array().is_some_and(|messages| {
                messages.iter().any(|m| {
                    m["role"] == "user" && m["content"].to_string().contains("Count them again.")
                })
            })
        })
        .expect("the child was asked");
    let resumed = resumed.to_string();
    assert!(
        resumed.contains("Count the files in the project."),
        "{resumed}"
    );
    assert!(resumed.contains("All set."), "{resumed}");
    let root_after = events_of(&place.store(), root);
    assert_eq!(&root_after[..root_before.len()], root_before.as_slice());
    assert_eq!(notices_from(&root_after), [child, child]);
    assert_eq!(
        assistant_texts(&root_after).last().map(String::as_str),
        Some("Noted again.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_refuses_a_parent_path_and_reads_a_file_in_the_working_directory() {
    let place = Place::new();
    std::fs::write(place.cwd().join("notes.txt"), "the word is plover").expect("file");
    std::fs::write(place.dir.path().join("outside.txt"), "forbidden fruit").expect("file");
    let server = LoopbackServer::start([
        chat::Script::new()
            .parallel_tool_calls(&[
                ("call_out", "read_file", &[r#"{"path":"../outside.txt"}"#]),
                ("call_in", "read_file", &[r#"{"path":"notes.txt"}"#]),
                ("call_ls", "list_dir", &[r#"{}"#]),
            ])
            .tool_stop()
            .reply(),
        chat::text("Read it."),
    ])
    .await
    .expect("server");

    let output = lineage_chat(&server, &place, &["Read the notes"], None).await;

    assert_ok(&output);
    let out = stdout(&output);
    assert!(out.contains("tool: read_file"), "{out}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let answered = requests[1].json().expect("JSON");
    let results: Vec<(String, String)> = answered["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                m["content"].to_string(),
            )
        })
        .collect();
    let result = |call: &str| {
        results
            .iter()
            .find(|r| r.0 == call)
            .map(|r| r.1.clone())
            .unwrap_or_else(|| panic!("no result for {call} in {results:?}"))
    };
    assert!(
        result("call_out").contains("outside the working directory"),
        "{results:?}"
    );
    assert!(
        result("call_in").contains("the word is plover"),
        "{results:?}"
    );
    assert!(result("call_ls").contains("notes.txt"), "{results:?}");
    assert!(
        !String::from_utf8_lossy(&requests[1].body).contains("forbidden fruit"),
        "nothing outside the working directory was read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_mode_prints_one_event_per_line_and_the_session_on_stderr() {
    let server = LoopbackServer::start([chat::Script::new().text("Hi").stop().reply()])
        .await
        .expect("server");
    let place = Place::new();

    let output = lineage_chat(&server, &place, &["--json", "Hi?"], None).await;

    assert_ok(&output);
    let root = printed_session(&stderr(&output));
    let lines: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    let types: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["body"]["type"].as_str())
        .collect();
    assert_eq!(types.first(), Some(&"inbox/spliced"), "{types:?}");
    for kind in [
        "turn/start",
        "assistant/chunk",
        "assistant/message",
        "turn/end",
    ] {
        assert!(types.contains(&kind), "{kind} in {types:?}");
    }
    // The lines are the stored events, seq by seq, in the log's own serde form.
    let stored = events_of(&place.store(), root);
    let last = lines.last().expect("lines");
    let seq = last["seq"].as_u64().expect("seq");
    assert_eq!(
        *last,
        serde_json::to_value(&stored[usize::try_from(seq).expect("seq")]).expect("serde form")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_exits_nonzero_with_auth_and_the_key_is_never_shown_or_stored() {
    let server = LoopbackServer::start([Reply::status(
        401,
        chat::error_body("invalid_request_error", "Incorrect API key provided."),
    )])
    .await
    .expect("server");
    let place = Place::new();

    let output = lineage_chat(&server, &place, &["Hello?"], None).await;

    assert!(!output.status.success(), "{output:?}");
    let (out, err) = (stdout(&output), stderr(&output));
    assert!(err.contains("AUTH"), "{err}");
    assert!(err.contains("Incorrect API key provided."), "{err}");
    assert!(out.contains("turn ended: error AUTH"), "{out}");
    assert_eq!(
        server.requests().len(),
        1,
        "an authentication failure is not retried"
    );
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str()),
        "the key was sent"
    );
    for (what, text) in [("stdout", &out), ("stderr", &err)] {
        assert!(!text.contains(KEY), "the key shows on {what}");
    }
    let bytes = std::fs::read(place.store()).expect("the store file");
    assert!(
        !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
        "the key is in the store file"
    );
    let root = printed_session(&out);
    let ends = turn_ends(&events_of(&place.store(), root));
    assert!(
        matches!(ends.as_slice(), [TurnEndReason::Error(e)] if e.code.as_str() == "AUTH"),
        "{ends:?}"
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_cancels_the_running_turn_and_the_chat_exits_with_the_store_flushed() {
    use std::io::{BufRead, BufReader, Read};

    // The answer starts, then stalls until the client goes away.
    let partial = chat::Script::new().text("Thinking").body();
    let server = LoopbackServer::start([Reply::Stall { body: partial }])
        .await
        .expect("server");
    let place = Place::new();
    let mut command = Command::new(env!("CARGO_BIN_EXE_lineage"));
    command
        .args(["chat", "--store"])
        .arg(place.store())
        .arg("Think hard")
        .current_dir(place.cwd())
        .env_clear()
        .env("LINEAGE_MODEL", "local:test-model")
        .env("LINEAGE_BASE_URL", format!("{}/v1", server.base_url()))
        .env("LINEAGE_WIRE", "chat")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (code, out) = tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("lineage runs");
        let mut reader = BufReader::new(child.stdout.take().expect("stdout piped"));
        // The streamed text is printed (and flushed) as it arrives: the turn is running.
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("Thinking") {
            let buf = reader.fill_buf().expect("stdout read");
            assert!(
                !buf.is_empty(),
                "lineage ended early: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(buf);
            let n = buf.len();
            reader.consume(n);
        }
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        // SAFETY: `kill` with a valid signal number on our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        reader.read_to_end(&mut seen).expect("stdout read");
        let status = child.wait().expect("lineage ends");
        (status.code(), String::from_utf8_lossy(&seen).into_owned())
    })
    .await
    .expect("the waiting task");

    assert_eq!(code, Some(130), "{out}");
    assert!(out.contains("interrupted: cancelling the turn"), "{out}");
    assert!(out.contains("turn ended: aborted(user)"), "{out}");
    let root = printed_session(&out);
    assert_eq!(
        turn_ends(&events_of(&place.store(), root)),
        [TurnEndReason::Aborted {
            cause: lineage_log::AbortCause::User
        }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_or_with_an_unknown_session_it_is_a_usage_error() {
    let server = LoopbackServer::start([]).await.expect("server");
    let place = Place::new();
    let mut command = Command::new(env!("CARGO_BIN_EXE_lineage"));
    command
        .args(["chat", "--store"])
        .arg(place.store())
        .arg("Hello?")
        .current_dir(place.cwd())
        .env_clear()
        .stdin(Stdio::null());
    let output = tokio::task::spawn_blocking(move || command.output().expect("lineage runs"))
        .await
        .expect("the waiting task");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        stderr(&output).contains("LINEAGE_MODEL"),
        "{}",
        stderr(&output)
    );
    assert!(
        !place.store().exists(),
        "nothing is created before the model is configured"
    );

    let output = lineage_chat(&server, &place, &["--resume", "0123abcd", "Hello?"], None).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        stderr(&output).contains("no session in"),
        "{}",
        stderr(&output)
    );
    assert!(server.requests().is_empty(), "no model was asked");
}
