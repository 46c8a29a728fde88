//! The on-disk layout: tables, keys, session records and blocks. `schema/FORMAT.md` documents it;
//! every change here is a format change.

use lineage_log::{Digest, Header, SessionId};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use crate::{Result, StoreError};

/// `meta`: store-wide facts, by name.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("lineage/meta");
/// `sessions`: session id (as a big-endian integer) → [`SessionRecord`].
pub(crate) const SESSIONS: TableDefinition<u128, &[u8]> = TableDefinition::new("lineage/sessions");
/// `events`: (session, first seq) → one block.
pub(crate) const EVENTS: TableDefinition<(u128, u64), &[u8]> =
    TableDefinition::new("lineage/events");
/// `children`: (parent, child) → nothing; lists a parent's children without a scan.
pub(crate) const CHILDREN: TableDefinition<(u128, u128), ()> =
    TableDefinition::new("lineage/children");

/// `meta` key of the magic value that marks a Lineage store.
pub(crate) const META_MAGIC: &str = "magic";
/// The magic value.
pub(crate) const MAGIC: &[u8] = b"lineage store";
/// `meta` key of the format version (u32, little endian).
pub(crate) const META_FORMAT: &str = "format_version";
/// `meta` key of the store id (16 bytes, a UUID).
pub(crate) const META_STORE_ID: &str = "store_id";

/// Size of a block's header: record count (u32 LE) then the running digest at its last record.
pub(crate) const BLOCK_HEADER_LEN: usize = 4 + 32;

/// A session's row in `sessions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub header: Header,
    /// The seq the next appended event must carry: the number of stored events.
    pub next_seq: u64,
    /// The running digest at `next_seq - 1`.
    pub head: Digest,
    /// Incremented once per committed write to the session.
    pub revision: u64,
}

impl SessionRecord {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("postcard serialization into a Vec is infallible")
    }

    pub fn decode(session: SessionId, bytes: &[u8]) -> Result<SessionRecord> {
        let (record, rest) = postcard::take_from_bytes::<SessionRecord>(bytes).map_err(|e| {
            StoreError::CorruptHeader {
                session,
                reason: format!("does not decode: {e}"),
            }
        })?;
        if !rest.is_empty() || record.header.id != session {
            return Err(StoreError::CorruptHeader {
                session,
                reason: "the stored record does not belong to this session".into(),
            });
        }
        Ok(record)
    }
}

/// A block: a contiguous run of one session's records with a small header.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block<'a> {
    pub count: u32,
    pub digest: Digest,
    pub records: &'a [u8],
}

impl<'a> Block<'a> {
    pub fn parse(session: SessionId, first_seq: u64, bytes: &'a [u8]) -> Result<Block<'a>> {
        let corrupt = |reason: &str| StoreError::CorruptBlock {
            session,
            first_seq,
            last_seq: first_seq,
            reason: reason.to_owned(),
        };
        if bytes.len() < BLOCK_HEADER_LEN {
            return Err(corrupt("shorter than a block header"));
        }
        let (head, records) = bytes.split_at(BLOCK_HEADER_LEN);
        let count = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let digest = Digest(head[4..].try_into().expect("32 bytes"));
        if count == 0 || records.is_empty() {
            return Err(corrupt("holds no records"));
        }
        // The smallest record is 4 bytes (length, tag, flags, time), so a count above a quarter
        // of the bytes is damage, and it bounds what a load allocates.
        if count as usize > records.len() / 4 {
            return Err(corrupt("counts more records than its bytes can hold"));
        }
        // Keeps seq arithmetic from overflowing: the seq after every block that parses (its
        // `last_seq + 1`) is representable.
        if first_seq.checked_add(u64::from(count)).is_none() {
            return Err(corrupt("its records would run past the largest seq"));
        }
        Ok(Block {
            count,
            digest,
            records,
        })
    }

    /// The seq of the block's last record. `first_seq` is the one the block was parsed with,
    /// which `parse` checked leaves room for every record.
    pub fn last_seq(&self, first_seq: u64) -> u64 {
        first_seq + u64::from(self.count) - 1
    }
}

/// Writes a block value: header then records.
pub(crate) fn encode_block(count: u32, digest: Digest, records: &[u8], out: &mut Vec<u8>) {
    out.reserve(BLOCK_HEADER_LEN + records.len());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&digest.0);
    out.extend_from_slice(records);
}

/// The key range of one session's blocks.
pub(crate) fn session_blocks(session: SessionId) -> std::ops::RangeInclusive<(u128, u64)> {
    let id = session.as_u128();
    (id, 0)..=(id, u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block whose key puts its records (or the seq after them) past `u64::MAX` is damage, refused before any seq
    /// arithmetic can overflow.
    #[test]
    fn a_block_running_past_the_largest_seq_is_refused() {
        let session = SessionId::from_u128(7);
        let mut bytes = Vec::new();
        encode_block(2, Digest([0; 32]), &[0u8; 8], &mut bytes);
        let block = Block::parse(session, u64::MAX - 2, &bytes).expect("the next seq is u64::MAX");
        assert_eq!(block.last_seq(u64::MAX - 2), u64::MAX - 1);
        match Block::parse(session, u64::MAX - 1, &bytes) {
            Err(StoreError::CorruptBlock {
                first_seq, reason, ..
            }) => {
                assert_eq!(first_seq, u64::MAX - 1);
                assert!(reason.contains("largest seq"), "{reason}");
            }
            other => panic!("expected a corrupt block, got {other:?}"),
        }
    }

    /// The session rows of `schema/golden/session.txt` decode with the store's own type and
    /// re-encode byte for byte, so the documented row layout is the one the store uses.
    #[test]
    fn golden_session_rows_round_trip() {
        let text = include_str!("../../../schema/golden/session.txt");
        let mut rows = 0;
        for line in text.lines().filter(|l| l.starts_with("session/")) {
            let (name, hex) = line.split_once(' ').expect("`name hex`");
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            let (record, rest) = postcard::take_from_bytes::<SessionRecord>(&bytes)
                .unwrap_or_else(|e| panic!("{name} does not decode: {e}"));
            assert!(rest.is_empty(), "{name} has trailing bytes");
            let decoded = SessionRecord::decode(record.header.id, &bytes).expect("decode");
            assert_eq!(decoded.encode(), bytes, "{name} re-encodes differently");
            rows += 1;
        }
        assert!(rows >= 2, "the golden file holds the session rows");
    }

    #[test]
    fn a_row_of_another_session_is_refused() {
        let header = Header::new(SessionId::from_u128(7), 0);
        let record = SessionRecord {
            header,
            next_seq: 0,
            head: lineage_log::Digest::of_empty(),
            revision: 0,
        };
        let err = SessionRecord::decode(SessionId::from_u128(8), &record.encode()).unwrap_err();
        assert!(matches!(err, StoreError::CorruptHeader { .. }), "{err}");
    }
}
