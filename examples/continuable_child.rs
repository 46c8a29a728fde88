//! A lead agent delegates to a continuable (background) child, sends it a follow-up, restarts,
//! and sends another: the child is resumed from its log alone and remembers what it said.
//!
//! ```sh
//! cargo run --release --example continuable_child [STORE]
//! ```
//!
//! The models answer from the request alone (a [`Model`] is any type that streams an answer), so
//! the story is the same on every run; a host puts a real endpoint in their place (see the
//! `tool_agent` example). With a `STORE` argument the file is kept: `lineage tree STORE` shows the
//! lead and its child.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lineage::agent::{
    AgentSpec, ChunkStream, CreateAgent, Model, ModelRequest, Response, ScriptedModel,
};
use lineage::log::{ContentBlock, Message, MessageSource, Role, SessionId, TurnEndReason};
use lineage::subagent::tools::SubagentToolConfig;
use lineage::subagent::{Host, SpawnProvider};

const LEAD: &str = "lead";
const WORKER: &str = "worker";
const SUMMARY: &str = "The release adds budgets, crash notices and a stable JSON export.";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let path = std::env::args_os()
        .nth(1)
        .map_or_else(|| dir.path().join("sessions.lineage"), PathBuf::from);

    // The first process: delegate, hear back, follow up.
    let host = Host::open(&path, Arc::new(StoryModel))?;
    let lead = host
        .agents
        .create(CreateAgent::fresh(lead_spec(&host)))
        .await?;
    for prompt in [
        "Start a worker to summarize the release notes.",
        "Ask the worker: which change matters most to hosts?",
    ] {
        let outcome = host.run(&lead, prompt).await?;
        println!("you: {prompt}\nlead: {}\n", outcome.text());
    }
    let lead_id = lead.id();
    let worker = *host
        .store
        .children(lead_id)?
        .first()
        .ok_or("no worker was started")?;
    drop(lead);
    host.close().await?;
    println!(
        "-- restart: the store is closed and opened again, nothing of the worker is in memory\n"
    );

    // The second process: resume the lead; its message resumes the worker from the worker's log.
    let host = Host::open(&path, Arc::new(StoryModel))?;
    let lead = host.resume(lead_id, lead_spec(&host)).await?;
    let prompt = "Ask the worker: what was your first answer?";
    let outcome = host.run(&lead, prompt).await?;
    println!("you: {prompt}\nlead: {}\n", outcome.text());
    drop(lead);
    host.close().await?;

    let turns = stored_turns(&path, worker)?;
    println!("worker {worker}: {turns} completed turns in its log, one of them after the restart");
    if turns != 3 || !outcome.text().contains(SUMMARY) {
        return Err("the worker did not resume with its history".into());
    }
    Ok(())
}

/// The lead: a `subagent` tool that starts continuable children on the `worker` model, and the
/// tools that talk to them (`send_message`, `interrupt_agent`, `list_agents`).
fn lead_spec(host: &Host) -> AgentSpec {
    let delegate = SubagentToolConfig::new(SpawnProvider::NAME)
        .continuable()
        .child_model(WORKER);
    AgentSpec {
        tools: host.delegation_tools(vec![delegate]),
        ..AgentSpec::new("story", LEAD)
    }
}

/// How many of `session`'s turns completed, read back from the store.
fn stored_turns(path: &Path, session: SessionId) -> Result<usize, Box<dyn Error>> {
    let store = lineage::store::Store::open(path)?;
    let events = store.read_from(session, 0)?;
    Ok(events
        .iter()
        .filter(|e| matches!(&e.body, lineage::log::EventBody::TurnEnd(end) if end.reason == TurnEndReason::Completed))
        .count())
}

/// Answers every request from its messages: the lead by what just arrived, the worker by what
/// it was asked.
struct StoryModel;

impl Model for StoryModel {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let response = match request.model.as_str() {
            LEAD => lead(&request.messages),
            _ => worker(&request.messages),
        };
        ScriptedModel::new([response]).stream(request)
    }
}

/// The messages after the last assistant message: what the model is answering.
fn new_messages(messages: &[Message]) -> &[Message] {
    let start = messages.iter().rposition(|m| m.role == Role::Assistant);
    &messages[start.map_or(0, |i| i + 1)..]
}

fn lead(messages: &[Message]) -> Response {
    let new = new_messages(messages);
    // A notice from the worker: pass on its closing message, the notice's last text block.
    if let Some(notice) = new
        .iter()
        .find(|m| matches!(m.source, MessageSource::SubagentSettled { .. }))
    {
        let said = notice.content.iter().rev().find_map(|block| match block {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        });
        return Response::text(&format!("The worker says: {}", said.unwrap_or_default()));
    }
    let Some(prompt) = new
        .iter()
        .find(|m| m.source == MessageSource::User)
        .map(Message::text)
    else {
        return Response::text("Waiting for the worker.");
    };
    if prompt.starts_with("Start a worker") {
        return Response::tool_call(
            "start-worker",
            "subagent",
            r#"{"description": "summarize", "prompt": "Summarize the release notes in one line.", "run_in_background": true}"#,
        );
    }
    // The worker is the sender of the notices the lead has heard.
    let worker = messages.iter().find_map(|m| match m.source {
        MessageSource::SubagentSettled { sender, .. } => Some(sender),
        _ => None,
    });
    match (prompt.strip_prefix("Ask the worker: "), worker) {
        (Some(question), Some(worker)) => {
            let arguments =
                serde_json::json!({"subagent_id": worker.to_string(), "message": question});
            Response::tool_call("ask-worker", "send_message", &arguments.to_string())
        }
        _ => Response::text("I have nothing to do with that."),
    }
}

fn worker(messages: &[Message]) -> Response {
    let asked = new_messages(messages)
        .iter()
        .map(Message::text)
        .collect::<String>();
    if asked.contains("Summarize") {
        Response::text(SUMMARY)
    } else if asked.contains("matters most") {
        Response::text("Crash notices: after a restart, no child is forgotten.")
    } else if asked.contains("first answer") {
        // From the history the resume rebuilt out of the log.
        let first = messages
            .iter()
            .find(|m| m.role == Role::Assistant)
            .map(Message::text);
        Response::text(&format!(
            "My first answer was: {}",
            first.unwrap_or_default()
        ))
    } else {
        Response::text("I was not asked anything I know.")
    }
}
