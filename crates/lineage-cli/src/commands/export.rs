//! `lineage export`: a session as JSON Lines, in the stable form of `schema/JSON.md`.
//!
//! The first line is the session line (the header facts, the number of events and the head
//! digest `S(n-1)`); then one line per event, `{"seq", "time_ms", "type", "data", "digest"}`,
//! where `digest` is the running digest `S(seq)`, so `lineage import` can check every event and
//! name the first one that differs. The session is streamed with its digests checked
//! (`Store::scan`), one block in memory at a time; each line is written as its block is read, and
//! damage is reported where it is met. The export stops at the length the session had when the
//! command started, so a host appending meanwhile does not make it disagree with its first line.
//! Crash-repair closers are not exported (they are not stored).

use std::io::Write;

use lineage_log::{Chain, Encoder, event_line, session_line};

use crate::cli::ExportArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::open;

/// Writes the session line, then every stored event of the session, one JSON object per line.
pub fn run(args: &ExportArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let info = opened.resolve(&args.session)?;
    let session = info.header.id;
    let scan = opened.store.scan(session, 0).map_err(|e| opened.fail(e))?;
    writeln!(out, "{}", session_line(&info.header, info.len, &info.head))?;
    let mut chain = Chain::new();
    let mut encoder = Encoder::new();
    let mut record = Vec::new();
    let mut written = 0u64;
    for event in scan {
        let event = event.map_err(|e| opened.fail(e))?;
        if event.seq >= info.len {
            break;
        }
        record.clear();
        encoder.encode(&event, &mut record);
        chain.update(&record);
        writeln!(out, "{}", event_line(&event, &chain.digest()))?;
        written += 1;
    }
    // The scan checked every stored block's digest; what is left to check is that the decoded
    // events encode back to the stored records (`verify` reports any that does not).
    if written != info.len || chain.digest() != info.head {
        return Err(CliError::Damaged(format!(
            "session {session} in {}: the {written} exported events give digest {}, but the \
             store holds {} events with digest {}: some record does not encode back to its \
             stored bytes (run lineage verify)",
            opened.path.display(),
            chain.digest(),
            info.len,
            info.head
        )));
    }
    Ok(EXIT_OK)
}
