//! [`AcpProvider`]: one-shot delegation to any agent that speaks the Agent Client Protocol on
//! its stdio, a fresh process per run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client};
use lineage_agent::{BoxFuture, Cancellation};
use lineage_log::{ContentBlock, SessionId};
use lineage_subagent::{
    ErrorCode, OutOfProcess, OutOfProcessAgent, ResolvedStart, StopReason, SubagentError,
    SubagentResult, SubagentRun, bound_diagnostic, child_working_directory,
};
use tokio::sync::oneshot;

use lineage_process::{
    AgentProcess, DEFAULT_PASSTHROUGH, Launch, Malformed, StderrTail, child_env, failure_report,
};

use crate::wire;

/// How a child agent's permission requests are answered. Nobody is asked: a delegated run is
/// unattended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PermissionPolicy {
    /// Reject once (or cancel the request, when the agent offers no way to reject).
    #[default]
    Reject,
    /// Allow once (or reject as above, when the agent offers no one-time allowance: a
    /// delegated run never grants more than the one call).
    AllowOnce,
}

/// How an [`AcpProvider`] runs its agent.
#[derive(Clone, Debug)]
pub struct AcpProviderConfig {
    /// The provider's name, which delegations select it by.
    pub name: String,
    /// The agent's program, found on `PATH` when it has no directory part.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Its working directory; by default the delegating agent's (its session's `cwd`). Either
    /// must be absolute and a directory.
    pub cwd: Option<PathBuf>,
    /// Variables set for the agent, credentials included: nothing else reaches it but these and
    /// the passed-through ones.
    pub env: Vec<(OsString, OsString)>,
    /// The parent's variables passed through, unless credential-shaped
    /// ([`crate::credential_shaped`]). Default [`DEFAULT_PASSTHROUGH`].
    pub env_passthrough: Vec<OsString>,
    /// How its permission requests are answered (default [`PermissionPolicy::Reject`]).
    pub permission: PermissionPolicy,
    /// How long a start waits for the answers to `initialize` and `session/new` together
    /// (default 60 s).
    pub handshake_timeout: Duration,
    /// How long disposal waits for the agent to exit once its stdin is closed (default 6 s).
    pub eof_grace: Duration,
    /// How long disposal waits after SIGTERM before SIGKILL (default 3 s).
    pub term_grace: Duration,
}

impl AcpProviderConfig {
    /// A provider named `name` running `program` with `args`, with the defaults.
    pub fn new(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        AcpProviderConfig {
            name: name.into(),
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            cwd: None,
            env: Vec::new(),
            env_passthrough: DEFAULT_PASSTHROUGH.iter().map(OsString::from).collect(),
            permission: PermissionPolicy::Reject,
            handshake_timeout: Duration::from_secs(60),
            eof_grace: Duration::from_secs(6),
            term_grace: Duration::from_secs(3),
        }
    }
}

/// A one-shot provider whose children are ACP agents in processes of their own.
///
/// A start spawns the agent in its own process group, in the delegating agent's working
/// directory, with an allow-listed environment; sends `initialize` and `session/new`; and only
/// then publishes the run, whose id is minted here (the agent's own session id stays private).
/// The run sends the task as `session/prompt`, collects the answer from `agent_message_chunk`
/// updates and maps the stop reason. Cancelling sends `session/cancel` and settles `aborted` at
/// once. Disposal closes stdin, waits [`AcpProviderConfig::eof_grace`], SIGTERMs the group,
/// waits [`AcpProviderConfig::term_grace`], SIGKILLs it and reaps it: no process of the group
/// survives.
///
/// It supports no start-time option (a request for one is refused before a process starts),
/// its children never see the parent's conversation, and delegation depth is the agent's own
/// business ([`MaxDepth::ProviderManaged`](lineage_subagent::tools::MaxDepth::ProviderManaged) in its tool row, [`AcpProvider::tool_row`]).
pub type AcpProvider = OutOfProcess<AcpProviderConfig>;

