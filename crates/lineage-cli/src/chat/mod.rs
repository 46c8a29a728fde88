//! `lineage chat`: a reference host on a real model.
//!
//! One root agent, answered by the model `--model` (or `LINEAGE_MODEL`) names through
//! lineage-models' router, with the delegation tools (`subagent` spawns a continuable child,
//! `subagent_fork` a continuable child that sees the conversation, `send_message`, `interrupt_agent`,
//! `list_agents`) and two read-only file tools confined to the working directory
//! ([`files`]). Children use the same router and model as the root, and get the root's tools.
//!
//! A prompt is one root turn; the command then waits until the root and every resident child
//! are quiet. The runtime delivers each child's settlement notice to the root, which takes it
//! as a further turn; at most [`MAX_ROOT_TURNS`] root turns run for one prompt, so a model that
//! answers every notice by delegating again cannot loop forever. Past the bound (or on Ctrl-C)
//! the [`brake`] refuses every further step of the root and of every continuable child before
//! it asks the model, the running turn is cancelled and the resident children interrupted, so
//! the work winds down to quiet.
//!
//! Output, as text: the root's streamed text as it arrives, each tool call and result, each
//! child report and settlement notice on its own line, and a `turn ended:` line for a turn that
//! did not complete. With `--json`, each event the root appends, one JSON object per line, in
//! the log's serde form (as `lineage export` writes them). The session id is printed first
//! (on stderr with `--json`), for `--resume`.

mod brake;
pub(crate) mod files;

use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::sync::Arc;

use lineage_agent::{Agent, AgentEvent, AgentOptions, AgentSpec, CreateAgent};
use lineage_log::{EventBody, Message, MessageSource, StreamChunk, TurnEndReason};
use lineage_models::{ModelChoice, Models};
use lineage_subagent::tools::SubagentToolConfig;
use tokio::sync::mpsc;

use crate::cli::ChatArgs;
use crate::commands::write_json_line;
use crate::error::{CliError, EXIT_OK};
use crate::host::{Host, child_message_line, one_line, open_host, result_text};
use crate::open::Opened;
use crate::render::stop_detail;
use brake::Brake;
use files::{ListDirTool, ReadFileTool, Root};

/// The most root turns one prompt may take: the prompt's own turn and the turns its children's
/// notices start.
pub const MAX_ROOT_TURNS: u32 = 16;

/// The exit code after Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Runs `lineage chat`: the conversation on `out` (the session id on `err` with `--json`).
pub fn run(args: &ChatArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, CliError> {
    let (models, choice) = Models::from_env(args.model.as_deref(), |v| std::env::var(v).ok())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let input = Input::choose(args.prompt.clone())?;
    let cwd = std::env::current_dir()
        .and_then(|dir| Root::new(&dir))
        .map_err(|e| CliError::Chat(format!("cannot use the working directory: {e}")))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Chat(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        let host = open_host(&args.store, Arc::new(models), true)
            .map_err(|e| CliError::CannotOpen(format!("{}: {e}", args.store.display())))?;
        let brake = Brake::new();
        host.subagents
            .register_continuable_setup(brake.child_setup());
        let conversed = converse(&host, args, &choice, cwd, brake, input, out, err).await;
        // Shut down whatever happened: children drained, agents disposed, the store flushed.
        let closed = host
            .close()
            .await
            .map_err(|e| CliError::Chat(e.to_string()));
        let code = conversed?;
        closed?;
        Ok(code)
    })
}

/// Where prompts come from.
enum Input {
    /// One prompt (the argument, or the whole of a piped stdin).
    Once(String),
    /// Lines typed at a terminal, one prompt each, until end of input.
    Lines,
}

impl Input {
    fn choose(prompt: Option<String>) -> Result<Input, CliError> {
        if let Some(prompt) = prompt {
            return Ok(Input::Once(prompt));
        }
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            return Ok(Input::Lines);
        }
        let mut text = String::new();
        stdin
            .lock()
            .read_to_string(&mut text)
            .map_err(|e| CliError::Usage(format!("cannot read the prompt from stdin: {e}")))?;
        if text.trim().is_empty() {
            return Err(CliError::Usage(
                "no prompt: give one as an argument or on stdin".into(),
            ));
        }
        Ok(Input::Once(text))
    }
}

