//! `lineage demo`: a scripted multi-agent run into a store file, then a restart and a cold
//! resume, then the tree and the verify summary of what it wrote.
//!
//! The lead agent takes a first turn, then delegates three tasks in one message: an audit and a
//! benchmark to continuable `spawn` children (in the background) and a review to a one-shot
//! `fork` child that inherits the lead's completed turn. The auditor reports mid-work and
//! settles; its notice makes the lead send it a follow-up and interrupt the benchmark. The demo
//! then closes everything, reopens the store as a new process would (no provider registered)
//! and has the lead message the auditor again, which resumes it from its log alone.
//!
//! The models are scripted ([`DemoModel`]): each answer is chosen from the request alone, so the
//! run needs no network and tells the same story every time.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lineage_agent::{
    Agent, AgentEvent, AgentOptions, AgentSpec, Agents, ChunkStream, CreateAgent, Model,
    ModelRequest, Response, ScriptedModel,
};
use lineage_log::{
    ContentBlock, EventBody, Message, MessageSource, Role, SessionId, fold_descriptor,
};
use lineage_subagent::tools::SubagentToolConfig;
use lineage_subagent::{ForkProvider, Lifecycle, SpawnProvider};
use tokio::sync::mpsc;

use crate::cli::{DemoArgs, Output, TreeArgs, VerifyArgs};
use crate::commands;
use crate::error::{CliError, EXIT_OK};
use crate::host::{Host, child_message_line, one_line, open_host, result_text};

/// The default store file, in the working directory.
pub const DEFAULT_STORE: &str = "lineage-demo.lineage";

/// How long one step of the story may take before the demo gives up.
const STALL: std::time::Duration = std::time::Duration::from_secs(60);

const LEAD: &str = "lead";
const WORKER: &str = "worker";
const REVIEWER: &str = "reviewer";

/// Runs the demo, writing its story to `out`.
pub fn run(args: &DemoArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let path = args
        .store
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STORE));
    let shown = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| CliError::Demo(format!("cannot start the async runtime: {e}")))?;
    let (lead, auditor) = runtime.block_on(story(&path, &shown, out))?;
    drop(runtime);
    let store = path.clone();
    section(
        out,
        "The lineage tree of this run, read back from the store",
    )?;
    commands::run_tree(
        &TreeArgs {
            store: store.clone(),
            root: Some(lead.to_string()),
            output: Output { json: false },
        },
        out,
    )?;
    section(out, "Verify")?;
    let verified = commands::run_verify(
        &VerifyArgs {
            store,
            session: None,
            output: Output { json: false },
        },
        out,
    )?;
    let p = shell_path(&shown);
    section(out, "Try next")?;
    for line in [
        format!("lineage ls {p}"),
        format!("lineage tree {p} {lead}"),
        format!("lineage show {p} {lead}"),
        format!("lineage show {p} {auditor}"),
        format!("lineage fold {p} {auditor}"),
        format!("lineage export {p} {auditor}"),
        format!("lineage stats {p}"),
    ] {
        writeln!(out, "  {line}").map_err(CliError::Output)?;
    }
    writeln!(
        out,
        "\n(from a checkout: cargo run --release -p lineage-cli -- <command> ...)"
    )
    .map_err(CliError::Output)?;
    Ok(if verified == EXIT_OK {
        EXIT_OK
    } else {
        verified
    })
}

fn shell_path(path: &Path) -> String {
    let s = path.display().to_string();
    if s.contains(char::is_whitespace) {
        format!("'{s}'")
    } else {
        s
    }
}

fn section(out: &mut dyn Write, title: &str) -> Result<(), CliError> {
    writeln!(out, "\n== {title}").map_err(CliError::Output)
}

fn failed(what: &str) -> impl Fn(String) -> CliError + '_ {
    move |reason| CliError::Demo(format!("{what}: {reason}"))
}

