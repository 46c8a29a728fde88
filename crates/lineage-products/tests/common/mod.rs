//! The parent side of a product test: a host whose root agent works in a temporary directory,
//! the product's configuration pointed at a loopback model server, and the checks that no
//! process of a run outlives it.

#![allow(dead_code)] // each test file uses its own part

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lineage_agent::{Agent, AgentSpec, Cancellation, CreateAgent, ScriptedModel};
use lineage_log::{AbortCause, ContentBlock};
use lineage_products::{
    ClaudeCodeConfig, ClaudeCodeProvider, CodexConfig, CodexProvider, ProcessConfig,
};
use lineage_store::Store;
use lineage_subagent::{
    ErrorCode, Host, Provider, StartRequest, StopReason, SubagentError, SubagentResult, SubagentRun,
};
use lineage_testkit::loopback::{LoopbackServer, Recorded, Reply};
use lineage_testkit::products::{processes_with_env, products};
use tempfile::TempDir;

/// The variable every process of a test's runs carries, so a survivor can be found wherever it
/// moved.
const MARK: &str = "LINEAGE_PRODUCT_TEST";

/// A parent host, its root agent (working in [`Parent::work`]) and the product's home folders.
pub struct Parent {
    dir: TempDir,
    pub host: Host,
    pub agent: Arc<Agent>,
}

impl Parent {
    pub async fn new() -> Parent {
        Parent::with_model(ScriptedModel::new(Vec::new())).await
    }

    /// A parent whose agents ask `model`.
    pub async fn with_model(model: Arc<ScriptedModel>) -> Parent {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["work", "home", "tmp", "codex-home", "claude-config"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let store = Store::open(dir.path().join("parent.lineage")).unwrap();
        let host = Host::new(store, model).unwrap();
        let agent = Parent::create(&host, dir.path(), AgentSpec::default()).await;
        Parent { dir, host, agent }
    }

    /// Another root agent of the host, working in [`Parent::work`] too.
    pub async fn agent_with(&self, spec: AgentSpec) -> Arc<Agent> {
        Parent::create(&self.host, self.dir.path(), spec).await
    }

    async fn create(host: &Host, dir: &Path, spec: AgentSpec) -> Arc<Agent> {
        let mut create = CreateAgent::fresh(spec);
        create.header.cwd = Some(dir.join("work").to_str().unwrap().into());
        host.agents.create(create).await.unwrap()
    }

    /// The delegating agent's working directory, where the products run.
    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// This test's mark: the temporary directory's path, unique while it lives.
    fn mark(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// The process settings every product gets: home and temporary folders of this test, the
    /// mark, short teardown graces.
    fn process(&self, program: &Path) -> ProcessConfig {
        let mut process = ProcessConfig::new(program);
        let env = [
            ("HOME", self.path("home")),
            ("TMPDIR", self.path("tmp")),
            (MARK, self.dir.path().to_path_buf()),
        ];
        process.env = env
            .into_iter()
            .map(|(name, value)| (OsString::from(name), value.into_os_string()))
            .collect();
        process.eof_grace = Duration::from_secs(3);
        process.term_grace = Duration::from_secs(2);
        process
    }

    /// Codex as this test runs it (see [`CodexConfig::config`]).
    pub fn codex(&self, server: &LoopbackServer) -> CodexConfig {
        CodexConfig::config(self, server)
    }

    /// Claude Code as this test runs it (see [`ClaudeCodeConfig::config`]).
    pub fn claude(&self, server: &LoopbackServer) -> ClaudeCodeConfig {
        ClaudeCodeConfig::config(self, server)
    }

    /// Registers `provider` (the first one of its name stays registered) and starts a one-shot
    /// run of `task` through it.
    pub async fn start(
        &self,
        provider: Arc<dyn Provider>,
        task: &str,
        request: impl FnOnce(StartRequest) -> StartRequest,
    ) -> Result<SubagentRun, SubagentError> {
        let name = provider.name().to_owned();
        let _ = self.host.subagents.register_provider(provider);
        let request = request(StartRequest::new(self.agent.clone(), task));
        self.host.subagents.start(&name, request).await
    }

    /// Runs `task` through `provider` to its end, disposes of the run and checks that no process
    /// of it is left.
    pub async fn delegate(&self, provider: Arc<dyn Provider>, task: &str) -> SubagentResult {
        let run = self.start(provider, task, |r| r).await.unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        assert_eq!(
            self.survivors(),
            Vec::<u32>::new(),
            "a process outlived its run"
        );
        result
    }

    /// Starts a run of "A task." through `provider` that fails before it runs, checks that no
    /// process of it is left and returns its error.
    pub async fn failed_start(&self, provider: Arc<dyn Provider>) -> SubagentError {
        let error = self.start(provider, "A task.", |r| r).await.unwrap_err();
        assert_eq!(self.survivors(), Vec::<u32>::new(), "{error}");
        error
    }

    /// The delegating agent's working directory with the file `name` holding `text`; returns its
    /// path.
    pub fn work_file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.work().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The live processes any run of this test started.
    pub fn survivors(&self) -> Vec<u32> {
        processes_with_env(MARK, &self.mark())
    }
}

/// A product's configuration for a test and the provider it makes: what the scenarios every
/// product goes through need of it.
pub trait Product: Sized {
    /// The provider delegating to the product so configured.
    fn provider(self) -> Arc<dyn Provider>;

    /// The product as `parent`'s test runs it: in its working directory and home folders, its
    /// model `server`.
    fn config(parent: &Parent, server: &LoopbackServer) -> Self;
}

impl Product for CodexConfig {
    fn provider(self) -> Arc<dyn Provider> {
        Arc::new(CodexProvider::new(self))
    }

    /// Codex, its model provider the Responses endpoint of `server`.
    fn config(parent: &Parent, server: &LoopbackServer) -> Self {
        let home = parent.path("codex-home");
        let config = format!(
            r#"model = "loopback-model"
model_provider = "loopback"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.loopback]
name = "loopback"
base_url = "{}/v1"
wire_api = "responses"
requires_openai_auth = false
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
remote_plugin = false
apps = false
plugin_sharing = false
unbounded_connection_retries = false
"#,
            server.base_url()
        );
        std::fs::write(home.join("config.toml"), config).unwrap();
        let mut codex = CodexConfig::new("codex", &products().codex);
        codex.process = parent.process(&products().codex);
        codex.process.env.push(("CODEX_HOME".into(), home.into()));
        codex
    }
}

impl Product for ClaudeCodeConfig {
    fn provider(self) -> Arc<dyn Provider> {
        Arc::new(ClaudeCodeProvider::new(self))
    }