impl OutOfProcessAgent for AcpProviderConfig {
    fn name(&self) -> &str {
        &self.name
    }

    /// The agent as an outside one, named by the provider's name.
    fn describe(&self) -> String {
        format!(
            "Hands a self-contained task to `{}`, an agent that runs in a process of its own and \
             speaks the Agent Client Protocol. It cannot see this conversation, so the prompt \
             must say everything it needs to know. You get its final answer.",
            self.name
        )
    }

    fn start(
        config: Arc<Self>,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        // Read now: the parent as it was when the delegation was asked for.
        let cwd = child_working_directory(config.cwd.as_deref(), &request.request.parent)
            .map_err(|message| refusal(&config.name, message));
        let prompt = request.request.prompt;
        let cancel = request.request.cancel;
        Box::pin(async move { start(config, cwd?, prompt, cancel).await })
    }
}

fn refusal(name: &str, message: String) -> SubagentError {
    SubagentError::new(
        ErrorCode::InvalidRequest,
        format!("ACP agent {name}: {message}"),
    )
}

/// Where a run failed, named in its diagnostic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Spawn,
    Initialize,
    SessionNew,
    Prompt,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Spawn => "spawn",
            Stage::Initialize => "initialize",
            Stage::SessionNew => "session-new",
            Stage::Prompt => "prompt",
        }
    }
}

/// How long a failure waits for the agent's exit status: a connection that broke is most often
/// an agent exiting, whose status explains it.
const EXIT_WAIT: Duration = Duration::from_millis(500);

/// Where a failure's evidence about the process is read from: the process itself, its stderr's
/// tail and the first line it wrote that was not a frame.
#[derive(Clone)]
struct Witness {
    process: Arc<tokio::sync::Mutex<AgentProcess>>,
    stderr: StderrTail,
    malformed: Malformed,
}

impl Witness {
    /// What the process can tell now, after waiting [`EXIT_WAIT`] for its exit status and as
    /// long again for the rest of its stderr.
    async fn evidence(&self) -> Evidence {
        let status = self.process.lock().await.wait_exit(EXIT_WAIT).await;
        if status.is_some() {
            self.stderr.drained(EXIT_WAIT).await;
        }
        Evidence {
            status,
            stderr: self.stderr.clone(),
            malformed: self.malformed.clone(),
        }
    }
}

/// What a failure reports about the process, gathered after the fact.
struct Evidence {
    status: Option<ExitStatus>,
    stderr: StderrTail,
    malformed: Malformed,
}

/// A failure at `stage`, for people: what went wrong, the exit status, a malformed frame if
/// one came, and the stderr tail; at most [`lineage_subagent::MAX_DIAGNOSTIC_BYTES`].
fn diagnostic(name: &str, stage: Stage, what: &str, evidence: &Evidence) -> String {
    let headline = headline(name, stage, what);
    let report = failure_report(
        &headline,
        evidence.status,
        &evidence.malformed,
        &evidence.stderr,
    );
    bound_diagnostic(&report)
}

/// The first words of a failure's diagnostic.
fn headline(name: &str, stage: Stage, what: &str) -> String {
    format!(
        "ACP agent {name} failed at stage {}: {what}",
        stage.as_str()
    )
}

/// The open connection of one run.
struct Session {
    name: String,
    connection: ConnectionTo<Agent>,
    id: acp::SessionId,
    /// The `agent_message_chunk` texts so far.
    answer: Arc<Mutex<String>>,
    witness: Witness,
}

impl Session {
    fn answer(&self) -> Vec<ContentBlock> {
        let text = self
            .answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if text.is_empty() {
            Vec::new()
        } else {
            vec![ContentBlock::text(text)]
        }
    }

