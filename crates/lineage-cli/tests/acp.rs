//! Delegation over the Agent Client Protocol, with real child processes: a parent host in this
//! process delegates through `AcpProvider` to `lineage acp serve` (on a scripted model), or to
//! shell commands that misbehave on purpose.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lineage_acp::{AcpProvider, AcpProviderConfig, PermissionPolicy, group_alive};
use lineage_agent::{Agent, AgentOptions, AgentSpec, CreateAgent, Response, ScriptedModel};
use lineage_log::{AbortCause, ContentBlock, EventBody, TurnEndReason};
use lineage_store::{Loaded, Store};
use lineage_subagent::tools::SubagentToolConfig;
use lineage_subagent::{
    ErrorCode, Host, StartRequest, StopReason, SubagentError, SubagentResult, SubagentRun,
};
use tempfile::TempDir;

fn lineage() -> &'static str {
    env!("CARGO_BIN_EXE_lineage")
}

/// A parent host over a store in a temporary directory, which is also its root agent's cwd.
struct Parent {
    dir: TempDir,
    host: Host,
    agent: Arc<Agent>,
}

impl Parent {
    async fn new(script: Vec<Response>, tools: impl FnOnce(&Host) -> AgentSpec) -> Parent {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("parent.lineage")).unwrap();
        let host = Host::new(store, ScriptedModel::new(script)).unwrap();
        let mut create = CreateAgent::fresh(tools(&host));
        create.header.cwd = Some(dir.path().to_str().unwrap().into());
        let agent = host.agents.create(create).await.unwrap();
        Parent { dir, host, agent }
    }

    async fn plain() -> Parent {
        Parent::new(Vec::new(), |_| AgentSpec::default()).await
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `acp serve` on a store of its own in the parent's directory, answering from `script`.
    fn served(&self, script: &str, extra: &[&str]) -> AcpProviderConfig {
        let script_path = self.path("child-script.json");
        std::fs::write(&script_path, script).unwrap();
        let mut args = vec![
            "acp".to_owned(),
            "serve".into(),
            "--store".into(),
            self.child_store().to_str().unwrap().into(),
            "--script".into(),
            script_path.to_str().unwrap().into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        AcpProviderConfig::new("acp", lineage(), args)
    }

    /// A shell command as the agent, with the lineage binary as `$0`.
    fn shell(&self, script: &str) -> AcpProviderConfig {
        let mut config = AcpProviderConfig::new("acp", "sh", ["-c", script, lineage()]);
        config.env.push(("PIDFILE".into(), self.path("pid").into()));
        config.env.push(("STORE".into(), self.child_store().into()));
        config
            .env
            .push(("SCRIPT".into(), self.path("child-script.json").into()));
        config
    }

    fn child_store(&self) -> PathBuf {
        self.path("child.lineage")
    }

    /// Registers `config` and starts a one-shot run of `task` through it.
    async fn start(
        &self,
        config: AcpProviderConfig,
        request: impl FnOnce(StartRequest) -> StartRequest,
    ) -> Result<SubagentRun, SubagentError> {
        self.host
            .subagents
            .register_provider(Arc::new(AcpProvider::new(config)))
            .unwrap();
        let request = request(StartRequest::new(self.agent.clone(), "the task"));
        self.host.subagents.start("acp", request).await
    }

    async fn delegate(&self, config: AcpProviderConfig) -> SubagentResult {
        let run = self.start(config, |r| r).await.unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    }

    /// Every session of the child's store, loaded once the child is gone (so it may open it).
    fn child_sessions(&self) -> Vec<Loaded> {
        let store = Store::open(self.child_store()).unwrap();
        let sessions = store.list().unwrap();
        sessions
            .iter()
            .map(|info| store.load(info.header.id).unwrap())
            .collect()
    }

    /// Whether a session in the child's store has started a turn (read without writing, while
    /// the child may be writing).
    fn child_turn_started(&self) -> bool {
        let Ok(store) = Store::open_read_only(self.child_store()) else {
            return false;
        };
        store.list().unwrap_or_default().iter().any(|info| {
            store.inspect(info.header.id).is_ok_and(|loaded| {
                loaded
                    .events
                    .iter()
                    .any(|e| matches!(e.body, EventBody::TurnStart(_)))
            })
        })
    }

    fn pid(&self) -> i32 {
        let text = std::fs::read_to_string(self.path("pid")).unwrap();
        text.trim().parse().unwrap()
    }

    /// Whether a live process has the parent's directory on its command line.
    fn child_running(&self) -> bool {
        let needle = self.dir.path().to_str().unwrap().as_bytes().to_vec();
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                return false;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            !zombie && cmdline.windows(needle.len()).any(|w| w == needle)
        })
    }
}

