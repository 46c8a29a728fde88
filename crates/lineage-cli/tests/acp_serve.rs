//! `lineage acp serve` as a real child process, driven by the protocol crate's own client:
//! the handshake, streamed updates, `session/load` after the server was killed, and the drain
//! at end of input.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::{Agent, ByteStreams, Client};
use lineage_log::{EventBody, MessageSource, SessionId, TurnEndReason};
use lineage_store::Store;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// What the client saw of the session's updates, in order, as short words.
type Seen = Arc<Mutex<Vec<String>>>;

fn describe(update: &acp::SessionUpdate) -> String {
    let text = |chunk: &acp::ContentChunk| match &chunk.content {
        acp::ContentBlock::Text(t) => t.text.clone(),
        other => format!("{other:?}"),
    };
    match update {
        acp::SessionUpdate::UserMessageChunk(c) => format!("user: {}", text(c)),
        acp::SessionUpdate::AgentMessageChunk(c) => format!("agent: {}", text(c)),
        acp::SessionUpdate::AgentThoughtChunk(c) => format!("thought: {}", text(c)),
        acp::SessionUpdate::ToolCall(call) => {
            format!("tool_call {} {}", call.tool_call_id.0, call.title)
        }
        acp::SessionUpdate::ToolCallUpdate(update) => format!(
            "tool_call_update {} {:?}",
            update.tool_call_id.0,
            update.fields.status.unwrap_or(acp::ToolCallStatus::Pending)
        ),
        other => format!("{other:?}"),
    }
}

