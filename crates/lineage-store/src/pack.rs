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

use lineage_log::{RawRecord, put_varint, split_record, take_varint};

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

/// Unpacks `packed` into canonical records appended to `out`, and returns how many there were.
/// Damage is reported as a reason; the caller names the block.
pub(crate) fn unpack(packed: &[u8], out: &mut Vec<u8>) -> Result<u64, String> {
    let mut rest = packed;
    let mut previous = 0i64;
    let mut count = 0u64;
    let mut frame = Vec::with_capacity(64);
    while !rest.is_empty() {
        let entry = count;
        let bad = |what: &str| format!("packed entry at record {entry}: {what}");
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
        let time = previous.wrapping_add(unzigzag(dt));
        if flags & FLAG_RUN == 0 {
            put_record(out, &mut frame, tag, flags, time, &[payload]);
            previous = time;
            count += 1;
            continue;
        }
        if tag != u64::from(CHUNK_TAG) || flags != FLAG_RUN {
            return Err(bad("a run that is not of plain chunk deltas"));
        }
        let head_len = delta_head_len(payload).ok_or_else(|| bad("a run's fields do not parse"))?;
        let (head, columns) = payload.split_at(head_len);
        let (members, mut columns) = take_varint(columns).ok_or_else(|| bad("bad run length"))?;
        // Every member takes at least one byte of lengths, which bounds what is read.
        if members < MIN_RUN as u64 || members > columns.len() as u64 {
            return Err(bad("a run of an impossible length"));
        }
        let members = members as usize;
        let mut times = Vec::with_capacity(members);
        times.push(time);
        for _ in 1..members {
            let (dt, after) = take_varint(columns).ok_or_else(|| bad("bad member time"))?;
            times.push(times[times.len() - 1].wrapping_add(unzigzag(dt)));
            columns = after;
        }
        let mut lens = Vec::with_capacity(members);
        for _ in 0..members {
            let (len, after) = take_varint(columns).ok_or_else(|| bad("bad member length"))?;
            lens.push(len);
            columns = after;
        }
        let mut texts = columns;
        let mut len_bytes = Vec::with_capacity(10);
        for (time, len) in times.iter().zip(lens) {
            let len = usize::try_from(len)
                .ok()
                .filter(|&len| len <= texts.len())
                .ok_or_else(|| bad("a member's text runs past the run"))?;
            let (text, after) = texts.split_at(len);
            texts = after;
            len_bytes.clear();
            put_varint(&mut len_bytes, len as u64);
            put_record(out, &mut frame, tag, 0, *time, &[head, &len_bytes, text]);
        }
        if !texts.is_empty() {
            return Err(bad("bytes after the run's last text"));
        }
        previous = times[members - 1];
        count += members as u64;
    }
    Ok(count)
}

/// Writes a canonical record `len ‖ tag ‖ flags ‖ zigzag(time) ‖ payload`.
fn put_record(
    out: &mut Vec<u8>,
    frame: &mut Vec<u8>,
    tag: u64,
    flags: u8,
    time: i64,
    payload: &[&[u8]],
) {
    frame.clear();
    put_varint(frame, tag);
    frame.push(flags);
    put_varint(frame, zigzag(time));
    let len = frame.len() + payload.iter().map(|p| p.len()).sum::<usize>();
    put_varint(out, len as u64);
    out.extend_from_slice(frame);
    for part in payload {
        out.extend_from_slice(part);
    }
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
}
