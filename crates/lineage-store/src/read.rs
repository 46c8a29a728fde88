//! Reading sessions back: one range scan over a session's blocks.

use std::sync::mpsc::{Receiver, Sender};

use lineage_log::{Chain, Event, Records, SessionId, Structure, decode_record};

use crate::engine::View;
use crate::layout::{Block, BlockFormat, Body, SessionRecord, is_compressed, open_block};
use crate::pack::WalkError;
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
    let total = usize::try_from(record.next_seq).unwrap_or(usize::MAX);
    let stored: usize = blocks.iter().map(|b| b.bytes.len()).sum();
    // Both threads decode straight into their own part of one vector, so the parts are never
    // copied together, as long as the headers' counts are plausible for the bytes read (damaged
    // counts must not allocate the machine away); otherwise each part grows as it is decoded.
    let slotted = total <= stored.saturating_mul(MAX_EVENTS_PER_STORED_BYTE);
    let mut events = if slotted {
        vec![PLACEHOLDER; total]
    } else {
        Vec::new()
    };
    let (early_out, late_out) = if slotted {
        let early_len: usize = early.iter().map(|b| b.count as usize).sum();
        let (early_slots, late_slots) = events.split_at_mut(early_len.min(total));
        (
            Out::Slots(early_slots.iter_mut()),
            Out::Slots(late_slots.iter_mut()),
        )
    } else {
        (Out::Grow(Vec::new()), Out::Grow(Vec::new()))
    };
    let (chain, early_done, late_done) = std::thread::scope(|scope| {
        // The helper hands the blocks it decompressed on to this thread, which hashes them.
        let (handoff, decompressed) = std::sync::mpsc::channel();
        let helper = (!late.is_empty())
            .then(|| scope.spawn(|| decode(format, session, late, late_out, handoff)));
        let late_bodies = helper.is_some().then_some(decompressed);
        let (chain, early_done) = hash_and_decode(
            format,
            session,
            &blocks,
            early.len(),
            early_out,
            late_bodies,
        );
        let late_done = helper.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        (chain, early_done, late_done)
    });
    let chain = chain?;
    let early_done = early_done?;
    let late_done = late_done.transpose()?;
    if let (Out::Grow(mut early), late) = (early_done, late_done) {
        if let Some(Out::Grow(mut late)) = late {
            early.append(&mut late);
        }
        events = early;
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
        BlockFormat::V2 => (1, 4),
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

/// At most this many events per stored byte are believed before they are decoded: far more than
/// any real log packs into a byte.
const MAX_EVENTS_PER_STORED_BYTE: usize = 8;

/// Where decoded events go: slots set aside for them, or a vector that grows.
enum Out<'a> {
    Slots(std::slice::IterMut<'a, Event>),
    Grow(Vec<Event>),
}

impl Out<'_> {
    /// Puts `event` in the next place; false when no slot is left.
    fn put(&mut self, event: Event) -> bool {
        match self {
            Out::Slots(slots) => match slots.next() {
                Some(slot) => {
                    *slot = event;
                    true
                }
                None => false,
            },
            Out::Grow(events) => {
                events.push(event);
                true
            }
        }
    }
}

/// Feeds every block through one running hasher, checking each stored digest, and decodes the
/// first `decode` blocks into `out` on the way. The first decode error is kept while the hashing
/// goes on: damage found by a digest outranks it. The later blocks' decompressed bodies come from
/// `late_bodies` (`None` for a block that was not compressed) while the helper sends them.
fn hash_and_decode<'a>(
    format: BlockFormat,
    session: SessionId,
    blocks: &[Stored<'_>],
    decode: usize,
    out: Out<'a>,
    mut late_bodies: Option<Receiver<Option<Vec<u8>>>>,
) -> (Result<Chain>, Result<Out<'a>>) {
    let mut chain = Chain::new();
    let (mut packed, mut canonical) = (Vec::new(), Vec::new());
    let mut out = Ok(out);
    for (i, stored) in blocks.iter().enumerate() {
        let handed = match &late_bodies {
            Some(bodies) if i >= decode => match bodies.recv() {
                Ok(body) => body,
                // The helper stopped (at damage it found): open the rest here.
                Err(_) => {
                    late_bodies = None;
                    None
                }
            },
            _ => None,
        };
        let opened = match &handed {
            Some(entries) => Block::header(session, stored.first_seq, stored.bytes)
                .map(|(count, digest, _)| (count, digest, Body::Packed(entries))),
            None => open_block(format, session, stored.first_seq, stored.bytes, &mut packed),
        };
        let (_, digest, body) = match opened {
            Ok(opened) => opened,
            Err(e) => return (Err(e), out),
        };
        let records = match body {
            Body::Canonical(records) => records,
            Body::Packed(entries) => {
                canonical.clear();
                if let Err(reason) = crate::pack::unpack(entries, &mut canonical) {
                    return (Err(damaged(session, stored, reason)), out);
                }
                &canonical[..]
            }
        };
        chain.update(records);
        if chain.digest() != digest {
            let reason = "digest mismatch: the block's records are not the ones written".into();
            return (Err(damaged(session, stored, reason)), out);
        }
        if i < decode
            && let Ok(events) = &mut out
            && let Err(e) = decode_body(session, stored, body, 0, events)
        {
            out = Err(e);
        }
    }
    (Ok(chain), out)
}

