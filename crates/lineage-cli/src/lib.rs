//! `lineage`: inspect Lineage session stores, offline or while a host is writing them; run the
//! demo; chat with a real model.
//!
//! Inspection subcommands: `ls`, `tree`, `show`, `fold`, `verify`, `tail` (`-f` to follow),
//! `export` (JSON Lines) and `stats`. Every one opens the store read-only, so it works while a
//! host process has the file open for writing, and never creates a file. Output is aligned plain
//! text (never coloured); `--json` gives JSON instead on every inspection command. Two hosts
//! write stores: `demo` (scripted models) and `chat` (a real endpoint, see `lineage chat --help`);
//! `import` writes one session read from JSON Lines (the stable form of `schema/JSON.md` that
//! `export` writes, or a deepseek-harness session file), creating the store if missing. `rm`,
//! `tag` and `prune` change an existing store (the data lifecycle): `rm` deletes a session
//! (refused while children or forks of it are stored, unless `--subtree` deletes them too), `tag`
//! records a title and `KEY=VALUE` tags in a session's log (`ls` shows them and filters with
//! `--tag`), `prune` deletes root trees by last activity or count; `rm` and `prune` end with the
//! store's `verify`. They open the store for writing, so a store a host holds is refused (exit 3).
//!
//! Exit codes:
//!
//! | code | meaning |
//! |---:|---|
//! | 0 | ok |
//! | 1 | problems found: `verify` found damage or inconsistencies, or a damaged session stopped a read (a corrupt record or block); `import` refused its file (nothing is written) |
//! | 2 | usage: bad arguments, including a session id the store does not hold, and `rm` of a session with children or forks without `--subtree` |
//! | 3 | cannot open or read the file: missing, not a Lineage store, a store or session in a newer format, cut short, damaged beneath its sessions (the storage engine's own pages), an I/O error |
//!
//! Every failure prints one sentence on stderr, prefixed `lineage: `, in Lineage's words: the
//! storage engine's messages (and its panics on a damaged file) are never shown.
//!
//! The binary is a thin wrapper around [`run`], which takes the arguments and both output
//! streams, so the whole command can also run in-process (for example under a fuzzer).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acp;
mod chat;
mod cli;
mod commands;
mod demo;
mod error;
mod host;
mod open;
mod render;
mod script;
mod time;

use std::ffi::OsString;
use std::io::{BufWriter, Write};

use clap::Parser;
use clap::error::ErrorKind;

use crate::cli::{Cli, Command};
use crate::error::{EXIT_OK, EXIT_USAGE};

/// Runs the `lineage` command line `args` (`args[0]` is the program name), writing its output to
/// `out` and its diagnostics to `err`, and returns the exit code: 0 ok, 1 problems found, 2 usage,
/// 3 cannot open.
///
/// Nothing is written anywhere else: neither the process's stdout nor its stderr is touched,
/// except by `acp serve`, whose protocol is the process's stdin and stdout. A
/// write to `out` that fails because the reader went away (`BrokenPipe`) ends the command quietly
/// with exit 0; a write to `err` that fails is ignored.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => return i32::from(usage(&error, out, err)),
    };
    // Notes a run on this thread left unprinted (it panicked) are not this run's.
    drop(open::take_notes());
    // The chat writes as the model streams (unbuffered) and needs `err` for its session id.
    let command = match cli.command {
        Command::Chat(args) => {
            let result = chat::run(&args, out, err);
            return finish(result, Ok(()), err);
        }
        // The protocol's frames go to the process's own stdout, read from its stdin.
        Command::Acp(cli::AcpCommand::Serve(args)) => {
            return finish(acp::serve(&args), Ok(()), err);
        }
        command => command,
    };
    let mut out = Noted {
        out: BufWriter::new(out),
        err,
        said: Vec::new(),
    };
    let result = commands::run(command, &mut out);
    // Whatever was printed before a failure (for example the rows of `ls` before a damaged
    // session) is still written out; a closed pipe is not worth a word.
    let flushed = out.flush();
    let Noted { err, .. } = out;
    finish(result, flushed, err)
}

/// The exit code of a command that ended with `result` and whose output flushed with
/// `flushed`, its failure said on `err`.
fn finish(
    result: Result<u8, error::CliError>,
    flushed: std::io::Result<()>,
    err: &mut dyn Write,
) -> i32 {
    let failure = match result {
        Ok(code) => match flushed {
            Ok(()) => return i32::from(code),
            Err(e) => error::CliError::Output(e),
        },
        Err(e) => e,
    };
    if let Some(message) = failure.message() {
        say(err, &message);
    }
    i32::from(failure.exit_code())
}

/// The command's output, which prints the notes opening the store left (see [`open::take_notes`])
/// on `err` before any output and before the command ends, each once.
struct Noted<'a> {
    out: BufWriter<&'a mut dyn Write>,
    err: &'a mut dyn Write,
    said: Vec<String>,
}

impl Noted<'_> {
    fn notes(&mut self) {
        for note in open::take_notes() {
            if !self.said.contains(&note) {
                say(self.err, &format!("note: {note}"));
                self.said.push(note);
            }
        }
    }
}

impl Write for Noted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.notes();
        self.out.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.notes();
        self.out.write_all(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.notes();
        self.out.flush()
    }
}

/// Installs a panic hook that keeps quiet about panics raised inside the storage engine, and
/// passes every other panic to the hook installed before it. Call it once, before [`run`].
///
/// On some damaged files the storage engine panics instead of returning an error. The store
/// contains those panics and the command reports the damage in one sentence of its own, but the
/// default hook would first print the engine's message, its source location and maybe a backtrace
/// on stderr. The `lineage` binary installs this hook; a host that runs [`run`] in-process decides
/// for itself (a fuzzer that aborts on every panic would otherwise stop at the first damaged page).
pub fn quiet_engine_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.location().is_some_and(|l| in_storage_engine(l.file())) {
                previous(info);
            }
        }));
    });
}

/// Whether a source file belongs to the storage engine's crate (`…/redb-<version>/src/…`).
fn in_storage_engine(file: &str) -> bool {
    std::path::Path::new(file).components().any(|c| {
        c.as_os_str()
            .to_str()
            .is_some_and(|name| name == "redb" || name.starts_with("redb-"))
    })
}

/// Writes `lineage: <message>` on `err`, ignoring a closed stream.
fn say(err: &mut dyn Write, message: &str) {
    let _ = writeln!(err, "lineage: {message}");
    let _ = err.flush();
}

/// Reports a command-line error in one sentence and returns its exit code; `--help` and
/// `--version` print their text on `out` and succeed.
fn usage(error: &clap::Error, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = write!(out, "{}", error.render());
            let _ = out.flush();
            EXIT_OK
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            say(err, "no command given; try 'lineage --help'");
            EXIT_USAGE
        }
        _ => {
            say(
                err,
                &format!("{}; try 'lineage --help'", first_paragraph(error)),
            );
            EXIT_USAGE
        }
    }
}

/// clap's message without its `error: ` prefix, usage and tips: the first paragraph, on one line.
fn first_paragraph(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let paragraph = rendered.split("\n\n").next().unwrap_or_default();
    let words: Vec<&str> = paragraph.split_whitespace().collect();
    let line = words.join(" ");
    line.strip_prefix("error: ").unwrap_or(&line).to_owned()
}
