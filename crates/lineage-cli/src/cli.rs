//! The command line: subcommands, their arguments and the help text.

use std::path::PathBuf;

use clap::{Args, ColorChoice, Parser, Subcommand};

/// Examples and exit codes, printed after the options by `--help`.
const AFTER_HELP: &str = "\
Examples:
  lineage demo
  LINEAGE_MODEL=openai:gpt-4.1 lineage chat --store chat.lineage 'Summarise README.md'
  lineage acp serve --store agents.lineage --model openai:gpt-4.1
  lineage ls sessions.lineage
  lineage tree sessions.lineage
  lineage show sessions.lineage 019b76da-a800-7000-8000-000000000001 --from 120 --limit 40
  lineage fold sessions.lineage 019b76da --json
  lineage verify sessions.lineage && echo intact
  lineage tail -f sessions.lineage 019b76da
  lineage export sessions.lineage 019b76da > session.jsonl
  lineage import copy.lineage session.jsonl
  lineage stats sessions.lineage --json
  lineage tag sessions.lineage 019b76da user=alice --title 'Parser fix'
  lineage ls sessions.lineage --tag user=alice
  lineage rm sessions.lineage 019b76da --subtree
  lineage prune sessions.lineage --older-than 30d --dry-run

A SESSION is a full session id or the start of exactly one stored session's id.
The inspection commands open the store read-only, so they work while a host writes to it;
demo, chat and acp serve are hosts that write; import writes one session, creating the store
if missing.
rm, tag and prune change an existing store: they need it free of any host writing to it (exit 3
otherwise). rm refuses a session with children or forks unless --subtree; rm and prune verify the
store when they are done (exit 1 if it has problems).

Exit codes:
  0  ok
  1  problems found: verify found damage or inconsistencies, or a damaged session stopped a read;
     import refused its file (a bad line, a digest that differs, a session held with other content)
  2  usage: bad arguments, including a session the store does not hold, and rm of a session
     with children or forks without --subtree
  3  cannot open or read the file: missing, not a Lineage store, a newer format, cut short,
     damaged beneath its sessions, an I/O error
  4  a database's server cannot be reached, or did not answer within its bound
  5  a database's server refused the login (a wrong password, an unknown role)
  6  the role lacks a right the store needs on the database
  7  the server holds no database of the URL's name";

/// Inspect Lineage session stores, offline or while a host is writing them.
#[derive(Debug, Parser)]
#[command(
    name = "lineage",
    version,
    after_help = AFTER_HELP,
    color = ColorChoice::Never,
    propagate_version = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every session: id, creation time, parent, origin, depth, events, turns, last stop
    /// reason, and whether its log ends inside an open turn.
    Ls(LsArgs),
    /// Show the lineage tree: sessions under their parents, with each child's mode, label,
    /// provider and depth.
    Tree(TreeArgs),
    /// Show a session's events, one per line, the inherited prefix set apart from the session's
    /// own suffix.
    Show(ShowArgs),
    /// Show what resuming a session would rebuild from its log: lineage, delegation depth,
    /// policy, descriptor, turns, last stop reason, balance.
    Fold(SessionArgs),
    /// Check digests, seqs, records, rules, headers and the children index; exit 1 on any problem.
    Verify(VerifyArgs),
    /// Print a session's last events; with -f, keep printing new ones as a host appends them.
    Tail(TailArgs),
    /// Write a session as JSON Lines in the stable form of schema/JSON.md: a session line, then
    /// {"seq", "time_ms", "type", "data", "digest"} per event.
    Export(ExportArgs),
    /// Read a session from JSON Lines (what export writes, or a deepseek-harness session file)
    /// into a store, checking seqs, rules and digests; the store is created if missing.
    Import(ImportArgs),
    /// Show space used: sessions, events, bytes, and bytes per event by kind.
    Stats(StoreArgs),
    /// Delete a session, refused while children or forks of it are stored unless --subtree
    /// deletes them too; one transaction, then the store is verified.
    Rm(RmArgs),
    /// Set a session's title and tags (KEY=VALUE), recorded in its log; without changes, show
    /// them.
    Tag(TagArgs),
    /// Delete root sessions (each with its whole subtree) whose last activity is older than a
    /// limit, or beyond the N most recently active; then verify the store.
    Prune(PruneArgs),
    /// Copy every session from one store to another (a file or a postgres:// URL, either way),
    /// blocks byte for byte, checking digests here and verifying there; sessions already copied
    /// are left alone.
    Copy(CopyArgs),
    /// Rewrite a store written by an earlier Lineage in this build's format, crash-safely (a
    /// kill leaves the old store or the new one), then verify it. Until then, an older store opens
    /// read-only: every inspection command works on it.
    Upgrade(StoreArgs),
    /// Run a scripted multi-agent delegation into a store, restart, resume a child, and show the
    /// result (no network: the models are scripted).
    Demo(DemoArgs),
    /// Talk to a real model: a root agent that can delegate to subagents and read files in the
    /// working directory, its sessions written to a store (resume one with --resume).
    Chat(ChatArgs),
    /// The Agent Client Protocol: `lineage acp serve` serves Lineage agents to an ACP client
    /// (an editor, or another agent delegating) on stdin and stdout.
    #[command(subcommand)]
    Acp(AcpCommand),
}

