//! The packed form of a block's records (store format 2, `schema/FORMAT.md` §4.2).
//!
//! A session's log is defined by its *canonical records* (§2): the running digest covers them, a
//! fork copies them, verify checks them. Store format 2 keeps the same records in a tighter form
//! and turns it back into the canonical bytes exactly, so nothing above the block layer can tell
//! the two formats apart:
//!
//! - each record's time is stored as the difference from the previous record's in the block (the
//!   first one's from 0), which is a byte or two where an absolute time takes six;
//! - consecutive `assistant/chunk` deltas of one content block (text, reasoning or one tool
//!   call's arguments) are one *run*: their shared fields once, then every member's time
//!   difference, then every member's length, then their texts back to back. The texts end up
//!   contiguous, which is what lets block compression find the assembled message that follows.
//!
//! Packing is lossless by construction: a run's shared fields are the members' own payload bytes
//! up to the text (equal bytes, and canonical varints make equal bytes mean equal fields), so
//! unpacking writes every record back byte for byte.

use lineage_log::{
    AssistantChunk, Event, LogError, RawRecord, StreamChunk, Text, decode_record, put_varint,
    split_record, take_varint,
};

use crate::layout::{MAX_BLOCK_BYTES, MAX_BLOCK_RECORDS};

/// The tag of `assistant/chunk`, the only kind that forms runs.
const CHUNK_TAG: u32 = 6;
/// Flag bit 1 of a packed entry: the entry is a run. (Bit 1 is reserved in canonical records, so
/// no canonical record is mistaken for a run.)
const FLAG_RUN: u8 = 0b10;
/// Runs are worth it from two members on: the shared fields are then written once instead of twice.
const MIN_RUN: usize = 2;
/// The chunk variants that form runs: `TextDelta`, `ReasoningDelta`, `ToolCallDelta`.
const TOOL_CALL_DELTA: u8 = 3;

/// Packs `records` (canonical records back to back) into `out`. Fails, naming the offending
/// position, on bytes that are not canonical records, which a writer never produces.
pub(crate) fn pack(records: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut split = Vec::new();
    let mut rest = records;
    while !rest.is_empty() {
        let (record, after) = split_record(rest, split.len() as u64)
            .map_err(|e| format!("record {}: {e}", split.len()))?;
        if record.flags & FLAG_RUN != 0 {
            return Err(format!("record {} sets reserved flag bit 1", split.len()));
        }
        split.push((record, delta_head(&record)));
        rest = after;
    }
    let mut previous = 0i64;
    let mut i = 0;
    while i < split.len() {
        let (first, head) = &split[i];
        let run_end = match head {
            Some(head) => {
                let mut end = i + 1;
                while end < split.len() && split[end].1 == Some(*head) {
                    end += 1;
                }
                end
            }
            None => i + 1,
        };
        if run_end - i >= MIN_RUN {
            let head = head.expect("runs have a head");
            put_run(out, &split[i..run_end], head, &mut previous);
        } else {
            put_entry(
                out,
                first.tag,
                first.flags,
                first.time_ms.wrapping_sub(previous),
                &[first.payload],
            );
            previous = first.time_ms;
        }
        i = run_end;
    }
    Ok(())
}

/// Writes a run's entry: the first member's frame, the shared fields, the count, the other
/// members' time differences, every length, every text.
fn put_run(
    out: &mut Vec<u8>,
    members: &[(RawRecord<'_>, Option<&[u8]>)],
    head: &[u8],
    previous: &mut i64,
) {
    let mut columns = Vec::with_capacity(members.len() * 4);
    put_varint(&mut columns, members.len() as u64);
    let first_dt = members[0].0.time_ms.wrapping_sub(*previous);
    let mut time = members[0].0.time_ms;
    for (member, _) in &members[1..] {
        put_varint(&mut columns, zigzag(member.time_ms.wrapping_sub(time)));
        time = member.time_ms;
    }
    let texts: Vec<&[u8]> = members.iter().map(|(m, _)| text_of(m, head)).collect();
    for text in &texts {
        put_varint(&mut columns, text.len() as u64);
    }
    let mut parts = Vec::with_capacity(texts.len() + 2);
    parts.push(head);
    parts.push(&columns[..]);
    parts.extend(texts);
    put_entry(out, CHUNK_TAG, FLAG_RUN, first_dt, &parts);
    *previous = time;
}

/// Writes one entry: `len ‖ tag ‖ flags ‖ zigzag(dt) ‖ parts…`.
fn put_entry(out: &mut Vec<u8>, tag: u32, flags: u8, dt: i64, parts: &[&[u8]]) {
    let dt = zigzag(dt);
    let len = varint_len(u64::from(tag))
        + 1
        + varint_len(dt)
        + parts.iter().map(|p| p.len()).sum::<usize>();
    put_varint(out, len as u64);
    put_varint(out, u64::from(tag));
    out.push(flags);
    put_varint(out, dt);
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// The shared fields of a chunk delta (its payload up to the text's length), if the record is one
/// that can join a run: a non-ignorable `assistant/chunk` whose payload is a text, reasoning or
/// tool-call delta ending in exactly one canonical string.
fn delta_head<'a>(record: &RawRecord<'a>) -> Option<&'a [u8]> {
    if record.tag != CHUNK_TAG || record.flags != 0 {
        return None;
    }
    let head_len = delta_head_len(record.payload)?;
    let (len, text) = take_varint(&record.payload[head_len..])?;
    (text.len() as u64 == len).then(|| &record.payload[..head_len])
}

/// The text of a member whose payload starts with `head`.
fn text_of<'a>(record: &RawRecord<'a>, head: &[u8]) -> &'a [u8] {
    let (_, text) = take_varint(&record.payload[head.len()..]).expect("checked by delta_head");
    text
}

