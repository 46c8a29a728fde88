//! The on-disk layout: session records, blocks and the store's `meta` keys, the same on every
//! engine (the embedded file's tables are `engine::redb::tables`). `schema/FORMAT.md` documents
//! it; every change here is a format change.

use std::borrow::Cow;

use lineage_log::{Digest, Header, SessionId};
use serde::{Deserialize, Serialize};

use crate::{Result, StoreError};

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

/// The largest record (one event, framed) the store accepts: an admission holding a larger one
/// is refused ([`StoreError::RecordTooLarge`]).
pub const MAX_RECORD_BYTES: usize = 64 << 20;
/// The most records one block holds: the writer never cuts more, and a block header counting more
/// is damage. It bounds what opening one block allocates per record.
pub const MAX_BLOCK_RECORDS: usize = 1 << 16;
/// The most bytes one block's records take, canonical or packed: a block whose stated or actual
/// size is larger is damage, found before anything that size is allocated. A block of several
/// records holds at most [`MAX_RECORD_BYTES`] of canonical records (the writer cuts there), and
/// packing adds at most ten bytes a record, so every block the writer makes is within it.
pub const MAX_BLOCK_BYTES: usize = MAX_RECORD_BYTES + 10 * MAX_BLOCK_RECORDS;

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

/// How a store lays out its blocks: its store format version (`meta`'s `format_version`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockFormat {
    /// Store format 1: the canonical records as they are. Read only; `Store::upgrade` rewrites it.
    V1,
    /// Store format 2: the records packed (`pack`), the packed bytes compressed when that is
    /// smaller. What this build writes.
    V2,
}

impl BlockFormat {
    /// The format of store format version `version`, if this build reads it.
    pub fn of_version(version: u32) -> Option<BlockFormat> {
        match version {
            1 => Some(BlockFormat::V1),
            2 => Some(BlockFormat::V2),
            _ => None,
        }
    }
}

/// How a format-2 block's body is stored (the byte after the block header).
const BODY_PACKED: u8 = 0;
/// The packed bytes, LZ4-compressed (block format): `raw length:varint ‖ compressed bytes`.
const BODY_LZ4: u8 = 1;

/// A block: a contiguous run of one session's records with a small header.
#[derive(Clone, Debug)]
pub(crate) struct Block<'a> {
    pub count: u32,
    pub digest: Digest,
    /// The canonical records: borrowed from the stored value in format 1, unpacked in format 2.
    pub records: Cow<'a, [u8]>,
}

