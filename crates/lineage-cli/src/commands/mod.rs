//! The subcommands. Each inspection command opens the store read-only (`import`, `rm`, `tag` and
//! `prune` open it for writing), writes its result to `out`, and returns the exit code (0, or 1
//! when `verify` found problems, `import` refused its file, or the store `rm` or `prune` changed
//! does not verify).

use std::io::{self, Write};

use lineage_log::{EventBody, SessionId, TurnEndReason};
use lineage_store::SessionInfo;
use serde_json::Value;

use crate::cli::Command;
use crate::error::CliError;
use crate::open::Opened;

mod copy;
mod export;
mod fold;
mod import;
mod lifecycle;
mod ls;
mod prune;
mod rm;
mod show;
mod stats;
mod tag;
mod tail;
mod tree;
mod upgrade;
mod verify;

/// Runs `command`, writing to `out`.
pub fn run(command: Command, out: &mut dyn Write) -> Result<u8, CliError> {
    match command {
        Command::Ls(args) => ls::run(&args, out),
        Command::Tree(args) => tree::run(&args, out),
        Command::Show(args) => show::run(&args, out),
        Command::Fold(args) => fold::run(&args, out),
        Command::Verify(args) => verify::run(&args, out),
        Command::Tail(args) => tail::run(&args, out),
        Command::Export(args) => export::run(&args, out),
        Command::Import(args) => import::run(&args, out),
        Command::Stats(args) => stats::run(&args, out),
        Command::Rm(args) => rm::run(&args, out),
        Command::Tag(args) => tag::run(&args, out),
        Command::Prune(args) => prune::run(&args, out),
        Command::Copy(args) => copy::run(&args, out),
        Command::Upgrade(args) => upgrade::run(&args, out),
        Command::Demo(args) => crate::demo::run(&args, out),
        // `lineage_cli::run` runs the chat itself, with its stderr; here it has none, so the
        // session id of `--json` goes nowhere.
        Command::Chat(args) => crate::chat::run(&args, out, &mut io::sink()),
        Command::Acp(crate::cli::AcpCommand::Serve(args)) => crate::acp::serve(&args),
    }
}

/// `lineage tree`, for the demo's closing summary.
pub fn run_tree(args: &crate::cli::TreeArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    tree::run(args, out)
}

/// `lineage verify`, for the demo's closing summary.
pub fn run_verify(args: &crate::cli::VerifyArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    verify::run(args, out)
}

/// Writes `value` as one pretty-printed JSON document and a newline.
/// How a command that went on past unreadable sessions ends: exit 0 when there were none, else
/// the first failure (which names its session), with the count when there were several.
pub fn unreadable_sessions(unreadable: Vec<CliError>) -> Result<u8, CliError> {
    let count = unreadable.len();
    match unreadable.into_iter().next() {
        None => Ok(crate::error::EXIT_OK),
        Some(first) if count == 1 => Err(first),
        Some(first) => {
            let message = format!(
                "{count} sessions could not be read, the first because {}",
                first.message().unwrap_or_default()
            );
            Err(first.restated(message))
        }
    }
}

pub fn write_json(out: &mut dyn Write, value: &Value) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(io::Error::from)?;
    writeln!(out)
}

/// Writes `value` as one line of JSON (JSON Lines).
pub fn write_json_line<T: serde::Serialize + ?Sized>(
    out: &mut dyn Write,
    value: &T,
) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value).map_err(io::Error::from)?;
    writeln!(out)
}

/// The serde form of `value` as a JSON value (`null` if it cannot be represented, which the
/// event types never are).
pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// An optional id as JSON: its string form, or `null`.
pub fn id_json(id: Option<SessionId>) -> Value {
    id.map_or(Value::Null, |id| Value::String(id.to_string()))
}

/// How a session's log ends, read from its tail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ending {
    /// The number of the last turn opened (inherited turns included; 0 when none).
    pub turns: u32,
    /// Why the last closed turn ended.
    pub last_stop: Option<TurnEndReason>,
    /// The turn the log ends inside, if it ends mid-turn.
    pub open_turn: Option<u32>,
}

/// Reads how `info`'s session ends without reading its whole log: the last events, then more
/// until the last `turn/end` is found (or the log's start is reached), streamed without holding
/// them. Events committed after `info` was read are ignored, so the result describes the listed
/// length.
pub fn ending(opened: &Opened, info: &SessionInfo) -> Result<Ending, CliError> {
    let session = info.header.id;
    let len = info.len;
    let mut window = 256u64;
    loop {
        let from = len.saturating_sub(window);
        let scan = opened
            .store
            .scan_unchecked(session, from)
            .map_err(|e| opened.fail(e))?;
        // The last `turn/end` of the window, and the turn opened after it, if any.
        let mut last_end: Option<(u32, TurnEndReason)> = None;
        let mut open_turn: Option<u32> = None;
        for event in scan {
            let event = event.map_err(|e| opened.fail(e))?;
            if event.seq >= len {
                break;
            }
            match event.body {
                EventBody::TurnEnd(end) => {
                    last_end = Some((end.turn, end.reason));
                    open_turn = None;
                }
                EventBody::TurnStart(start) => open_turn = Some(start.turn),
                _ => {}
            }
        }
        if last_end.is_none() && from > 0 {
            window = window.saturating_mul(4);
            continue;
        }
        let (ended, last_stop) = last_end.unzip();
        return Ok(Ending {
            turns: open_turn.or(ended).unwrap_or(0),
            last_stop,
            open_turn,
        });
    }
}