/// How long a delta payload's fields before the text are: turn, step, the variant (1, 2 or 3),
/// the block index, and for a tool-call delta the call id and the optional name. Every varint must
/// be canonical and every string length must fit.
fn delta_head_len(payload: &[u8]) -> Option<usize> {
    let (_turn, rest) = take_varint(payload)?;
    let (_step, rest) = take_varint(rest)?;
    let (&variant, rest) = rest.split_first()?;
    if !(1..=TOOL_CALL_DELTA).contains(&variant) {
        return None;
    }
    let (_index, mut rest) = take_varint(rest)?;
    if variant == TOOL_CALL_DELTA {
        rest = skip_str(rest)?;
        let (&present, after) = rest.split_first()?;
        rest = match present {
            0 => after,
            1 => skip_str(after)?,
            _ => return None,
        };
    }
    Some(payload.len() - rest.len())
}

fn skip_str(bytes: &[u8]) -> Option<&[u8]> {
    let (len, rest) = take_varint(bytes)?;
    let len = usize::try_from(len).ok().filter(|&len| len <= rest.len())?;
    Some(&rest[len..])
}

/// One record of a packed body: its frame and its payload, in one part (a plain entry) or three
/// (a run member: the shared fields, the text's length, the text).
pub(crate) struct Unpacked<'a> {
    pub tag: u64,
    pub flags: u8,
    pub time_ms: i64,
    pub payload: [&'a [u8]; 3],
}

/// Why a packed body could not be read: its packing is damaged (a reason; the caller names the
/// block), or what a visitor made of a record failed.
pub(crate) enum WalkError<E> {
    Packing(String),
    Visit(E),
}

/// Calls `visit` with every record of `packed` in order, numbered from 0, and returns how many
/// there were.
pub(crate) fn walk<E>(
    packed: &[u8],
    mut visit: impl FnMut(u64, Unpacked<'_>) -> Result<(), E>,
) -> Result<u64, WalkError<E>> {
    let mut rest = packed;
    let mut previous = 0i64;
    let mut count = 0u64;
    let mut canonical = 0usize;
    let mut len_bytes = [0u8; 10];
    while !rest.is_empty() {
        let entry = count;
        let bad =
            |what: &str| WalkError::Packing(format!("packed entry at record {entry}: {what}"));
        let (len, after) = take_varint(rest).ok_or_else(|| bad("bad length"))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= after.len())
            .ok_or_else(|| bad("runs past the end of the block"))?;
        let (body, after) = after.split_at(len);
        rest = after;
        let (tag, body) = take_varint(body).ok_or_else(|| bad("bad tag"))?;
        let (&flags, body) = body.split_first().ok_or_else(|| bad("no flags"))?;
        let (dt, payload) = take_varint(body).ok_or_else(|| bad("bad time"))?;
        let time_ms = previous.wrapping_add(unzigzag(dt));
        if flags & FLAG_RUN == 0 {
            let record = Unpacked {
                tag,
                flags,
                time_ms,
                payload: [payload, &[], &[]],
            };
            spend(&mut canonical, &record, count)?;
            visit(count, record).map_err(WalkError::Visit)?;
            previous = time_ms;
            count += 1;
            continue;
        }
        if tag != u64::from(CHUNK_TAG) || flags != FLAG_RUN {
            return Err(bad("a run that is not of plain chunk deltas"));
        }
        let head_len = delta_head_len(payload).ok_or_else(|| bad("a run's fields do not parse"))?;
        let (head, columns) = payload.split_at(head_len);
        let (members, columns) = take_varint(columns).ok_or_else(|| bad("bad run length"))?;
        // Every member takes at least one byte of lengths, which bounds what is read.
        if members < MIN_RUN as u64 || members > columns.len() as u64 {
            return Err(bad("a run of an impossible length"));
        }
        // The time differences come first, then the lengths: find where the lengths start.
        let mut lens = columns;
        for _ in 1..members {
            lens = take_varint(lens).ok_or_else(|| bad("bad member time"))?.1;
        }
        let mut texts = lens;
        for _ in 0..members {
            texts = take_varint(texts)
                .ok_or_else(|| bad("bad member length"))?
                .1;
        }
        let mut dts = columns;
        let mut time_ms = time_ms;
        for k in 0..members {
            if k > 0 {
                let (dt, after) = take_varint(dts).expect("read above");
                time_ms = time_ms.wrapping_add(unzigzag(dt));
                dts = after;
            }
            let (len, after) = take_varint(lens).expect("read above");
            lens = after;
            let len = usize::try_from(len)
                .ok()
                .filter(|&len| len <= texts.len())
                .ok_or_else(|| bad("a member's text runs past the run"))?;
            let (text, after) = texts.split_at(len);
            texts = after;
            let len_len = varint_into(&mut len_bytes, len as u64);
            let record = Unpacked {
                tag,
                flags: 0,
                time_ms,
                payload: [head, &len_bytes[..len_len], text],
            };
            spend(&mut canonical, &record, count)?;
            visit(count, record).map_err(WalkError::Visit)?;
            count += 1;
        }
        if !texts.is_empty() {
            return Err(bad("bytes after the run's last text"));
        }
        previous = time_ms;
    }
    Ok(count)
}

