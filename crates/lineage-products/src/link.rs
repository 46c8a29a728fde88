//! What both products share: how their process is configured and spawned, the frames it writes,
//! and a failure's diagnostic.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lineage_agent::{BoxFuture, Cancellation};
use lineage_log::{ContentBlock, SessionId};
use lineage_process::{
    AgentProcess, DEFAULT_PASSTHROUGH, FrameReader, Ladder, Launch, Malformed, SharedWriter,
    StderrTail, child_env, failure_report, write_frame,
};
use lineage_subagent::{
    ErrorCode, ResolvedStart, StopReason, SubagentError, SubagentResult, SubagentRun,
    bound_diagnostic, child_working_directory,
};
use serde_json::Value;
use tokio::process::ChildStdin;
use tokio::sync::mpsc;

/// How a product's process runs: the part of a provider's configuration both products share.
#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// The product's program (`node_modules/.bin/codex` or `node_modules/.bin/claude` of an
    /// installation, see `scripts/install-products`), found on `PATH` when it has no directory
    /// part.
    pub program: PathBuf,
    /// Arguments before the ones the provider adds.
    pub args: Vec<OsString>,
    /// Its working directory; by default the delegating agent's (its session's `cwd`). Either
    /// must be absolute and a directory.
    pub cwd: Option<PathBuf>,
    /// Variables set for the product, credentials included (`OPENAI_API_KEY`,
    /// `ANTHROPIC_API_KEY`, `CODEX_HOME`, ...): nothing else reaches it but these and the
    /// passed-through ones.
    pub env: Vec<(OsString, OsString)>,
    /// The parent's variables passed through, unless credential-shaped. Default
    /// [`DEFAULT_PASSTHROUGH`].
    pub env_passthrough: Vec<OsString>,
    /// How long a start waits for the product's handshake (default 60 s).
    pub handshake_timeout: Duration,
    /// How long disposal waits for the product to exit once its stdin is closed (default 6 s).
    pub eof_grace: Duration,
    /// How long disposal waits after SIGTERM before SIGKILL (default 3 s).
    pub term_grace: Duration,
}

impl ProcessConfig {
    /// `program` with no extra arguments, the defaults otherwise.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        ProcessConfig {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            env: Vec::new(),
            env_passthrough: DEFAULT_PASSTHROUGH.iter().map(OsString::from).collect(),
            handshake_timeout: Duration::from_secs(60),
            eof_grace: Duration::from_secs(6),
            term_grace: Duration::from_secs(3),
        }
    }
}

/// Where a run failed, named in its diagnostic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Spawn,
    Initialize,
    ThreadStart,
    Turn,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Spawn => "spawn",
            Stage::Initialize => "initialize",
            Stage::ThreadStart => "thread-start",
            Stage::Turn => "turn",
        }
    }
}

/// How long a failure waits for the product's exit status: output that ended is most often a
/// product exiting, whose status explains it.
const EXIT_WAIT: Duration = Duration::from_millis(500);

/// A product's running process and the frames it writes, parsed.
pub(crate) struct Link {
    /// The product's name and the provider's, for diagnostics ("Codex (codex)").
    who: String,
    process: tokio::sync::Mutex<AgentProcess>,
    stdin: Arc<SharedWriter<ChildStdin>>,
    stderr: StderrTail,
    malformed: Malformed,
    frames: tokio::sync::Mutex<mpsc::UnboundedReceiver<io::Result<Value>>>,
    /// Set when the reader has read the whole output (so every line that was not a frame is
    /// recorded in `malformed`).
    read_all: tokio::sync::watch::Receiver<bool>,
}

