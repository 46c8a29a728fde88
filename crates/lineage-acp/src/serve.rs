//! [`serve`]: a Lineage host as an ACP agent. Every ACP session is a durable Lineage session
//! (the ACP session id is its id), so a client can load one again after the server restarts.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, Error, JsonRpcResponse};
use lineage_agent::{
    Agent as LineageAgent, AgentEvent, AgentSpec, BoxFuture, CreateAgent, Tool, ToolContext,
    ToolOutput,
};
use lineage_log::{
    ContentBlock, Event, EventBody, Message, MessageSource, SessionId, TurnEndReason,
};
use lineage_subagent::{Host, HostError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::wire;

/// The spec of a session's agent, made for its working directory (the tools a host gives it,
/// its model and options).
pub type SessionSpec = Arc<dyn Fn(&Host, &Path) -> AgentSpec + Send + Sync>;

/// How [`serve`] runs.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// The tools whose every call the client is asked to allow first (`session/request_permission`,
    /// one-time allow or reject). A call the client does not allow fails, and the model is told.
    pub ask_permission: HashSet<String>,
}

/// What stopped a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The connection failed (its transport broke, or a frame could not be written).
    #[error("the ACP connection failed: {0}")]
    Connection(String),
    /// The host failed to shut down (its store's last flush, or draining its children).
    #[error(transparent)]
    Host(#[from] HostError),
}

