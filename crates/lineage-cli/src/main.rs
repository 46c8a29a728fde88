//! `lineage`: inspect Lineage session stores, offline or while a host is writing them.
//!
//! Subcommands: `ls`, `tree`, `show`, `fold`, `verify`, `tail` (`-f` to follow), `export` (JSON
//! Lines) and `stats`. Every one opens the store read-only, so it works while a host process has
//! the file open for writing, and never creates a file. Output is aligned plain text (never
//! coloured); `--json` gives JSON instead on every inspection command.
//!
//! Exit codes:
//!
//! | code | meaning |
//! |---:|---|
//! | 0 | ok |
//! | 1 | problems found: `verify` found damage or inconsistencies, or damage stopped a read (a corrupt record or block) |
//! | 2 | usage: bad arguments, including a session id the store does not hold |
//! | 3 | cannot open: a missing file, a file that is not a Lineage store, a store or session in a newer format, an I/O error |
//!
//! Every failure prints one sentence on stderr, prefixed `lineage: `.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cli;
mod commands;
mod demo;
mod error;
mod open;
mod render;
mod time;

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::cli::Cli;
use crate::error::{EXIT_OK, EXIT_USAGE};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return ExitCode::from(usage(&error)),
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = commands::run(cli.command, &mut out);
    // Whatever was printed before a failure (for example the rows of `ls` before a damaged
    // session) is still written out; a closed pipe is not worth a word.
    let flushed = out.flush();
    let code = match result {
        Ok(code) => match flushed {
            Ok(()) => return ExitCode::from(code),
            Err(e) => error::CliError::Output(e),
        },
        Err(e) => e,
    };
    if let Some(message) = code.message() {
        say(&message);
    }
    ExitCode::from(code.exit_code())
}

/// Writes `lineage: <message>` on stderr, ignoring a closed stderr.
fn say(message: &str) {
    let _ = writeln!(io::stderr().lock(), "lineage: {message}");
}

/// Reports a command-line error in one sentence and returns its exit code; `--help` and
/// `--version` print their text and succeed.
fn usage(error: &clap::Error) -> u8 {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            EXIT_OK
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            say("no command given; try 'lineage --help'");
            EXIT_USAGE
        }
        _ => {
            say(&format!("{}; try 'lineage --help'", first_paragraph(error)));
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
