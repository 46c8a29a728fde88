//! Reading sessions back: one range scan over a session's blocks.

use lineage_log::{Chain, Event, Records, SessionId, Structure, decode_record};

use crate::engine::View;
use crate::layout::{Block, SessionRecord};
use crate::{Result, StoreError};

/// A session as stored: its row, every event, and the digest and structure after the last one.
pub(crate) struct StoredLog {
    pub record: SessionRecord,
    pub events: Vec<Event>,
    pub chain: Chain,
    pub structure: Structure,
}

pub(crate) fn read_record(view: &dyn View, session: SessionId) -> Result<SessionRecord> {
    let Some(bytes) = view.row(session)? else {
        return Err(StoreError::UnknownSession { session });
    };
    let record = SessionRecord::decode(session, &bytes)?;
    lineage_log::check_format_version(record.header.format_version)
        .map_err(|e| StoreError::from_log(session, e))?;
    Ok(record)
}

/// Reads, digest-checks and decodes every event of `session`.
///
/// Each block's records go through one running hasher and must reproduce the block's stored
/// digest before any of them is decoded, so damage is reported as the block's seq range. Intact
/// digests prove the records are the ones the writer checked when it admitted them, so only the
/// open tail turn is replayed to recover the structure; `verify` re-checks every rule.
pub(crate) fn read_log(view: &dyn View, session: SessionId) -> Result<StoredLog> {
    let record = read_record(view, session)?;
    // The values keep each block's bytes in place while they are hashed and decoded.
    let guards = view.blocks(session, 0)?.collect::<Result<Vec<_>>>()?;
    let mut blocks = Vec::with_capacity(guards.len());
    let mut expected = 0u64;
    for (first_seq, guard) in &guards {
        let block = Block::parse(session, *first_seq, guard)?;
        if *first_seq != expected {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq: *first_seq,
                last_seq: block.last_seq(*first_seq),
                reason: format!("seq gap: expected a block starting at seq {expected}"),
            });
        }
        expected = block.last_seq(*first_seq) + 1;
        blocks.push((*first_seq, block));
    }
    if expected != record.next_seq {
        return Err(StoreError::CorruptHeader {
            session,
            reason: format!(
                "the header records {} events, the blocks hold {expected}",
                record.next_seq
            ),
        });
    }

    // Large sessions decode on two threads: a helper decodes the later blocks while this thread
    // hashes every block, then decodes the earlier ones. A digest mismatch outranks any decode
    // error, so damage is always named by its block's seq range.
    let total = usize::try_from(record.next_seq).unwrap_or(usize::MAX);
    let split = if total >= PARALLEL_DECODE_MIN && parallelism() > 1 {
        split_point(&blocks)
    } else {
        blocks.len()
    };
    let (early, late) = blocks.split_at(split);
    // Both threads decode straight into their own part of one vector, so the halves are never
    // copied together afterwards.
    let early_len: usize = early.iter().map(|(_, b)| b.count as usize).sum();
    // `total` is bounded by the bytes read: a block holds at most a record per 4 bytes.
    let mut events = vec![PLACEHOLDER; total];
    let (early_slots, late_slots) = events.split_at_mut(early_len.min(total));
    let (chain, early_done, late_done) = std::thread::scope(|scope| {
        let helper =
            (!late.is_empty()).then(|| scope.spawn(|| decode_into(session, late, late_slots)));
        let chain = hash_blocks(session, &blocks);
        let early_done = chain
            .as_ref()
            .ok()
            .map(|_| decode_into(session, early, early_slots));
        let late_done = helper.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        (chain, early_done, late_done)
    });
    let chain = chain?;
    early_done.expect("decoded once the digests held")?;
    if let Some(late) = late_done {
        late?;
    }
    if chain.digest() != record.head {
        return Err(StoreError::CorruptHeader {
            session,
            reason: "the header's head digest differs from its blocks'".into(),
        });
    }
    let structure = Structure::of_valid_log(&events).map_err(|e| match e {
        lineage_log::LogError::InvalidEvent { seq, reason, .. } => StoreError::Corrupt {
            session,
            seq,
            reason,
        },
        other => StoreError::from_log(session, other),
    })?;
    drop(blocks);
    drop(guards);
    Ok(StoredLog {
        record,
        events,
        chain,
        structure,
    })
}