/// The whole scripted run. Returns the lead's and the auditor's ids.
async fn story(
    path: &Path,
    shown: &Path,
    out: &mut dyn Write,
) -> Result<(SessionId, SessionId), CliError> {
    writeln!(
        out,
        "Lineage demo: a lead agent delegates to three subagents, hears back, follows up, \
         and resumes a child after a restart.\nstore: {}",
        shown.display()
    )
    .map_err(CliError::Output)?;

    // ----- first process --------------------------------------------------------------------
    let host = DemoHost::open(path, true)?;
    let lead = host
        .host
        .agents
        .create(CreateAgent::fresh(host.lead_spec()))
        .await
        .map_err(|e| failed("creating the lead agent")(e.to_string()))?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    host.narrate(&lead, tx.clone());

    section(out, "1. The lead takes a first turn")?;
    host.say(&lead, "We are preparing release 0.2 of the store.")?;
    host.settle(&lead, &mut rx, out).await?;

    section(
        out,
        "2. It delegates three tasks at once: two background children and a fork",
    )?;
    host.say(
        &lead,
        "Plan the release checks and hand them out: audit, benchmark, review.",
    )?;
    host.settle(&lead, &mut rx, out).await?;
    let auditor = auditor_id(&lead.events())
        .ok_or_else(|| CliError::Demo("the lead never started the auditor".into()))?;
    let lead_id = lead.id();
    // Every handle goes, so the store is closed as if the process had exited.
    drop(lead);

    section(out, "3. The host stops; a new process opens the same store")?;
    host.close().await?;
    writeln!(
        out,
        "    closed every agent and the store; reopening with no provider registered"
    )
    .map_err(CliError::Output)?;
    let host = DemoHost::open(path, false)?;
    let lead = host
        .host
        .agents
        .resume(lead_id, host.lead_spec())
        .await
        .map_err(|e| failed("resuming the lead")(e.to_string()))?;
    host.narrate(&lead, tx);

    section(
        out,
        "4. The lead messages the auditor, which resumes from its log alone",
    )?;
    host.say(&lead, "Ask the auditor for a one-line summary.")?;
    host.settle(&lead, &mut rx, out).await?;
    drop(lead);
    host.close().await?;
    Ok((lead_id, auditor))
}

/// The demo's host: the shared runtime, its agents answered by [`DemoModel`].
struct DemoHost {
    host: Host,
}

impl DemoHost {
    fn open(path: &Path, with_providers: bool) -> Result<DemoHost, CliError> {
        let host = open_host(path, Arc::new(DemoModel), with_providers).map_err(CliError::Demo)?;
        Ok(DemoHost { host })
    }

    /// Tears down every resident child and agent and closes the store.
    async fn close(self) -> Result<(), CliError> {
        self.host
            .close()
            .await
            .map_err(|e| CliError::Demo(e.to_string()))
    }

    /// The lead's tools: background delegation to `spawn`, a foreground `review` through `fork`,
    /// and the controls.
    fn lead_spec(&self) -> AgentSpec {
        let delegate = SubagentToolConfig::new(SpawnProvider::NAME)
            .continuable()
            .child_model(WORKER);
        let review = SubagentToolConfig {
            tool_name: "review".into(),
            ..SubagentToolConfig::new(ForkProvider::NAME).child_model(REVIEWER)
        };
        let tools = self.host.delegation_tools(vec![delegate, review]);
        AgentSpec {
            options: AgentOptions {
                endpoint: Some("scripted".into()),
                model: Some(LEAD.into()),
                max_tokens: Some(2048),
                subagent_depth: 0,
            },
            tools,
            ..AgentSpec::default()
        }
    }

    fn say(&self, lead: &Arc<Agent>, text: &str) -> Result<(), CliError> {
        lead.followup(Message::user_text(text, MessageSource::User))
            .map_err(|e| failed("sending to the lead")(e.to_string()))
    }

    /// Forwards what is worth telling about `lead` and its children to `tx`, as lines.
    fn narrate(&self, lead: &Arc<Agent>, tx: mpsc::UnboundedSender<Line>) {
        let agents = self.host.agents.clone();
        let lifecycle = tx.clone();
        self.host.subagents.on_lifecycle(move |event| {
            let _ = lifecycle.send(Line::Lifecycle(describe(&agents, event)));
            Ok(())
        });
        let mut events = lead.subscribe();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let Some(line) = lead_line(&event)
                    && tx.send(Line::Text(line)).is_err()
                {
                    break;
                }
            }
        });
    }

    /// Prints lines until the lead is idle with nothing pending and no child is resident. The
    /// scripted run takes milliseconds; a step that has not settled within [`STALL`] is a
    /// failure, reported rather than waited on forever.
    async fn settle(
        &self,
        lead: &Arc<Agent>,
        rx: &mut mpsc::UnboundedReceiver<Line>,
        out: &mut dyn Write,
    ) -> Result<(), CliError> {
        tokio::time::timeout(STALL, self.settle_quietly(lead, rx, out))
            .await
            .map_err(|_| {
                CliError::Demo(format!(
                    "the run did not settle within {} seconds",
                    STALL.as_secs()
                ))
            })?
    }

    async fn settle_quietly(
        &self,
        lead: &Arc<Agent>,
        rx: &mut mpsc::UnboundedReceiver<Line>,
        out: &mut dyn Write,
    ) -> Result<(), CliError> {
        loop {
            tokio::select! {
                line = rx.recv() => match line {
                    Some(line) => print_line(out, &line)?,
                    None => return Ok(()),
                },
                () = lead.when_idle() => {
                    // Let the event feeds catch up before deciding that all is quiet.
                    tokio::task::yield_now().await;
                    while let Ok(line) = rx.try_recv() {
                        print_line(out, &line)?;
                    }
                    if self.host.is_quiet(lead) {
                        return Ok(());
                    }
                    // Something is still going on: wait for its next line.
                    match rx.recv().await {
                        Some(line) => print_line(out, &line)?,
                        None => return Ok(()),
                    }
                }
            }
        }
    }
}

