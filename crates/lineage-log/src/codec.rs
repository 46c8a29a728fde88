//! The record codec and the running digest.
//!
//! A record is one event, framed so that the variant tag and the flags sit outside the postcard
//! payload:
//!
//! ```text
//! record = len:varint  tag:varint  flags:u8  time_ms:zigzag-varint  payload
//! ```
//!
//! `len` counts the bytes after itself. The seq is not stored: it is the record's position in the
//! log. `flags` bit 0 means *ignorable*; every other bit must be zero. A reader that meets a tag it
//! does not know refuses the log with [`LogError::UnknownKind`] unless the record is ignorable, in
//! which case it keeps the record as [`Opaque`]. The exact layout is documented in `schema/FORMAT.md`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::{CustomWire, CustomWireRef};
use crate::{
    AssistantChunk, Custom, Event, EventBody, EventKind, LogError, Opaque, StreamChunk, Text,
};

/// The flag bit that marks a record ignorable.
pub const FLAG_IGNORABLE: u8 = 0b0000_0001;

/// A blake3 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of no records: the running digest of an empty log.
    pub fn of_empty() -> Digest {
        Chain::new().digest()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

/// The running digest `S(n)`: one blake3 over the framed records of seqs `0..=n`, back to back.
///
/// It depends only on the records, never on how storage groups them, so a fork that copies a
/// prefix verbatim has the same `S(seed_len - 1)` as its parent.
#[derive(Clone, Debug, Default)]
pub struct Chain(blake3::Hasher);

impl Chain {
    /// The digest state of an empty log.
    pub fn new() -> Self {
        Chain(blake3::Hasher::new())
    }

    /// Feeds framed records (one or many, back to back).
    pub fn update(&mut self, records: &[u8]) {
        self.0.update(records);
    }

    /// `S` at the last record fed so far.
    pub fn digest(&self) -> Digest {
        Digest(*self.0.finalize().as_bytes())
    }
}

/// Encodes events into records, reusing one scratch buffer across calls.
#[derive(Debug, Default)]
pub struct Encoder {
    scratch: Vec<u8>,
}

impl Encoder {
    /// A new encoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `event`'s record to `out`.
    pub fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        let scratch = &mut self.scratch;
        scratch.clear();
        let (tag, flags) = match &event.body {
            EventBody::Opaque(opaque) => (opaque.tag, FLAG_IGNORABLE),
            EventBody::Custom(custom) => (
                EventKind::Custom.tag().expect("custom has a tag"),
                if custom.ignorable { FLAG_IGNORABLE } else { 0 },
            ),
            body => (body.kind().tag().expect("known kinds have tags"), 0),
        };
        put_varint(scratch, u64::from(tag));
        scratch.push(flags);
        put_varint(scratch, zigzag(event.time_ms));
        let written = match &event.body {
            EventBody::TurnStart(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::TurnEnd(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::StepStart(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::StepEnd(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::UserMessage(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::AssistantChunk(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::AssistantMessage(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::ToolCall(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::ToolResult(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::InboxSpliced(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::SessionLineage(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::SubagentDescriptor(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::ApprovalPolicy(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::SandboxMode(p) => postcard::to_io(p, &mut *scratch).map(drop),
            EventBody::Custom(custom) => postcard::to_io(
                &CustomWireRef {
                    type_name: &custom.type_name,
                    payload: &custom.payload,
                },
                &mut *scratch,
            )
            .map(drop),
            EventBody::Opaque(Opaque { payload, .. }) => {
                scratch.extend_from_slice(payload);
                Ok(())
            }
        };
        // Serializing plain data into a Vec cannot fail: no type here has a fallible Serialize.
        written.expect("postcard serialization into a Vec is infallible for event payloads");
        put_varint(out, scratch.len() as u64);
        out.extend_from_slice(scratch);
    }

    /// Appends the records of `events` to `out`, back to back.
    pub fn encode_all<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a Event>,
        out: &mut Vec<u8>,
    ) {
        for event in events {
            self.encode(event, out);
        }
    }
}

/// The record of one event.
pub fn encode_record(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new().encode(event, &mut out);
    out
}

/// A framed record, split but not decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRecord<'a> {
    /// The whole record, length prefix included: what the digest covers.
    pub bytes: &'a [u8],
    /// The variant tag.
    pub tag: u32,
    /// The flags byte.
    pub flags: u8,
    /// The event's time.
    pub time_ms: i64,
    /// The postcard payload.
    pub payload: &'a [u8],
}

impl RawRecord<'_> {
    /// Whether the writer marked the record ignorable.
    pub fn ignorable(&self) -> bool {
        self.flags & FLAG_IGNORABLE != 0
    }

    /// The kind, if this build knows the tag.
    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_tag(self.tag)
    }
}

/// Splits the first record off `buf`. `seq` is only used to name the record in errors.
pub fn split_record(buf: &[u8], seq: u64) -> Result<(RawRecord<'_>, &[u8]), LogError> {
    let corrupt = |reason: &str| LogError::Corrupt {
        seq,
        reason: reason.to_owned(),
    };
    let (len, after_len) = take_varint(buf).ok_or_else(|| corrupt("bad record length"))?;
    let prefix = buf.len() - after_len.len();
    let len = usize::try_from(len).map_err(|_| corrupt("record length overflows"))?;
    if len > after_len.len() {
        return Err(corrupt("record runs past the end of its block"));
    }
    let (body, rest) = after_len.split_at(len);
    let (tag, after_tag) = take_varint(body).ok_or_else(|| corrupt("bad record tag"))?;
    let tag = u32::try_from(tag).map_err(|_| corrupt("record tag overflows"))?;
    let (&flags, after_flags) = after_tag
        .split_first()
        .ok_or_else(|| corrupt("record has no flags"))?;
    let (time, payload) = take_varint(after_flags).ok_or_else(|| corrupt("bad record time"))?;
    let record = RawRecord {
        bytes: &buf[..prefix + len],
        tag,
        flags,
        time_ms: unzigzag(time),
        payload,
    };
    Ok((record, rest))
}

/// Iterates over the records of a buffer of back-to-back records, numbering them from `first_seq`.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    rest: &'a [u8],
    next_seq: u64,
}

impl<'a> Records<'a> {
    /// The records in `buf`, the first of which has seq `first_seq`.
    pub fn new(buf: &'a [u8], first_seq: u64) -> Self {
        Records {
            rest: buf,
            next_seq: first_seq,
        }
    }

    /// The seq of the next record.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The bytes not yet split.
    pub fn remaining(&self) -> &'a [u8] {
        self.rest
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(u64, RawRecord<'a>), LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let seq = self.next_seq;
        match split_record(self.rest, seq) {
            Ok((record, rest)) => {
                self.rest = rest;
                self.next_seq += 1;
                Some(Ok((seq, record)))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// Decodes a record into the event at `seq`.
pub fn decode_record(seq: u64, record: &RawRecord<'_>) -> Result<Event, LogError> {
    if record.flags & !FLAG_IGNORABLE != 0 {
        return Err(LogError::UnknownFlags {
            seq,
            flags: record.flags,
        });
    }
    if record.tag == 0 {
        return Err(LogError::Corrupt {
            seq,
            reason: "tag 0 is reserved and never written".into(),
        });
    }
    let Some(kind) = record.kind() else {
        if record.ignorable() {
            let body = EventBody::Opaque(Opaque {
                tag: record.tag,
                payload: record.payload.into(),
            });
            return Ok(Event::new(seq, record.time_ms, body));
        }
        return Err(LogError::UnknownKind {
            seq,
            tag: record.tag,
        });
    };
    if record.ignorable() && kind != EventKind::Custom {
        return Err(LogError::Corrupt {
            seq,
            reason: format!("a {kind} record cannot be marked ignorable"),
        });
    }
    fn payload<'de, T: Deserialize<'de>>(seq: u64, bytes: &'de [u8]) -> Result<T, LogError> {
        let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| LogError::Corrupt {
            seq,
            reason: format!("payload does not decode: {e}"),
        })?;
        if !rest.is_empty() {
            return Err(LogError::Corrupt {
                seq,
                reason: format!("{} trailing payload bytes", rest.len()),
            });
        }
        Ok(value)
    }
    let p = record.payload;
    if kind == EventKind::AssistantChunk
        && let Some(chunk) = text_chunk(p)
    {
        return Ok(Event::new(seq, record.time_ms, chunk));
    }
    let body = match kind {
        EventKind::TurnStart => EventBody::TurnStart(payload(seq, p)?),
        EventKind::TurnEnd => EventBody::TurnEnd(payload(seq, p)?),
        EventKind::StepStart => EventBody::StepStart(payload(seq, p)?),
        EventKind::StepEnd => EventBody::StepEnd(payload(seq, p)?),
        EventKind::UserMessage => EventBody::UserMessage(payload(seq, p)?),
        EventKind::AssistantChunk => EventBody::AssistantChunk(payload(seq, p)?),
        EventKind::AssistantMessage => EventBody::AssistantMessage(payload(seq, p)?),
        EventKind::ToolCall => EventBody::ToolCall(payload(seq, p)?),
        EventKind::ToolResult => EventBody::ToolResult(payload(seq, p)?),
        EventKind::InboxSpliced => EventBody::InboxSpliced(payload(seq, p)?),
        EventKind::SessionLineage => EventBody::SessionLineage(payload(seq, p)?),
        EventKind::SubagentDescriptor => EventBody::SubagentDescriptor(payload(seq, p)?),
        EventKind::ApprovalPolicy => EventBody::ApprovalPolicy(payload(seq, p)?),
        EventKind::SandboxMode => EventBody::SandboxMode(payload(seq, p)?),
        EventKind::Custom => {
            let wire: CustomWire = payload(seq, p)?;
            EventBody::Custom(Box::new(Custom {
                type_name: wire.type_name,
                payload: wire.payload,
                ignorable: record.ignorable(),
            }))
        }
        EventKind::Opaque => unreachable!("from_tag never yields Opaque"),
    };
    Ok(Event::new(seq, record.time_ms, body))
}

/// Decodes the payload of an `assistant/chunk` text or reasoning delta without the generic
/// decoder: nine in ten records of a streaming session are these. `None` for any other chunk and
/// for a payload this reader does not take exactly as canonical, which the generic decoder then
/// decodes (or refuses) as it would without this path.
fn text_chunk(payload: &[u8]) -> Option<AssistantChunk> {
    let (turn, rest) = take_varint(payload)?;
    let (step, rest) = take_varint(rest)?;
    let (&variant, rest) = rest.split_first()?;
    let (index, rest) = take_varint(rest)?;
    let (len, rest) = take_varint(rest)?;
    if rest.len() as u64 != len {
        return None;
    }
    let text = Text::from(std::str::from_utf8(rest).ok()?);
    let index = u32::try_from(index).ok()?;
    let chunk = match variant {
        1 => StreamChunk::TextDelta { index, text },
        2 => StreamChunk::ReasoningDelta { index, text },
        _ => return None,
    };
    Some(AssistantChunk {
        turn: u32::try_from(turn).ok()?,
        step: u32::try_from(step).ok()?,
        chunk,
    })
}

/// Decodes every record of `buf`, the first of which has seq `first_seq`, appending to `out`.
pub fn decode_records(buf: &[u8], first_seq: u64, out: &mut Vec<Event>) -> Result<(), LogError> {
    for item in Records::new(buf, first_seq) {
        let (seq, record) = item?;
        out.push(decode_record(seq, &record)?);
    }
    Ok(())
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Appends `v` as an unsigned LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a canonical unsigned LEB128 varint (no redundant trailing zero groups, at most 64 bits).
pub fn take_varint(buf: &[u8]) -> Option<(u64, &[u8])> {
    let mut value: u64 = 0;
    for (i, &byte) in buf.iter().enumerate().take(10) {
        let group = u64::from(byte & 0x7f);
        if i == 9 && byte > 1 {
            return None;
        }
        value |= group << (7 * i);
        if byte & 0x80 == 0 {
            if byte == 0 && i > 0 {
                return None;
            }
            return Some((value, &buf[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TurnStart, event::StepStart};

    #[test]
    fn varints_are_canonical() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(take_varint(&buf), Some((v, &[][..])));
        }
        assert_eq!(take_varint(&[0x80, 0x00]), None, "overlong zero");
        assert_eq!(take_varint(&[0x80]), None, "truncated");
        assert_eq!(take_varint(&[0xff; 10]), None, "more than 64 bits");
    }

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0, -1, 1, i64::MIN, i64::MAX, 1_780_000_000_000] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn unknown_tags_are_refused_unless_ignorable() {
        let mut record = encode_record(&Event::new(0, 5, TurnStart { turn: 1 }));
        record[1] = 99; // the tag byte, after a one-byte length
        let (raw, _) = split_record(&record, 0).unwrap();
        assert!(matches!(
            decode_record(0, &raw),
            Err(LogError::UnknownKind { seq: 0, tag: 99 })
        ));
        record[2] = FLAG_IGNORABLE;
        let (raw, _) = split_record(&record, 0).unwrap();
        let event = decode_record(0, &raw).unwrap();
        assert_eq!(event.kind(), EventKind::Opaque);
        assert_eq!(encode_record(&event), record, "kept byte for byte");
    }

    #[test]
    fn unknown_flag_bits_are_refused() {
        let mut record = encode_record(&Event::new(3, 5, StepStart { turn: 1, step: 1 }));
        record[2] = 0b10;
        let (raw, _) = split_record(&record, 3).unwrap();
        assert!(matches!(
            decode_record(3, &raw),
            Err(LogError::UnknownFlags { seq: 3, flags: 2 })
        ));
    }

    #[test]
    fn truncated_and_padded_records_are_corrupt() {
        let record = encode_record(&Event::new(0, 5, TurnStart { turn: 1 }));
        assert!(split_record(&record[..record.len() - 1], 7).is_err());
        let mut padded = record.clone();
        padded[0] += 1;
        padded.push(0);
        let (raw, _) = split_record(&padded, 7).unwrap();
        assert!(matches!(
            decode_record(7, &raw),
            Err(LogError::Corrupt { seq: 7, .. })
        ));
    }
}