/// The conversation, from the root's creation (or resume) to the last prompt's quiet.
#[allow(clippy::too_many_arguments)]
async fn converse(
    host: &Host,
    args: &ChatArgs,
    choice: &ModelChoice,
    cwd: Root,
    brake: Arc<Brake>,
    input: Input,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    let spec = root_spec(host, choice, cwd, &brake);
    let root = match &args.resume {
        Some(session) => resume_root(host, &args.store, session, spec).await?,
        None => host
            .agents
            .create(CreateAgent::fresh(spec))
            .await
            .map_err(|e| CliError::Chat(format!("creating the root agent: {e}")))?,
    };
    let (interrupt, interrupts) = mpsc::unbounded_channel();
    listen_for_ctrl_c(interrupt);
    let feed = Feed::new(host, &root, interrupts);
    let shown: &mut dyn Write = if args.json { &mut *err } else { &mut *out };
    writeln!(shown, "session: {}", root.id())?;
    shown.flush()?;
    let mut chat = Conversation {
        host,
        root,
        feed,
        brake,
        printer: Printer {
            json: args.json,
            mid_line: false,
        },
    };
    match input {
        Input::Once(prompt) => chat.prompt(&prompt, out, err).await?.exit_code(),
        Input::Lines => {
            let mut lines = read_lines();
            loop {
                write!(err, "> ")?;
                err.flush()?;
                let line = tokio::select! {
                    line = lines.recv() => line,
                    // Ctrl-C at the prompt, with nothing running, ends the chat.
                    Some(()) = chat.feed.interrupts.recv() => None,
                };
                let Some(line) = line else {
                    writeln!(err)?;
                    return Ok(EXIT_OK);
                };
                if line.trim().is_empty() {
                    continue;
                }
                if chat.prompt(&line, out, err).await?.stopped == Some(Stop::Exit) {
                    return Ok(EXIT_INTERRUPTED);
                }
            }
        }
    }
}

/// The root's spec: delegation (continuable `subagent` and `subagent_fork`, and the controls)
/// and the file tools, on the chosen endpoint and model, its steps gated by the brake.
fn root_spec(host: &Host, choice: &ModelChoice, cwd: Root, brake: &Arc<Brake>) -> AgentSpec {
    let mut tools = host.delegation_tools(SubagentToolConfig::in_process_rows());
    tools.push(ReadFileTool::new(cwd.clone()));
    tools.push(ListDirTool::new(cwd));
    AgentSpec {
        options: AgentOptions {
            endpoint: Some(choice.endpoint.as_str().into()),
            model: Some(choice.model.as_str().into()),
            max_tokens: None,
            subagent_depth: 0,
        },
        tools,
        hooks: Some(brake.root_hooks()),
        ..AgentSpec::default()
    }
}

/// Resumes the stored root session `session` names. A child session is refused: its parent
/// owns it, and resuming it as a root would cut it from its notices.
async fn resume_root(
    host: &Host,
    path: &Path,
    session: &str,
    spec: AgentSpec,
) -> Result<Arc<Agent>, CliError> {
    let opened = Opened {
        store: host.store.clone(),
        path: path.to_owned(),
    };
    let info = opened.resolve(session)?;
    let id = info.header.id;
    if let Some(parent) = info.header.parent {
        return Err(CliError::Usage(format!(
            "session {id} is a subagent of {parent}: resume its root session instead"
        )));
    }
    host.agents
        .resume(id, spec)
        .await
        .map_err(|e| CliError::Chat(format!("resuming session {id}: {e}")))
}

/// What the chat listens to: the root's events, a wake-up whenever a child's activation ends
/// (so the quiet test runs again), and Ctrl-C.
struct Feed {
    events: mpsc::UnboundedReceiver<AgentEvent>,
    wakes: mpsc::UnboundedReceiver<()>,
    interrupts: mpsc::UnboundedReceiver<()>,
}

impl Feed {
    /// The feed of `root`, with Ctrl-C (or whatever sends to it) on `interrupts`.
    fn new(host: &Host, root: &Arc<Agent>, interrupts: mpsc::UnboundedReceiver<()>) -> Feed {
        let (wake, wakes) = mpsc::unbounded_channel();
        host.subagents.on_lifecycle(move |_| {
            let _ = wake.send(());
            Ok(())
        });
        Feed {
            events: root.subscribe(),
            wakes,
            interrupts,
        }
    }
}