impl Link {
    /// Spawns the product: `config`'s program and arguments, then `args`, in `cwd`.
    pub(crate) fn spawn(
        who: String,
        config: &ProcessConfig,
        args: &[OsString],
        cwd: &std::path::Path,
    ) -> Result<Link, SubagentError> {
        let all_args: Vec<OsString> = config.args.iter().chain(args).cloned().collect();
        let launch = Launch {
            program: config.program.as_os_str(),
            args: &all_args,
            cwd,
            env: child_env(std::env::vars_os(), &config.env_passthrough, &config.env),
        };
        let (process, stdout) = AgentProcess::spawn(launch).map_err(|error| {
            let what = format!("cannot run {}: {error}", config.program.display());
            failure(&headline(&who, Stage::Spawn, &what))
        })?;
        let malformed = Malformed::default();
        let (frames_in, frames) = mpsc::unbounded_channel();
        let mut reader = FrameReader::strict(stdout, malformed.clone());
        let (read_all_tx, read_all) = tokio::sync::watch::channel(false);
        // Read on a task of its own, so the product never blocks on a full stdout whoever is
        // (or is not) waiting for its frames.
        tokio::spawn(async move {
            while let Some(frame) = reader.next().await {
                let frame = frame.and_then(|line| {
                    serde_json::from_str(&line)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
                });
                if frames_in.send(frame).is_err() {
                    break;
                }
            }
            read_all_tx.send_replace(true);
        });
        Ok(Link {
            who,
            stdin: process.stdin.clone(),
            stderr: process.stderr.clone(),
            process: tokio::sync::Mutex::new(process),
            malformed,
            frames: tokio::sync::Mutex::new(frames),
            read_all,
        })
    }

    /// Who the diagnostics name.
    pub(crate) fn who(&self) -> &str {
        &self.who
    }

    /// Writes one frame.
    pub(crate) async fn send(&self, frame: &Value) -> io::Result<()> {
        write_frame(&self.stdin, &frame.to_string()).await
    }

    /// The next frame; `Err` with what ended the output (its end included).
    pub(crate) async fn next(&self) -> Result<Value, String> {
        match self.frames.lock().await.recv().await {
            Some(Ok(frame)) => Ok(frame),
            Some(Err(error)) => Err(format!("its output broke: {error}")),
            None => Err("its output ended".to_owned()),
        }
    }

    /// A failure at `stage` for people: what went wrong, then what the process can tell (its
    /// exit status, a line that was not a frame, its stderr's tail), bounded.
    pub(crate) async fn diagnostic(&self, stage: Stage, what: &str) -> String {
        let status = self.process.lock().await.wait_exit(EXIT_WAIT).await;
        // What the process printed before it exited is read before it is told.
        let mut read_all = self.read_all.clone();
        let _ = tokio::time::timeout(EXIT_WAIT, read_all.wait_for(|done| *done)).await;
        if status.is_some() {
            self.stderr.drained(EXIT_WAIT).await;
        }
        let headline = headline(&self.who, stage, what);
        bound_diagnostic(&failure_report(
            &headline,
            status,
            &self.malformed,
            &self.stderr,
        ))
    }

    /// A start's handshake: `work` within [`ProcessConfig::handshake_timeout`], stopped by
    /// `cancel`. When it fails, the diagnostic names the stage `stage` holds then, and the group
    /// is killed and reaped before the error (`Cancelled` after a cancel) is returned.
    pub(crate) async fn handshake<T>(
        &self,
        config: &ProcessConfig,
        cancel: &Cancellation,
        stage: &Mutex<Stage>,
        work: impl Future<Output = Result<T, String>>,
    ) -> Result<T, SubagentError> {
        let timeout = config.handshake_timeout;
        let done = tokio::select! {
            done = tokio::time::timeout(timeout, work) => done
                .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}"))),
            cause = cancel.cancelled() => Err(format!("cancelled ({cause:?})")),
        };
        let what = match done {
            Ok(done) => return Ok(done),
            Err(what) => what,
        };
        let stage = *stage.lock().unwrap_or_else(|p| p.into_inner());
        let text = self.diagnostic(stage, &what).await;
        self.process.lock().await.kill().await;
        Err(if cancel.is_cancelled() {
            SubagentError::new(ErrorCode::Cancelled, bound_diagnostic(&text))
        } else {
            failure(&text)
        })
    }

    /// The teardown ladder (see [`AgentProcess::shut_down`]).
    pub(crate) async fn shut_down(&self, config: &ProcessConfig) -> Ladder {
        self.process
            .lock()
            .await
            .shut_down(config.eof_grace, config.term_grace)
            .await
    }

    /// The process group's id.
    pub(crate) async fn group(&self) -> Option<i32> {
        self.process.lock().await.group()
    }
}