impl<'a> Block<'a> {
    /// Parses a stored block, unpacking a format-2 block into a buffer of its own.
    pub fn parse(
        format: BlockFormat,
        session: SessionId,
        first_seq: u64,
        bytes: &'a [u8],
    ) -> Result<Block<'a>> {
        let (count, digest, body) = Self::header(session, first_seq, bytes)?;
        let records = match format {
            BlockFormat::V1 => Cow::Borrowed(body),
            BlockFormat::V2 => {
                let mut records = Vec::new();
                unpack_body(body, &mut Vec::new(), &mut records)
                    .map_err(|reason| corrupt(session, first_seq, count, &reason))?;
                Cow::Owned(records)
            }
        };
        Self::checked(session, first_seq, count, digest, records)
    }

    /// The record count and digest of a stored block, and its body, without unpacking it.
    pub fn header(
        session: SessionId,
        first_seq: u64,
        bytes: &[u8],
    ) -> Result<(u32, Digest, &[u8])> {
        if bytes.len() < BLOCK_HEADER_LEN {
            return Err(corrupt(
                session,
                first_seq,
                1,
                "shorter than a block header",
            ));
        }
        let (head, body) = bytes.split_at(BLOCK_HEADER_LEN);
        let count = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let digest = Digest(head[4..].try_into().expect("32 bytes"));
        if count == 0 {
            return Err(corrupt(session, first_seq, 1, "holds no records"));
        }
        if count as usize > MAX_BLOCK_RECORDS {
            return Err(corrupt(
                session,
                first_seq,
                1,
                &format!("counts {count} records, more than the {MAX_BLOCK_RECORDS} a block holds"),
            ));
        }
        // Keeps seq arithmetic from overflowing: the seq after every block that parses (its
        // `last_seq + 1`) is representable.
        if first_seq.checked_add(u64::from(count)).is_none() {
            return Err(corrupt(
                session,
                first_seq,
                1,
                "its records would run past the largest seq",
            ));
        }
        Ok((count, digest, body))
    }

    fn checked(
        session: SessionId,
        first_seq: u64,
        count: u32,
        digest: Digest,
        records: Cow<'a, [u8]>,
    ) -> Result<Block<'a>> {
        if records.is_empty() {
            return Err(corrupt(session, first_seq, count, "holds no records"));
        }
        // The smallest record is 4 bytes (length, tag, flags, time), so a count above a quarter
        // of the bytes is damage.
        if count as usize > records.len() / 4 {
            return Err(corrupt(
                session,
                first_seq,
                count,
                "counts more records than its bytes can hold",
            ));
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

/// Damage to the block at `first_seq` whose header counts `count` records (1 when the header
/// itself is damaged).
fn corrupt(session: SessionId, first_seq: u64, count: u32, reason: &str) -> StoreError {
    StoreError::CorruptBlock {
        session,
        first_seq,
        last_seq: first_seq.saturating_add(u64::from(count).max(1) - 1),
        reason: reason.to_owned(),
    }
}

/// Unpacks a format-2 body into canonical records appended to `records`, decompressing into
/// `packed` first if it is compressed. (Their count is checked where they are split.)
fn unpack_body(
    body: &[u8],
    packed: &mut Vec<u8>,
    records: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    crate::pack::unpack(packed_entries(body, packed)?, records).map(drop)
}

/// The packed entries of a format-2 body: the body's own bytes, or decompressed into `packed`.
fn packed_entries<'a>(
    body: &'a [u8],
    packed: &'a mut Vec<u8>,
) -> std::result::Result<&'a [u8], String> {
    let (&kind, body) = body.split_first().ok_or("no body")?;
    match kind {
        BODY_PACKED => Ok(body),
        BODY_LZ4 => {
            let (raw_len, compressed) =
                lineage_log::take_varint(body).ok_or("bad uncompressed length")?;
            // Checked before anything is allocated: no block the writer makes is larger, and LZ4
            // expands a byte into at most 255.
            let raw_len = usize::try_from(raw_len).unwrap_or(usize::MAX);
            if raw_len > MAX_BLOCK_BYTES {
                return Err(format!(
                    "records an uncompressed length of {raw_len} bytes, more than the \
                     {MAX_BLOCK_BYTES} a block may hold"
                ));
            }
            if raw_len > compressed.len().saturating_mul(255) {
                return Err("an uncompressed length the compressed bytes cannot hold".into());
            }
            packed.clear();
            packed.resize(raw_len, 0);
            let written = lz4_flex::block::decompress_into(compressed, packed)
                .map_err(|e| format!("does not decompress: {e}"))?;
            if written != raw_len {
                return Err("decompresses to another length than it records".into());
            }
            Ok(&packed[..])
        }
        other => Err(format!("unknown body encoding {other}")),
    }
}

/// Whether a stored block's body is compressed: opening it decompresses into the caller's buffer.
pub(crate) fn is_compressed(format: BlockFormat, bytes: &[u8]) -> bool {
    format == BlockFormat::V2 && bytes.get(BLOCK_HEADER_LEN) == Some(&BODY_LZ4)
}

/// A stored block's records as they are kept: canonical (format 1) or packed (format 2).
pub(crate) enum Body<'a> {
    Canonical(&'a [u8]),
    Packed(&'a [u8]),
}

/// The record count, digest and records of a stored block, decompressing a compressed body into
/// `packed` but not unpacking it.
pub(crate) fn open_block<'a>(
    format: BlockFormat,
    session: SessionId,
    first_seq: u64,
    bytes: &'a [u8],
    packed: &'a mut Vec<u8>,
) -> Result<(u32, Digest, Body<'a>)> {
    let (count, digest, body) = Block::header(session, first_seq, bytes)?;
    let body = match format {
        BlockFormat::V1 => Body::Canonical(body),
        BlockFormat::V2 => Body::Packed(
            packed_entries(body, packed)
                .map_err(|reason| corrupt(session, first_seq, count, &reason))?,
        ),
    };
    Ok((count, digest, body))
}