/// Sessions at least this long decode on two threads.
const PARALLEL_DECODE_MIN: usize = 20_000;

fn parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Where the helper's share starts: half of the bytes. This thread also hashes every block, but
/// the helper's share, the session's later records, decodes more slowly per byte (measured on
/// realistic sessions: an even split ends both threads within a few percent of each other).
fn split_point(blocks: &[(u64, Block<'_>)]) -> usize {
    let bytes: usize = blocks.iter().map(|(_, b)| b.records.len()).sum();
    let mut mine = 0;
    for (i, (_, block)) in blocks.iter().enumerate() {
        if mine * 2 >= bytes {
            return i;
        }
        mine += block.records.len();
    }
    blocks.len()
}

/// Feeds every block through one running hasher, checking each stored digest.
fn hash_blocks(session: SessionId, blocks: &[(u64, Block<'_>)]) -> Result<Chain> {
    let mut chain = Chain::new();
    for (first_seq, block) in blocks {
        chain.update(block.records);
        if chain.digest() != block.digest {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq: *first_seq,
                last_seq: block.last_seq(*first_seq),
                reason: "digest mismatch: the block's records are not the ones written".into(),
            });
        }
    }
    Ok(chain)
}

/// A cheap stand-in for slots not yet decoded; every one is overwritten before a load returns.
const PLACEHOLDER: Event = Event {
    seq: 0,
    time_ms: 0,
    body: lineage_log::EventBody::StepStart(lineage_log::StepStart { turn: 0, step: 0 }),
};

/// Decodes the records of `blocks` into `slots` (exactly as many as the blocks hold), checking
/// each block's record count.
fn decode_into(session: SessionId, blocks: &[(u64, Block<'_>)], slots: &mut [Event]) -> Result<()> {
    let mut slots = slots.iter_mut();
    for (first_seq, block) in blocks {
        let last_seq = block.last_seq(*first_seq);
        let mut records = Records::new(block.records, *first_seq);
        for item in records.by_ref() {
            let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
            let event = decode_record(seq, &raw).map_err(|e| StoreError::from_log(session, e))?;
            match slots.next() {
                Some(slot) => *slot = event,
                None => {
                    return Err(StoreError::CorruptBlock {
                        session,
                        first_seq: *first_seq,
                        last_seq,
                        reason: "holds more records than its header counts".into(),
                    });
                }
            }
        }
        if records.next_seq() != last_seq + 1 {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq: *first_seq,
                last_seq,
                reason: format!(
                    "header counts {} records, the block holds {}",
                    block.count,
                    records.next_seq() - first_seq
                ),
            });
        }
    }
    Ok(())
}

/// The stored events with `seq >= from`, found with one reverse lookup and a forward scan. Blocks
/// are decoded but, without the prefix, their digests cannot be checked: `verify` and `load` do.
pub(crate) fn read_from(view: &dyn View, session: SessionId, from: u64) -> Result<Vec<Event>> {
    let record = read_record(view, session)?;
    if from >= record.next_seq {
        return Ok(Vec::new());
    }
    let start = view.block_start(session, from)?;
    let mut events = Vec::with_capacity((record.next_seq - from).min(1 << 20) as usize);
    for block in view.blocks(session, start)? {
        let (first_seq, value) = block?;
        let block = Block::parse(session, first_seq, &value)?;
        for item in Records::new(block.records, first_seq) {
            let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
            if seq >= from {
                events
                    .push(decode_record(seq, &raw).map_err(|e| StoreError::from_log(session, e))?);
            }
        }
    }
    Ok(events)
}