    /// Sends the task and waits for the stop reason, or for `cancel`.
    async fn run(
        self: Arc<Self>,
        prompt: Vec<ContentBlock>,
        cancel: Cancellation,
    ) -> SubagentResult {
        let blocks = prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text { text } => Some(acp::ContentBlock::Text(
                    acp::TextContent::new(text.as_str()),
                )),
                _ => None,
            })
            .collect();
        let request = acp::PromptRequest::new(self.id.clone(), blocks);
        let answered = tokio::select! {
            answered = self.connection.send_request(request).block_task() => answered,
            _ = cancel.cancelled() => {
                let _ = self
                    .connection
                    .send_notification(acp::CancelNotification::new(self.id.clone()));
                return self.result(StopReason::Aborted, None);
            }
        };
        match answered {
            Ok(response) => {
                let (reason, note) = stop_reason(&response.stop_reason);
                self.result(reason, note)
            }
            Err(error) => {
                let evidence = self.witness.evidence().await;
                let what = rpc_error(&error);
                let text = diagnostic(&self.name, Stage::Prompt, &what, &evidence);
                self.result(StopReason::Error, Some(text))
            }
        }
    }

    fn result(&self, stop_reason: StopReason, diagnostic: Option<String>) -> SubagentResult {
        SubagentResult {
            output: self.answer(),
            structured: None,
            diagnostic,
            stop_reason,
        }
    }
}

/// A protocol error for people: its message, and its data on the same line.
fn rpc_error(error: &agent_client_protocol::Error) -> String {
    match &error.data {
        Some(data) => format!("{} ({data})", error.message),
        None => error.message.clone(),
    }
}

/// The protocol's stop reason as a run's: `max_turn_requests` and reasons this version does not
/// know are failures, with a diagnostic that names them.
fn stop_reason(reason: &acp::StopReason) -> (StopReason, Option<String>) {
    match reason {
        acp::StopReason::EndTurn => (StopReason::Completed, None),
        acp::StopReason::MaxTokens => (StopReason::MaxTokens, None),
        acp::StopReason::Refusal => (StopReason::Refusal, None),
        acp::StopReason::Cancelled => (StopReason::Aborted, None),
        other => (
            StopReason::Error,
            Some(format!("the agent stopped with {other:?}")),
        ),
    }
}

/// The answer `policy` gives to a permission request.
fn permission_answer(
    policy: PermissionPolicy,
    request: &acp::RequestPermissionRequest,
) -> acp::RequestPermissionResponse {
    let find = |kind: acp::PermissionOptionKind| {
        request
            .options
            .iter()
            .find(|option| option.kind == kind)
            .map(|option| option.option_id.clone())
    };
    let chosen = match policy {
        PermissionPolicy::AllowOnce => find(acp::PermissionOptionKind::AllowOnce),
        PermissionPolicy::Reject => None,
    }
    .or_else(|| find(acp::PermissionOptionKind::RejectOnce));
    acp::RequestPermissionResponse::new(match chosen {
        Some(option) => {
            acp::RequestPermissionOutcome::Selected(acp::SelectedPermissionOutcome::new(option))
        }
        None => acp::RequestPermissionOutcome::Cancelled,
    })
}

