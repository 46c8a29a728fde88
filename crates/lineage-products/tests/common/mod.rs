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
use lineage_products::{ClaudeCodeConfig, CodexConfig, ProcessConfig};
use lineage_store::Store;
use lineage_subagent::{
    Host, Provider, StartRequest, StopReason, SubagentError, SubagentResult, SubagentRun,
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

    /// Codex, its model provider the Responses endpoint of `server`.
    pub fn codex(&self, server: &LoopbackServer) -> CodexConfig {
        let home = self.path("codex-home");
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
        codex.process = self.process(&products().codex);
        codex.process.env.push(("CODEX_HOME".into(), home.into()));
        codex
    }

    /// Claude Code, its endpoint `server`'s Messages API, its key a placeholder.
    pub fn claude(&self, server: &LoopbackServer) -> ClaudeCodeConfig {
        let mut claude = ClaudeCodeConfig::new("claude", &products().claude);
        claude.process = self.process(&products().claude);
        claude.model = Some("loopback-model".into());
        let env: [(&str, OsString); 10] = [
            ("ANTHROPIC_BASE_URL", server.base_url().into()),
            ("ANTHROPIC_API_KEY", "placeholder".into()),
            ("CLAUDE_CONFIG_DIR", self.path("claude-config").into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            ("DISABLE_ERROR_REPORTING", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("CLAUDE_CODE_MAX_RETRIES", "0".into()),
            // One request per model call: no second, non-streaming try after a broken stream.
            ("CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK", "1".into()),
            ("CLAUDE_CODE_TMPDIR", self.path("tmp").into()),
        ];
        claude
            .process
            .env
            .extend(env.into_iter().map(|(name, value)| (name.into(), value)));
        claude
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

    /// Starts a run through `provider` whose model request `server` holds unanswered, cancels
    /// it once the request arrived, and checks that it settles `aborted`, drops the request and,
    /// once disposed of, leaves no process.
    pub async fn cancel_mid_turn(&self, provider: Arc<dyn Provider>, server: &LoopbackServer) {
        let cancel = Cancellation::new();
        let run = self
            .start(provider, "Take your time.", |r| StartRequest {
                cancel: cancel.clone(),
                ..r
            })
            .await
            .unwrap();
        requests_reach(server, 1).await;
        cancel.cancel(AbortCause::Parent);
        let result = run.result().await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Aborted);
        run.dispose().await.unwrap();
        server.stalls_released(1).await;
        assert_eq!(self.survivors(), Vec::<u32>::new());
    }

    /// The live processes any run of this test started.
    pub fn survivors(&self) -> Vec<u32> {
        processes_with_env(MARK, &self.mark())
    }
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