/// Sends one `()` to `interrupt` per Ctrl-C. On Unix the handler is installed before this
/// returns, so a Ctrl-C after the session line is printed is never the default one (which
/// would end the process unflushed). If it cannot be installed, Ctrl-C keeps its default.
fn listen_for_ctrl_c(interrupt: mpsc::UnboundedSender<()>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::interrupt()) {
            Ok(mut signals) => {
                tokio::spawn(async move {
                    while signals.recv().await.is_some() {
                        forward(&interrupt);
                    }
                });
            }
            Err(error) => tracing::warn!(%error, "Ctrl-C cannot be handled; it ends the chat"),
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            forward(&interrupt);
        }
    });
}

/// Hands one Ctrl-C to the conversation; once it no longer listens (the chat is shutting down),
/// a Ctrl-C ends the process at once, so a shutdown that hangs never needs a kill. The store
/// stays sound: an unflushed tail is what crash repair is for.
fn forward(interrupt: &mpsc::UnboundedSender<()>) {
    if interrupt.send(()).is_err() {
        eprintln!("lineage: interrupted while shutting down: exiting at once");
        std::process::exit(i32::from(EXIT_INTERRUPTED));
    }
}

/// Typed lines, read on a thread of their own (reading a terminal blocks).
fn read_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Why a prompt's work was stopped before it went quiet by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// The root's next turn would have been past [`MAX_ROOT_TURNS`].
    Bound,
    /// Ctrl-C: the running turn was cancelled and the children interrupted.
    Interrupted,
    /// A second Ctrl-C: the chat ends now.
    Exit,
}

/// How one prompt's turns went.
#[derive(Debug, Default)]
struct PromptEnd {
    /// The last root turn that did not complete, and why.
    failure: Option<TurnEndReason>,
    /// Why the work was stopped, if it was.
    stopped: Option<Stop>,
}

impl PromptEnd {
    /// The exit code of a one-prompt chat that ended so.
    fn exit_code(&self) -> Result<u8, CliError> {
        match (self.stopped, &self.failure) {
            (Some(Stop::Interrupted | Stop::Exit), _) => Ok(EXIT_INTERRUPTED),
            (Some(Stop::Bound), _) => Err(CliError::Chat(format!(
                "stopped: the root took its {MAX_ROOT_TURNS} turns for one prompt (each child's \
                 notice starts one) and would have taken more; its further steps and its \
                 children's were refused"
            ))),
            (None, Some(reason)) => Err(CliError::Chat(format!(
                "the turn ended {}",
                stop_detail(reason, true)
            ))),
            (None, None) => Ok(EXIT_OK),
        }
    }

    /// Takes note of one of the root's events.
    fn observe(&mut self, event: &AgentEvent) {
        if let AgentEvent::Appended { event, .. } = event
            && let EventBody::TurnEnd(end) = &event.body
            && end.reason != TurnEndReason::Completed
        {
            self.failure = Some(end.reason.clone());
        }
    }
}

/// A running chat: the host, its root, what it listens to, the brake and the printer.
struct Conversation<'h> {
    host: &'h Host,
    root: Arc<Agent>,
    feed: Feed,
    brake: Arc<Brake>,
    printer: Printer,
}