/// Serves `host`'s agents as an ACP agent over `input` and `output` (a process's stdin and
/// stdout), until `input` ends. Then it drains: every running prompt is cancelled and waited
/// for, and the host is closed (children torn down, agents shut down, the store flushed).
///
/// Served: `initialize` (protocol version 1; `loadSession`), `session/new` (a fresh durable
/// session in the request's `cwd`, with `spec`), `session/load` (a stored session resumed and
/// its history replayed as updates), `session/prompt` (text content; `agent_message_chunk`,
/// `agent_thought_chunk`, `tool_call` and `tool_call_update` as events are appended; the answer
/// comes once the session and every child it delegated to are quiet) and `session/cancel`.
pub async fn serve<R, W>(
    host: Host,
    spec: SessionSpec,
    options: ServeOptions,
    input: R,
    output: W,
) -> Result<(), ServeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(State {
        host,
        spec,
        options,
        sessions: Mutex::new(HashMap::new()),
        tasks: Mutex::new(Vec::new()),
    });
    let transport = wire::lines(input, Arc::new(tokio::sync::Mutex::new(Some(output))), None);
    let served = Agent
        .v1()
        .name("lineage")
        .on_receive_request(
            async move |request: acp::InitializeRequest,
                        responder: Responder<acp::InitializeResponse>,
                        _cx| {
                let version = request.protocol_version.min(ProtocolVersion::V1);
                responder.respond(
                    acp::InitializeResponse::new(version)
                        .agent_capabilities(
                            acp::AgentCapabilities::new()
                                .load_session(true)
                                .session_capabilities(
                                    acp::SessionCapabilities::new()
                                        .close(acp::SessionCloseCapabilities::new()),
                                ),
                        )
                        .agent_info(acp::Implementation::new(
                            "lineage",
                            env!("CARGO_PKG_VERSION"),
                        )),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let state = state.clone();
                async move |request: acp::NewSessionRequest,
                            responder: Responder<acp::NewSessionResponse>,
                            cx: ConnectionTo<Client>| {
                    state.answer_later(responder, async move |state| {
                        state.new_session(request, cx).await
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let state = state.clone();
                async move |request: acp::LoadSessionRequest,
                            responder: Responder<acp::LoadSessionResponse>,
                            cx: ConnectionTo<Client>| {
                    state.answer_later(responder, async move |state| {
                        state.load_session(request, cx).await
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let state = state.clone();
                async move |request: acp::PromptRequest,
                            responder: Responder<acp::PromptResponse>,
                            cx: ConnectionTo<Client>| {
                    // Begun here, in the dispatch loop, so a `session/cancel` read right after
                    // the prompt finds it.
                    match state.begin_prompt(&request) {
                        Ok(begun) => {
                            state.answer_later(responder, async move |state| {
                                state.prompt(request, begun, cx).await
                            });
                            Ok(())
                        }
                        Err(error) => responder.respond_with_error(error),
                    }
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let state = state.clone();
                async move |request: acp::CloseSessionRequest,
                            responder: Responder<acp::CloseSessionResponse>,
                            _cx| {
                    state.answer_later(responder, async move |state| {
                        state.close_session(request).await
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            {
                let state = state.clone();
                async move |notification: acp::CancelNotification, _cx| {
                    state.cancel(&notification.session_id);
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await;
    // The input ended (or the connection broke): drain. Every prompt still running is
    // stopped, and every task is waited for, so nothing holds the host when it closes.
    state.cancel_all();
    loop {
        let tasks = std::mem::take(&mut *state.lock_tasks());
        if tasks.is_empty() {
            break;
        }
        for task in tasks {
            let _ = task.await;
        }
    }
    let closed = match Arc::into_inner(state) {
        Some(state) => state.host.close().await.map_err(ServeError::from),
        None => Err(ServeError::Connection(
            "the connection's handlers outlived it; the host was not closed".into(),
        )),
    };
    served.map_err(|e| ServeError::Connection(e.to_string()))?;
    closed
}

struct State {
    host: Host,
    spec: SessionSpec,
    options: ServeOptions,
    /// The sessions this server has created or loaded.
    sessions: Mutex<HashMap<SessionId, Served>>,
    /// Every task a request started, waited for at the drain.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Marks a session free of its prompt when dropped.
struct Running<'a> {
    sessions: &'a Mutex<HashMap<SessionId, Served>>,
    id: SessionId,
    running: Arc<watch::Sender<bool>>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(served) = lock(self.sessions).get_mut(&self.id) {
            served.stop = None;
        }
        self.running.send_replace(false);
    }
}

/// A prompt admitted to its session.
struct Begun {
    id: SessionId,
    agent: Arc<LineageAgent>,
    text: String,
    stop: Arc<Notify>,
    running: Arc<watch::Sender<bool>>,
}

struct Served {
    agent: Arc<LineageAgent>,
    /// Set while a prompt runs: notified by `session/cancel`.
    stop: Option<Arc<Notify>>,
    /// Whether a prompt runs (until its turn is flushed): what `session/close` waits for.
    running: Arc<watch::Sender<bool>>,
}

impl Served {
    fn new(agent: Arc<LineageAgent>) -> Served {
        Served {
            agent,
            stop: None,
            running: Arc::new(watch::Sender::new(false)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        lock(&self.tasks)
    }

    /// Answers `responder` with what `work` comes to, on a task of its own, so the connection's
    /// dispatch loop (which runs the handlers one at a time) keeps reading frames,
    /// `session/cancel` among them. The task is waited for at the drain.
    fn answer_later<T, F>(
        self: &Arc<Self>,
        responder: Responder<T>,
        work: impl FnOnce(Arc<State>) -> F,
    ) where
        T: JsonRpcResponse + Send + 'static,
        F: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let work = work(self.clone());
        let mut tasks = self.lock_tasks();
        tasks.retain(|task| !task.is_finished());
        tasks.push(tokio::spawn(async move {
            let _ = responder.respond_with_result(work.await);
        }));
    }

    fn cancel(&self, session: &acp::SessionId) {
        let Ok(id) = session.0.parse::<SessionId>() else {
            return;
        };
        if let Some(stop) = lock(&self.sessions).get(&id).and_then(|s| s.stop.clone()) {
            stop.notify_one();
        }
    }

    fn cancel_all(&self) {
        for served in lock(&self.sessions).values() {
            if let Some(stop) = &served.stop {
                stop.notify_one();
            }
        }
    }

    /// The spec of ACP session `session` in `cwd`, its permission-gated tools wrapped.
    fn spec(&self, session: SessionId, cwd: &Path, connection: &ConnectionTo<Client>) -> AgentSpec {
        let mut spec = (self.spec)(&self.host, cwd);
        for tool in &mut spec.tools {
            if self.options.ask_permission.contains(tool.name()) {
                *tool = Arc::new(AskFirst {
                    inner: tool.clone(),
                    session: session.to_string().into(),
                    connection: connection.clone(),
                });
            }
        }
        spec
    }

    async fn new_session(
        &self,
        request: acp::NewSessionRequest,
        connection: ConnectionTo<Client>,
    ) -> Result<acp::NewSessionResponse, Error> {
        let cwd = working_directory(&request.cwd)?;
        let mut create = CreateAgent::fresh(AgentSpec::default());
        create.spec = self.spec(create.header.id, &cwd, &connection);
        create.header.cwd = Some(cwd.to_string_lossy().as_ref().into());
        let agent = self
            .host
            .agents
            .create(create)
            .await
            .map_err(|e| internal(format!("creating a session: {e}")))?;
        let id = agent.id();
        lock(&self.sessions).insert(id, Served::new(agent));
        Ok(acp::NewSessionResponse::new(id.to_string()))
    }

    async fn load_session(
        &self,
        request: acp::LoadSessionRequest,
        connection: ConnectionTo<Client>,
    ) -> Result<acp::LoadSessionResponse, Error> {
        let id = session_id(&request.session_id)?;
        let live = lock(&self.sessions).get(&id).map(|s| s.agent.clone());
        let agent = match live {
            Some(agent) => agent,
            None => {
                let cwd = working_directory(&request.cwd)?;
                let agent = self
                    .host
                    .resume(id, self.spec(id, &cwd, &connection))
                    .await
                    .map_err(|e| match &e {
                        HostError::Resume { .. } if !self.stored(id) => {
                            Error::from(acp::Error::session_not_found(request.session_id.clone()))
                        }
                        _ => internal(format!("loading session {id}: {e}")),
                    })?;
                lock(&self.sessions).insert(id, Served::new(agent.clone()));
                agent
            }
        };
        let events = agent.with_events(<[Event]>::to_vec);
        for event in &events {
            for update in updates(event, true) {
                send(&connection, &request.session_id, update);
            }
        }
        Ok(acp::LoadSessionResponse::new())
    }

    fn stored(&self, id: SessionId) -> bool {
        self.host.store.info(id).is_ok()
    }

    /// Claims the session for a prompt: its stop is set, so a cancel finds it from now on.
    fn begin_prompt(&self, request: &acp::PromptRequest) -> Result<Begun, Error> {
        let id = session_id(&request.session_id)?;
        let text = prompt_text(&request.prompt)?;
        let stop = Arc::new(Notify::new());
        let mut sessions = lock(&self.sessions);
        let served = sessions.get_mut(&id).ok_or_else(|| {
            Error::from(acp::Error::session_not_found(request.session_id.clone()))
        })?;
        if served.stop.is_some() {
            return Err(Error::invalid_request().data(serde_json::json!({
                "reason": format!("session {id} is already running a prompt"),
            })));
        }
        served.stop = Some(stop.clone());
        served.running.send_replace(true);
        Ok(Begun {
            id,
            agent: served.agent.clone(),
            text,
            stop,
            running: served.running.clone(),
        })
    }

    /// `session/close`: the session leaves the server. A prompt still running is stopped as
    /// `session/cancel` stops it, and waited for until its turn is flushed; then the session's resident children are
    /// torn down and its agent is shut down (its log flushed, pending input kept for a later
    /// `session/load`).
    async fn close_session(
        &self,
        request: acp::CloseSessionRequest,
    ) -> Result<acp::CloseSessionResponse, Error> {
        let id = session_id(&request.session_id)?;
        let served = lock(&self.sessions).remove(&id).ok_or_else(|| {
            Error::from(acp::Error::session_not_found(request.session_id.clone()))
        })?;
        if let Some(stop) = &served.stop {
            stop.notify_one();
        }
        // The sender lives in `served`, so the wait cannot fail: it ends with the prompt.
        let _ = served
            .running
            .subscribe()
            .wait_for(|running| !running)
            .await;
        let agent = served.agent;
        self.host
            .subagents
            .drain_descendants(std::slice::from_ref(&agent))
            .await
            .map_err(|e| internal(format!("closing session {id}: {e}")))?;
        agent
            .shut_down()
            .await
            .map_err(|e| internal(format!("closing session {id}: {e}")))?;
        Ok(acp::CloseSessionResponse::new())
    }

    async fn prompt(
        &self,
        request: acp::PromptRequest,
        begun: Begun,
        connection: ConnectionTo<Client>,
    ) -> Result<acp::PromptResponse, Error> {
        let Begun {
            id,
            agent,
            text,
            stop,
            running,
        } = begun;
        // The session takes prompts again once this one is over, however it ends.
        let _running = Running {
            sessions: &self.sessions,
            id,
            running,
        };
        let mut events = agent.subscribe();
        let forward = |event: AgentEvent| {
            if let AgentEvent::Appended { event, .. } = event {
                for update in updates(&event, false) {
                    send(&connection, &request.session_id, update);
                }
            }
        };
        let message = Message::user_text(text, MessageSource::User);
        let run = self
            .host
            .run_until(&agent, message, async move { stop.notified().await });
        tokio::pin!(run);
        let outcome = loop {
            tokio::select! {
                Some(event) = events.recv() => forward(event),
                outcome = &mut run => {
                    // Everything the run appended was published before it returned.
                    while let Ok(event) = events.try_recv() {
                        forward(event);
                    }
                    break outcome;
                }
            }
        };
        let outcome = outcome.map_err(|e| internal(format!("session {id}: {e}")))?;
        // The answer promises the turn is kept: a client may kill the server the moment it has
        // it and load the session again.
        agent
            .flush()
            .await
            .map_err(|e| internal(format!("session {id}: {e}")))?;
        let reason = if outcome.stopped {
            acp::StopReason::Cancelled
        } else {
            match &outcome.stop_reason {
                Some(reason) => stop_reason(id, reason)?,
                None => return Err(internal(format!("session {id}: the prompt ran no turn"))),
            }
        };
        Ok(acp::PromptResponse::new(reason))
    }
}

/// A turn's end as the protocol's stop reason; a turn that failed is an error, because the
/// protocol has no stop reason for one.
fn stop_reason(id: SessionId, reason: &TurnEndReason) -> Result<acp::StopReason, Error> {
    Ok(match reason {
        TurnEndReason::Completed => acp::StopReason::EndTurn,
        TurnEndReason::MaxTokens => acp::StopReason::MaxTokens,
        TurnEndReason::Aborted { .. } => acp::StopReason::Cancelled,
        TurnEndReason::Blocked => acp::StopReason::Refusal,
        TurnEndReason::Budget(_) => acp::StopReason::MaxTurnRequests,
        TurnEndReason::Error(error) => {
            return Err(
                internal(format!("session {id}: the turn failed: {}", error.message))
                    .data(serde_json::json!({ "code": error.code.as_str() })),
            );
        }
        other => {
            return Err(internal(format!("session {id}: the turn ended {other:?}")));
        }
    })
}

/// An internal error (-32603) saying `message`.
fn internal(message: String) -> Error {
    Error::new(-32603, message)
}

fn session_id(id: &acp::SessionId) -> Result<SessionId, Error> {
    id.0.parse().map_err(|_| {
        Error::invalid_params().data(serde_json::json!({
            "reason": format!("{:?} is not a Lineage session id", id.0),
        }))
    })
}

fn working_directory(cwd: &Path) -> Result<PathBuf, Error> {
    if cwd.is_absolute() {
        Ok(cwd.to_owned())
    } else {
        Err(Error::invalid_params().data(serde_json::json!({
            "reason": format!("cwd {} is not an absolute path", cwd.display()),
        })))
    }
}

/// The text of a prompt: only text content is served (the server announces no other kind).
fn prompt_text(prompt: &[acp::ContentBlock]) -> Result<String, Error> {
    let mut text = String::new();
    for block in prompt {
        match block {
            acp::ContentBlock::Text(t) => text.push_str(&t.text),
            _ => {
                return Err(Error::invalid_params().data(serde_json::json!({
                    "reason": "only text content is served",
                })));
            }
        }
    }
    Ok(text)
}

fn send(connection: &ConnectionTo<Client>, session: &acp::SessionId, update: acp::SessionUpdate) {
    // A client that went away gets nothing more; the prompt runs on to its end regardless.
    let _ = connection.send_notification(acp::SessionNotification::new(session.clone(), update));
}

fn chunk(text: &str) -> acp::ContentChunk {
    acp::ContentChunk::new(acp::ContentBlock::Text(acp::TextContent::new(text)))
}

/// The updates an event makes. Live, only what the agent produces; replayed (`session/load`),
/// the user's own messages too.
fn updates(event: &Event, replay: bool) -> Vec<acp::SessionUpdate> {
    let mut updates = Vec::new();
    match &event.body {
        EventBody::UserMessage(message) if replay && message.source == MessageSource::User => {
            for block in &message.content {
                if let ContentBlock::Text { text } = block {
                    updates.push(acp::SessionUpdate::UserMessageChunk(chunk(text)));
                }
            }
        }
        EventBody::AssistantMessage(assistant) => {
            for block in &assistant.message.content {
                match block {
                    ContentBlock::Text { text } => {
                        updates.push(acp::SessionUpdate::AgentMessageChunk(chunk(text)));
                    }
                    ContentBlock::Reasoning { text } => {
                        updates.push(acp::SessionUpdate::AgentThoughtChunk(chunk(text)));
                    }
                    ContentBlock::ToolCall {
                        id,
                        name,
                        arguments,
                    } => {
                        let input = serde_json::from_str(arguments)
                            .unwrap_or_else(|_| serde_json::Value::String(arguments.to_string()));
                        updates.push(acp::SessionUpdate::ToolCall(
                            acp::ToolCall::new(id.to_string(), name.as_str())
                                .status(acp::ToolCallStatus::Pending)
                                .raw_input(input),
                        ));
                    }
                    _ => {}
                }
            }
        }
        EventBody::ToolCall(call) => {
            updates.push(acp::SessionUpdate::ToolCallUpdate(
                acp::ToolCallUpdate::new(
                    call.call_id.to_string(),
                    acp::ToolCallUpdateFields::new().status(acp::ToolCallStatus::InProgress),
                ),
            ));
        }
        EventBody::ToolResult(result) => {
            for block in &result.message.content {
                if let ContentBlock::ToolResult {
                    tool_call_id,
                    content,
                    is_error,
                } = block
                {
                    let status = if *is_error {
                        acp::ToolCallStatus::Failed
                    } else {
                        acp::ToolCallStatus::Completed
                    };
                    let content: Vec<acp::ToolCallContent> = content
                        .iter()
                        .filter_map(|b| match b {
                            ContentBlock::Text { text } => Some(acp::ToolCallContent::from(
                                acp::ContentBlock::Text(acp::TextContent::new(text.as_str())),
                            )),
                            _ => None,
                        })
                        .collect();
                    updates.push(acp::SessionUpdate::ToolCallUpdate(
                        acp::ToolCallUpdate::new(
                            tool_call_id.to_string(),
                            acp::ToolCallUpdateFields::new()
                                .status(status)
                                .content(content),
                        ),
                    ));
                }
            }
        }
        _ => {}
    }
    updates
}

/// A tool whose every call the client is asked to allow first. The request names the ACP
/// session the tool was given to: a child it delegates to inherits the tool, and the client
/// knows only that session.
struct AskFirst {
    inner: Arc<dyn Tool>,
    session: acp::SessionId,
    connection: ConnectionTo<Client>,
}

/// The option ids the server offers.
const ALLOW: &str = "allow-once";
const REJECT: &str = "reject-once";

impl Tool for AskFirst {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn description(&self) -> &str {
        self.inner.description()
    }

    fn input_schema(&self) -> serde_json::Value {
        self.inner.input_schema()
    }

    fn parallel_safe(&self, arguments: &serde_json::Value) -> bool {
        self.inner.parallel_safe(arguments)
    }

    fn guidance(&self) -> Option<&str> {
        self.inner.guidance()
    }

    fn available(&self) -> bool {
        self.inner.available()
    }

    fn call(&self, ctx: ToolContext, arguments: serde_json::Value) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let request = acp::RequestPermissionRequest::new(
                self.session.clone(),
                acp::ToolCallUpdate::new(
                    ctx.call_id.to_string(),
                    acp::ToolCallUpdateFields::new()
                        .title(self.inner.name())
                        .raw_input(arguments.clone()),
                ),
                vec![
                    acp::PermissionOption::new(
                        ALLOW,
                        "Allow once",
                        acp::PermissionOptionKind::AllowOnce,
                    ),
                    acp::PermissionOption::new(
                        REJECT,
                        "Reject",
                        acp::PermissionOptionKind::RejectOnce,
                    ),
                ],
            );
            let answer = tokio::select! {
                answer = self.connection.send_request(request).block_task() => answer,
                _ = ctx.cancel.cancelled() => {
                    return ToolOutput::error("PermissionCancelled", "CANCELLED", "the call was cancelled while the client was asked");
                }
            };
            match answer {
                Ok(response) => match response.outcome {
                    acp::RequestPermissionOutcome::Selected(selected)
                        if &*selected.option_id.0 == ALLOW =>
                    {
                        self.inner.call(ctx, arguments).await
                    }
                    _ => ToolOutput::error(
                        "PermissionRefused",
                        "PERMISSION_REFUSED",
                        format!(
                            "the client did not allow this call of {}",
                            self.inner.name()
                        ),
                    ),
                },
                Err(error) => ToolOutput::error(
                    "PermissionUnanswered",
                    "PERMISSION_UNANSWERED",
                    format!("asking the client to allow this call failed: {error}"),
                ),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use lineage_log::{BudgetLimit, BudgetReached, MessageId, TurnError};
    use lineage_testkit::ev;

    use super::*;

    fn kinds(body: EventBody, replay: bool) -> Vec<String> {
        updates(&Event::new(0, 0, body), replay)
            .iter()
            .map(|update| match update {
                acp::SessionUpdate::UserMessageChunk(_) => "user".to_owned(),
                acp::SessionUpdate::AgentMessageChunk(_) => "agent".to_owned(),
                acp::SessionUpdate::AgentThoughtChunk(_) => "thought".to_owned(),
                acp::SessionUpdate::ToolCall(call) => format!("call {}", call.title),
                acp::SessionUpdate::ToolCallUpdate(u) => format!("update {:?}", u.fields.status),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn events_become_updates_and_the_users_words_only_in_a_replay() {
        let id = MessageId::new;
        assert_eq!(kinds(ev::user(id(), "hi"), true), ["user"]);
        assert!(kinds(ev::user(id(), "hi"), false).is_empty());
        let content = vec![
            ContentBlock::Reasoning { text: "hmm".into() },
            ContentBlock::text("answer"),
            ev::call_block("c1", "read_file", r#"{"path": "a"}"#),
        ];
        assert_eq!(
            kinds(ev::assistant(1, 1, id(), content), false),
            ["thought", "agent", "call read_file"]
        );
        assert_eq!(
            kinds(ev::tool_call(1, 1, "c1", "read_file", "{}"), false),
            ["update Some(InProgress)"]
        );
        assert_eq!(
            kinds(ev::tool_result(1, 1, id(), "c1", "text"), true),
            ["update Some(Completed)"]
        );
        assert!(kinds(ev::turn_end(1, TurnEndReason::Completed), true).is_empty());
    }

    #[test]
    fn turn_ends_map_to_stop_reasons_and_a_failure_to_an_error() {
        let id = SessionId::new();
        let budget = TurnEndReason::Budget(Box::new(BudgetReached {
            limit: BudgetLimit::Requests,
            max: 3,
            owner: id,
        }));
        for (reason, expected) in [
            (TurnEndReason::Completed, acp::StopReason::EndTurn),
            (TurnEndReason::MaxTokens, acp::StopReason::MaxTokens),
            (
                TurnEndReason::Aborted {
                    cause: lineage_log::AbortCause::User,
                },
                acp::StopReason::Cancelled,
            ),
            (TurnEndReason::Blocked, acp::StopReason::Refusal),
            (budget, acp::StopReason::MaxTurnRequests),
        ] {
            assert_eq!(stop_reason(id, &reason).unwrap(), expected, "{reason:?}");
        }
        let failed = TurnEndReason::Error(Box::new(TurnError {
            message: "the endpoint broke".into(),
            code: "SERVER".into(),
            status: Some(502),
            retry_after_ms: None,
            request_id: None,
        }));
        let error = stop_reason(id, &failed).unwrap_err();
        assert!(error.message.contains("the endpoint broke"), "{error:?}");
        assert_eq!(error.data, Some(serde_json::json!({"code": "SERVER"})));
        assert!(stop_reason(id, &TurnEndReason::Interrupted).is_err());
    }

    #[test]
    fn only_text_prompts_are_served() {
        let text = |t: &str| acp::ContentBlock::Text(acp::TextContent::new(t));
        assert_eq!(prompt_text(&[text("a "), text("b")]).unwrap(), "a b");
        let image = acp::ContentBlock::Image(acp::ImageContent::new("AAAA", "image/png"));
        assert!(prompt_text(&[text("look"), image]).is_err());
    }
}
