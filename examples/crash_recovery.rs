//! A host process is killed while its lead's background child is mid-turn. The next process
//! resumes the lead with `Host::resume`, which finds the torn child in the store and tells the
//! lead, once, that a crash stopped it; a second restart tells it nothing new.
//!
//! ```sh
//! cargo run --release --example crash_recovery [STORE]
//! ```
//!
//! The example runs itself again as the host to kill (`crash_recovery --host STORE`) and kills
//! it with SIGKILL once the child is waiting for its model: nothing closes the child's turn but
//! the recovery. The models answer from the request alone, as in `continuable_child`.

use std::error::Error;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use lineage::agent::{
    AgentSpec, AgentStatus, ChunkStream, CreateAgent, Model, ModelRequest, Response, ScriptedModel,
};
use lineage::log::{ContentBlock, Message, MessageSource, Role, SessionId, model_history};
use lineage::subagent::tools::SubagentToolConfig;
use lineage::subagent::{Host, SpawnProvider};
use tokio::sync::Notify;

const LEAD: &str = "lead";
const WORKER: &str = "worker";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args_os().skip(1);
    let first = args.next();
    if first.as_deref() == Some("--host".as_ref()) {
        let path = PathBuf::from(args.next().ok_or("--host needs a store path")?);
        return host_to_kill(&path).await;
    }
    let dir = tempfile::tempdir()?;
    let path = first.map_or_else(|| dir.path().join("sessions.lineage"), PathBuf::from);

    // The first process, killed once its lead has delegated and the child waits for its model.
    let mut process = Command::new(std::env::current_exe()?)
        .arg("--host")
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()?;
    // Its first line, read on a thread of its own so that a host that never gets there is
    // killed after a while instead of hanging this program.
    let stdout = process.stdout.take().ok_or("no stdout")?;
    let (first_line, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = first_line.send(BufReader::new(stdout).lines().next());
    });
    let lead_id: SessionId = match read.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(Some(line)) => line?.trim_start_matches("lead ").parse()?,
        Ok(None) => return Err(format!("the host process ended first: {}", process.wait()?).into()),
        Err(_) => {
            process.kill()?;
            return Err("the host process did not delegate within two minutes".into());
        }
    };
    process.kill()?; // SIGKILL: no destructor, no flush, no goodbye
    println!("killed the host process ({}) mid-turn", process.wait()?);

    // Two restarts: the first tells the lead, the second finds nothing new to tell.
    for restart in 1..=2 {
        let host = Host::open(&path, Arc::new(StoryModel::default()))?;
        let lead = host.resume(lead_id, lead_spec(&host)).await?;
        let prompt = "What happened while I was away?";
        let outcome = host.run(&lead, prompt).await?;
        let notices = model_history(&lead.events())
            .iter()
            .filter(|m| matches!(m.source, MessageSource::SubagentSettled { .. }))
            .count();
        println!("restart {restart}: the lead's log holds {notices} notice of the crash");
        println!("  you: {prompt}\n  lead: {}", outcome.text());
        drop(lead);
        host.close().await?;
        if notices != 1 {
            return Err(format!("expected exactly one notice, found {notices}").into());
        }
    }
    Ok(())
}

/// The process to kill: the lead delegates in the background, and once the child has asked its
/// model (everything before a model request is durable) and the lead is idle, prints the lead's
/// id and waits to be killed.
async fn host_to_kill(path: &Path) -> Result<(), Box<dyn Error>> {
    let model = Arc::new(StoryModel::default());
    let host = Host::open(path, model.clone())?;
    let lead = host
        .agents
        .create(CreateAgent::fresh(lead_spec(&host)))
        .await?;
    let mut changes = lead.changes();
    lead.followup(Message::user_text(
        "Start a worker on the index.",
        MessageSource::User,
    ))?;
    model.worker_asked.notified().await;
    while lead.status() != AgentStatus::Idle {
        changes.changed().await?;
    }
    println!("lead {}", lead.id());
    std::future::pending::<()>().await;
    Ok(())
}

fn lead_spec(host: &Host) -> AgentSpec {
    let delegate = SubagentToolConfig::new(SpawnProvider::NAME)
        .continuable()
        .child_model(WORKER);
    AgentSpec {
        tools: host.delegation_tools(vec![delegate]),
        ..AgentSpec::new("story", LEAD)
    }
}

/// The lead delegates when asked, and passes on a notice; the worker never answers.
#[derive(Default)]
struct StoryModel {
    worker_asked: Notify,
}

impl Model for StoryModel {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let response = if request.model.as_str() == LEAD {
            lead(&request.messages)
        } else {
            self.worker_asked.notify_one();
            Response::hang()
        };
        ScriptedModel::new([response]).stream(request)
    }
}

fn lead(messages: &[Message]) -> Response {
    let start = messages.iter().rposition(|m| m.role == Role::Assistant);
    let new = &messages[start.map_or(0, |i| i + 1)..];
    let notices: Vec<&Message> = messages
        .iter()
        .filter(|m| matches!(m.source, MessageSource::SubagentSettled { .. }))
        .collect();
    let asked = new.iter().map(Message::text).collect::<String>();
    let answer = if asked.starts_with("Start a worker") {
        return Response::tool_call(
            "start-worker",
            "subagent",
            r#"{"description": "index", "prompt": "Index the files.", "run_in_background": true}"#,
        );
    } else if new
        .iter()
        .any(|m| matches!(m.source, MessageSource::Tool { .. }))
    {
        "The worker is on it.".to_owned()
    } else if asked.starts_with("What happened") {
        match notices.last() {
            Some(notice) => format!(
                "{} notice so far; the last: {}",
                notices.len(),
                lines(notice)
            ),
            None => "No child has settled.".to_owned(),
        }
    } else {
        // A notice starts a turn of its own: acknowledge it.
        "Noted.".to_owned()
    };
    Response::text(&answer)
}

/// A message's text blocks, one per line.
fn lines(message: &Message) -> String {
    let texts = message.content.iter().filter_map(|block| match block {
        ContentBlock::Text { text } => Some(text.as_str()),
        _ => None,
    });
    texts.collect::<Vec<_>>().join("\n    ")
}
