//! Reading sessions back: one range scan over a session's blocks.

use lineage_log::{Chain, Event, Records, SessionId, Structure, decode_record};

use crate::engine::View;
use crate::layout::{Block, BlockFormat, Buffers, SessionRecord};
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
/// digest, so damage is reported as the block's seq range. Intact digests prove the records are
/// the ones the writer checked when it admitted them, so only the open tail turn is replayed to
/// recover the structure; `verify` re-checks every rule.
pub(crate) fn read_log(
    view: &dyn View,
    format: BlockFormat,
    session: SessionId,
) -> Result<StoredLog> {
    let record = read_record(view, session)?;
    // The values keep each block's bytes in place while they are hashed and decoded.
    let values = view.blocks(session, 0)?.collect::<Result<Vec<_>>>()?;
    let mut blocks = Vec::with_capacity(values.len());
    let mut expected = 0u64;
    for (first_seq, value) in &values {
        let (count, _, _) = Block::header(session, *first_seq, value)?;
        if *first_seq != expected {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq: *first_seq,
                last_seq: first_seq + u64::from(count) - 1,
                reason: format!("seq gap: expected a block starting at seq {expected}"),
            });
        }
        expected = first_seq + u64::from(count);
        blocks.push(Stored {
            first_seq: *first_seq,
            count,
            bytes: value,
        });
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

    // Large sessions decode on two threads: a helper unpacks and decodes the later blocks while
    // this thread unpacks and hashes every block, decoding the earlier ones as it goes. A digest
    // mismatch outranks any decode error, so damage is always named by its block's seq range.
    let split = if record.next_seq >= PARALLEL_DECODE_MIN && parallelism() > 1 {
        split_point(format, &blocks)
    } else {
        blocks.len()
    };
    let (early, late) = blocks.split_at(split);
    let (chain, events, late_events) = std::thread::scope(|scope| {
        let helper = (!late.is_empty()).then(|| scope.spawn(|| decode(format, session, late)));
        let (chain, early_events) = hash_and_decode(format, session, &blocks, early.len());
        let late_events = helper.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        (chain, early_events, late_events)
    });
    let chain = chain?;
    let mut events = events?;
    if let Some(late) = late_events {
        events.append(&mut late?);
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
    drop(values);
    Ok(StoredLog {
        record,
        events,
        chain,
        structure,
    })
}

/// A stored block not yet unpacked: where it starts, how many records its header counts, its
/// bytes.
struct Stored<'a> {
    first_seq: u64,
    count: u32,
    bytes: &'a [u8],
}

/// Sessions at least this long decode on two threads.
const PARALLEL_DECODE_MIN: u64 = 20_000;

fn parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Where the helper's share starts, as a share of the stored bytes. This thread also hashes every
/// block (and, in format 2, unpacks every block to do so), so it decodes fewer: measured on
/// realistic sessions, these splits end both threads within a few percent of each other.
fn split_point(format: BlockFormat, blocks: &[Stored<'_>]) -> usize {
    let (mine, of) = match format {
        BlockFormat::V1 => (1, 2),
        BlockFormat::V2 => (3, 8),
    };
    let bytes: usize = blocks.iter().map(|b| b.bytes.len()).sum();
    let mut so_far = 0;
    for (i, block) in blocks.iter().enumerate() {
        if so_far * of >= bytes * mine {
            return i;
        }
        so_far += block.bytes.len();
    }
    blocks.len()
}

/// Feeds every block through one running hasher, checking each stored digest, and decodes the
/// first `decode` blocks on the way. The first decode error is kept while the hashing goes on.
fn hash_and_decode(
    format: BlockFormat,
    session: SessionId,
    blocks: &[Stored<'_>],
    decode: usize,
) -> (Result<Chain>, Result<Vec<Event>>) {
    let mut chain = Chain::new();
    let mut buffers = Buffers::default();
    let mut events = Ok(with_capacity(&blocks[..decode]));
    for (i, stored) in blocks.iter().enumerate() {
        let block = match Block::parse_into(
            format,
            session,
            stored.first_seq,
            stored.bytes,
            &mut buffers,
        ) {
            Ok(block) => block,
            Err(e) => return (Err(e), events),
        };
        chain.update(&block.records);
        if chain.digest() != block.digest {
            let damage = StoreError::CorruptBlock {
                session,
                first_seq: stored.first_seq,
                last_seq: block.last_seq(stored.first_seq),
                reason: "digest mismatch: the block's records are not the ones written".into(),
            };
            return (Err(damage), events);
        }
        if i < decode
            && let Ok(out) = &mut events
            && let Err(e) = decode_block(session, stored.first_seq, &block, out)
        {
            events = Err(e);
        }
    }
    (Ok(chain), events)
}

/// Unpacks and decodes `blocks`.
fn decode(format: BlockFormat, session: SessionId, blocks: &[Stored<'_>]) -> Result<Vec<Event>> {
    let mut buffers = Buffers::default();
    let mut events = with_capacity(blocks);
    for stored in blocks {
        let block = Block::parse_into(
            format,
            session,
            stored.first_seq,
            stored.bytes,
            &mut buffers,
        )?;
        decode_block(session, stored.first_seq, &block, &mut events)?;
    }
    Ok(events)
}

/// Room for the events of `blocks`, as their headers count them, but never more than their bytes
/// could plausibly hold: a damaged count must not allocate the machine away (the count is checked
/// against the records as they are decoded).
fn with_capacity(blocks: &[Stored<'_>]) -> Vec<Event> {
    let counted: usize = blocks.iter().map(|b| b.count as usize).sum();
    let bytes: usize = blocks.iter().map(|b| b.bytes.len()).sum();
    Vec::with_capacity(counted.min(bytes.saturating_mul(8)))
}

/// Decodes a block's records onto `events`, checking the block's record count.
fn decode_block(
    session: SessionId,
    first_seq: u64,
    block: &Block<'_>,
    events: &mut Vec<Event>,
) -> Result<()> {
    let last_seq = block.last_seq(first_seq);
    let mut records = Records::new(&block.records, first_seq);
    for item in records.by_ref() {
        let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
        if seq > last_seq {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq,
                last_seq,
                reason: "holds more records than its header counts".into(),
            });
        }
        events.push(decode_record(seq, &raw).map_err(|e| StoreError::from_log(session, e))?);
    }
    if records.next_seq() != last_seq + 1 {
        return Err(StoreError::CorruptBlock {
            session,
            first_seq,
            last_seq,
            reason: format!(
                "header counts {} records, the block holds {}",
                block.count,
                records.next_seq() - first_seq
            ),
        });
    }
    Ok(())
}

/// The stored events with `seq >= from`, found with one reverse lookup and a forward scan. Blocks
/// are decoded but, without the prefix, their digests cannot be checked: `verify` and `load` do.
pub(crate) fn read_from(
    view: &dyn View,
    format: BlockFormat,
    session: SessionId,
    from: u64,
) -> Result<Vec<Event>> {
    let record = read_record(view, session)?;
    if from >= record.next_seq {
        return Ok(Vec::new());
    }
    let start = view.block_start(session, from)?;
    let mut events = Vec::with_capacity((record.next_seq - from).min(1 << 20) as usize);
    for block in view.blocks(session, start)? {
        let (first_seq, value) = block?;
        let block = Block::parse(format, session, first_seq, &value)?;
        for item in Records::new(&block.records, first_seq) {
            let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
            if seq >= from {
                events
                    .push(decode_record(seq, &raw).map_err(|e| StoreError::from_log(session, e))?);
            }
        }
    }
    Ok(events)
}