/// The `acp` subcommands.
#[derive(Debug, Subcommand)]
pub enum AcpCommand {
    /// Serve durable Lineage agents over ACP on stdin and stdout until stdin ends: every ACP
    /// session is a session in the store (load one again by its id after a restart), and its
    /// agent can delegate (`subagent`, `subagent_fork`) and read files in the session's cwd.
    Serve(AcpServeArgs),
}

/// Arguments of `acp serve`.
#[derive(Debug, Args)]
#[command(after_help = ACP_SERVE_HELP)]
pub struct AcpServeArgs {
    /// The store file to write (created if missing).
    #[arg(long, value_name = "PATH")]
    pub store: PathBuf,
    /// The model, as ENDPOINT:MODEL (default: $LINEAGE_MODEL), configured as for `chat`.
    #[arg(long, value_name = "ENDPOINT:MODEL", conflicts_with = "script")]
    pub model: Option<String>,
    /// Answer from a script instead of a model: a JSON array of answers, taken in order by
    /// every agent the server runs (see below).
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Ask the client to allow each call of this tool first (repeatable).
    #[arg(long = "ask", value_name = "TOOL")]
    pub ask: Vec<String>,
}

/// `acp serve --help`'s closing text.
pub(crate) const ACP_SERVE_HELP: &str = "\
stdout carries protocol frames only. When stdin ends, running prompts are cancelled, the
children torn down and the store flushed; then the server exits 0.