impl Conversation<'_> {
    /// Sends `prompt` to the root and prints what happens until the root and its children are
    /// quiet (or a second Ctrl-C); the host's own notes go to `err` in JSON mode.
    async fn prompt(
        &mut self,
        prompt: &str,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> Result<PromptEnd, CliError> {
        self.brake.release();
        self.root
            .followup(Message::user_text(prompt, MessageSource::User))
            .map_err(|e| CliError::Chat(format!("sending the prompt: {e}")))?;
        let mut end = PromptEnd::default();
        // Whether the running work was cancelled since the brake engaged.
        let mut stopped_work = false;
        loop {
            tokio::select! {
                event = self.feed.events.recv() => {
                    // The root's feed closes only with the root itself.
                    let Some(event) = event else { break };
                    end.observe(&event);
                    self.printer.event(out, &event)?;
                }
                Some(()) = self.feed.wakes.recv() => {}
                Some(()) = self.feed.interrupts.recv() => {
                    if end.stopped == Some(Stop::Interrupted) {
                        end.stopped = Some(Stop::Exit);
                        self.printer.note(out, err, "interrupted again: exiting")?;
                        return Ok(end);
                    }
                    end.stopped = Some(Stop::Interrupted);
                    self.printer.note(
                        out,
                        err,
                        "interrupted: cancelling the turn and the subagents (Ctrl-C again to exit)",
                    )?;
                    self.brake.engage();
                }
            }
            // The brake refuses every new step; what runs now is cancelled, once.
            if self.brake.is_engaged() && !stopped_work {
                stopped_work = true;
                self.host.stop(&self.root);
            }
            // Input the idle root holds is parked for the next prompt (its children's notices,
            // once the brake is on): no work in flight.
            if self.host.is_quiet(&self.root) {
                // Everything the root published before it went quiet is already queued.
                while let Ok(event) = self.feed.events.try_recv() {
                    end.observe(&event);
                    self.printer.event(out, &event)?;
                }
                break;
            }
        }
        // A Ctrl-C that came as the work went quiet has nothing left to stop; left queued, it
        // would end the next prompt, or the chat at its next prompt line.
        while self.feed.interrupts.try_recv().is_ok() {}
        if self.brake.bound_reached() && end.stopped.is_none() {
            end.stopped = Some(Stop::Bound);
            self.printer.note(
                out,
                err,
                &format!("stopped: the root reached {MAX_ROOT_TURNS} turns for one prompt"),
            )?;
        }
        self.printer.end_line(out)?;
        Ok(end)
    }
}

/// Writes the root's events as text or JSON Lines.
struct Printer {
    json: bool,
    /// Streamed text was written without its line's end.
    mid_line: bool,
}

