//! Steps of continuable-children tests (feature `subagent`), each one call: start a child through
//! the `spawn` provider, send it a follow-up, create or resume a parent in a registry of its own,
//! and reopen or stop a host built by [`reopen`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lineage_agent::{Agent, Agents, Cancellation, CreateAgent, Gate, Response, ScriptedModel};
use lineage_log::{ContentBlock, MessageId, MessageSource, SessionId};
use lineage_subagent::{
    ContinuableStarted, SpawnProvider, StartRequest, SubagentError, SubagentRuntime,
};

use crate::subagent::{Router, continuable, parent_spec, reopen};

/// Starts a continuable child of `parent` through the `spawn` provider, labelled `<model> job`
/// and asking `model` (see [`continuable`]); panics if the runtime refuses it.
pub async fn spawn_continuable(
    runtime: &SubagentRuntime,
    parent: &Arc<Agent>,
    model: &str,
    prompt: &str,
) -> ContinuableStarted {
    runtime
        .start_continuable("spawn", continuable(parent, model, prompt))
        .await
        .expect("the continuable child starts")
}

/// Runs `start` through the `spawn` provider as a one-shot child, to its result, and disposes
/// of it: a child that never continues. Returns its id; panics if the run fails to start or end.
pub async fn one_shot_run(runtime: &SubagentRuntime, start: StartRequest) -> SessionId {
    let run = runtime
        .start("spawn", start)
        .await
        .expect("the one-shot run starts");
    run.result().await.expect("the run has a result");
    run.dispose().await.expect("the run is disposed");
    run.id()
}

/// Sends `text` to `child` as a coordinator message of `parent`, with a cancellation nobody
/// fires.
pub async fn send(
    runtime: &SubagentRuntime,
    parent: &Arc<Agent>,
    child: SessionId,
    text: &str,
) -> Result<MessageId, SubagentError> {
    send_cancellable(runtime, parent, child, text, &Cancellation::new()).await
}

/// Sends `text` to `child` as a coordinator message of `parent`, ended early by `cancel`.
pub async fn send_cancellable(
    runtime: &SubagentRuntime,
    parent: &Arc<Agent>,
    child: SessionId,
    text: &str,
    cancel: &Cancellation,
) -> Result<MessageId, SubagentError> {
    let source = MessageSource::Coordinator {
        sender: parent.id(),
    };
    runtime
        .followup(
            parent,
            child,
            vec![ContentBlock::text(text)],
            source,
            cancel,
        )
        .await
}

/// A fresh top-level parent in `agents` asking the `parent` model, with no tools.
pub async fn fresh_parent(agents: &Agents) -> Arc<Agent> {
    agents
        .create(CreateAgent::fresh(parent_spec(Vec::new())))
        .await
        .expect("the parent is created")
}

/// The stored parent `id` made live again in `agents`, with no tools.
pub async fn resumed_parent(agents: &Agents, id: SessionId) -> Arc<Agent> {
    agents
        .resume(id, parent_spec(Vec::new()))
        .await
        .expect("the parent resumes")
}

/// Drains `runtime` and disposes of every agent of `agents`, as a host does when it stops.
pub async fn shut_down(runtime: &SubagentRuntime, agents: &Agents) {
    runtime.drain().await.expect("the runtime drains");
    agents.dispose_all().await;
}

/// Scripts `model` to answer its next request with `text` once the returned gate opens.
pub fn gated_text(model: &ScriptedModel, text: &str) -> Gate {
    let gate = Gate::new();
    model.push([Response::text(text).gated(&gate)]);
    gate
}

/// A temporary directory and the path of a host's store file in it, for hosts [`reopen`]ed
/// across a restart; the file goes with the directory.
pub fn host_store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("host.lineage");
    (dir, path)
}

/// [`reopen`] with the `spawn` provider registered, as a host that delegates builds it.
pub fn reopen_with_spawn(path: &Path) -> (Arc<Router>, Agents, SubagentRuntime) {
    let (router, agents, runtime) = reopen(path);
    runtime
        .register_provider(Arc::new(SpawnProvider::new()))
        .expect("spawn registers");
    (router, agents, runtime)
}