A script is a JSON array; each element answers one model request:
  {\"text\": \"...\"}                       an answer
  {\"max_tokens\": \"...\"}                 a partial answer cut at the output limit
  {\"tool_call\": {\"name\": \"...\", \"arguments\": {...}}}
  {\"error\": {\"code\": \"...\", \"message\": \"...\"}}   a failed request
  {\"hang\": true}                         a request that waits until cancelled
  {\"refuse\": true}                       the step is refused before the model is asked

Example, as an ACP agent command:
  lineage acp serve --store agents.lineage --model openai:gpt-4.1";

/// Arguments of `chat`.
#[derive(Debug, Args)]
#[command(after_help = CHAT_HELP)]
pub struct ChatArgs {
    /// The store file to write (created if missing).
    #[arg(long, value_name = "PATH")]
    pub store: PathBuf,
    /// The model, as ENDPOINT:MODEL (default: $LINEAGE_MODEL).
    #[arg(long, value_name = "ENDPOINT:MODEL")]
    pub model: Option<String>,
    /// Continue this stored root session (its id, or the start of exactly one stored id).
    #[arg(long, value_name = "SESSION")]
    pub resume: Option<String>,
    /// Print the root's events as JSON Lines instead of text (the session id goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// The prompt: one turn, then exit. Without it, prompts are read line by line from a
    /// terminal, or the whole of a piped stdin is one prompt.
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,
}

/// `chat --help`'s closing text.
pub(crate) const CHAT_HELP: &str = "\
The endpoint's address, wire format and key come from the environment: a known endpoint
(openai, openai-responses, anthropic, deepseek, ollama) needs only its key variable
(OPENAI_API_KEY, ANTHROPIC_API_KEY, ...); any other name needs LINEAGE_BASE_URL and LINEAGE_WIRE
(chat, responses or anthropic), with its key in LINEAGE_API_KEY (or the variable
LINEAGE_API_KEY_VAR names).

One prompt runs until the root agent and every child it started are quiet: each child's
settlement notice is delivered to the root as a further turn, at most 16 root turns per prompt
(past that, no agent asks the model again and the prompt fails). Ctrl-C cancels the running turn
and interrupts the children (their notices wait for the next prompt); a second Ctrl-C exits, the
store flushed, and one more during that shutdown exits at once. Exit 0 when the prompt's turns
completed, 1 when one failed (the error's code and message on stderr), 2 on bad arguments or
configuration, 130 after Ctrl-C.";

/// Arguments of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The store file to write (created if missing; an existing store gets new sessions).
    #[arg(long, value_name = "PATH")]
    pub store: Option<PathBuf>,
}

/// Output format shared by the inspection commands.
#[derive(Clone, Copy, Debug, Args)]
pub struct Output {
    /// Print JSON instead of aligned text.
    #[arg(long)]
    pub json: bool,
}

/// A command that reads a whole store.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// `ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// List only sessions with this tag (repeatable: every one must match).
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// Arguments of `copy`.
#[derive(Debug, Args)]
pub struct CopyArgs {
    /// The store to copy from (read-only, so a host may be writing to it).
    #[arg(value_name = "SRC")]
    pub source: PathBuf,
    /// The store to copy to, created if missing (opened for writing: no host may hold a file).
    #[arg(value_name = "DST")]
    pub destination: PathBuf,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// `rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// The store file (opened for writing: no host may hold it).
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// The session: its id, or the start of exactly one stored id.
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Delete every session descending from it too (children and forks, recursively).
    #[arg(long)]
    pub subtree: bool,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// `tag`.
#[derive(Debug, Args)]
pub struct TagArgs {
    /// The store file (opened for writing when something changes: no host may hold it).
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// The session: its id, or the start of exactly one stored id.
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Tags to set, as KEY=VALUE.
    #[arg(value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Remove this tag (repeatable).
    #[arg(long, value_name = "KEY")]
    pub untag: Vec<String>,
    /// Set the title.
    #[arg(long, value_name = "TITLE", conflicts_with = "clear_title")]
    pub title: Option<String>,
    /// Clear the title.
    #[arg(long)]
    pub clear_title: bool,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// `prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The store file (opened for writing unless --dry-run: no host may hold it).
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// Delete the root trees last active longer ago than this: a number and a unit (s, m, h,
    /// d, w), for example 30d or 1h30m.
    #[arg(long, value_name = "DURATION")]
    pub older_than: Option<String>,
    /// Keep the N most recently active root trees and delete the others.
    #[arg(long, value_name = "N")]
    pub keep: Option<u64>,
    /// Only say what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// `tree`.
#[derive(Debug, Args)]
pub struct TreeArgs {
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// Only this session and its descendants (default: every root session).
    #[arg(value_name = "ROOT")]
    pub root: Option<String>,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// A command about one session.
#[derive(Debug, Args)]
pub struct SessionArgs {
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// The session: its id, or the start of exactly one stored id.
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// How events are printed as text.
#[derive(Clone, Copy, Debug, Args)]
pub struct Style {
    /// Print every assistant/chunk event on its own line (default: one line per run of chunks).
    #[arg(long)]
    pub chunks: bool,
    /// Print texts and arguments whole instead of cutting them at 80 characters.
    #[arg(long)]
    pub full: bool,
}

/// `show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// The session: its id, or the start of exactly one stored id.
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Start at this seq.
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub from: u64,
    /// Show at most this many events.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Text style.
    #[command(flatten)]
    pub style: Style,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// Report only this session (the whole store is still read, to check seeds and the index).
    #[arg(value_name = "SESSION")]
    pub session: Option<String>,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}

/// `tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    /// Keep following the session, printing events as they are committed (stop with Ctrl-C).
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// How many of the last events to print first.
    #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 10)]
    pub last: u64,
    /// How often to look for new events while following, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub interval: u64,
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// The session: its id, or the start of exactly one stored id.
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Text style.
    #[command(flatten)]
    pub style: Style,
    /// Output format (JSON Lines, one event per line).
    #[command(flatten)]
    pub output: Output,
}

/// `export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The store file.
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// The session: its id, or the start of exactly one stored id.
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Accepted like on the other commands: the export is always JSON Lines.
    #[arg(long)]
    pub json: bool,
}

/// `import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The store file to write (created if missing).
    #[arg(value_name = "STORE")]
    pub store: PathBuf,
    /// The session file: what `lineage export` writes, or a session file of deepseek-harness's
    /// JSON Lines store; `-` reads stdin.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Output format.
    #[command(flatten)]
    pub output: Output,
}