fn scripted_options() -> AgentOptions {
    AgentOptions {
        endpoint: Some("scripted".into()),
        model: Some("scripted".into()),
        ..AgentOptions::default()
    }
}

fn turn_ends(loaded: &Loaded) -> Vec<TurnEndReason> {
    loaded
        .events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TurnEnd(end) => Some(end.reason.clone()),
            _ => None,
        })
        .collect()
}

fn tool_results(events: &[lineage_log::Event]) -> Vec<(String, bool)> {
    let mut results = Vec::new();
    for event in events {
        if let EventBody::ToolResult(result) = &event.body {
            for block in &result.message.content {
                if let ContentBlock::ToolResult {
                    content, is_error, ..
                } = block
                {
                    let text = content
                        .iter()
                        .filter_map(|b| match b {
                            ContentBlock::Text { text } => Some(text.to_string()),
                            _ => None,
                        })
                        .collect::<String>();
                    results.push((text, *is_error));
                }
            }
        }
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_returns_the_childs_answer_and_leaves_a_durable_session() {
    let parent = Parent::plain().await;
    let result = parent
        .delegate(parent.served(r#"[{"text": "the child's answer"}]"#, &[]))
        .await;
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(result.text(), "the child's answer");
    assert!(!parent.child_running(), "the child outlived its disposal");
    let sessions = parent.child_sessions();
    assert_eq!(sessions.len(), 1);
    let child = &sessions[0];
    assert_eq!(
        child.header.cwd.as_deref(),
        Some(parent.dir.path().to_str().unwrap()),
        "the child runs in the parent's working directory"
    );
    assert_eq!(turn_ends(child), vec![TurnEndReason::Completed]);
    assert_eq!(child.closers, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stop_reason_maps_to_the_runs() {
    for (script, expected) in [
        (r#"[{"max_tokens": "cut"}]"#, StopReason::MaxTokens),
        (r#"[{"refuse": true}]"#, StopReason::Refusal),
        (
            r#"[{"error": {"code": "SERVER", "message": "the endpoint broke"}}]"#,
            StopReason::Error,
        ),
    ] {
        let parent = Parent::plain().await;
        let result = parent.delegate(parent.served(script, &[])).await;
        assert_eq!(result.stop_reason, expected, "{script}: {result:?}");
        if expected == StopReason::Error {
            let diagnostic = result.diagnostic.unwrap();
            assert!(diagnostic.contains("stage prompt"), "{diagnostic}");
            assert!(diagnostic.contains("the endpoint broke"), "{diagnostic}");
        }
        assert!(!parent.child_running());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_mid_turn_settles_aborted_at_once_and_the_child_goes_at_disposal() {
    let parent = Parent::plain().await;
    let cancel = lineage_agent::Cancellation::new();
    let run = parent
        .start(parent.served(r#"[{"hang": true}]"#, &[]), |r| {
            StartRequest {
                cancel: cancel.clone(),
                ..r
            }
        })
        .await
        .unwrap();
    // Mid-turn: the child's turn has started (it is durable before the model is asked).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !parent.child_turn_started() {
        assert!(
            Instant::now() < deadline,
            "the child never started its turn"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel(AbortCause::Parent);
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    // Settled before any teardown: the child process is still there, serving.
    assert!(parent.child_running());
    run.dispose().await.unwrap();
    assert!(!parent.child_running(), "the child outlived its disposal");
    let sessions = parent.child_sessions();
    assert!(
        matches!(
            turn_ends(&sessions[0]).as_slice(),
            [TurnEndReason::Aborted { .. }]
        ),
        "the hung turn was cancelled: {:?}",
        turn_ends(&sessions[0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ignores_eof_and_sigterm_is_killed_on_schedule_with_its_group() {
    let parent = Parent::plain().await;
    std::fs::write(parent.path("child-script.json"), r#"[{"text": "done"}]"#).unwrap();
    // SIGTERM ignored by the shell and, inherited, by everything it starts; after the server
    // exits at EOF, a sleep holds on; another sleep runs in the background all along.
    let mut config = parent.shell(
        r#"trap '' TERM; echo $$ > "$PIDFILE"; sleep 600 &
           "$0" acp serve --store "$STORE" --script "$SCRIPT"; exec sleep 600"#,
    );
    config.eof_grace = Duration::from_millis(300);
    config.term_grace = Duration::from_millis(300);
    let run = parent.start(config, |r| r).await.unwrap();
    assert_eq!(run.result().await.unwrap().text(), "done");
    let group = parent.pid();
    assert!(group_alive(group));
    let began = Instant::now();
    run.dispose().await.unwrap();
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(600),
        "SIGKILL came before both graces ran out: {took:?}"
    );
    assert!(!group_alive(group), "a process of the group survived");
}

async fn start_failure(parent: &Parent, config: AcpProviderConfig) -> String {
    let error = parent.start(config, |r| r).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::AgentFailure, "{error}");
    assert!(error.message().len() <= lineage_subagent::MAX_DIAGNOSTIC_BYTES);
    error.message().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_exits_before_initialize_fails_at_that_stage_with_its_status() {
    let parent = Parent::plain().await;
    let message = start_failure(
        &parent,
        parent.shell("echo 'no model configured' >&2; exit 3"),
    )
    .await;
    assert!(message.contains("stage initialize"), "{message}");
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("no model configured"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_fails_the_start_and_leaves_no_process() {
    let parent = Parent::plain().await;
    let message = start_failure(
        &parent,
        parent.shell(r#"echo $$ > "$PIDFILE"; echo 'Starting agent...'; exec sleep 600"#),
    )
    .await;
    assert!(message.contains("stage initialize"), "{message}");
    assert!(message.contains("Starting agent..."), "{message}");
    assert!(!group_alive(parent.pid()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_binary_fails_at_spawn() {
    let parent = Parent::plain().await;
    let config = AcpProviderConfig::new("acp", "/nonexistent/acp-agent", ["serve"]);
    let message = start_failure(&parent, config).await;
    assert!(message.contains("stage spawn"), "{message}");
    assert!(message.contains("/nonexistent/acp-agent"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_time_option_is_refused_before_a_process_starts() {
    let parent = Parent::plain().await;
    let config = parent.shell(r#"echo $$ > "$PIDFILE""#);
    let error = parent
        .start(config, |r| StartRequest {
            persona: Some("a reviewer".into()),
            ..r
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability, "{error}");
    assert!(!parent.path("pid").exists(), "a process was started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_requests_are_answered_by_the_policy() {
    for (policy, allowed) in [
        (PermissionPolicy::AllowOnce, true),
        (PermissionPolicy::Reject, false),
    ] {
        let parent = Parent::plain().await;
        std::fs::write(parent.path("note.txt"), "the note's words").unwrap();
        let script = r#"[{"tool_call": {"name": "read_file", "arguments": {"path": "note.txt"}}},
                         {"text": "read"}]"#;
        let mut config = parent.served(script, &["--ask", "read_file"]);
        config.permission = policy;
        let result = parent.delegate(config).await;
        assert_eq!(result.stop_reason, StopReason::Completed);
        let results = tool_results(&parent.child_sessions()[0].events);
        assert_eq!(results.len(), 1, "{policy:?}");
        let (text, is_error) = &results[0];
        if allowed {
            assert!(!is_error && text.contains("the note's words"), "{text}");
        } else {
            assert!(*is_error && text.contains("did not allow"), "{text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_child_delegates_to_its_own_spawn_child() {
    let parent = Parent::plain().await;
    let script = r#"[
        {"tool_call": {"name": "subagent", "arguments":
            {"description": "inner", "prompt": "the inner task", "run_in_background": false}}},
        {"text": "the inner answer"},
        {"text": "outer, having heard: the inner answer"}
    ]"#;
    let result = parent.delegate(parent.served(script, &[])).await;
    assert_eq!(result.text(), "outer, having heard: the inner answer");
    let sessions = parent.child_sessions();
    assert_eq!(sessions.len(), 2, "the ACP child and its own child");
    let (outer, inner): (Vec<&Loaded>, Vec<&Loaded>) =
        sessions.iter().partition(|s| s.header.parent.is_none());
    assert_eq!(inner[0].header.parent, Some(outer[0].header.id));
    let results = tool_results(&outer[0].events);
    assert_eq!(results[0].0, "the inner answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_model_delegates_through_the_subagent_acp_row() {
    let dir = tempfile::tempdir().unwrap();
    let script_path = dir.path().join("child-script.json");
    std::fs::write(&script_path, r#"[{"text": "42, from the ACP agent"}]"#).unwrap();
    let provider = AcpProvider::new(AcpProviderConfig::new(
        "acp",
        lineage(),
        [
            "acp",
            "serve",
            "--store",
            dir.path().join("child.lineage").to_str().unwrap(),
            "--script",
            script_path.to_str().unwrap(),
        ],
    ));
    let row = provider.tool_row("subagent_acp");
    assert_eq!(
        row.max_depth,
        lineage_subagent::tools::MaxDepth::ProviderManaged
    );
    let parent_script = vec![
        Response::tool_call(
            "c1",
            "subagent_acp",
            r#"{"description": "ask", "prompt": "what is the answer?"}"#,
        ),
        Response::text("the agent says 42"),
    ];
    let store = Store::open(dir.path().join("parent.lineage")).unwrap();
    let host = Host::new(store, ScriptedModel::new(parent_script)).unwrap();
    host.subagents
        .register_provider(Arc::new(provider))
        .unwrap();
    let mut rows = SubagentToolConfig::in_process_rows();
    rows.push(row);
    let tools = host.delegation_tools(rows);
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(
        names[..3],
        ["subagent", "subagent_fork", "subagent_acp"],
        "one tool per row"
    );
    assert!(tools[2].description().contains("Agent Client Protocol"));
    let mut create = CreateAgent::fresh(AgentSpec {
        tools,
        options: scripted_options(),
        ..AgentSpec::default()
    });
    create.header.cwd = Some(dir.path().to_str().unwrap().into());
    let root = host.agents.create(create).await.unwrap();
    let outcome = host.run(&root, "ask the ACP agent").await.unwrap();
    assert!(outcome.completed(), "{outcome:?}");
    assert_eq!(
        root.with_events(tool_results),
        vec![("42, from the ACP agent".to_owned(), false)]
    );
    drop(root);
    host.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_never_answers_initialize_is_given_up_on_and_killed() {
    let parent = Parent::plain().await;
    let mut config = parent.shell(r#"echo $$ > "$PIDFILE"; exec sleep 600"#);
    config.handshake_timeout = Duration::from_millis(300);
    let message = start_failure(&parent, config).await;
    assert!(message.contains("stage initialize"), "{message}");
    assert!(message.contains("no answer within"), "{message}");
    assert!(!group_alive(parent.pid()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_sees_only_the_allow_listed_environment_and_what_is_set_for_it() {
    let parent = Parent::plain().await;
    // Set by cargo for this test process: a variable the child must not inherit.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let mut config = parent.shell(r#"env > "$PIDFILE.env"; exit 1"#);
    config
        .env
        .push(("LINEAGE_API_KEY".into(), "set-for-the-child".into()));
    start_failure(&parent, config).await;
    let env = std::fs::read_to_string(parent.path("pid.env")).unwrap();
    let names: Vec<&str> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&"PATH"), "{names:?}");
    assert!(env.contains("LINEAGE_API_KEY=set-for-the-child"), "{env}");
    assert!(!names.contains(&"CARGO_MANIFEST_DIR"), "{names:?}");
    for name in &names {
        let allowed = lineage_acp::DEFAULT_PASSTHROUGH.contains(name)
            || ["PIDFILE", "STORE", "SCRIPT", "LINEAGE_API_KEY"].contains(name)
            // What the shell itself sets.
            || ["PWD", "SHLVL", "_", "OLDPWD"].contains(name);
        assert!(allowed, "{name} reached the child");
    }
}