impl Printer {
    fn event(&mut self, out: &mut dyn Write, event: &AgentEvent) -> std::io::Result<()> {
        if self.json {
            if let AgentEvent::Appended { event, .. } = event {
                write_json_line(out, event)?;
                out.flush()?;
            }
            return Ok(());
        }
        match event {
            AgentEvent::Appended { event, .. } => match &event.body {
                EventBody::AssistantChunk(chunk) => {
                    if let StreamChunk::TextDelta { text, .. } = &chunk.chunk {
                        out.write_all(text.as_bytes())?;
                        out.flush()?;
                        self.mid_line = !text.ends_with('\n');
                    }
                    Ok(())
                }
                EventBody::AssistantMessage(_) => self.end_line(out),
                EventBody::ToolCall(call) => self.line(
                    out,
                    &format!("tool: {} {}", call.name, one_line(&call.arguments)),
                ),
                EventBody::ToolResult(result) => self.line(
                    out,
                    &format!("  -> {}", one_line(&result_text(&result.message))),
                ),
                EventBody::TurnEnd(end) if end.reason != TurnEndReason::Completed => self.line(
                    out,
                    &format!("turn ended: {}", stop_detail(&end.reason, true)),
                ),
                _ => Ok(()),
            },
            AgentEvent::InboxInserted { message, .. } => match child_message_line(message) {
                Some(line) => self.line(out, &line),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// A line of the host's own: on `out` with the text, on `err` in JSON mode (whose `out`
    /// holds only events).
    fn note(
        &mut self,
        out: &mut dyn Write,
        err: &mut dyn Write,
        text: &str,
    ) -> std::io::Result<()> {
        if self.json {
            writeln!(err, "{text}")?;
            return err.flush();
        }
        self.line(out, text)
    }

    fn line(&mut self, out: &mut dyn Write, text: &str) -> std::io::Result<()> {
        self.end_line(out)?;
        writeln!(out, "{text}")?;
        out.flush()
    }

    /// Ends a line of streamed text, if one is open.
    fn end_line(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.mid_line {
            self.mid_line = false;
            writeln!(out)?;
            out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use lineage_agent::{ChunkStream, Model, ModelRequest, Response, ScriptedModel};
    use lineage_log::AbortCause;

    use super::*;

    /// A root that answers every notice by delegating again (the loop the bound is for), and
    /// children that answer at once.
    #[derive(Default)]
    struct Redelegating {
        calls: AtomicUsize,
    }

    impl Model for Redelegating {
        fn stream(&self, request: ModelRequest) -> ChunkStream {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let is_root = request
                .messages
                .iter()
                .any(|m| m.source == MessageSource::User && m.text() == "go");
            let answered_a_call = request
                .messages
                .last()
                .is_some_and(|m| matches!(m.source, MessageSource::Tool { .. }));
            let response = if !is_root {
                Response::text("done")
            } else if answered_a_call {
                Response::text("waiting for it")
            } else {
                Response::tool_call(
                    &format!("call-{n}"),
                    "subagent",
                    r#"{"description":"again","prompt":"sub task"}"#,
                )
            };
            ScriptedModel::new([response]).stream(request)
        }
    }

    #[tokio::test]
    async fn a_root_that_delegates_on_every_notice_stops_at_the_turn_bound() {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = open_host(
            &dir.path().join("s.lineage"),
            Arc::new(Redelegating::default()),
            true,
        )
        .expect("host");
        let brake = Brake::new();
        host.subagents
            .register_continuable_setup(brake.child_setup());
        let choice = ModelChoice::parse("scripted:redelegating").expect("choice");
        let spec = root_spec(&host, &choice, Root::new(dir.path()).expect("root"), &brake);
        let root = host
            .agents
            .create(CreateAgent::fresh(spec))
            .await
            .expect("root");
        let (_interrupt, interrupts) = mpsc::unbounded_channel();
        let mut chat = Conversation {
            feed: Feed::new(&host, &root, interrupts),
            host: &host,
            root: root.clone(),
            brake,
            printer: Printer {
                json: false,
                mid_line: false,
            },
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());

        let end = chat.prompt("go", &mut out, &mut err).await.expect("ran");

        assert_eq!(end.stopped, Some(Stop::Bound));
        let ends: Vec<TurnEndReason> = root.with_events(|events| {
            events
                .iter()
                .filter_map(|e| match &e.body {
                    EventBody::TurnEnd(end) => Some(end.reason.clone()),
                    _ => None,
                })
                .collect()
        });
        let bound = usize::try_from(MAX_ROOT_TURNS).expect("small");
        assert!(ends.len() > bound, "{ends:?}");
        assert!(ends[..bound].iter().all(|r| *r == TurnEndReason::Completed));
        for stopped in &ends[bound..] {
            assert!(
                matches!(stopped, TurnEndReason::Error(e) if e.code == lineage_agent::HOOK_FAILED),
                "stopped before asking the model: {stopped:?}"
            );
        }
        assert!(
            root.has_pending(),
            "the notices of the children it stopped wait for the next prompt"
        );
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("stopped: the root reached 16 turns"),
            "{text}"
        );
        assert!(host.subagents.resident().is_empty());
        drop(chat);
        drop(root);
        host.close().await.expect("closed");
    }

    #[test]
    fn the_help_states_the_turn_bound_in_force() {
        let help = crate::cli::CHAT_HELP;
        assert!(
            help.contains(&format!("at most {MAX_ROOT_TURNS} root turns per prompt")),
            "{help}"
        );
    }

    #[test]
    fn a_prompt_fails_by_its_last_unfinished_turn_unless_it_was_stopped() {
        let ok = PromptEnd::default();
        assert_eq!(ok.exit_code().unwrap(), EXIT_OK);
        let failed = PromptEnd {
            failure: Some(TurnEndReason::MaxTokens),
            ..PromptEnd::default()
        };
        let message = failed
            .exit_code()
            .unwrap_err()
            .message()
            .unwrap_or_default();
        assert!(message.contains("max-tokens"), "{message}");
        let interrupted = PromptEnd {
            failure: Some(TurnEndReason::Aborted {
                cause: AbortCause::User,
            }),
            stopped: Some(Stop::Interrupted),
        };
        assert_eq!(interrupted.exit_code().unwrap(), EXIT_INTERRUPTED);
        let bounded = PromptEnd {
            stopped: Some(Stop::Bound),
            ..PromptEnd::default()
        };
        let message = bounded
            .exit_code()
            .unwrap_err()
            .message()
            .unwrap_or_default();
        assert!(message.contains(&MAX_ROOT_TURNS.to_string()), "{message}");
    }
}