/// Counts the record numbered `index` against what one block may hold: at most
/// [`MAX_BLOCK_RECORDS`] records of [`MAX_BLOCK_BYTES`] canonical bytes in all. So no packing,
/// however damaged (a run repeats its shared fields for every member), unpacks or decodes to more
/// than a block the writer could have made.
fn spend<E>(canonical: &mut usize, record: &Unpacked<'_>, index: u64) -> Result<(), WalkError<E>> {
    if index >= MAX_BLOCK_RECORDS as u64 {
        return Err(WalkError::Packing(format!(
            "unpacks to more than the {MAX_BLOCK_RECORDS} records a block holds"
        )));
    }
    let body = varint_len(record.tag)
        + 1
        + varint_len(zigzag(record.time_ms))
        + record.payload.iter().map(|p| p.len()).sum::<usize>();
    *canonical = canonical.saturating_add(varint_len(body as u64) + body);
    if *canonical > MAX_BLOCK_BYTES {
        return Err(WalkError::Packing(format!(
            "unpacks to more than the {MAX_BLOCK_BYTES} bytes of records a block holds"
        )));
    }
    Ok(())
}

/// Unpacks `packed` into canonical records appended to `out`, and returns how many there were.
/// Damage is reported as a reason; the caller names the block.
pub(crate) fn unpack(packed: &[u8], out: &mut Vec<u8>) -> Result<u64, String> {
    walk(packed, |_, record| {
        put_record(out, &record);
        Ok::<(), std::convert::Infallible>(())
    })
    .map_err(|e| match e {
        WalkError::Packing(reason) => reason,
        WalkError::Visit(never) => match never {},
    })
}

/// Decodes the records of `packed`, the block whose first seq is `first_seq`, from seq `from` on,
/// handing each event to `emit`, without writing the canonical records; returns how many records
/// the block holds.
pub(crate) fn decode(
    packed: &[u8],
    first_seq: u64,
    from: u64,
    mut emit: impl FnMut(Event),
) -> Result<u64, WalkError<LogError>> {
    let mut scratch = Vec::with_capacity(64);
    // The fields of the run being decoded, parsed once for all its members.
    let mut run: Option<(*const u8, Option<TextRun>)> = None;
    walk(packed, |i, record| {
        let seq = first_seq.saturating_add(i);
        if seq < from {
            return Ok(());
        }
        let [head, len, text] = record.payload;
        if !len.is_empty() {
            let fields = match run {
                Some((at, fields)) if at == head.as_ptr() => fields,
                _ => {
                    let fields = TextRun::parse(head);
                    run = Some((head.as_ptr(), fields));
                    fields
                }
            };
            if let Some(fields) = fields
                && let Ok(text) = std::str::from_utf8(text)
            {
                emit(fields.event(seq, record.time_ms, text));
                return Ok(());
            }
        }
        let tag = u32::try_from(record.tag).map_err(|_| LogError::Corrupt {
            seq,
            reason: "record tag overflows".into(),
        })?;
        // A run member's payload is in three parts: join them.
        let payload = if len.is_empty() {
            head
        } else {
            scratch.clear();
            for part in record.payload {
                scratch.extend_from_slice(part);
            }
            &scratch[..]
        };
        let raw = RawRecord {
            bytes: &[],
            tag,
            flags: record.flags,
            time_ms: record.time_ms,
            payload,
        };
        emit(decode_record(seq, &raw)?);
        Ok(())
    })
}

