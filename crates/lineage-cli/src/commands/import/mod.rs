//! `lineage import`: a session from a JSON Lines file into a store.
//!
//! The file is either the stable JSON form `lineage export` writes (`schema/JSON.md`), or a
//! session file of deepseek-harness's default JSON Lines store, mapped to Lineage's events
//! ([`upstream`]); its first line says which. The whole file is read and checked before the store
//! is opened: seqs contiguous from 0, every event valid where it stands, every digest the file
//! states equal to the events' own, the header agreeing with the log. So a refused file leaves
//! nothing written (and no new store file). The session is then written in one transaction
//! through `Store::import`, and the stored head digest compared with the file's.
//!
//! A session the store already holds is not written again: when the stored one is identical
//! (header, length and digest), the import succeeds saying so; otherwise it is refused.

mod upstream;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;

use lineage_log::{
    Chain, Digest, Encoder, Event, Header, SESSION_LINE_TYPE, SessionReader, fold_header,
};
use lineage_store::{Store, StoreError};
use serde_json::{Value, json};

use super::write_json;
use crate::cli::ImportArgs;
use crate::error::{CliError, EXIT_OK};

/// Which kind of file a session came from.
#[derive(Debug)]
enum Source {
    /// The stable JSON form.
    Lineage,
    /// deepseek-harness's JSON Lines, with what the mapping did.
    Upstream {
        id: String,
        kept_as_custom: BTreeMap<String, u64>,
        left_out: BTreeMap<&'static str, u64>,
        closers: u64,
    },
}

/// A session read from a file and checked, ready to be written.
#[derive(Debug)]
struct Incoming {
    header: Header,
    events: Vec<Event>,
    digest: Digest,
    source: Source,
}

/// The two readers, chosen by the first line.
enum Reader {
    Lineage(Box<SessionReader>),
    Upstream(Box<upstream::UpstreamReader>),
}

/// Imports the session in `args.file` into `args.store`.
pub fn run(args: &ImportArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let incoming = read(&args.file)?;
    let id = incoming.header.id;
    let store = Store::open(&args.store).map_err(|e| CliError::opening(&args.store, e))?;
    let shown = args.store.display();
    let status = match store.info(id) {
        Ok(info) => {
            if info.header == incoming.header
                && info.len == incoming.events.len() as u64
                && info.head == incoming.digest
            {
                "identical"
            } else {
                return Err(CliError::Refused(format!(
                    "session {id} is already in {shown} with other content ({} events, digest \
                     {}; the file has {} events, digest {}): nothing was written",
                    info.len,
                    info.head,
                    incoming.events.len(),
                    incoming.digest
                )));
            }
        }
        Err(StoreError::UnknownSession { .. }) => {
            store
                .import(incoming.header.clone(), &incoming.events)
                .map_err(|e| writing(&args.store, e))?;
            let info = store.info(id).map_err(|e| writing(&args.store, e))?;
            if info.head != incoming.digest || info.len != incoming.events.len() as u64 {
                return Err(CliError::Damaged(format!(
                    "session {id} was written to {shown}, but the store holds {} events with \
                     digest {} where the file has {} events with digest {}",
                    info.len,
                    info.head,
                    incoming.events.len(),
                    incoming.digest
                )));
            }
            "imported"
        }
        Err(e) => return Err(writing(&args.store, e)),
    };
    store.close().map_err(|e| writing(&args.store, e))?;
    report(args, out, &incoming, status)?;
    Ok(EXIT_OK)
}

/// Maps a store failure while importing: the log's refusals refuse the file, the rest are the
/// store's.
fn writing(path: &Path, error: StoreError) -> CliError {
    match error {
        e @ (StoreError::SessionExists { .. }
        | StoreError::SeqMismatch { .. }
        | StoreError::InvalidSeed { .. }
        | StoreError::Rejected { .. }
        | StoreError::HeaderContradictsLog { .. }) => {
            CliError::Refused(format!("{e}: nothing was written"))
        }
        e => CliError::reading(path, e),
    }
}

fn report(
    args: &ImportArgs,
    out: &mut dyn Write,
    incoming: &Incoming,
    status: &str,
) -> Result<(), CliError> {
    let id = incoming.header.id;
    let events = incoming.events.len();
    if args.output.json {
        let upstream = match &incoming.source {
            Source::Lineage => Value::Null,
            Source::Upstream {
                id,
                kept_as_custom,
                left_out,
                closers,
            } => json!({
                "id": id,
                "kept_as_custom": kept_as_custom,
                "left_out": left_out,
                "closers": closers,
            }),
        };
        write_json(
            out,
            &json!({
                "status": status,
                "session": id.to_string(),
                "store": args.store.display().to_string(),
                "events": events,
                "digest": incoming.digest.to_string(),
                "source": match incoming.source {
                    Source::Lineage => "lineage",
                    Source::Upstream { .. } => "upstream",
                },
                "upstream": upstream,
            }),
        )?;
        return Ok(());
    }
    let store = args.store.display();
    match status {
        "identical" => writeln!(
            out,
            "session {id} is already in {store}, identical ({events} events, digest {}): \
             nothing written",
            incoming.digest
        )?,
        _ => writeln!(
            out,
            "imported session {id} into {store}: {events} events, digest {}",
            incoming.digest
        )?,
    }
    if let Source::Upstream {
        id: upstream_id,
        kept_as_custom,
        left_out,
        closers,
    } = &incoming.source
    {
        writeln!(out, "  from upstream session {upstream_id:?}")?;
        if !kept_as_custom.is_empty() {
            let kinds: Vec<String> = kept_as_custom
                .iter()
                .map(|(kind, n)| format!("{kind} ×{n}"))
                .collect();
            writeln!(out, "  kept as custom events: {}", kinds.join(", "))?;
        }
        if !left_out.is_empty() {
            let fields: Vec<String> = left_out
                .iter()
                .map(|(field, n)| format!("{field} ×{n}"))
                .collect();
            writeln!(out, "  fields left out: {}", fields.join(", "))?;
        }
        if *closers > 0 {
            writeln!(
                out,
                "  the log ended inside a turn: {closers} crash-repair closers appended"
            )?;
        }
    }
    Ok(())
}