/// The whole start: spawn, connect, `initialize`, `session/new`, then the run published.
async fn start(
    config: Arc<AcpProviderConfig>,
    cwd: PathBuf,
    prompt: Vec<ContentBlock>,
    cancel: Cancellation,
) -> Result<SubagentRun, SubagentError> {
    let name = config.name.clone();
    let launch = Launch {
        program: config.program.as_os_str(),
        args: &config.args,
        cwd: &cwd,
        env: child_env(std::env::vars_os(), &config.env_passthrough, &config.env),
    };
    let (process, stdout) = AgentProcess::spawn(launch).map_err(|error| {
        let what = format!("cannot run {}: {error}", config.program.display());
        let text = headline(&name, Stage::Spawn, &what);
        SubagentError::new(ErrorCode::AgentFailure, bound_diagnostic(&text))
    })?;
    let malformed = Malformed::default();
    let transport = wire::lines(stdout, process.stdin.clone(), Some(malformed.clone()));
    let group = process.group();
    let witness = Witness {
        stderr: process.stderr.clone(),
        process: Arc::new(tokio::sync::Mutex::new(process)),
        malformed,
    };
    let answer = Arc::new(Mutex::new(String::new()));
    let (connected, connection) = oneshot::channel();
    let (close, closed) = oneshot::channel::<()>();
    let policy = config.permission;
    let client = Client
        .v1()
        .name("lineage")
        .on_receive_notification(
            {
                let answer = answer.clone();
                async move |notification: acp::SessionNotification, _cx| {
                    if let acp::SessionUpdate::AgentMessageChunk(chunk) = notification.update
                        && let acp::ContentBlock::Text(text) = chunk.content
                    {
                        answer
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push_str(&text.text);
                    }
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: acp::RequestPermissionRequest,
                        responder: Responder<acp::RequestPermissionResponse>,
                        _cx| { responder.respond(permission_answer(policy, &request)) },
            agent_client_protocol::on_receive_request!(),
        );
    let driver = tokio::spawn(client.connect_with(
        transport,
        async move |cx: ConnectionTo<Agent>| {
            let _ = connected.send(cx);
            // Open until the run is disposed of (or the agent goes away).
            let _ = closed.await;
            Ok(())
        },
    ));
    let connection = match connection.await {
        Ok(connection) => connection,
        Err(_) => {
            let what = match driver.await {
                Ok(Err(error)) => error.to_string(),
                _ => "the connection did not start".to_owned(),
            };
            return Err(failed_start(&name, Stage::Initialize, &what, &witness).await);
        }
    };
    // The stage in progress, for a failure of either request, a timeout or a cancel.
    let mut stage = Stage::Initialize;
    let handshake = async {
        let initialize = acp::InitializeRequest::new(ProtocolVersion::V1).client_info(
            acp::Implementation::new("lineage", env!("CARGO_PKG_VERSION")),
        );
        connection
            .send_request(initialize)
            .block_task()
            .await
            .map_err(|e| rpc_error(&e))?;
        stage = Stage::SessionNew;
        let new = acp::NewSessionRequest::new(cwd.clone());
        connection
            .send_request(new)
            .block_task()
            .await
            .map(|created| created.session_id)
            .map_err(|e| rpc_error(&e))
    };
    let handshake = tokio::select! {
        done = tokio::time::timeout(config.handshake_timeout, handshake) => match done {
            Ok(done) => done,
            Err(_) => Err(format!("no answer within {:?}", config.handshake_timeout)),
        },
        cause = cancel.cancelled() => Err(format!("cancelled ({cause:?})")),
    }
    .map_err(|what| (stage, what));
    let session_id = match handshake {
        Ok(session_id) => session_id,
        Err((stage, what)) => {
            let _ = close.send(());
            let error = failed_start(&name, stage, &what, &witness).await;
            let _ = driver.await;
            return Err(if cancel.is_cancelled() {
                SubagentError::new(ErrorCode::Cancelled, error.message().to_owned())
            } else {
                error
            });
        }
    };
    let process = witness.process.clone();
    let session = Arc::new(Session {
        name: name.clone(),
        connection,
        id: session_id,
        answer,
        witness,
    });
    let id = SessionId::new();
    tracing::debug!(provider = %name, run = %id, ?group, "ACP agent started");
    let result = {
        let session = session.clone();
        async move { Ok(session.run(prompt, cancel).await) }
    };
    let dispose = move || -> BoxFuture<'static, Result<(), SubagentError>> {
        Box::pin(async move {
            // Best effort: a prompt still running is told to stop before its input closes.
            let _ = session
                .connection
                .send_notification(acp::CancelNotification::new(session.id.clone()));
            let _ = close.send(());
            let ladder = process
                .lock()
                .await
                .shut_down(config.eof_grace, config.term_grace)
                .await;
            tracing::debug!(provider = %config.name, run = %id, ?ladder, "ACP agent gone");
            let _ = driver.await;
            Ok(())
        })
    };
    Ok(SubagentRun::new(id, None, result, dispose))
}

/// A start that failed before its run was published: the group killed and reaped first, then
/// the error naming the stage and the exit status.
async fn failed_start(name: &str, stage: Stage, what: &str, witness: &Witness) -> SubagentError {
    let evidence = witness.evidence().await;
    witness.process.lock().await.kill().await;
    SubagentError::new(
        ErrorCode::AgentFailure,
        diagnostic(name, stage, what, &evidence),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_as_the_protocol_means_them() {
        let cases = [
            (acp::StopReason::EndTurn, StopReason::Completed),
            (acp::StopReason::MaxTokens, StopReason::MaxTokens),
            (acp::StopReason::Refusal, StopReason::Refusal),
            (acp::StopReason::Cancelled, StopReason::Aborted),
            (acp::StopReason::MaxTurnRequests, StopReason::Error),
        ];
        for (reason, expected) in cases {
            let (mapped, note) = stop_reason(&reason);
            assert_eq!(mapped, expected, "{reason:?}");
            assert_eq!(note.is_some(), expected == StopReason::Error, "{reason:?}");
        }
    }

    fn request(kinds: &[acp::PermissionOptionKind]) -> acp::RequestPermissionRequest {
        let options = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| acp::PermissionOption::new(format!("o{i}"), "an option", *kind))
            .collect();
        acp::RequestPermissionRequest::new(
            "s",
            acp::ToolCallUpdate::new("c", acp::ToolCallUpdateFields::new()),
            options,
        )
    }

    fn chosen(response: acp::RequestPermissionResponse) -> Option<String> {
        match response.outcome {
            acp::RequestPermissionOutcome::Selected(selected) => {
                Some(selected.option_id.0.to_string())
            }
            _ => None,
        }
    }

    #[test]
    fn permission_is_granted_once_at_most_and_rejected_when_it_cannot_be() {
        use acp::PermissionOptionKind::{AllowAlways, AllowOnce, RejectAlways, RejectOnce};
        let all = request(&[AllowAlways, AllowOnce, RejectOnce, RejectAlways]);
        let policy = |p, r: &acp::RequestPermissionRequest| chosen(permission_answer(p, r));
        assert_eq!(
            policy(PermissionPolicy::AllowOnce, &all).as_deref(),
            Some("o1")
        );
        assert_eq!(
            policy(PermissionPolicy::Reject, &all).as_deref(),
            Some("o2")
        );
        // Only a standing allowance offered: a delegated run never takes it.
        let always = request(&[AllowAlways, RejectOnce]);
        assert_eq!(
            policy(PermissionPolicy::AllowOnce, &always).as_deref(),
            Some("o1")
        );
        let nothing = request(&[AllowAlways]);
        assert_eq!(policy(PermissionPolicy::AllowOnce, &nothing), None);
        assert_eq!(policy(PermissionPolicy::Reject, &nothing), None);
    }

    #[test]
    fn a_diagnostic_names_stage_status_frame_and_stderr_within_the_bound() {
        let evidence = Evidence {
            status: None,
            stderr: StderrTail::default(),
            malformed: Malformed::default(),
        };
        *evidence.malformed.lock().unwrap() = Some("Starting...".into());
        let text = diagnostic("acp", Stage::SessionNew, &"x".repeat(10_000), &evidence);
        assert!(text.starts_with("ACP agent acp failed at stage session-new: xxx"));
        assert!(text.len() <= lineage_subagent::MAX_DIAGNOSTIC_BYTES);
        let short = diagnostic("acp", Stage::Initialize, "broken pipe", &evidence);
        assert!(short.contains("the process was still running"), "{short}");
        assert!(short.contains("\"Starting...\""), "{short}");
    }
}