/// The fields a run of text or reasoning deltas shares, parsed once for all its members. (A
/// tool-call run, or fields out of range, decode member by member as records.)
#[derive(Clone, Copy)]
struct TextRun {
    turn: u32,
    step: u32,
    reasoning: bool,
    index: u32,
}

impl TextRun {
    fn parse(head: &[u8]) -> Option<TextRun> {
        let (turn, rest) = take_varint(head)?;
        let (step, rest) = take_varint(rest)?;
        let (&variant, rest) = rest.split_first()?;
        let (index, rest) = take_varint(rest)?;
        if !rest.is_empty() || !(1..=2).contains(&variant) {
            return None;
        }
        Some(TextRun {
            turn: u32::try_from(turn).ok()?,
            step: u32::try_from(step).ok()?,
            reasoning: variant == 2,
            index: u32::try_from(index).ok()?,
        })
    }

    fn event(self, seq: u64, time_ms: i64, text: &str) -> Event {
        let (index, text) = (self.index, Text::from(text));
        let chunk = if self.reasoning {
            StreamChunk::ReasoningDelta { index, text }
        } else {
            StreamChunk::TextDelta { index, text }
        };
        Event::new(
            seq,
            time_ms,
            AssistantChunk {
                turn: self.turn,
                step: self.step,
                chunk,
            },
        )
    }
}

/// Writes a canonical record `len ‖ tag ‖ flags ‖ zigzag(time) ‖ payload`.
fn put_record(out: &mut Vec<u8>, record: &Unpacked<'_>) {
    let mut frame = [0u8; 21];
    let mut n = varint_into(&mut frame, record.tag);
    frame[n] = record.flags;
    n += 1;
    n += varint_into(&mut frame[n..], zigzag(record.time_ms));
    let len = n + record.payload.iter().map(|p| p.len()).sum::<usize>();
    let mut prefix = [0u8; 10];
    let prefix_len = varint_into(&mut prefix, len as u64);
    out.reserve(prefix_len + len);
    out.extend_from_slice(&prefix[..prefix_len]);
    out.extend_from_slice(&frame[..n]);
    for part in record.payload {
        out.extend_from_slice(part);
    }
}