/// Reads and checks the session in `path` (`-` for stdin).
fn read(path: &Path) -> Result<Incoming, CliError> {
    let shown = if path.as_os_str() == "-" {
        "stdin".to_owned()
    } else {
        path.display().to_string()
    };
    let input: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(io::stdin())
    } else {
        match File::open(path) {
            Ok(file) => Box::new(file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CliError::CannotOpen(format!(
                    "cannot read {shown}: no such file"
                )));
            }
            Err(e) => return Err(CliError::CannotOpen(format!("cannot read {shown}: {e}"))),
        }
    };
    let refused = |what: String| {
        CliError::Refused(format!(
            "cannot import {shown}: {what}; nothing was written"
        ))
    };
    let mut input = BufReader::new(input);
    let mut reader: Option<Reader> = None;
    let mut blank_lines = 0u64;
    let mut buffer = Vec::new();
    let mut line_no = 0u64;
    loop {
        buffer.clear();
        let n = input
            .read_until(b'\n', &mut buffer)
            .map_err(|e| CliError::CannotOpen(format!("cannot read {shown}: {e}")))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if buffer.last() == Some(&b'\n') {
            buffer.pop();
        }
        let Ok(line) = std::str::from_utf8(&buffer) else {
            return Err(refused(format!("line {line_no} is not UTF-8 text")));
        };
        let reader = match &mut reader {
            Some(reader) => reader,
            None if line.trim().is_empty() => {
                blank_lines += 1;
                continue;
            }
            None => {
                let mut chosen =
                    choose(line).map_err(|e| refused(format!("line {line_no}: {e}")))?;
                for _ in 0..blank_lines {
                    match &mut chosen {
                        Reader::Lineage(r) => {
                            r.read_line("").map_err(|e| refused(e.to_string()))?
                        }
                        Reader::Upstream(r) => {
                            r.read_line("").map_err(|e| refused(e.to_string()))?
                        }
                    }
                }
                reader.insert(chosen)
            }
        };
        match reader {
            Reader::Lineage(r) => r.read_line(line).map_err(|e| refused(e.to_string()))?,
            Reader::Upstream(r) => r.read_line(line).map_err(|e| refused(e.to_string()))?,
        }
    }
    let incoming = match reader {
        None => return Err(refused("the file is empty".into())),
        Some(Reader::Lineage(r)) => {
            let session = r.finish().map_err(|e| refused(e.to_string()))?;
            if session.events.is_empty() {
                return Err(refused(
                    "the session has no events, and a store keeps no empty session".into(),
                ));
            }
            Incoming {
                header: session.header,
                events: session.events,
                digest: session.digest,
                source: Source::Lineage,
            }
        }
        Some(Reader::Upstream(r)) => {
            let mapped = r.finish().map_err(|e| refused(e.to_string()))?;
            let folded = fold_header(&mapped.header, &mapped.events);
            if folded != mapped.header {
                return Err(refused(
                    "the mapped session's header contradicts its log (a child session's facts)"
                        .into(),
                ));
            }
            let mut chain = Chain::new();
            let mut encoder = Encoder::new();
            let mut records = Vec::new();
            for event in &mapped.events {
                records.clear();
                encoder.encode(event, &mut records);
                chain.update(&records);
            }
            Incoming {
                header: mapped.header,
                events: mapped.events,
                digest: chain.digest(),
                source: Source::Upstream {
                    id: mapped.upstream_id,
                    kept_as_custom: mapped.kept_as_custom,
                    left_out: mapped.left_out,
                    closers: mapped.closers,
                },
            }
        }
    };
    // The readers checked every event where it stands; the seed contract is the same check over
    // the whole log, kept here so nothing reaches the store that it would refuse.
    lineage_log::check_seed(&incoming.events)
        .map_err(|e| refused(format!("the session breaks the log's rules: {e}")))?;
    Ok(incoming)
}

/// The reader for a file whose first (non-blank) line is `line`.
fn choose(line: &str) -> Result<Reader, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    match value.get("type").and_then(Value::as_str) {
        Some(SESSION_LINE_TYPE) => Ok(Reader::Lineage(Box::default())),
        Some(upstream::HEADER_TYPE) => Ok(Reader::Upstream(Box::default())),
        other => Err(format!(
            "the first line is neither a Lineage session line (type {SESSION_LINE_TYPE:?}) nor \
             an upstream session header (type {:?}); its type is {}",
            upstream::HEADER_TYPE,
            other.map_or("missing".to_owned(), |t| format!("{t:?}"))
        )),
    }
}