    /// Claude Code, its endpoint `server`'s Messages API, its key a placeholder.
    fn config(parent: &Parent, server: &LoopbackServer) -> Self {
        let mut claude = ClaudeCodeConfig::new("claude", &products().claude);
        claude.process = parent.process(&products().claude);
        claude.model = Some("loopback-model".into());
        let env: [(&str, OsString); 10] = [
            ("ANTHROPIC_BASE_URL", server.base_url().into()),
            ("ANTHROPIC_API_KEY", "placeholder".into()),
            ("CLAUDE_CONFIG_DIR", parent.path("claude-config").into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            ("DISABLE_ERROR_REPORTING", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("CLAUDE_CODE_MAX_RETRIES", "0".into()),
            // One request per model call: no second, non-streaming try after a broken stream.
            ("CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK", "1".into()),
            ("CLAUDE_CODE_TMPDIR", parent.path("tmp").into()),
        ];
        claude
            .process
            .env
            .extend(env.into_iter().map(|(name, value)| (name.into(), value)));
        claude
    }
}

/// Checks that product `P`, its model answering with `reply` (the text "Paris is the
/// capital."), completes the task "Name the capital of France." with that answer, asking the
/// model once; returns that request.
pub async fn answered_task<P: Product>(reply: Reply) -> Recorded {
    let server = serve([reply]).await;
    let parent = Parent::new().await;
    let task = "Name the capital of France.";
    let provider = P::config(&parent, &server).provider();
    let result = parent.delegate(provider, task).await;
    assert_answered(&result, "Paris is the capital.");
    only_request(&server, task)
}

/// Checks that product `P`, configured by `unattended` to ask before it runs a command, given a
/// model that asks for `command` (its arguments making `file` in the working directory) and then
/// answers, completes `task` without running it, the model told `refusal` after the call.
pub async fn refused_command<P: Product>(
    [command, answer]: [Reply; 2],
    file: &str,
    task: &str,
    refusal: &str,
    unattended: impl FnOnce(P) -> P,
) {
    let server = serve([command, answer]).await;
    let parent = Parent::new().await;
    let config = unattended(P::config(&parent, &server));
    let result = parent.delegate(config.provider(), task).await;
    assert_completed(&result);
    assert!(!parent.work().join(file).exists(), "a refused command ran");
    assert_told_after_the_call(&server, &[refusal]);
}

/// Checks that a start through product `P` using a start-time option it does not support
/// (`option` sets it) is refused as `UNSUPPORTED_CAPABILITY` before a process starts or the
/// model is asked anything.
pub async fn refuses_option<P: Product>(option: impl FnOnce(StartRequest) -> StartRequest) {
    let server = serve([]).await;
    let parent = Parent::new().await;
    let provider = P::config(&parent, &server).provider();
    let error = parent.start(provider, "A task.", option).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability, "{error}");
    assert_eq!(parent.survivors(), Vec::<u32>::new());
    assert!(server.requests().is_empty());
}

/// `process` made a shell running `script` in place of the product.
pub fn run_shell(process: &mut ProcessConfig, script: &str) {
    process.program = "/bin/sh".into();
    process.args = vec!["-c".into(), script.into()];
}

/// Checks that product `P`, its process made by `shell` a shell that fails (see [`run_shell`]),
/// fails to start as `AGENT_FAILURE` at the stage `initialize` of the provider `described` (how
/// its messages name it), the message holding each of `told`, and leaves no process.
pub async fn shell_start_failure<P: Product>(
    shell: impl FnOnce(&mut P),
    described: &str,
    told: &[&str],
) {
    let server = serve([]).await;
    let parent = Parent::new().await;
    let mut config = P::config(&parent, &server);
    shell(&mut config);
    let error = parent.failed_start(config.provider()).await;
    assert_eq!(error.code(), ErrorCode::AgentFailure);
    let message = error.message();
    let stage = format!("{described} failed at stage initialize");
    assert!(message.starts_with(&stage), "{message}");
    for told in told {
        assert!(message.contains(told), "{message}");
    }
}

/// Checks, against a model server whose one reply holds its request open after `stalled_body`,
/// that a run through product `P`, cancelled once the request arrived, settles `aborted`, drops
/// the request and, once disposed of, leaves no process.
pub async fn cancel_mid_turn<P: Product>(stalled_body: Vec<u8>) {
    let server = serve([Reply::Stall { body: stalled_body }]).await;
    let parent = Parent::new().await;
    let cancel = Cancellation::new();
    let provider = P::config(&parent, &server).provider();
    let run = parent
        .start(provider, "Take your time.", |r| StartRequest {
            cancel: cancel.clone(),
            ..r
        })
        .await
        .unwrap();
    requests_reach(&server, 1).await;
    cancel.cancel(AbortCause::Parent);
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    server.stalls_released(1).await;
    assert_eq!(parent.survivors(), Vec::<u32>::new());
}

/// Checks that `server` got one request, holding `task`, and returns it.
pub fn only_request(server: &LoopbackServer, task: &str) -> Recorded {
    let mut requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(body_has(&requests[0], task), "the task reached the model");
    requests.remove(0)
}

/// Checks that `server` got two requests, the second (the one after the product's tool call)
/// holding every one of `needles`.
pub fn assert_told_after_the_call(server: &LoopbackServer, needles: &[&str]) {
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    for needle in needles {
        assert!(
            body_has(&requests[1], needle),
            "the model heard {needle:?} after the call"
        );
    }
}

/// Checks that `result` stopped for `reason` and returns its diagnostic.
pub fn diagnostic(result: SubagentResult, reason: StopReason) -> String {
    assert_eq!(result.stop_reason, reason, "{:?}", result.diagnostic);
    result.diagnostic.expect("a diagnostic")
}

/// Waits until `server` has received `count` requests (a product works at its own pace; this
/// bounds the wait, it does not time anything).
pub async fn requests_reach(server: &LoopbackServer, count: usize) -> Vec<Recorded> {
    for _ in 0..3000 {
        let requests = server.requests();
        if requests.len() >= count {
            return requests;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the model server got {} of {count} requests in 30 s",
        server.requests().len()
    );
}

/// Whether `request`'s body holds `needle` anywhere (the products wrap a task in context of
/// their own).
pub fn body_has(request: &Recorded, needle: &str) -> bool {
    String::from_utf8_lossy(&request.body).contains(needle)
}

/// Asserts that `result` completed, showing its diagnostic if it did not.
pub fn assert_completed(result: &SubagentResult) {
    assert_eq!(
        result.stop_reason,
        StopReason::Completed,
        "{:?}",
        result.diagnostic
    );
}

/// Asserts that `result` completed with the single text block `text` as its output.
pub fn assert_answered(result: &SubagentResult, text: &str) {
    assert_completed(result);
    assert_eq!(result.output, vec![ContentBlock::text(text)]);
}

/// A loopback model server answering from `replies`, in order.
pub async fn serve(replies: impl IntoIterator<Item = Reply>) -> LoopbackServer {
    LoopbackServer::start(replies)
        .await
        .expect("the loopback server starts")
}