/// Writes `v` as a varint at the start of `buf` (room for ten bytes), returning its length.
fn varint_into(buf: &mut [u8], mut v: u64) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        buf[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    buf[i] = v as u8;
    i + 1
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lineage_log::{Encoder, Event};

    fn records(events: &[Event]) -> Vec<u8> {
        let mut out = Vec::new();
        Encoder::new().encode_all(events, &mut out);
        out
    }

    fn round_trip(records: &[u8]) -> Vec<u8> {
        let mut packed = Vec::new();
        pack(records, &mut packed).unwrap();
        let mut back = Vec::new();
        unpack(&packed, &mut back).unwrap();
        assert_eq!(back, records, "unpacking restores the canonical records");
        packed
    }

    #[test]
    fn varint_lengths() {
        for v in [0, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(varint_len(v), buf.len(), "{v}");
        }
    }

    #[test]
    fn a_realistic_session_packs_smaller_and_round_trips() {
        let events = lineage_testkit::realistic_session(3, 5_000);
        let canonical = records(&events);
        let packed = round_trip(&canonical);
        // The texts themselves stay: what goes is each delta's frame, time and shared fields.
        assert!(
            packed.len() * 10 < canonical.len() * 9,
            "{} packed bytes of {} canonical",
            packed.len(),
            canonical.len()
        );
    }

    /// A run repeats its shared fields for every member: a tool-call delta's fields holding a
    /// 2 MiB call id, shared by 40 empty members, is 2 MiB packed and 80 MiB unpacked. Unpacking
    /// and decoding refuse it once what they made passes what a block may hold.
    #[test]
    fn a_run_that_would_unpack_past_a_blocks_limit_is_refused() {
        let mut head = Vec::new();
        put_varint(&mut head, 1); // turn
        put_varint(&mut head, 1); // step
        head.push(TOOL_CALL_DELTA);
        put_varint(&mut head, 0); // index
        let call_id = vec![b'c'; 2 << 20];
        put_varint(&mut head, call_id.len() as u64);
        head.extend_from_slice(&call_id);
        head.push(0); // no name
        let members = 40u64;
        let mut columns = Vec::new();
        put_varint(&mut columns, members);
        columns.extend(std::iter::repeat_n(0, 2 * members as usize - 1)); // times, then lengths
        let mut packed = Vec::new();
        put_entry(&mut packed, CHUNK_TAG, FLAG_RUN, 0, &[&head, &columns]);
        assert!(packed.len() < 3 << 20);
        let mut out = Vec::new();
        let refused = unpack(&packed, &mut out).unwrap_err();
        assert!(
            refused.contains("bytes of records a block holds"),
            "{refused}"
        );
        assert!(out.len() <= MAX_BLOCK_BYTES, "{} bytes unpacked", out.len());
        let mut decoded = 0;
        match decode(&packed, 0, 0, |_| decoded += 1) {
            Err(WalkError::Packing(reason)) => {
                assert!(reason.contains("a block holds"), "{reason}")
            }
            _ => panic!("decoding is refused too"),
        }
        assert!(decoded * (2 << 20) <= MAX_BLOCK_BYTES);
    }

    /// Four-byte entries, 70,000 of them (280 KB packed): more records than a block holds.
    #[test]
    fn more_records_than_a_block_holds_is_refused() {
        let mut packed = Vec::new();
        for _ in 0..70_000 {
            put_entry(&mut packed, 9, 0, 0, &[]);
        }
        let refused = unpack(&packed, &mut Vec::new()).unwrap_err();
        assert!(refused.contains("65536 records"), "{refused}");
    }

    // ---------------------------------------------------------------------------------------
    // Properties: packing is lossless, and unpacking damage never panics.

    use crate::StoreError;
    use crate::layout::{Block, BlockFormat, encode_block};
    use lineage_log::{
        AssistantChunk, BlockType, CallId, Chain, ContentBlock, Custom, FinishReason, SessionId,
        StreamChunk, Text, ToolCallDelta, TurnStart, Usage,
    };
    use lineage_testkit::arb_valid_log;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::Index;

    /// `pack` then `unpack` gives back `canonical` byte for byte and counts `count` records, and
    /// so does a format-2 block value: `encode_block` then `Block::parse`.
    fn assert_lossless(canonical: &[u8], count: usize) -> Result<(), TestCaseError> {
        let mut packed = Vec::new();
        pack(canonical, &mut packed).map_err(TestCaseError::fail)?;
        let mut back = Vec::new();
        let unpacked = unpack(&packed, &mut back).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&back, canonical, "unpack(pack(records)) differs");
        prop_assert_eq!(unpacked, count as u64);
        if count == 0 {
            prop_assert!(packed.is_empty());
            return Ok(());
        }
        let mut chain = Chain::new();
        chain.update(canonical);
        let digest = chain.digest();
        let mut value = Vec::new();
        encode_block(count as u32, digest, canonical, &mut value);
        let block = Block::parse(BlockFormat::V2, SessionId::from_u128(1), 0, &value)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            &*block.records,
            canonical,
            "Block::parse(encode_block) differs"
        );
        prop_assert_eq!(block.count as usize, count);
        prop_assert_eq!(block.digest, digest);
        Ok(())
    }

    /// Unpacking `packed`, and parsing it as a format-2 block body stored plain and compressed,
    /// returns (an error or records) without panicking; records it accepts re-pack losslessly when
    /// they are records `pack` takes.
    fn survives(packed: &[u8]) -> Result<(), TestCaseError> {
        let mut out = Vec::new();
        if let Ok(count) = unpack(packed, &mut out) {
            let mut repacked = Vec::new();
            if pack(&out, &mut repacked).is_ok() {
                let mut again = Vec::new();
                prop_assert_eq!(unpack(&repacked, &mut again), Ok(count));
                prop_assert_eq!(again, out);
            }
        }
        let session = SessionId::from_u128(1);
        let mut plain = 1u32.to_le_bytes().to_vec();
        plain.extend_from_slice(&[0; 32]);
        plain.push(0);
        plain.extend_from_slice(packed);
        let mut compressed = plain[..36].to_vec();
        compressed.push(1);
        put_varint(&mut compressed, packed.len() as u64);
        compressed.extend_from_slice(&lz4_flex::block::compress(packed));
        for value in [plain, compressed] {
            match Block::parse(BlockFormat::V2, session, 0, &value) {
                Ok(_) | Err(StoreError::CorruptBlock { .. }) => {}
                Err(other) => prop_assert!(false, "refused other than as corrupt: {other}"),
            }
        }
        Ok(())
    }

    fn frame(tag: u32, flags: u8, time_ms: i64, payload: &[u8], out: &mut Vec<u8>) {
        let mut body = Vec::new();
        put_varint(&mut body, u64::from(tag));
        body.push(flags);
        put_varint(&mut body, zigzag(time_ms));
        body.extend_from_slice(payload);
        put_varint(out, body.len() as u64);
        out.extend_from_slice(&body);
    }

    const EXTREME_TIMES: [i64; 8] = [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX, 63];
    const TURNS: [u32; 5] = [1, 1, 2, 300, u32::MAX];
    const STEPS: [u32; 3] = [1, 2, 200];
    const INDEXES: [u32; 6] = [0, 0, 1, 127, 128, u32::MAX];
    const CALL_IDS: [&str; 3] = ["call_1", "call_2", ""];
    const NAMES: [Option<&str>; 3] = [None, Some("read_file"), Some("")];

    fn sample_text(choice: u8) -> String {
        match choice % 6 {
            0 => String::new(),
            1 => "a".into(),
            2 => "hello ".into(),
            3 => "日本語 🦀".into(),
            4 => "x".repeat(130),
            _ => "{\"path\":\"src/lib.rs\"}".repeat(10),
        }
    }

    /// One chunk (mostly deltas, from few enough field values that runs form and break often)
    /// or, now and then, another record.
    fn chunk_body(sel: [u8; 6]) -> lineage_log::EventBody {
        let [variant, turn, step, index, text_choice, call] = sel;
        let turn = TURNS[usize::from(turn) % TURNS.len()];
        let step = STEPS[usize::from(step) % STEPS.len()];
        let index = INDEXES[usize::from(index) % INDEXES.len()];
        let text = Text::from(sample_text(text_choice));
        let chunk = match variant % 16 {
            0..=3 => StreamChunk::TextDelta { index, text },
            4..=6 => StreamChunk::ReasoningDelta { index, text },
            7..=9 => StreamChunk::ToolCallDelta(
                ToolCallDelta {
                    index,
                    id: CallId::new(CALL_IDS[usize::from(call) % CALL_IDS.len()]),
                    name: NAMES[usize::from(call / 3) % NAMES.len()].map(Text::from),
                    arguments_delta: text,
                }
                .into(),
            ),
            10 => StreamChunk::BlockStart {
                index,
                block_type: BlockType::Text,
            },
            11 => StreamChunk::BlockEnd {
                index,
                block: ContentBlock::Text { text }.into(),
            },
            12 => StreamChunk::Usage(
                Usage {
                    input_tokens: u64::from(index),
                    output_tokens: 1,
                    cache_read_tokens: None,
                }
                .into(),
            ),
            13 => StreamChunk::Finish {
                reason: FinishReason::Stop,
            },
            14 => return TurnStart { turn }.into(),
            _ => {
                return Custom {
                    type_name: Text::from("todo/write"),
                    payload: Text::from("{}"),
                    ignorable: call % 2 == 0,
                }
                .into();
            }
        };
        AssistantChunk { turn, step, chunk }.into()
    }

    /// Logs of chunk deltas with random turn, step, index, variant and text sequences, at random
    /// times: increasing, going back, arbitrary, or at the extremes of i64. Most records keep the
    /// fields of the one before (a new text), so runs of every length form, and break on every
    /// field.
    fn arb_chunk_log() -> impl Strategy<Value = Vec<Event>> {
        let time = prop_oneof![
            3 => (-50i64..200).prop_map(|dt| (false, dt)),
            1 => any::<i64>().prop_map(|t| (true, t)),
            1 => (0..EXTREME_TIMES.len()).prop_map(|i| (true, EXTREME_TIMES[i])),
        ];
        let start = prop_oneof![
            Just(1_767_225_600_000i64),
            any::<i64>(),
            (0..EXTREME_TIMES.len()).prop_map(|i| EXTREME_TIMES[i]),
        ];
        let pick = (any::<[u8; 6]>(), 0u8..10, time);
        (start, vec(pick, 0..80)).prop_map(|(start, picks)| {
            let mut now = start;
            let mut fields = [0u8; 6];
            picks
                .into_iter()
                .enumerate()
                .map(|(seq, (sel, keep, (absolute, t)))| {
                    if seq == 0 || keep >= 7 {
                        fields = sel;
                    } else {
                        fields[4] = sel[4];
                    }
                    now = if absolute { t } else { now.wrapping_add(t) };
                    Event::new(seq as u64, now, chunk_body(fields))
                })
                .collect()
        })
    }

    /// Record-shaped byte strings `pack` accepts that no writer produces, among the records of a
    /// chunk log, with how many records there are: any tag, flags without bit 1 (reserved bits and
    /// ignorable chunks included), any time, and payloads that look like chunk deltas but may not
    /// be (a text length off by one, a non-canonical varint, a name option of 2, trailing bytes).
    fn arb_odd_records() -> impl Strategy<Value = (Vec<u8>, usize)> {
        let tag = prop_oneof![4 => Just(6u32), 1 => any::<u32>(), 1 => 1u32..16];
        let flags = prop_oneof![4 => Just(0u8), 1 => Just(1u8), 1 => any::<u8>().prop_map(|f| f & !FLAG_RUN)];
        let payload = prop_oneof![
            vec(any::<u8>(), 0..24),
            (any::<[u8; 6]>(), 0u8..6, vec(any::<u8>(), 0..3)).prop_map(|(sel, damage, extra)| {
                let mut payload = Vec::new();
                // Turn, step, index and call from two values each, so neighbours often share a head.
                let body = chunk_body([
                    sel[0] % 10,
                    sel[1] % 2,
                    sel[2] % 2,
                    sel[3] % 2,
                    sel[4],
                    sel[5] % 2,
                ]);
                let event = Event::new(0, 0, body);
                let record = lineage_log::encode_record(&event);
                let (raw, _) = split_record(&record, 0).expect("a record");
                payload.extend_from_slice(raw.payload);
                match damage {
                    0 => payload.extend_from_slice(&extra),
                    1 if !payload.is_empty() => {
                        let last = payload.len() - 1;
                        payload.truncate(last);
                    }
                    2 => payload.splice(0..0, [0x81, 0x00]).for_each(drop),
                    3 if payload.len() > 3 => payload[2] = extra.first().copied().unwrap_or(7),
                    _ => {}
                }
                payload
            }),
        ];
        let odd = (tag, flags, any::<i64>(), payload).prop_map(|(tag, flags, time, payload)| {
            let mut out = Vec::new();
            frame(tag, flags, time, &payload, &mut out);
            out
        });
        // Odd records among the records of a chunk log, next to its runs and inside them.
        (arb_chunk_log(), vec((any::<Index>(), odd), 0..12)).prop_map(|(events, odd)| {
            let mut list: Vec<Vec<u8>> = events.iter().map(lineage_log::encode_record).collect();
            for (at, record) in odd {
                list.insert(at.index(list.len() + 1), record);
            }
            (list.concat(), list.len())
        })
    }

    /// Packed entries assembled from pieces, so that damage reaches past the framing: plain
    /// entries and runs with valid or invalid flags, heads, member counts, columns and texts.
    fn arb_entries() -> impl Strategy<Value = Vec<u8>> {
        let head = prop_oneof![
            Just(vec![0x01, 0x01, 0x01, 0x00]),
            Just(vec![0x01, 0x01, 0x02, 0x00]),
            Just(vec![0x01, 0x01, 0x03, 0x00, 0x01, 0x63, 0x00]),
            Just(vec![0x01, 0x01, 0x03, 0x00, 0x01, 0x63, 0x01, 0x01, 0x6e]),
            vec(any::<u8>(), 0..8),
        ];
        let entry = (
            prop_oneof![Just(6u64), any::<u64>(), 0u64..16],
            prop_oneof![Just(FLAG_RUN), Just(0), any::<u8>()],
            any::<i64>(),
            head,
            0u64..6,
            vec(any::<u64>().prop_map(|v| v % 300), 0..10),
            vec(any::<u8>(), 0..16),
        )
            .prop_map(|(tag, flags, dt, head, n, columns, texts)| {
                let mut body = Vec::new();
                put_varint(&mut body, tag);
                body.push(flags);
                put_varint(&mut body, zigzag(dt));
                body.extend_from_slice(&head);
                put_varint(&mut body, n);
                for c in columns {
                    put_varint(&mut body, c);
                }
                body.extend_from_slice(&texts);
                let mut out = Vec::new();
                put_varint(&mut out, body.len() as u64);
                out.extend_from_slice(&body);
                out
            });
        vec(entry, 0..6).prop_map(|entries| entries.concat())
    }

    proptest! {
        /// Every valid log packs and unpacks to its canonical records byte for byte, alone and
        /// as a format-2 block value.
        #[test]
        fn valid_logs_pack_losslessly(events in arb_valid_log(6)) {
            assert_lossless(&records(&events), events.len())?;
        }

        /// Logs of chunk deltas (runs of every length, broken by every field, at any times) pack
        /// and unpack byte for byte, alone and as a block value.
        #[test]
        fn chunk_logs_pack_losslessly(events in arb_chunk_log()) {
            assert_lossless(&records(&events), events.len())?;
        }

        /// Decoding a packed body gives the events its canonical records decode to, record for
        /// record, for valid logs and for logs of chunk deltas (whose runs decode member by
        /// member).
        #[test]
        fn packed_bodies_decode_as_their_records(
            valid in arb_valid_log(6),
            chunks in arb_chunk_log(),
            first_seq in 0u64..1_000,
        ) {
            for events in [valid, chunks] {
                let canonical = records(&events);
                let mut packed = Vec::new();
                pack(&canonical, &mut packed).map_err(TestCaseError::fail)?;
                let mut expected = Vec::new();
                lineage_log::decode_records(&canonical, first_seq, &mut expected)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let mut decoded = Vec::new();
                let count = decode(&packed, first_seq, 0, |event| decoded.push(event))
                    .map_err(|_| TestCaseError::fail("the packed body decodes"))?;
                prop_assert_eq!(count, events.len() as u64);
                prop_assert_eq!(decoded, expected);
            }
        }

        /// Packing is lossless for every record-shaped input it accepts, not only for records a
        /// writer produces.
        #[test]
        fn odd_records_pack_losslessly((input, count) in arb_odd_records()) {
            let mut packed = Vec::new();
            pack(&input, &mut packed).map_err(TestCaseError::fail)?;
            let mut back = Vec::new();
            prop_assert_eq!(unpack(&packed, &mut back), Ok(count as u64));
            prop_assert_eq!(back, input);
        }

        /// Unpacking arbitrary bytes returns, never panics.
        #[test]
        fn unpacking_arbitrary_bytes_never_panics(bytes in vec(any::<u8>(), 0..512)) {
            survives(&bytes)?;
        }

        /// Unpacking entries assembled from damaged pieces returns, never panics.
        #[test]
        fn unpacking_damaged_entries_never_panics(packed in arb_entries()) {
            survives(&packed)?;
        }

        /// Single-byte changes (and a cut) anywhere in a valid packed body, and anywhere in a
        /// valid block value (LZ4 bodies included), return, never panic.
        #[test]
        fn mutated_packed_bodies_never_panic(
            events in arb_chunk_log(),
            at in any::<Index>(),
            byte in any::<u8>(),
            cut in any::<Index>(),
        ) {
            let canonical = records(&events);
            let mut packed = Vec::new();
            pack(&canonical, &mut packed).map_err(TestCaseError::fail)?;
            if !packed.is_empty() {
                let mut mutated = packed.clone();
                mutated[at.index(packed.len())] = byte;
                survives(&mutated)?;
                survives(&packed[..cut.index(packed.len())])?;
            }
            if !events.is_empty() {
                let mut value = Vec::new();
                encode_block(events.len() as u32, Chain::new().digest(), &canonical, &mut value);
                let mut mutated = value.clone();
                mutated[at.index(value.len())] = byte;
                for value in [&mutated[..], &value[..cut.index(value.len())]] {
                    match Block::parse(BlockFormat::V2, SessionId::from_u128(1), 0, value) {
                        Ok(_) | Err(StoreError::CorruptBlock { .. }) => {}
                        Err(other) => prop_assert!(false, "refused other than as corrupt: {other}"),
                    }
                }
            }
        }
    }

    /// Every byte of a packed body of runs and plain entries set to each of a few awkward
    /// values, one at a time: unpacking returns, never panics.
    #[test]
    fn every_single_byte_change_of_a_packed_body_is_survived() {
        // Chunks whose fields repeat for a few records at a time, so that runs form, with a
        // plain record now and then; times going back and forth.
        let mut rng = lineage_testkit::SplitMix64::new(7);
        let mut sel = [0u8; 6];
        let events: Vec<Event> = (0..48u64)
            .map(|seq| {
                if seq % 4 == 0 {
                    for (i, s) in sel.iter_mut().enumerate() {
                        *s = rng.next_u64() as u8 % if i == 0 { 16 } else { 3 };
                    }
                }
                sel[4] = rng.next_u64() as u8;
                let time = 1_767_225_600_000 + (rng.next_u64() % 100) as i64 - 50;
                Event::new(seq, time, chunk_body(sel))
            })
            .collect();
        let mut packed = Vec::new();
        pack(&records(&events), &mut packed).unwrap();
        assert!(
            packed.windows(2).any(|w| w == [CHUNK_TAG as u8, FLAG_RUN]),
            "the body holds a run"
        );
        for at in 0..packed.len() {
            let original = packed[at];
            for byte in [
                0x00,
                0x01,
                0x02,
                0x03,
                0x7f,
                0x80,
                0xff,
                original ^ 0x01,
                original ^ 0x40,
            ] {
                let mut mutated = packed.clone();
                mutated[at] = byte;
                survives(&mutated).unwrap_or_else(|e| panic!("byte {at} set to {byte:#04x}: {e}"));
            }
        }
    }

    /// A record with flag bit 1 set (reserved, so never written) is refused by `pack`, not taken
    /// for a run; bytes that are not records are refused too.
    #[test]
    fn pack_refuses_what_is_not_canonical_records() {
        let mut record = Vec::new();
        frame(1, FLAG_RUN, 0, &[0x01], &mut record);
        assert!(pack(&record, &mut Vec::new()).is_err());
        assert!(pack(&[0x05, 0x01], &mut Vec::new()).is_err());
    }

    /// Long runs, and a body so repetitive that LZ4 nears its largest ratio, round-trip.
    #[test]
    fn extreme_bodies_round_trip() {
        let delta = |text: &str| -> lineage_log::EventBody {
            AssistantChunk {
                turn: 1,
                step: 1,
                chunk: StreamChunk::TextDelta {
                    index: 0,
                    text: Text::from(text),
                },
            }
            .into()
        };
        let run: Vec<Event> = (0..20_000)
            .map(|i| Event::new(i, 0, delta(if i % 2 == 0 { "" } else { "ab" })))
            .collect();
        assert_lossless(&records(&run), run.len()).unwrap();
        let zeros = Event::new(
            0,
            0,
            lineage_log::Opaque {
                tag: 1 << 20,
                payload: vec![0; 1 << 20].into(),
            },
        );
        assert_lossless(&records(&[zeros]), 1).unwrap();
    }
}