/// Opens and decodes `blocks` into `out`, handing each decompressed body on to `handoff` (and
/// `None` for a body that was not compressed).
fn decode<'a>(
    format: BlockFormat,
    session: SessionId,
    blocks: &[Stored<'_>],
    mut out: Out<'a>,
    handoff: Sender<Option<Vec<u8>>>,
) -> Result<Out<'a>> {
    let mut packed = Vec::new();
    for stored in blocks {
        let compressed = is_compressed(format, stored.bytes);
        let (_, _, body) =
            open_block(format, session, stored.first_seq, stored.bytes, &mut packed)?;
        decode_body(session, stored, body, 0, &mut out)?;
        // The hashing thread may have stopped at damage: then nobody takes the body.
        let _ = handoff.send(compressed.then(|| std::mem::take(&mut packed)));
    }
    Ok(out)
}

/// Damage to `stored`, named by its seqs.
fn damaged(session: SessionId, stored: &Stored<'_>, reason: String) -> StoreError {
    StoreError::CorruptBlock {
        session,
        first_seq: stored.first_seq,
        last_seq: stored.first_seq + u64::from(stored.count) - 1,
        reason,
    }
}

/// Decodes a block's records from seq `from` on into `out` (the earlier ones are split, or walked,
/// but not decoded), checking the block's record count.
fn decode_body(
    session: SessionId,
    stored: &Stored<'_>,
    body: Body<'_>,
    from: u64,
    out: &mut Out<'_>,
) -> Result<()> {
    let mut room = true;
    let mut put = |event: Event| room &= out.put(event);
    let held = match body {
        Body::Canonical(records) => {
            let mut held = 0u64;
            for item in Records::new(records, stored.first_seq) {
                let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
                if seq >= from {
                    put(decode_record(seq, &raw).map_err(|e| StoreError::from_log(session, e))?);
                }
                held += 1;
            }
            held
        }
        Body::Packed(entries) => crate::pack::decode(entries, stored.first_seq, from, &mut put)
            .map_err(|e| match e {
                WalkError::Packing(reason) => damaged(session, stored, reason),
                WalkError::Visit(e) => StoreError::from_log(session, e),
            })?,
    };
    if !room || held != u64::from(stored.count) {
        return Err(damaged(
            session,
            stored,
            format!(
                "header counts {} records, the block holds {held}",
                stored.count
            ),
        ));
    }
    Ok(())
}

/// A cheap stand-in for slots not yet decoded; every one is overwritten before a load returns.
const PLACEHOLDER: Event = Event {
    seq: 0,
    time_ms: 0,
    body: lineage_log::EventBody::StepStart(lineage_log::StepStart { turn: 0, step: 0 }),
};

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
    let mut out = Out::Grow(Vec::with_capacity(
        (record.next_seq - from).min(1 << 20) as usize
    ));
    let mut packed = Vec::new();
    for block in view.blocks(session, start)? {
        let (first_seq, value) = block?;
        let (count, _, body) = open_block(format, session, first_seq, &value, &mut packed)?;
        let stored = Stored {
            first_seq,
            count,
            bytes: &value,
        };
        decode_body(session, &stored, body, from, &mut out)?;
    }
    let Out::Grow(events) = out else {
        unreachable!("a tail read collects into a growing vector")
    };
    Ok(events)
}