/// Writes a block value as this build stores it (format 2): header, then the records packed, and
/// compressed when that is smaller.
pub(crate) fn encode_block(count: u32, digest: Digest, records: &[u8], out: &mut Vec<u8>) {
    out.reserve(BLOCK_HEADER_LEN + 1 + records.len() / 2);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&digest.0);
    let mut packed = Vec::with_capacity(records.len());
    crate::pack::pack(records, &mut packed)
        .expect("the writer's records are canonical: it encoded them itself");
    let compressed = lz4_flex::block::compress(&packed);
    let mut raw_len = Vec::new();
    lineage_log::put_varint(&mut raw_len, packed.len() as u64);
    if raw_len.len() + compressed.len() < packed.len() {
        out.push(BODY_LZ4);
        out.extend_from_slice(&raw_len);
        out.extend_from_slice(&compressed);
    } else {
        out.push(BODY_PACKED);
        out.extend_from_slice(&packed);
    }
}

/// Sets the digest in a block value's header.
pub(crate) fn set_block_digest(value: &mut [u8], digest: Digest) {
    value[4..BLOCK_HEADER_LEN].copy_from_slice(&digest.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block whose key puts its records (or the seq after them) past `u64::MAX` is damage, refused before any seq
    /// arithmetic can overflow.
    #[test]
    fn a_block_running_past_the_largest_seq_is_refused() {
        let session = SessionId::from_u128(7);
        let mut bytes = 2u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 32 + 8]);
        let block = Block::parse(BlockFormat::V1, session, u64::MAX - 2, &bytes)
            .expect("the next seq is u64::MAX");
        assert_eq!(block.last_seq(u64::MAX - 2), u64::MAX - 1);
        match Block::parse(BlockFormat::V2, session, u64::MAX - 1, &bytes) {
            Err(StoreError::CorruptBlock {
                first_seq, reason, ..
            }) => {
                assert_eq!(first_seq, u64::MAX - 1);
                assert!(reason.contains("largest seq"), "{reason}");
            }
            other => panic!("expected a corrupt block, got {other:?}"),
        }
    }

    /// A format-2 block value: a header counting `count` records, then `body` as it is.
    fn block_value(count: u32, body: &[u8]) -> Vec<u8> {
        let mut value = count.to_le_bytes().to_vec();
        value.extend_from_slice(&[0; 32]);
        value.extend_from_slice(body);
        value
    }

    fn refusal(value: &[u8]) -> String {
        match Block::parse(BlockFormat::V2, SessionId::from_u128(7), 40, value) {
            Err(StoreError::CorruptBlock {
                session,
                first_seq,
                reason,
                ..
            }) => {
                assert_eq!((session, first_seq), (SessionId::from_u128(7), 40));
                reason
            }
            other => panic!("expected a corrupt block, got {other:?}"),
        }
    }

    /// A compressed body whose recorded length is 10 GiB, or just past the limit, or more than its
    /// compressed bytes can expand to, is damage named before anything that size is allocated.
    #[test]
    fn a_lying_uncompressed_length_is_refused_before_anything_is_allocated() {
        for (raw_len, says) in [
            (10u64 << 30, "more than the"),
            (MAX_BLOCK_BYTES as u64 + 1, "more than the"),
            (255 * 1000 + 1, "cannot hold"),
        ] {
            let mut body = vec![BODY_LZ4];
            lineage_log::put_varint(&mut body, raw_len);
            body.extend_from_slice(&[0x11; 1000]);
            let reason = refusal(&block_value(1, &body));
            assert!(reason.contains(says), "{raw_len}: {reason}");
        }
    }

    /// A real decompression bomb: 80 MiB of zeros compress to a few hundred kilobytes, and are
    /// refused by their stated length; a body that states a small length but decompresses past it
    /// is refused by the decompressor's bound.
    #[test]
    fn a_decompression_bomb_is_refused() {
        let zeros = vec![0u8; 80 << 20];
        let compressed = lz4_flex::block::compress(&zeros);
        assert!(compressed.len() < 1 << 20);
        for stated in [zeros.len(), 4096] {
            let mut body = vec![BODY_LZ4];
            lineage_log::put_varint(&mut body, stated as u64);
            body.extend_from_slice(&compressed);
            refusal(&block_value(1, &body));
        }
    }

    /// A header counting more records than a block holds is damage before its body is read.
    #[test]
    fn a_count_past_the_records_a_block_holds_is_refused() {
        let reason = refusal(&block_value(MAX_BLOCK_RECORDS as u32 + 1, &[BODY_PACKED]));
        assert!(reason.contains("more than the 65536"), "{reason}");
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