/// Runs `lineage acp serve` on `store` with `script` and `session` against it through the
/// reference client; returns what `session` returned, the updates seen and the server's exit.
async fn with_server<T: Send + 'static>(
    store: &Path,
    script: &Path,
    session: impl AsyncFnOnce(ConnectionTo<Agent>) -> Result<T, agent_client_protocol::Error>
    + Send
    + 'static,
) -> (T, Vec<String>, tokio::process::Child) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lineage"))
        .args(["acp", "serve", "--store"])
        .arg(store)
        .arg("--script")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let seen = Seen::default();
    let out = Client
        .v1()
        .on_receive_notification(
            {
                let seen = seen.clone();
                async move |notification: acp::SessionNotification, _cx| {
                    seen.lock().unwrap().push(describe(&notification.update));
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(
            ByteStreams::new(stdin.compat_write(), stdout.compat()),
            session,
        )
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    (out, seen, child)
}

async fn exit_of(mut child: tokio::process::Child) -> ExitStatus {
    tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the server did not exit at end of input")
        .unwrap()
}

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn script(&self, name: &str, json: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, json).unwrap();
        path
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("served.lineage")
    }

    fn cwd(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

async fn new_session(
    cx: &ConnectionTo<Agent>,
    cwd: PathBuf,
) -> Result<acp::SessionId, agent_client_protocol::Error> {
    cx.send_request(acp::InitializeRequest::new(ProtocolVersion::V1))
        .block_task()
        .await?;
    Ok(cx
        .send_request(acp::NewSessionRequest::new(cwd))
        .block_task()
        .await?
        .session_id)
}

fn prompt(session: &acp::SessionId, text: &str) -> acp::PromptRequest {
    acp::PromptRequest::new(
        session.clone(),
        vec![acp::ContentBlock::Text(acp::TextContent::new(text))],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_client_sees_the_handshake_and_streamed_updates() {
    let dir = Dir::new();
    std::fs::write(dir.dir.path().join("a.txt"), "a").unwrap();
    let script = dir.script(
        "script.json",
        r#"[{"tool_call": {"name": "list_dir", "arguments": {"path": "."}}}, {"text": "listed"},
            {"text": "again"}]"#,
    );
    let cwd = dir.cwd();
    let ((init, stop, unknown, relative), seen, child) =
        with_server(&dir.store(), &script, async move |cx| {
            let init = cx
                .send_request(acp::InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(acp::NewSessionRequest::new(cwd))
                .block_task()
                .await?
                .session_id;
            let stop = cx
                .send_request(prompt(&session, "list the files"))
                .block_task()
                .await?
                .stop_reason;
            // The session takes the next prompt once the first is answered.
            let again = cx
                .send_request(prompt(&session, "once more"))
                .block_task()
                .await?
                .stop_reason;
            assert_eq!(again, acp::StopReason::EndTurn);
            let unknown = cx
                .send_request(prompt(
                    &acp::SessionId::new(SessionId::new().to_string()),
                    "hi",
                ))
                .block_task()
                .await
                .unwrap_err();
            let relative = cx
                .send_request(acp::NewSessionRequest::new("relative/dir"))
                .block_task()
                .await
                .unwrap_err();
            Ok((init, stop, unknown, relative))
        })
        .await;
    assert!(init.agent_capabilities.load_session);
    assert_eq!(init.agent_info.unwrap().name, "lineage");
    assert_eq!(stop, acp::StopReason::EndTurn);
    assert_eq!(
        seen,
        [
            "tool_call call-1 list_dir",
            "tool_call_update call-1 InProgress",
            "tool_call_update call-1 Completed",
            "agent: listed",
            "agent: again",
        ]
    );
    assert_eq!(unknown.code.value(), -32002, "{unknown:?}");
    assert_eq!(relative.code.value(), -32602, "{relative:?}");
    assert!(exit_of(child).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_loads_after_the_server_was_killed_and_its_log_continues() {
    let dir = Dir::new();
    let first = dir.script("first.json", r#"[{"text": "answer one"}]"#);
    let cwd = dir.cwd();
    let (session, _, mut child) = with_server(&dir.store(), &first, async move |cx| {
        let session = new_session(&cx, cwd).await?;
        let stop = cx
            .send_request(prompt(&session, "first"))
            .block_task()
            .await?
            .stop_reason;
        assert_eq!(stop, acp::StopReason::EndTurn);
        Ok(session)
    })
    .await;
    // SIGKILL: no drain, no last flush. The answer promised the turn was durable.
    child.kill().await.unwrap();

    let second = dir.script("second.json", r#"[{"text": "answer two"}]"#);
    let cwd = dir.cwd();
    let loaded = session.clone();
    let (stop, seen, child) = with_server(&dir.store(), &second, async move |cx| {
        cx.send_request(acp::InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await?;
        cx.send_request(acp::LoadSessionRequest::new(loaded.clone(), cwd))
            .block_task()
            .await?;
        Ok(cx
            .send_request(prompt(&loaded, "second"))
            .block_task()
            .await?
            .stop_reason)
    })
    .await;
    assert_eq!(stop, acp::StopReason::EndTurn);
    assert_eq!(
        seen,
        ["user: first", "agent: answer one", "agent: answer two"],
        "the history replayed, then the new answer"
    );
    assert!(exit_of(child).await.success());

    let store = Store::open(dir.store()).unwrap();
    assert!(store.verify().unwrap().is_ok());
    let id: SessionId = session.0.parse().unwrap();
    let log = store.load(id).unwrap();
    assert_eq!(log.closers, 0);
    let prompts: Vec<String> = log
        .events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserMessage(m) if m.source == MessageSource::User => Some(m.text()),
            _ => None,
        })
        .collect();
    assert_eq!(prompts, ["first", "second"]);
    let ends: Vec<&TurnEndReason> = log
        .events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TurnEnd(end) => Some(&end.reason),
            _ => None,
        })
        .collect();
    assert_eq!(ends, [&TurnEndReason::Completed, &TurnEndReason::Completed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_of_input_cancels_the_running_prompt_flushes_and_exits_zero() {
    let dir = Dir::new();
    let script = dir.script("hang.json", r#"[{"hang": true}]"#);
    let cwd = dir.cwd();
    let (session, _, child) = with_server(&dir.store(), &script, async move |cx| {
        let session = new_session(&cx, cwd).await?;
        // Sent, never waited for: the input ends while the turn hangs.
        drop(cx.send_request(prompt(&session, "wait forever")));
        Ok(session)
    })
    .await;
    assert!(exit_of(child).await.success());
    let store = Store::open(dir.store()).unwrap();
    let log = store.load(session.0.parse().unwrap()).unwrap();
    assert_eq!(log.closers, 0, "the drain closed the turn itself");
    assert!(
        log.events.iter().any(|e| matches!(
            &e.body,
            EventBody::TurnEnd(end) if matches!(end.reason, TurnEndReason::Aborted { .. })
        )),
        "the hung turn ended aborted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_stops_its_prompt_and_frees_it_and_a_load_brings_it_back() {
    let dir = Dir::new();
    let script = dir.script("hang.json", r#"[{"hang": true}, {"text": "back again"}]"#);
    let cwd = dir.cwd();
    let ((session, reason, after_close, answer), seen, child) =
        with_server(&dir.store(), &script, async move |cx| {
            let session = new_session(&cx, cwd.clone()).await?;
            let running = cx.send_request(prompt(&session, "wait forever"));
            // A prompt arrives before a close sent after it: the close finds it running.
            cx.send_request(acp::CloseSessionRequest::new(session.clone()))
                .block_task()
                .await?;
            let reason = running.block_task().await?.stop_reason;
            let after_close = cx
                .send_request(prompt(&session, "are you there?"))
                .block_task()
                .await
                .map_err(|e| e.code);
            cx.send_request(acp::LoadSessionRequest::new(session.clone(), cwd))
                .block_task()
                .await?;
            let answer = cx
                .send_request(prompt(&session, "and now?"))
                .block_task()
                .await?
                .stop_reason;
            Ok((session, reason, after_close, answer))
        })
        .await;
    assert_eq!(reason, acp::StopReason::Cancelled);
    assert!(after_close.is_err(), "a closed session takes no prompt");
    assert_eq!(answer, acp::StopReason::EndTurn);
    assert!(seen.iter().any(|s| s == "agent: back again"), "{seen:?}");
    assert!(exit_of(child).await.success());
    let store = Store::open(dir.store()).unwrap();
    assert!(store.verify().unwrap().is_ok());
    let log = store.load(session.0.parse().unwrap()).unwrap();
    assert_eq!(log.closers, 0, "the close ended the hung turn itself");
}

/// The `initialize` answer, frame for frame: a protocol crate upgrade that changes what goes on
/// the wire shows here first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_initialize_answer_on_the_wire() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let dir = Dir::new();
    let script = dir.script("script.json", "[]");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lineage"))
        .args(["acp", "serve", "--store"])
        .arg(dir.store())
        .arg("--script")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n")
        .await
        .unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).await.unwrap();
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    let expected = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 0,
        "result": {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": true,
                "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
                "mcpCapabilities": {"http": false, "sse": false},
                "sessionCapabilities": {"close": {}},
                "auth": {}
            },
            "authMethods": [],
            "agentInfo": {"name": "lineage", "version": env!("CARGO_PKG_VERSION")}
        }
    });
    assert_eq!(answer, expected);
    drop(stdin);
    let mut rest = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut rest)
        .await
        .unwrap();
    assert_eq!(rest, "", "stdout carries frames only");
    assert!(exit_of(child).await.success());
}

/// `lineage acp serve --store STORE --script SCRIPT EXTRA...`, which must fail as a usage
/// error without writing a frame; what it said on stderr.
fn usage_failure(store: &Path, script: &Path, extra: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lineage"))
        .args(["acp", "serve", "--store"])
        .arg(store)
        .arg("--script")
        .arg(script)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{extra:?}");
    assert!(output.stdout.is_empty(), "stdout carries frames only");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn a_bad_command_line_or_script_is_a_usage_error_before_anything_is_served() {
    let dir = Dir::new();
    let store = dir.store();
    let bad = dir.script("bad.json", r#"[{"txt": "a typo"}]"#);
    let said = usage_failure(&store, &bad, &[]);
    assert!(said.contains("bad.json") && said.contains("txt"), "{said}");
    let said = usage_failure(&store, Path::new("missing.json"), &[]);
    assert!(
        said.contains("cannot read the script missing.json"),
        "{said}"
    );
    let script = dir.script("ok.json", "[]");
    let said = usage_failure(&store, &script, &["--model", "a:b"]);
    assert!(said.contains("cannot be used with"), "{said}");
    assert!(!store.exists(), "nothing was written");
}