/// What a start reads of its request, for either product.
pub(crate) struct Delegation {
    /// The product's name and the provider's, for diagnostics ("Codex (codex)").
    pub who: String,
    /// Where the product runs, or why it cannot: refused before any process starts.
    pub cwd: Result<PathBuf, SubagentError>,
    /// The task: the prompt's text blocks, a blank line between two.
    pub task: String,
    /// The caller's cancellation, which stops the handshake and the run.
    pub cancel: Cancellation,
}

impl Delegation {
    /// Reads `request` now: the parent as it was when the delegation was asked for.
    pub(crate) fn read(
        product: &str,
        name: &str,
        process: &ProcessConfig,
        request: ResolvedStart,
    ) -> Delegation {
        let who = format!("{product} ({name})");
        let cwd = child_working_directory(process.cwd.as_deref(), &request.request.parent)
            .map_err(|message| refusal(&who, message));
        let task = request
            .request
            .prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n\n");
        Delegation {
            who,
            cwd,
            task,
            cancel: request.request.cancel,
        }
    }
}

/// A product's connection once its handshake is done: what its run and its disposal share.
pub(crate) trait Connected: Send + Sync + 'static {
    /// The process it talks to.
    fn link(&self) -> &Link;
    /// Stops the turn in flight, if there is one (best effort: the process may be gone).
    fn interrupt(&self) -> impl Future<Output = ()> + Send;
}

/// Publishes a started run of `product` under a fresh id: `run` is its turn, and disposal
/// interrupts a turn still running and tears the process group down (`process`'s ladder).
pub(crate) async fn publish<C: Connected>(
    product: &'static str,
    provider: &str,
    process: &ProcessConfig,
    connection: Arc<C>,
    run: impl Future<Output = Result<SubagentResult, SubagentError>> + Send + 'static,
) -> SubagentRun {
    let id = SessionId::new();
    let group = connection.link().group().await;
    tracing::debug!(provider, run = %id, ?group, "{product} started");
    let (provider, process) = (provider.to_owned(), process.clone());
    let dispose = move || -> BoxFuture<'static, Result<(), SubagentError>> {
        Box::pin(async move {
            connection.interrupt().await;
            let ladder = connection.link().shut_down(&process).await;
            tracing::debug!(provider, run = %id, ?ladder, "{product} gone");
            Ok(())
        })
    };
    SubagentRun::new(id, None, run, dispose)
}

/// A run's result.
pub(crate) fn result(
    output: Vec<ContentBlock>,
    stop_reason: StopReason,
    diagnostic: Option<String>,
) -> SubagentResult {
    SubagentResult {
        output,
        structured: None,
        diagnostic,
        stop_reason,
    }
}

/// The first words of a failure's diagnostic.
fn headline(who: &str, stage: Stage, what: &str) -> String {
    format!("{who} failed at stage {}: {what}", stage.as_str())
}

fn failure(text: &str) -> SubagentError {
    SubagentError::new(ErrorCode::AgentFailure, bound_diagnostic(text))
}

/// A refusal before anything starts, for a request the provider cannot serve.
fn refusal(who: &str, message: String) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidRequest, format!("{who}: {message}"))
}

/// The text of a JSON value when it is a string, else its JSON.
pub(crate) fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
