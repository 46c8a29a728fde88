//! The JSON Lines baseline: one file per session, one event per line, serde_json.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use lineage_log::{Event, Header};

/// Writes a session file: the header line, then one line per event, then fsync.
pub fn write(path: &Path, header: &Header, events: &[Event]) -> std::io::Result<()> {
    let mut out = BufWriter::new(File::create(path)?);
    serde_json::to_writer(&mut out, header)?;
    out.write_all(b"\n")?;
    for event in events {
        serde_json::to_writer(&mut out, event)?;
        out.write_all(b"\n")?;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()
}

/// Reads a session file and parses every line, checking seqs are contiguous.
pub fn load(path: &Path) -> std::io::Result<(Header, Vec<Event>)> {
    let bytes = std::fs::read(path)?;
    let mut lines = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    let header: Header = serde_json::from_slice(lines.next().unwrap_or_default())?;
    let mut events = Vec::new();
    for line in lines {
        let event: Event = serde_json::from_slice(line)?;
        if event.seq != events.len() as u64 {
            return Err(std::io::Error::other(format!("seq gap at {}", event.seq)));
        }
        events.push(event);
    }
    Ok((header, events))
}

/// Appends one durable batch: the lines, then fsync.
pub fn append(path: &Path, events: &[Event], scratch: &mut Vec<u8>) -> std::io::Result<()> {
    scratch.clear();
    for event in events {
        serde_json::to_writer(&mut *scratch, event)?;
        scratch.push(b'\n');
    }
    let mut file = OpenOptions::new().append(true).open(path)?;
    file.write_all(scratch)?;
    file.sync_data()
}

/// Forks a session file: the header line and the first `seed_len` event lines, copied, fsynced.
pub fn fork(parent: &Path, child: &Path, seed_len: usize) -> std::io::Result<()> {
    let bytes = std::fs::read(parent)?;
    let mut end = 0;
    for (lines, i) in bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i)
        .enumerate()
    {
        if lines == seed_len {
            end = i + 1;
            break;
        }
    }
    let mut file = File::create(child)?;
    file.write_all(&bytes[..end])?;
    file.sync_all()
}
