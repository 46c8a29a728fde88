//! How the writer lays a session's committed records out in stored blocks.
//!
//! The storage engine gives a value the smallest power-of-two run of pages that holds it, so a
//! file wastes least when its values sit just under such a size: measured on redb, values just
//! under 16 or 32 KiB take 1.03–1.05 times their bytes on disk, values of 6 or 12 KiB 1.4–1.8
//! times. So every block aims at `block_bytes` bytes as stored (packed and compressed):
//!
//! - The writer cuts records wherever that fills a block. A cut needs only the running digest
//!   there, which it computes as it goes from the digest state before the records.
//! - A commit too small to fill a block writes a small one that stays *open*: the writer keeps its
//!   records. Once a session's open blocks and the next commit's records would fill a block, that
//!   commit rewrites them into full blocks, in the same transaction that appends (a conditional
//!   write, like any other). So a session's blocks are full but for the last few, and a record is
//!   written about twice at most.
//!
//! Blocks are physical only: how records are grouped changes no seq, no record and no digest.

use std::ops::Range;

use lineage_log::{Chain, Digest, split_record};

use crate::StoreOptions;
use crate::layout::{MAX_BLOCK_RECORDS, MAX_RECORD_BYTES, encode_block, set_block_digest};
use crate::writer::PendingBlock;

/// A block counts as full from this share of `block_bytes` (in percent): filling it further is
/// not worth rewriting it.
const FULL_PERCENT: usize = 90;

/// A session's open blocks: the small blocks after its last full one, as this writer stored them.
#[derive(Debug)]
pub(crate) struct OpenRun {
    /// The first seqs of the stored blocks it spans, in order.
    keys: Vec<u64>,
    first_seq: u64,
    count: u64,
    /// Their records, back to back.
    records: Vec<u8>,
    /// The running digest before the first of them.
    start: Chain,
    /// The bytes they take as stored.
    stored: usize,
}

impl OpenRun {
    /// The seq after its last record.
    fn end_seq(&self) -> u64 {
        self.first_seq + self.count
    }
}

/// What a commit writes for one session.
pub(crate) struct Layout {
    /// Block values by first seq, in order.
    pub blocks: Vec<(u64, Vec<u8>)>,
    /// First seqs of stored blocks the new ones replace (rewritten open blocks).
    pub replaced: Vec<u64>,
    /// The session's open run once the commit applies.
    pub open: Option<OpenRun>,
}

/// Stored bytes per record byte, as last measured: how many records are likely to fill a block.
#[derive(Debug)]
pub(crate) struct Ratio(f64);

impl Default for Ratio {
    fn default() -> Self {
        Ratio(0.5)
    }
}

impl Ratio {
    fn stored(&self, raw: usize) -> usize {
        (raw as f64 * self.0) as usize
    }

    fn raw(&self, stored: usize) -> usize {
        (stored as f64 / self.0) as usize
    }

    fn observe(&mut self, stored: usize, raw: usize) {
        if raw > 0 {
            self.0 = (stored as f64 / raw as f64).clamp(0.01, 2.0);
        }
    }
}

/// Lays out `pending` (one session's admitted blocks, contiguous) after `open`, the session's
/// open run, which is used only if it ends where `pending` begins.
pub(crate) fn lay_out(
    open: Option<&OpenRun>,
    pending: &[PendingBlock],
    options: &StoreOptions,
    ratio: &mut Ratio,
) -> Layout {
    let first_seq = pending[0].first_seq;
    let open = open.filter(|open| open.end_seq() == first_seq);
    let new_bytes: usize = pending.iter().map(|b| b.records.len()).sum();
    let mut records = Vec::with_capacity(new_bytes + open.map_or(0, |o| o.records.len()));
    let full = options.block_bytes * FULL_PERCENT / 100;
    // Rewrite the open blocks only once they and the new records would fill a block.
    let merge = open.filter(|open| open.stored + ratio.stored(new_bytes) >= full);
    let (base, start) = match merge {
        Some(open) => {
            records.extend_from_slice(&open.records);
            (open.first_seq, open.start.clone())
        }
        None => (first_seq, pending[0].start.clone()),
    };
    for block in pending {
        records.extend_from_slice(&block.records);
    }
    let cuts = cut(base, &records, start, options, ratio);
    let last = cuts.last().expect("records make at least one block");
    let still_open = last.value.len() < full && (last.count as usize) < options.block_events;
    let open_after = match (still_open, open, merge) {
        (false, _, _) => None,
        // A small commit after small blocks: they stay open together.
        (true, Some(open), None) if cuts.len() == 1 => {
            let mut keys = open.keys.clone();
            keys.push(last.first_seq);
            let mut run_records = open.records.clone();
            run_records.extend_from_slice(&records);
            Some(OpenRun {
                keys,
                first_seq: open.first_seq,
                count: open.count + u64::from(last.count),
                records: run_records,
                start: open.start.clone(),
                stored: open.stored + last.value.len(),
            })
        }
        (true, _, _) => Some(OpenRun {
            keys: vec![last.first_seq],
            first_seq: last.first_seq,
            count: u64::from(last.count),
            records: records[last.bytes.clone()].to_vec(),
            start: last.before.clone(),
            stored: last.value.len(),
        }),
    };
    Layout {
        replaced: merge.map(|open| open.keys.clone()).unwrap_or_default(),
        blocks: cuts.into_iter().map(|c| (c.first_seq, c.value)).collect(),
        open: open_after,
    }
}

