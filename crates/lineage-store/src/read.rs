//! Reading sessions back: one range scan over a session's blocks.

use lineage_log::{Chain, Event, Records, SessionId, Structure, decode_record};
use redb::ReadTransaction;

use crate::layout::{Block, EVENTS, SESSIONS, SessionRecord, session_blocks};
use crate::{Result, StoreError};

/// A session as stored: its row, every event, and the digest and structure after the last one.
pub(crate) struct StoredLog {
    pub record: SessionRecord,
    pub events: Vec<Event>,
    pub chain: Chain,
    pub structure: Structure,
}

pub(crate) fn read_record(txn: &ReadTransaction, session: SessionId) -> Result<SessionRecord> {
    let sessions = txn.open_table(SESSIONS)?;
    let Some(bytes) = sessions.get(session.as_u128())? else {
        return Err(StoreError::UnknownSession { session });
    };
    let record = SessionRecord::decode(session, bytes.value())?;
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
pub(crate) fn read_log(txn: &ReadTransaction, session: SessionId) -> Result<StoredLog> {
    let record = read_record(txn, session)?;
    let table = txn.open_table(EVENTS)?;
    let capacity = usize::try_from(record.next_seq).unwrap_or(0).min(1 << 24);
    let mut events = Vec::with_capacity(capacity);
    let mut chain = Chain::new();
    let mut expected = 0u64;
    for entry in table.range(session_blocks(session))? {
        let (key, value) = entry?;
        let (_, first_seq) = key.value();
        let block = Block::parse(session, first_seq, value.value())?;
        let last_seq = block.last_seq(first_seq);
        if first_seq != expected {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq,
                last_seq,
                reason: format!("seq gap: expected a block starting at seq {expected}"),
            });
        }
        chain.update(block.records);
        if chain.digest() != block.digest {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq,
                last_seq,
                reason: "digest mismatch: the block's records are not the ones written".into(),
            });
        }
        let mut records = Records::new(block.records, first_seq);
        for item in records.by_ref() {
            let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
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
        expected = last_seq + 1;
    }
    if expected != record.next_seq || chain.digest() != record.head {
        return Err(StoreError::CorruptHeader {
            session,
            reason: format!(
                "the header records {} events and its head digest, the blocks hold {expected}",
                record.next_seq
            ),
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
    Ok(StoredLog {
        record,
        events,
        chain,
        structure,
    })
}

/// The stored events with `seq >= from`, found with one reverse lookup and a forward scan. Blocks
/// are decoded but, without the prefix, their digests cannot be checked: `verify` and `load` do.
pub(crate) fn read_from(
    txn: &ReadTransaction,
    session: SessionId,
    from: u64,
) -> Result<Vec<Event>> {
    let record = read_record(txn, session)?;
    if from >= record.next_seq {
        return Ok(Vec::new());
    }
    let table = txn.open_table(EVENTS)?;
    let id = session.as_u128();
    let start = match table.range((id, 0)..=(id, from))?.next_back() {
        Some(entry) => entry?.0.value().1,
        None => 0,
    };
    let mut events = Vec::with_capacity((record.next_seq - from).min(1 << 20) as usize);
    for entry in table.range((id, start)..=(id, u64::MAX))? {
        let (key, value) = entry?;
        let first_seq = key.value().1;
        let block = Block::parse(session, first_seq, value.value())?;
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