/// A line of the story.
enum Line {
    Text(String),
    Lifecycle(String),
}

fn print_line(out: &mut dyn Write, line: &Line) -> Result<(), CliError> {
    let text = match line {
        Line::Text(text) | Line::Lifecycle(text) => text,
    };
    writeln!(out, "    {text}").map_err(CliError::Output)
}

fn describe(agents: &Agents, event: &Lifecycle) -> String {
    let info = event.info();
    let label = agents
        .get(info.child)
        .and_then(|child| child.with_events(|e| fold_descriptor(e).and_then(|d| d.label.clone())))
        .map(|l| format!(" \"{l}\""))
        .unwrap_or_default();
    match event {
        Lifecycle::Start(_) => format!("+ child {}{label} started ({})", info.child, info.provider),
        Lifecycle::End { stop_reason, .. } => {
            format!("- child {} settled: {stop_reason}", info.child)
        }
    }
}

/// What the narration says about one of the lead's events.
fn lead_line(event: &AgentEvent) -> Option<String> {
    match event {
        AgentEvent::Appended { event, .. } => match &event.body {
            EventBody::AssistantMessage(m) => {
                let text = m.message.text();
                (!text.is_empty()).then(|| format!("lead: {}", one_line(&text)))
            }
            EventBody::ToolCall(call) => Some(format!(
                "lead calls {} {}",
                call.name,
                one_line(&call.arguments)
            )),
            EventBody::ToolResult(result) => {
                let text = result_text(&result.message);
                Some(format!("  -> {}", one_line(&text)))
            }
            _ => None,
        },
        AgentEvent::InboxInserted { message, .. } => child_message_line(message),
        _ => None,
    }
}

/// The auditor's id, from the result of the lead's `audit` delegation.
fn auditor_id(events: &[lineage_log::Event]) -> Option<SessionId> {
    let messages: Vec<Message> = events
        .iter()
        .filter_map(|e| e.body.history_message().cloned())
        .collect();
    started_child(&messages, AUDIT_CALL)
}

// ----- the scripted models --------------------------------------------------------------------

const AUDIT_CALL: &str = "delegate-audit";
const BENCH_CALL: &str = "delegate-bench";

/// Answers every request from the request alone: the lead by what just arrived, the workers by
/// what they were asked.
struct DemoModel;

impl Model for DemoModel {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let response = match request.model.as_str() {
            LEAD => lead(&request.messages),
            WORKER => worker(&request.messages),
            REVIEWER => Response::text(
                "Reviewed the plan against our first exchange: audit and benchmark cover the \
                 store; add a changelog check before tagging.",
            ),
            other => Response::error("UNKNOWN_MODEL", &format!("no script for model {other:?}")),
        };
        ScriptedModel::new([response]).stream(request)
    }
}

/// The messages after the last assistant message: what the model is answering.
fn trailing(messages: &[Message]) -> &[Message] {
    let start = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .map_or(0, |i| i + 1);
    &messages[start..]
}