/// A whole log's records (canonical, back to back, from seq 0) laid out in full blocks, the last
/// one as it falls: what an upgrade writes.
pub(crate) fn lay_out_log(records: &[u8], options: &StoreOptions) -> Vec<(u64, Vec<u8>)> {
    cut(0, records, Chain::new(), options, &mut Ratio::default())
        .into_iter()
        .map(|c| (c.first_seq, c.value))
        .collect()
}

/// One stored block cut from a run of records.
struct Cut {
    first_seq: u64,
    count: u32,
    value: Vec<u8>,
    /// Where its records lie in the run.
    bytes: Range<usize>,
    /// The running digest before its first record.
    before: Chain,
}

/// Cuts `records` (canonical, back to back, the first at `first_seq`, the running digest before
/// them `chain`) into blocks of at most `block_events` records and `block_bytes` stored bytes; a
/// single record too large gets a block alone.
fn cut(
    first_seq: u64,
    records: &[u8],
    mut chain: Chain,
    options: &StoreOptions,
    ratio: &mut Ratio,
) -> Vec<Cut> {
    let mut ends = Vec::new();
    let mut rest = records;
    while !rest.is_empty() {
        let (record, after) =
            split_record(rest, 0).expect("the writer's records are canonical: it framed them");
        ends.push(records.len() - after.len());
        debug_assert!(!record.bytes.is_empty());
        rest = after;
    }
    let limit = options.block_bytes;
    let max_events = options.block_events.clamp(1, MAX_BLOCK_RECORDS);
    let mut out = Vec::new();
    let mut start = 0;
    while start < ends.len() {
        let from = if start == 0 { 0 } else { ends[start - 1] };
        // The most records after `start` within `raw` record bytes (and the event limit), at
        // least one. Never more than a record's limit of them, so that every block is within
        // what a reader accepts (`MAX_BLOCK_BYTES`), however well its records compress.
        let fit = |raw: usize| {
            let raw = raw.min(MAX_RECORD_BYTES);
            let most = ends.len().min(start + max_events);
            let within = ends[start..most].partition_point(|&end| end - from <= raw);
            (start + within).max(start + 1)
        };
        let encode = |end: usize| {
            let mut value = Vec::new();
            encode_block(
                (end - start) as u32,
                Digest([0; 32]),
                &records[from..ends[end - 1]],
                &mut value,
            );
            value
        };
        // Aim a little under the limit, so that an estimate a few percent off still fits and the
        // block is encoded once.
        let mut end = fit(ratio.raw(limit * 96 / 100));
        let mut value = encode(end);
        // One step up when the estimate left much of the block empty.
        if value.len() < limit * FULL_PERCENT / 100 && end < ends.len().min(start + max_events) {
            let raw = ends[end - 1] - from;
            let more = fit(raw * limit * 97 / 100 / value.len().max(1));
            if more > end {
                let bigger = encode(more);
                if bigger.len() <= limit {
                    (end, value) = (more, bigger);
                }
            }
        }
        // Down until it fits: each step cuts in proportion to the excess.
        while value.len() > limit && end - start > 1 {
            let raw = ends[end - 1] - from;
            end = fit(raw * limit * 95 / 100 / value.len()).min(end - 1);
            value = encode(end);
        }
        let to = ends[end - 1];
        ratio.observe(value.len(), to - from);
        let before = chain.clone();
        chain.update(&records[from..to]);
        set_block_digest(&mut value, chain.digest());
        out.push(Cut {
            first_seq: first_seq + start as u64,
            count: (end - start) as u32,
            value,
            bytes: from..to,
            before,
        });
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lineage_log::{Encoder, Event, EventBody, TurnStart};

    /// However large the options allow blocks to be, the writer cuts them within what a reader
    /// accepts: at most `MAX_BLOCK_RECORDS` records, and records compressing as well as these
    /// (identical tiny events) still end a block before `MAX_BLOCK_BYTES`.
    #[test]
    fn blocks_are_cut_within_the_readers_limits() {
        let options = StoreOptions {
            block_events: usize::MAX,
            block_bytes: usize::MAX / 1024,
            ..StoreOptions::default()
        };
        let events: Vec<Event> = (0..150_000u64)
            .map(|seq| Event::new(seq, 0, EventBody::TurnStart(TurnStart { turn: 1 })))
            .collect();
        let mut records = Vec::new();
        Encoder::new().encode_all(&events, &mut records);
        let cuts = cut(0, &records, Chain::new(), &options, &mut Ratio::default());
        assert!(cuts.len() >= 3, "{} blocks", cuts.len());
        let mut seq = 0;
        for block in &cuts {
            assert_eq!(block.first_seq, seq);
            assert!(block.count as usize <= MAX_BLOCK_RECORDS, "{}", block.count);
            assert!(block.bytes.len() <= MAX_RECORD_BYTES);
            seq += u64::from(block.count);
        }
        assert_eq!(seq, 150_000);
    }
}