fn lead(messages: &[Message]) -> Response {
    let new = trailing(messages);
    let said = |needle: &str| {
        new.iter()
            .any(|m| m.source == MessageSource::User && m.text().contains(needle))
    };
    let auditor = started_child(messages, AUDIT_CALL);
    let auditor_settled = auditor.is_some_and(|a| {
        new.iter().any(
            |m| matches!(m.source, MessageSource::SubagentSettled { sender, .. } if sender == a),
        )
    });
    let followed_up = messages.iter().any(|m| {
        m.content.iter().any(
            |b| matches!(b, ContentBlock::ToolCall { name, .. } if name.as_str() == "send_message"),
        )
    });
    if said("Plan the release") {
        return Response::tool_calls(
            Some("Three independent checks; I will run them side by side."),
            &[
                (
                    AUDIT_CALL,
                    "subagent",
                    r#"{"description":"audit dependencies","prompt":"Audit the workspace dependencies: list outdated crates and licence concerns."}"#,
                ),
                (
                    BENCH_CALL,
                    "subagent",
                    r#"{"description":"benchmark replay","prompt":"Benchmark replay of a 1.3M-event store against the baseline."}"#,
                ),
                (
                    "review-plan",
                    "review",
                    r#"{"description":"review the plan","prompt":"Review the release plan we discussed and name anything missing."}"#,
                ),
            ],
        );
    }
    if let (Some(auditor), true, false) = (auditor, auditor_settled, followed_up) {
        let bench = started_child(messages, BENCH_CALL);
        let mut calls = vec![(
            "follow-up-audit".to_owned(),
            "send_message",
            format!(
                r#"{{"subagent_id":"{auditor}","message":"Also check the licences of the outdated crates."}}"#
            ),
        )];
        if let Some(bench) = bench {
            calls.push((
                "stop-bench".to_owned(),
                "interrupt_agent",
                format!(r#"{{"agent_id":"{bench}"}}"#),
            ));
        }
        let calls: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|(id, name, args)| (id.as_str(), *name, args.as_str()))
            .collect();
        return Response::tool_calls(
            Some("The audit is in. One more question for the auditor; the benchmark can stop."),
            &calls,
        );
    }
    if said("Ask the auditor")
        && let Some(auditor) = auditor
    {
        return Response::tool_call(
            "summary-audit",
            "send_message",
            &format!(
                r#"{{"subagent_id":"{auditor}","message":"Summarise your findings in one line."}}"#
            ),
        );
    }
    if said("release 0.2") {
        return Response::text("Understood: release 0.2 of the store. Tell me what to check.");
    }
    let answered = |call: &str| {
        new.iter().any(
            |m| matches!(&m.source, MessageSource::Tool { call_id } if call_id.as_str() == call),
        )
    };
    if answered("summary-audit") {
        return Response::text("Asked the auditor; its answer comes with its settlement notice.");
    }
    let reported = new
        .iter()
        .any(|m| matches!(m.source, MessageSource::SubagentReport { .. }));
    if reported {
        return Response::text("Noted the auditor's interim finding.");
    }
    if new
        .iter()
        .any(|m| matches!(m.source, MessageSource::SubagentSettled { .. }))
    {
        return Response::text("Acknowledged.");
    }
    Response::text("Waiting for the background children.")
}

fn worker(messages: &[Message]) -> Response {
    let asked = |needle: &str| {
        messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User && !matches!(m.source, MessageSource::Tool { .. }))
            .is_some_and(|m| m.text().contains(needle))
    };
    if messages
        .iter()
        .any(|m| m.text().contains("Benchmark replay"))
    {
        // Runs until it is interrupted.
        return Response::hang();
    }
    let reported = trailing(messages)
        .iter()
        .any(|m| matches!(m.source, MessageSource::Tool { .. }));
    if reported && asked("Audit the workspace") {
        return Response::text(
            "Audit finished: serde, tokio and redb are one minor version behind; nothing else \
             is outdated.",
        );
    }
    if asked("licences") {
        return Response::text("Licences checked: all three are MIT or Apache-2.0.");
    }
    if asked("Summarise") {
        return Response::text("Three crates to bump; licences are clean.");
    }
    Response::tool_call(
        "interim",
        "report",
        r#"{"output":"Interim: 3 of 41 dependencies are outdated; checking the rest."}"#,
    )
}

/// The child a delegation call started, read from its tool result (`Started subagent <id>.`).
fn started_child(messages: &[Message], call: &str) -> Option<SessionId> {
    messages
        .iter()
        .filter(
            |m| matches!(&m.source, MessageSource::Tool { call_id } if call_id.as_str() == call),
        )
        .flat_map(|m| {
            let text = result_text(m);
            text.split_whitespace()
                .filter_map(|w| w.trim_end_matches('.').parse::<SessionId>().ok())
                .collect::<Vec<_>>()
        })
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::user_text(text, MessageSource::User)
    }

    #[test]
    fn the_lead_delegates_three_tasks_in_one_message_when_asked_to_plan() {
        let response = format!("{:?}", lead(&[user("Plan the release checks")]));
        for call in [AUDIT_CALL, BENCH_CALL, "review-plan"] {
            assert!(response.contains(call), "{call} in {response}");
        }
    }

    #[test]
    fn the_auditor_reports_before_it_answers_and_the_benchmark_runs_until_stopped() {
        let first = format!("{:?}", worker(&[user("Audit the workspace dependencies")]));
        assert!(first.contains("report"), "{first}");
        let bench = worker(&[user("Benchmark replay of a store")]);
        assert!(matches!(bench, Response::Hang(_)));
    }

    #[test]
    fn a_started_child_is_found_by_its_delegation_call() {
        let id = SessionId::new();
        let result = Message {
            id: lineage_log::MessageId::new(),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: AUDIT_CALL.into(),
                content: vec![ContentBlock::text(format!("Started subagent {id}. More."))],
                is_error: false,
            }],
            source: MessageSource::Tool {
                call_id: AUDIT_CALL.into(),
            },
        };
        assert_eq!(
            started_child(std::slice::from_ref(&result), AUDIT_CALL),
            Some(id)
        );
        assert_eq!(started_child(&[result], BENCH_CALL), None);
    }
}
