//! Golden vectors of store format 2 blocks (`schema/golden/blocks.txt`).
//!
//! Every vector is a small fixed event list (fixed ids and times, seqs from 0). The test encodes
//! its canonical records with [`encode_block`] and compares the value with the stored bytes, then
//! parses the stored bytes with [`Block::parse`] and compares the records, count and digest with
//! the canonical ones. A second reader written here from the format's description (not from
//! `pack.rs`) walks every stored body, rebuilds the canonical records from it on its own, and
//! reports which shapes of the packed form it met; every shape must be met by some vector, and
//! every vector must show the shapes it claims. Invalid block values (`invalid/...` lines) must
//! be refused by `Block::parse` as a corrupt block. Any difference fails the test and names the
//! vector.
//!
//! Blessing: with `LINEAGE_BLESS=1` the test rewrites `schema/golden/blocks.txt` from this code
//! instead of comparing, after checking the code's own values round-trip. That is allowed only
//! together with a store format version bump, or to add vectors (the diff then only adds lines);
//! see `schema/FORMAT.md`, "Golden vectors".
//!
//! ```sh
//! LINEAGE_BLESS=1 cargo test -p lineage-store --lib golden
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use lineage_log::{
    AssistantChunk, AssistantMessage, BlockType, CallId, Chain, ContentBlock, Custom, Digest,
    Encoder, Event, EventBody, FinishReason, Message, MessageId, MessageSource, Opaque, Role,
    SessionId, StepEnd, StepStart, StreamChunk, Text, ToolCallDelta, TurnEnd, TurnEndReason,
    TurnStart, Usage, put_varint, take_varint,
};

use lineage_testkit::golden::{blessing, hex, unhex};

use crate::StoreError;
use crate::layout::{BLOCK_HEADER_LEN, Block, BlockFormat, encode_block};

const BLOCKS_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../schema/golden/blocks.txt"
);

/// 2026-01-01T00:00:00Z in milliseconds since the Unix epoch: the base time of most vectors.
const BASE_MS: i64 = 1_767_225_600_000;

const HINT: &str = "The store format 2 block layout changed. If the change is deliberate, bump \
     STORE_FORMAT_VERSION and re-bless with LINEAGE_BLESS=1 (schema/FORMAT.md, \"Golden \
     vectors\"); otherwise the change breaks every stored block.";

// ---------------------------------------------------------------------------------------------
// Fixed values. Ids are UUIDv7-shaped constants, as in lineage-log's golden vectors.

/// The session every vector is parsed as (the block value does not hold it).
fn session() -> SessionId {
    SessionId::from_u128(0x019b76da_a800_7000_8000_000000000001)
}

fn mid(n: u128) -> MessageId {
    MessageId::from_u128(0x019b76da_a801_7000_8000_000000000000 | n)
}

fn t(s: &str) -> Text {
    Text::from(s)
}

/// `(time, body)` pairs as events numbered from seq 0.
fn numbered(list: Vec<(i64, EventBody)>) -> Vec<Event> {
    list.into_iter()
        .enumerate()
        .map(|(seq, (time, body))| Event::new(seq as u64, time, body))
        .collect()
}

fn turn_start(turn: u32) -> EventBody {
    TurnStart { turn }.into()
}

fn turn_end(turn: u32) -> EventBody {
    TurnEnd {
        turn,
        reason: TurnEndReason::Completed,
    }
    .into()
}

fn step_start(turn: u32, step: u32) -> EventBody {
    StepStart { turn, step }.into()
}

fn step_end(turn: u32, step: u32) -> EventBody {
    StepEnd { turn, step }.into()
}

fn user(n: u128, text: &str) -> EventBody {
    Message {
        id: mid(n),
        role: Role::User,
        content: vec![ContentBlock::text(text)],
        source: MessageSource::User,
    }
    .into()
}

fn chunk_in(turn: u32, step: u32, chunk: StreamChunk) -> EventBody {
    AssistantChunk { turn, step, chunk }.into()
}

/// A chunk of turn 1, step 1.
fn chunk(chunk: StreamChunk) -> EventBody {
    chunk_in(1, 1, chunk)
}

fn text_delta(index: u32, text: &str) -> StreamChunk {
    StreamChunk::TextDelta {
        index,
        text: t(text),
    }
}

fn reasoning_delta(index: u32, text: &str) -> StreamChunk {
    StreamChunk::ReasoningDelta {
        index,
        text: t(text),
    }
}

fn tool_delta(index: u32, id: &str, name: Option<&str>, arguments: &str) -> StreamChunk {
    StreamChunk::ToolCallDelta(
        ToolCallDelta {
            index,
            id: CallId::new(id),
            name: name.map(t),
            arguments_delta: t(arguments),
        }
        .into(),
    )
}

fn block_start(index: u32, block_type: BlockType) -> StreamChunk {
    StreamChunk::BlockStart { index, block_type }
}

fn block_end(index: u32, block: ContentBlock) -> StreamChunk {
    StreamChunk::BlockEnd {
        index,
        block: block.into(),
    }
}

fn usage() -> StreamChunk {
    StreamChunk::Usage(
        Usage {
            input_tokens: 1200,
            output_tokens: 85,
            cache_read_tokens: Some(1024),
        }
        .into(),
    )
}

fn finish() -> StreamChunk {
    StreamChunk::Finish {
        reason: FinishReason::Stop,
    }
}

// ---------------------------------------------------------------------------------------------
// The shapes of the packed form that the vectors must show.

/// A shape of a format-2 block, as the reader below sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    /// Body kind 0: the packed entries as they are.
    BodyPacked,
    /// Body kind 1: `raw_len ‖ lz4 block` of the packed entries.
    BodyLz4,
    /// The block's first entry is plain; its time difference is from 0, i.e. the absolute time.
    FirstTimeAbsolute,
    /// A later plain entry whose time is after the previous record's.
    DeltaPositive,
    /// A later plain entry at the same time as the previous record.
    DeltaZero,
    /// A later plain entry whose time is before the previous record's.
    DeltaNegative,
    /// A later plain entry whose time difference only adds up with wrapping arithmetic.
    DeltaWraps,
    /// A plain non-chunk record of a known kind (e.g. `turn/start`).
    PlainKnownKind,
    /// A plain `custom` record with the ignorable flag.
    CustomIgnorable,
    /// A plain `custom` record without it.
    CustomRequired,
    /// A plain record of a tag this build does not know, ignorable (an opaque event).
    OpaqueRecord,
    /// A plain chunk delta: a delta that joined no run (a run of one).
    LoneDelta,
    /// A plain `BlockStart` chunk (never joins a run).
    PlainBlockStart,
    /// A plain `Usage` chunk (never joins a run).
    PlainUsage,
    /// A plain `BlockEnd` or `Finish` chunk (never joins a run).
    PlainBlockEndOrFinish,
    /// A run of text deltas.
    RunText,
    /// A run of reasoning deltas.
    RunReasoning,
    /// A run of tool-call deltas that carry the tool's name.
    RunToolCallNamed,
    /// A run of tool-call deltas without a name.
    RunToolCallUnnamed,
    /// A run of exactly two members.
    RunOfTwo,
    /// A run of three members or more.
    RunOfMore,
    /// A run member with an empty text.
    RunEmptyText,
    /// A run member whose text length takes two varint bytes or more.
    RunLongText,
    /// A run member whose time is before the previous member's.
    RunMemberBackInTime,
    /// A run whose shared fields have a turn or step of two varint bytes or more.
    RunWideHead,
    /// Two runs back to back whose shared fields differ only by the block index.
    AdjacentRunsByIndex,
    /// Two runs back to back whose shared fields differ only by the variant.
    AdjacentRunsByVariant,
}

impl Shape {
    const ALL: [Shape; 27] = [
        Shape::BodyPacked,
        Shape::BodyLz4,
        Shape::FirstTimeAbsolute,
        Shape::DeltaPositive,
        Shape::DeltaZero,
        Shape::DeltaNegative,
        Shape::DeltaWraps,
        Shape::PlainKnownKind,
        Shape::CustomIgnorable,
        Shape::CustomRequired,
        Shape::OpaqueRecord,
        Shape::LoneDelta,
        Shape::PlainBlockStart,
        Shape::PlainUsage,
        Shape::PlainBlockEndOrFinish,
        Shape::RunText,
        Shape::RunReasoning,
        Shape::RunToolCallNamed,
        Shape::RunToolCallUnnamed,
        Shape::RunOfTwo,
        Shape::RunOfMore,
        Shape::RunEmptyText,
        Shape::RunLongText,
        Shape::RunMemberBackInTime,
        Shape::RunWideHead,
        Shape::AdjacentRunsByIndex,
        Shape::AdjacentRunsByVariant,
    ];
}

// ---------------------------------------------------------------------------------------------
// The vectors.

/// One named block vector: the events whose canonical records it packs (seqs from 0), and the
/// shapes it is there to show.
struct Vector {
    name: &'static str,
    events: Vec<Event>,
    shows: &'static [Shape],
}

fn vectors() -> Vec<Vector> {
    use Shape::*;
    let b = BASE_MS;
    let long_reasoning = "The user asks for a summary of the README, so I should read it first, \
                          then describe what Lineage is and how its sessions are stored on disk.";
    assert!(long_reasoning.len() >= 128, "a two-byte text length");
    let answer_parts: Vec<String> = (0..40)
        .map(|i| format!("Lineage stores session {i} as an append-only log. "))
        .collect();
    let answer: String = answer_parts.concat();
    vec![
        Vector {
            name: "plain/first-time-absolute",
            events: numbered(vec![(b, turn_start(1))]),
            shows: &[BodyPacked, FirstTimeAbsolute, PlainKnownKind],
        },
        Vector {
            name: "plain/time-deltas",
            events: numbered(vec![
                (b, turn_start(1)),
                (b + 5, user(1, "Summarize the README.")),
                (b + 3, step_start(1, 1)),
                (b + 3, step_end(1, 1)),
                (b + 400, turn_end(1)),
            ]),
            shows: &[DeltaPositive, DeltaNegative, DeltaZero, PlainKnownKind],
        },
        Vector {
            name: "plain/time-extremes",
            events: numbered(vec![
                (i64::MAX, turn_start(1)),
                // i64::MAX to i64::MIN: a difference of 1, with wrapping.
                (i64::MIN, step_start(1, 1)),
                // i64::MIN to 0: a difference of -i64::MIN, which wraps to i64::MIN.
                (0, step_end(1, 1)),
                (-1, turn_end(1)),
                (i64::MIN, turn_start(2)),
            ]),
            shows: &[FirstTimeAbsolute, DeltaWraps, DeltaNegative, DeltaPositive],
        },
        Vector {
            name: "plain/custom",
            events: numbered(vec![
                (
                    b,
                    Custom {
                        type_name: t("todo/write"),
                        payload: t("{\"items\":[\"write docs\"]}"),
                        ignorable: true,
                    }
                    .into(),
                ),
                (
                    b + 1,
                    Custom {
                        type_name: t("billing/charge"),
                        payload: t("{\"cents\":12}"),
                        ignorable: false,
                    }
                    .into(),
                ),
            ]),
            shows: &[CustomIgnorable, CustomRequired],
        },
        Vector {
            name: "plain/opaque",
            events: numbered(vec![
                (
                    b,
                    Opaque {
                        tag: 9000,
                        payload: vec![0x02, 0x68, 0x69, 0x00, 0xff].into(),
                    }
                    .into(),
                ),
                (
                    b + 1,
                    Opaque {
                        tag: u32::MAX,
                        payload: Vec::new().into(),
                    }
                    .into(),
                ),
            ]),
            shows: &[OpaqueRecord],
        },
        Vector {
            name: "plain/lone-deltas",
            // One delta of each variant, none next to one with the same shared fields.
            events: numbered(vec![
                (b, chunk(block_start(0, BlockType::Text))),
                (b + 1, chunk(text_delta(0, "Done."))),
                (b + 2, chunk(reasoning_delta(0, "Nothing to add."))),
                (
                    b + 3,
                    chunk(tool_delta(1, "call_1", Some("read_file"), "{}")),
                ),
                (b + 4, chunk(block_end(0, ContentBlock::text("Done.")))),
            ]),
            shows: &[LoneDelta, PlainBlockStart, PlainBlockEndOrFinish],
        },
        Vector {
            name: "plain/chunks-that-cannot-join",
            // Deltas with equal shared fields, kept apart by chunks that never join a run.
            events: numbered(vec![
                (b, chunk(text_delta(0, "The "))),
                (b + 1, chunk(usage())),
                (b + 2, chunk(text_delta(0, "README "))),
                (b + 3, chunk(block_start(1, BlockType::Text))),
                (b + 4, chunk(text_delta(0, "describes "))),
                (b + 5, chunk(finish())),
                (b + 6, chunk(text_delta(0, "Lineage."))),
            ]),
            shows: &[
                LoneDelta,
                PlainUsage,
                PlainBlockStart,
                PlainBlockEndOrFinish,
            ],
        },
        Vector {
            name: "run/text-delta",
            events: numbered(vec![
                (b, chunk(block_start(0, BlockType::Text))),
                (b + 10, chunk(text_delta(0, "The README"))),
                (b + 11, chunk(text_delta(0, " describes"))),
                (b + 11, chunk(text_delta(0, ""))),
                (b + 9, chunk(text_delta(0, " Lineage."))),
                (
                    b + 12,
                    chunk(block_end(
                        0,
                        ContentBlock::text("The README describes Lineage."),
                    )),
                ),
            ]),
            shows: &[RunText, RunOfMore, RunEmptyText, RunMemberBackInTime],
        },
        Vector {
            name: "run/reasoning-delta",
            events: numbered(vec![
                (b, chunk(reasoning_delta(0, "Let me think. "))),
                (b + 40, chunk(reasoning_delta(0, long_reasoning))),
                (b + 41, chunk(reasoning_delta(0, " Then answer."))),
            ]),
            shows: &[RunReasoning, RunOfMore, RunLongText],
        },
        Vector {
            name: "run/tool-call-delta-named",
            events: numbered(vec![
                (
                    b,
                    chunk(tool_delta(2, "call_1", Some("read_file"), "{\"path\":")),
                ),
                (
                    b + 1,
                    chunk(tool_delta(2, "call_1", Some("read_file"), "\"README")),
                ),
                (
                    b + 2,
                    chunk(tool_delta(2, "call_1", Some("read_file"), ".md\"}")),
                ),
            ]),
            shows: &[RunToolCallNamed, RunOfMore],
        },
        Vector {
            name: "run/tool-call-delta-unnamed",
            // As models stream it: the name on the first delta only, which then stays plain, in
            // turn 300, step 200 (shared fields with two-byte varints).
            events: numbered(vec![
                (
                    b,
                    chunk_in(300, 200, tool_delta(1, "call_7", Some("grep"), "")),
                ),
                (
                    b + 1,
                    chunk_in(300, 200, tool_delta(1, "call_7", None, "{\"pattern\":")),
                ),
                (
                    b + 2,
                    chunk_in(300, 200, tool_delta(1, "call_7", None, "\"fn main\",")),
                ),
                (
                    b + 3,
                    chunk_in(300, 200, tool_delta(1, "call_7", None, "\"path\":\"src\"}")),
                ),
            ]),
            shows: &[LoneDelta, RunToolCallUnnamed, RunOfMore, RunWideHead],
        },
        Vector {
            name: "run/format-md-example",
            // schema/FORMAT.md §4.2's worked example: `He`, `llo`, `!` at 1000, 1003 and 1004.
            events: numbered(vec![
                (1000, chunk(text_delta(0, "He"))),
                (1003, chunk(text_delta(0, "llo"))),
                (1004, chunk(text_delta(0, "!"))),
            ]),
            shows: &[BodyPacked, RunText, RunOfMore],
        },
        Vector {
            name: "run/exactly-two",
            events: numbered(vec![
                (b, turn_start(1)),
                (b + 20, chunk(text_delta(0, "Hello"))),
                (b + 21, chunk(text_delta(0, ", world."))),
                (b + 30, turn_end(1)),
            ]),
            shows: &[RunText, RunOfTwo, PlainKnownKind],
        },
        Vector {
            name: "run/adjacent-differ-by-index",
            events: numbered(vec![
                (b, chunk(text_delta(0, "First "))),
                (b + 1, chunk(text_delta(0, "block."))),
                (b + 2, chunk(text_delta(1, "Second "))),
                (b + 3, chunk(text_delta(1, "block "))),
                (b + 4, chunk(text_delta(1, "here."))),
            ]),
            shows: &[AdjacentRunsByIndex, RunOfTwo, RunOfMore],
        },
        Vector {
            name: "run/adjacent-differ-by-variant",
            events: numbered(vec![
                (b, chunk(reasoning_delta(0, "Think "))),
                (b + 1, chunk(reasoning_delta(0, "first."))),
                (b + 2, chunk(text_delta(0, "Then "))),
                (b + 3, chunk(text_delta(0, "answer."))),
            ]),
            shows: &[AdjacentRunsByVariant, RunReasoning, RunText],
        },
        Vector {
            name: "body/lz4-turn",
            // A whole turn: the answer streamed in forty deltas, then assembled twice (the block's
            // end and the message), which LZ4 finds right after the run's contiguous texts.
            events: {
                let mut list = vec![
                    (b, turn_start(1)),
                    (b + 1, user(1, "Summarize the README.")),
                    (b + 2, step_start(1, 1)),
                    (b + 300, chunk(block_start(0, BlockType::Text))),
                ];
                for (i, part) in answer_parts.iter().enumerate() {
                    list.push((b + 300 + 7 * i as i64, chunk(text_delta(0, part))));
                }
                list.extend([
                    (
                        b + 700,
                        chunk(block_end(0, ContentBlock::text(answer.as_str()))),
                    ),
                    (b + 701, chunk(usage())),
                    (b + 701, chunk(finish())),
                    (
                        b + 702,
                        AssistantMessage {
                            turn: 1,
                            step: 1,
                            message: Message {
                                id: mid(2),
                                role: Role::Assistant,
                                content: vec![ContentBlock::text(answer.as_str())],
                                source: MessageSource::Model {
                                    endpoint: t("acme"),
                                    model: t("acme-large-2"),
                                },
                            },
                            usage: None,
                            interrupted: false,
                        }
                        .into(),
                    ),
                    (b + 703, step_end(1, 1)),
                    (b + 703, turn_end(1)),
                ]);
                numbered(list)
            },
            shows: &[BodyLz4, RunText, RunOfMore, PlainUsage],
        },
    ]
}

// ---------------------------------------------------------------------------------------------
// What a vector is made of.

/// A vector's canonical records, their digest `S(last)`, and its block value as this build
/// encodes it.
struct Built {
    records: Vec<u8>,
    digest: Digest,
    count: u32,
    /// The packed entries (`pack::pack` of the records): the body, or what it decompresses to.
    packed: Vec<u8>,
    block: Vec<u8>,
}

fn build(vector: &Vector) -> Built {
    let mut records = Vec::new();
    Encoder::new().encode_all(&vector.events, &mut records);
    let mut chain = Chain::new();
    chain.update(&records);
    let digest = chain.digest();
    let count = u32::try_from(vector.events.len()).expect("small vectors");
    let mut packed = Vec::new();
    crate::pack::pack(&records, &mut packed)
        .unwrap_or_else(|e| panic!("vector {}: does not pack: {e}", vector.name));
    let mut block = Vec::new();
    encode_block(count, digest, &records, &mut block);
    Built {
        records,
        digest,
        count,
        packed,
        block,
    }
}

// ---------------------------------------------------------------------------------------------
// An independent reader of format-2 blocks, written from the layout's description:
//
//   block  = count u32 LE ‖ digest 32 ‖ kind u8 ‖ body
//   kind 0 = the packed entries; kind 1 = raw_len varint ‖ LZ4 block of the packed entries
//   entry  = len varint ‖ tag varint ‖ flags u8 ‖ zigzag(time - previous time) varint ‖ rest
//   plain  = flags bit 1 clear: rest is the record's payload, the record keeps tag and flags
//   run    = tag 6, flags exactly 0b10: rest = head ‖ n varint ‖ (n - 1) zigzag time differences
//            between members ‖ n text lengths ‖ n texts back to back; each member is the record
//            `6 ‖ 00 ‖ time ‖ head ‖ len ‖ text`, head being a delta chunk's fields before its text
//
// "previous time" is 0 before the first entry, then the time of the last record written.

/// The fields a delta chunk has before its text.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Head {
    turn: u64,
    step: u64,
    variant: u8,
    index: u64,
    /// A tool-call delta's call id and optional name.
    call: Option<(Vec<u8>, Option<Vec<u8>>)>,
    /// How many bytes the fields take.
    len: usize,
}

fn take_str(bytes: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let (len, rest) = take_varint(bytes)?;
    let len = usize::try_from(len).ok().filter(|&len| len <= rest.len())?;
    Some((rest[..len].to_vec(), &rest[len..]))
}

fn parse_head(payload: &[u8]) -> Option<Head> {
    let (turn, rest) = take_varint(payload)?;
    let (step, rest) = take_varint(rest)?;
    let (&variant, rest) = rest.split_first()?;
    if !(1..=3).contains(&variant) {
        return None;
    }
    let (index, mut rest) = take_varint(rest)?;
    let mut call = None;
    if variant == 3 {
        let (id, after) = take_str(rest)?;
        let (&present, after) = after.split_first()?;
        let (name, after) = match present {
            0 => (None, after),
            1 => {
                let (name, after) = take_str(after)?;
                (Some(name), after)
            }
            _ => return None,
        };
        call = Some((id, name));
        rest = after;
    }
    Some(Head {
        turn,
        step,
        variant,
        index,
        call,
        len: payload.len() - rest.len(),
    })
}

/// Whether a chunk payload is a delta: its head, then exactly one string that ends it.
fn is_delta(payload: &[u8]) -> bool {
    parse_head(payload)
        .is_some_and(|head| take_str(&payload[head.len..]).is_some_and(|(_, rest)| rest.is_empty()))
}

/// The variant of a chunk payload (after turn and step), if it has one.
fn chunk_variant(payload: &[u8]) -> Option<u8> {
    let (_, rest) = take_varint(payload)?;
    let (_, rest) = take_varint(rest)?;
    rest.first().copied()
}

#[derive(Debug)]
enum Entry {
    Plain {
        tag: u64,
        flags: u8,
        dt: i64,
        payload: Vec<u8>,
    },
    Run {
        dt: i64,
        head: Head,
        head_bytes: Vec<u8>,
        /// The differences of members 2.. from the member before each.
        member_dts: Vec<i64>,
        texts: Vec<Vec<u8>>,
    },
}

/// A block as the independent reader sees it.
struct Walked {
    count: u32,
    digest: Digest,
    kind: u8,
    /// The packed entries, decompressed.
    packed: Vec<u8>,
    entries: Vec<Entry>,
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn walk_block(bytes: &[u8]) -> Result<Walked, String> {
    if bytes.len() < BLOCK_HEADER_LEN + 1 {
        return Err("shorter than a header and a body kind".into());
    }
    let count = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    let digest = Digest(bytes[4..36].try_into().expect("32 bytes"));
    let kind = bytes[36];
    let body = &bytes[37..];
    let packed = match kind {
        0 => body.to_vec(),
        1 => {
            let (raw_len, compressed) = take_varint(body).ok_or("bad raw length")?;
            let packed = lz4_flex::block::decompress(compressed, raw_len as usize)
                .map_err(|e| format!("does not decompress: {e}"))?;
            if packed.len() as u64 != raw_len {
                return Err("raw length disagrees".into());
            }
            packed
        }
        other => return Err(format!("body kind {other}")),
    };
    let mut entries = Vec::new();
    let mut rest = &packed[..];
    while !rest.is_empty() {
        let (len, after) = take_varint(rest).ok_or("bad entry length")?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= after.len())
            .ok_or("entry past the end")?;
        let (entry, after) = after.split_at(len);
        rest = after;
        let (tag, entry) = take_varint(entry).ok_or("bad tag")?;
        let (&flags, entry) = entry.split_first().ok_or("no flags")?;
        let (dt, entry) = take_varint(entry).ok_or("bad time")?;
        let dt = unzigzag(dt);
        if flags & 0b10 == 0 {
            entries.push(Entry::Plain {
                tag,
                flags,
                dt,
                payload: entry.to_vec(),
            });
            continue;
        }
        if tag != 6 || flags != 0b10 {
            return Err("a run that is not of chunk deltas".into());
        }
        let head = parse_head(entry).ok_or("a run's head does not parse")?;
        let (head_bytes, columns) = entry.split_at(head.len);
        let (n, mut columns) = take_varint(columns).ok_or("bad member count")?;
        if !(2..=columns.len() as u64).contains(&n) {
            return Err(format!("a run of {n}"));
        }
        let mut member_dts = Vec::new();
        for _ in 1..n {
            let (dt, after) = take_varint(columns).ok_or("bad member time")?;
            member_dts.push(unzigzag(dt));
            columns = after;
        }
        let mut lens = Vec::new();
        for _ in 0..n {
            let (len, after) = take_varint(columns).ok_or("bad member length")?;
            lens.push(len);
            columns = after;
        }
        let mut texts = Vec::new();
        for len in lens {
            let len = usize::try_from(len)
                .ok()
                .filter(|&len| len <= columns.len())
                .ok_or("a text past the run")?;
            texts.push(columns[..len].to_vec());
            columns = &columns[len..];
        }
        if !columns.is_empty() {
            return Err("bytes after the last text".into());
        }
        entries.push(Entry::Run {
            dt,
            head_bytes: head_bytes.to_vec(),
            head,
            member_dts,
            texts,
        });
    }
    Ok(Walked {
        count,
        digest,
        kind,
        packed,
        entries,
    })
}

fn put_canonical(out: &mut Vec<u8>, tag: u64, flags: u8, time: i64, payload: &[u8]) {
    let mut body = Vec::new();
    put_varint(&mut body, tag);
    body.push(flags);
    put_varint(&mut body, zigzag(time));
    body.extend_from_slice(payload);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(&body);
}

/// The canonical records the entries stand for, and how many there are.
fn rebuild(entries: &[Entry]) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let mut previous = 0i64;
    let mut count = 0;
    for entry in entries {
        match entry {
            Entry::Plain {
                tag,
                flags,
                dt,
                payload,
            } => {
                previous = previous.wrapping_add(*dt);
                put_canonical(&mut out, *tag, *flags, previous, payload);
                count += 1;
            }
            Entry::Run {
                dt,
                head_bytes,
                member_dts,
                texts,
                ..
            } => {
                previous = previous.wrapping_add(*dt);
                for (k, text) in texts.iter().enumerate() {
                    if k > 0 {
                        previous = previous.wrapping_add(member_dts[k - 1]);
                    }
                    let mut payload = head_bytes.clone();
                    put_varint(&mut payload, text.len() as u64);
                    payload.extend_from_slice(text);
                    put_canonical(&mut out, 6, 0, previous, &payload);
                    count += 1;
                }
            }
        }
    }
    (out, count)
}

/// The shapes a walked block shows.
fn shapes(walked: &Walked) -> BTreeSet<Shape> {
    let mut seen = BTreeSet::new();
    seen.insert(match walked.kind {
        0 => Shape::BodyPacked,
        _ => Shape::BodyLz4,
    });
    let mut previous = 0i64;
    let mut previous_run: Option<&Head> = None;
    for (i, entry) in walked.entries.iter().enumerate() {
        match entry {
            Entry::Plain {
                tag,
                flags,
                dt,
                payload,
            } => {
                if i == 0 {
                    seen.insert(Shape::FirstTimeAbsolute);
                } else {
                    seen.insert(match dt.signum() {
                        1 => Shape::DeltaPositive,
                        0 => Shape::DeltaZero,
                        _ => Shape::DeltaNegative,
                    });
                    if previous.checked_add(*dt).is_none() {
                        seen.insert(Shape::DeltaWraps);
                    }
                }
                previous = previous.wrapping_add(*dt);
                match (*tag, *flags) {
                    (15, 1) => {
                        seen.insert(Shape::CustomIgnorable);
                    }
                    (15, 0) => {
                        seen.insert(Shape::CustomRequired);
                    }
                    (6, 0) if is_delta(payload) => {
                        seen.insert(Shape::LoneDelta);
                    }
                    (6, 0) => match chunk_variant(payload) {
                        Some(0) => {
                            seen.insert(Shape::PlainBlockStart);
                        }
                        Some(5) => {
                            seen.insert(Shape::PlainUsage);
                        }
                        Some(4 | 6) => {
                            seen.insert(Shape::PlainBlockEndOrFinish);
                        }
                        _ => {}
                    },
                    (16.., 1) => {
                        seen.insert(Shape::OpaqueRecord);
                    }
                    (1..=14, 0) => {
                        seen.insert(Shape::PlainKnownKind);
                    }
                    _ => {}
                }
                previous_run = None;
            }
            Entry::Run {
                dt,
                head,
                member_dts,
                texts,
                ..
            } => {
                previous = previous.wrapping_add(*dt);
                for dt in member_dts {
                    previous = previous.wrapping_add(*dt);
                }
                seen.insert(match (head.variant, &head.call) {
                    (1, _) => Shape::RunText,
                    (2, _) => Shape::RunReasoning,
                    (_, Some((_, Some(_)))) => Shape::RunToolCallNamed,
                    _ => Shape::RunToolCallUnnamed,
                });
                seen.insert(if texts.len() == 2 {
                    Shape::RunOfTwo
                } else {
                    Shape::RunOfMore
                });
                if texts.iter().any(Vec::is_empty) {
                    seen.insert(Shape::RunEmptyText);
                }
                if texts.iter().any(|text| text.len() >= 128) {
                    seen.insert(Shape::RunLongText);
                }
                if member_dts.iter().any(|dt| *dt < 0) {
                    seen.insert(Shape::RunMemberBackInTime);
                }
                if head.turn >= 128 || head.step >= 128 {
                    seen.insert(Shape::RunWideHead);
                }
                if let Some(before) = previous_run {
                    let same_but = |index: bool, variant: bool| {
                        before.turn == head.turn
                            && before.step == head.step
                            && before.call == head.call
                            && (before.index == head.index) != index
                            && (before.variant == head.variant) != variant
                    };
                    if same_but(true, false) {
                        seen.insert(Shape::AdjacentRunsByIndex);
                    }
                    if same_but(false, true) {
                        seen.insert(Shape::AdjacentRunsByVariant);
                    }
                }
                previous_run = Some(head);
            }
        }
    }
    seen
}

// ---------------------------------------------------------------------------------------------
// Block values Block::parse must refuse.

/// A packed entry `len ‖ tag ‖ flags ‖ zigzag(dt) ‖ rest`.
fn entry(tag: u64, flags: u8, dt: i64, rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    put_varint(&mut body, tag);
    body.push(flags);
    put_varint(&mut body, zigzag(dt));
    body.extend_from_slice(rest);
    let mut out = Vec::new();
    put_varint(&mut out, body.len() as u64);
    out.extend_from_slice(&body);
    out
}

/// A run's rest: `head ‖ n ‖ member time differences ‖ lengths ‖ texts`, with the lengths given
/// apart from the texts so that they can disagree.
fn run_rest(head: &[u8], n: u64, dts: &[i64], lens: &[u64], texts: &[u8]) -> Vec<u8> {
    let mut out = head.to_vec();
    put_varint(&mut out, n);
    for dt in dts {
        put_varint(&mut out, zigzag(*dt));
    }
    for len in lens {
        put_varint(&mut out, *len);
    }
    out.extend_from_slice(texts);
    out
}

/// A block value: `count ‖ digest ‖ kind ‖ body`.
fn block_value(count: u32, digest: Digest, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = count.to_le_bytes().to_vec();
    out.extend_from_slice(&digest.0);
    out.push(kind);
    out.extend_from_slice(body);
    out
}

/// An LZ4 body `raw_len ‖ compressed` of `packed`, with the recorded length off by `skew`.
fn lz4_body(packed: &[u8], skew: i64) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, (packed.len() as i64 + skew) as u64);
    out.extend_from_slice(&lz4_flex::block::compress(packed));
    out
}

fn invalid_vectors() -> Vec<(&'static str, Vec<u8>)> {
    // The digest of invalid blocks is a visible pattern: Block::parse does not check it.
    let digest = Digest(std::array::from_fn(|i| 0xd0u8.wrapping_add(i as u8)));
    let valid_entry = entry(1, 0, BASE_MS, &[0x01]); // turn/start { turn: 1 } at BASE_MS
    // The head of a text delta of turn 1, step 1, block 0: turn, step, variant 1, index.
    let text_head = [0x01, 0x01, 0x01, 0x00];
    let good_run = run_rest(&text_head, 2, &[1], &[2, 3], b"abcde");
    let block = |kind: u8, body: &[u8]| block_value(2, digest, kind, body);
    let with_run = |tag: u64, flags: u8, rest: &[u8]| block(0, &entry(tag, flags, 5, rest));
    // A packed body that needs compression to be decent: the same entry many times.
    let repeated: Vec<u8> = valid_entry.repeat(64);
    let mut truncated = valid_entry.clone();
    truncated.pop();
    let mut lz4_cut = lz4_body(&repeated, 0);
    lz4_cut.truncate(lz4_cut.len() - 3);
    vec![
        (
            "invalid/shorter-than-header",
            vec![0x01; BLOCK_HEADER_LEN - 1],
        ),
        (
            "invalid/count-zero",
            block_value(0, digest, 0, &valid_entry),
        ),
        ("invalid/no-body-kind", {
            let mut value = block(0, &[]);
            value.pop();
            value
        }),
        ("invalid/unknown-body-kind-2", block(2, &valid_entry)),
        ("invalid/empty-packed-body", block(0, &[])),
        (
            "invalid/count-past-the-record-bytes",
            block_value(3, digest, 0, &valid_entry),
        ),
        ("invalid/entry-truncated", block(0, &truncated)),
        (
            "invalid/entry-overlong-length",
            block(0, &[0x84, 0x00, 0x01, 0x00, 0x00, 0x01]),
        ),
        (
            "invalid/entry-overlong-tag",
            block(0, &[0x05, 0x81, 0x00, 0x00, 0x00, 0x01]),
        ),
        ("invalid/entry-without-flags", block(0, &[0x01, 0x01])),
        ("invalid/entry-without-time", block(0, &[0x02, 0x01, 0x00])),
        (
            "invalid/entry-overlong-time",
            block(0, &[0x05, 0x01, 0x00, 0x80, 0x00, 0x01]),
        ),
        (
            "invalid/run-on-a-non-chunk-tag",
            with_run(1, 0b10, &good_run),
        ),
        (
            "invalid/run-flag-with-ignorable-bit",
            with_run(6, 0b11, &good_run),
        ),
        (
            "invalid/run-flag-with-reserved-bit",
            with_run(6, 0b110, &good_run),
        ),
        (
            "invalid/run-of-one",
            with_run(6, 0b10, &run_rest(&text_head, 1, &[], &[5], b"abcde")),
        ),
        (
            "invalid/run-of-zero",
            with_run(6, 0b10, &run_rest(&text_head, 0, &[], &[], b"")),
        ),
        (
            "invalid/run-longer-than-its-columns",
            with_run(6, 0b10, &run_rest(&text_head, 300, &[1], &[2, 3], b"abcde")),
        ),
        (
            "invalid/run-member-time-truncated",
            with_run(6, 0b10, &[&text_head[..], &[0x02, 0x80, 0x80]].concat()),
        ),
        (
            "invalid/run-member-time-overlong",
            with_run(
                6,
                0b10,
                &[&text_head[..], &[0x02, 0x82, 0x00, 0x02, 0x03], b"abcde"].concat(),
            ),
        ),
        (
            "invalid/run-member-length-overlong",
            with_run(
                6,
                0b10,
                &[&text_head[..], &[0x02, 0x02, 0x82, 0x00, 0x03], b"abcde"].concat(),
            ),
        ),
        (
            "invalid/run-texts-shorter-than-lengths",
            with_run(6, 0b10, &run_rest(&text_head, 2, &[1], &[2, 3], b"abcd")),
        ),
        (
            "invalid/run-texts-longer-than-lengths",
            with_run(6, 0b10, &run_rest(&text_head, 2, &[1], &[2, 3], b"abcdef")),
        ),
        (
            "invalid/run-head-block-start",
            with_run(
                6,
                0b10,
                &run_rest(&[0x01, 0x01, 0x00, 0x00], 2, &[1], &[2, 3], b"abcde"),
            ),
        ),
        (
            "invalid/run-head-variant-4",
            with_run(
                6,
                0b10,
                &run_rest(&[0x01, 0x01, 0x04, 0x00], 2, &[1], &[2, 3], b"abcde"),
            ),
        ),
        (
            "invalid/run-head-overlong-turn",
            with_run(
                6,
                0b10,
                &run_rest(&[0x81, 0x00, 0x01, 0x01, 0x00], 2, &[1], &[2, 3], b"abcde"),
            ),
        ),
        (
            "invalid/run-head-name-option-2",
            with_run(
                6,
                0b10,
                &run_rest(
                    &[0x01, 0x01, 0x03, 0x00, 0x01, 0x63, 0x02, 0x01, 0x6e],
                    2,
                    &[1],
                    &[2, 3],
                    b"abcde",
                ),
            ),
        ),
        (
            "invalid/run-head-call-id-past-the-entry",
            with_run(6, 0b10, &[0x01, 0x01, 0x03, 0x00, 0x7f, 0x63]),
        ),
        (
            "invalid/lz4-raw-length-too-long",
            block(1, &lz4_body(&repeated, 1)),
        ),
        (
            "invalid/lz4-raw-length-too-short",
            block(1, &lz4_body(&repeated, -1)),
        ),
        (
            "invalid/lz4-raw-length-past-the-bound",
            block(1, &[0xff, 0xff, 0x03, 0x10, 0x00]),
        ),
        ("invalid/lz4-compressed-bytes-cut", block(1, &lz4_cut)),
        (
            "invalid/lz4-of-a-damaged-packed-body",
            block(1, &lz4_body(&[&repeated[..], &truncated[..]].concat(), 0)),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// The file.

const PREAMBLE: &str = "\
# Golden block vectors of Lineage store format 2 (schema/FORMAT.md §4.1, §4.2).
# Generated by crates/lineage-store/src/golden.rs with LINEAGE_BLESS=1; do not edit by hand.
# Each data line is `name hex`. Every vector <v> is a small fixed event list (fixed ids and times,
# seqs from 0) stored as one block, in four lines:
#   records/<v>  the events' canonical records (§2), back to back (lineage_log::Encoder)
#   digest/<v>   S(last seq) (§5): blake3 over records/<v> (lineage_log::Chain)
#   packed/<v>   the packed entries of records/<v> (pack::pack): the block's body after its kind
#                byte when that is 0, what the LZ4 body decompresses to when it is 1
#   block/<v>    the block value under key (session, 0) as layout::encode_block writes it:
#                count u32 LE ‖ digest/<v> ‖ body kind (0 packed entries; 1 LZ4: raw_len varint ‖
#                lz4 block of the packed entries) ‖ body. A packed entry is
#                len ‖ tag ‖ flags ‖ zigzag(time - previous time) ‖ payload (the first entry's
#                previous time is 0); flag bit 1 marks a run of >= 2 consecutive assistant/chunk
#                deltas with equal fields before the text: head ‖ n ‖ n-1 member time differences ‖
#                n text lengths ‖ n texts.
#   invalid/<c>  a block value Block::parse (format 2, first seq 0) must refuse as a corrupt block.
#                A count that disagrees with the records is not among them: the reader that splits
#                the records refuses it, not Block::parse (which refuses only a count above a
#                quarter of the record bytes, the smallest record being 4 bytes).
# The shapes each vector shows (checked when the test walks the body):
";

fn render(vectors: &[Vector], invalid: &[(&'static str, Vec<u8>)]) -> String {
    let mut out = String::from(PREAMBLE);
    for vector in vectors {
        let shows: Vec<String> = vector.shows.iter().map(|s| format!("{s:?}")).collect();
        writeln!(out, "#   {}: {}", vector.name, shows.join(", ")).expect("String");
    }
    for vector in vectors {
        let built = build(vector);
        writeln!(out, "records/{} {}", vector.name, hex(&built.records)).expect("String");
        writeln!(out, "digest/{} {}", vector.name, hex(&built.digest.0)).expect("String");
        writeln!(out, "packed/{} {}", vector.name, hex(&built.packed)).expect("String");
        writeln!(out, "block/{} {}", vector.name, hex(&built.block)).expect("String");
    }
    for (name, bytes) in invalid {
        writeln!(out, "{name} {}", hex(bytes)).expect("String");
    }
    out
}

/// The data lines of the file, by name: line number and bytes.
type Stored = BTreeMap<String, (usize, Vec<u8>)>;

fn stored() -> (Stored, Vec<String>) {
    let text = std::fs::read_to_string(BLOCKS_FILE).unwrap_or_else(|e| {
        panic!("cannot read schema/golden/blocks.txt: {e} (generate it with LINEAGE_BLESS=1)")
    });
    let mut lines = BTreeMap::new();
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, bytes] = fields.as_slice() else {
            panic!("schema/golden/blocks.txt:{line_no}: expected `name hex`, got {line:?}");
        };
        if lines
            .insert(
                name.to_string(),
                (line_no, unhex("schema/golden/blocks.txt", line_no, bytes)),
            )
            .is_some()
        {
            problems.push(format!("{name}: listed twice (line {line_no})"));
        }
    }
    (lines, problems)
}

/// Where two byte strings first differ, for failure messages.
fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at byte {i}"),
        None => format!("lengths differ: {} vs {} bytes", a.len(), b.len()),
    }
}

/// What is wrong with a block value read as vector `name` whose canonical records, digest and
/// count are known.
fn check_block(name: &str, bytes: &[u8], built: &Built, problems: &mut Vec<String>) {
    match Block::parse(BlockFormat::V2, session(), 0, bytes) {
        Ok(block) => {
            if *block.records != built.records[..] {
                problems.push(format!(
                    "block/{name}: Block::parse gives records {} instead of {} ({})",
                    hex(&block.records),
                    hex(&built.records),
                    first_difference(&block.records, &built.records)
                ));
            }
            if block.count != built.count {
                problems.push(format!(
                    "block/{name}: Block::parse counts {} records, the vector has {}",
                    block.count, built.count
                ));
            }
            if block.digest != built.digest {
                problems.push(format!(
                    "block/{name}: Block::parse gives digest {} instead of S(last) {}",
                    block.digest, built.digest
                ));
            }
        }
        Err(e) => problems.push(format!("block/{name}: Block::parse refuses it: {e}")),
    }
    match walk_block(bytes) {
        Ok(walked) => {
            let (records, count) = rebuild(&walked.entries);
            if records != built.records {
                problems.push(format!(
                    "block/{name}: the independent reader rebuilds other records ({})",
                    first_difference(&records, &built.records)
                ));
            }
            if count != u64::from(walked.count) || walked.count != built.count {
                problems.push(format!(
                    "block/{name}: header count {}, {count} records in the body, {} events",
                    walked.count, built.count
                ));
            }
            if walked.digest != built.digest {
                problems.push(format!("block/{name}: the header's digest is not S(last)"));
            }
            if walked.packed != built.packed {
                problems.push(format!(
                    "block/{name}: the body holds other packed entries than pack::pack writes ({})",
                    first_difference(&walked.packed, &built.packed)
                ));
            }
            let seen = shapes(&walked);
            for shape in vector_shows(name) {
                if !seen.contains(shape) {
                    problems.push(format!(
                        "block/{name}: does not show {shape:?}; it shows {seen:?}"
                    ));
                }
            }
        }
        Err(e) => problems.push(format!(
            "block/{name}: the independent reader refuses it: {e}"
        )),
    }
}

fn vector_shows(name: &str) -> &'static [Shape] {
    vectors()
        .into_iter()
        .find(|v| v.name == name)
        .map_or(&[], |v| v.shows)
}

fn check_invalid(name: &str, bytes: &[u8]) -> Result<(), String> {
    match Block::parse(BlockFormat::V2, session(), 0, bytes) {
        Err(StoreError::CorruptBlock { first_seq: 0, .. }) => Ok(()),
        Err(other) => Err(format!(
            "{name}: refused with {other}, not as a corrupt block"
        )),
        Ok(block) => Err(format!(
            "{name}: parses, to {} records {}",
            block.count,
            hex(&block.records)
        )),
    }
}

fn fail_if_any(problems: &[String]) {
    assert!(
        problems.is_empty(),
        "golden vectors in schema/golden/blocks.txt do not match this build:\n  {}\n{HINT}",
        problems.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// Every vector encodes to the stored block value, the stored value parses back to the vector's
/// records, count and digest, and every invalid value is refused; or, blessing, the file is
/// rewritten from the code (after the code's own values pass the same checks).
#[test]
fn golden_blocks_match() {
    let vectors = vectors();
    let invalid = invalid_vectors();
    let mut problems = Vec::new();

    // The code's own values first: whatever is blessed must read back.
    for vector in &vectors {
        let built = build(vector);
        check_block(vector.name, &built.block, &built, &mut problems);
    }
    for (name, bytes) in &invalid {
        if let Err(e) = check_invalid(name, bytes) {
            problems.push(format!("{e} (this build's value)"));
        }
    }
    fail_if_any(&problems);

    if blessing() {
        std::fs::write(BLOCKS_FILE, render(&vectors, &invalid))
            .unwrap_or_else(|e| panic!("cannot write schema/golden/blocks.txt: {e}"));
        eprintln!("blessed schema/golden/blocks.txt");
        return;
    }

    let (mut stored, mut problems) = stored();
    let mut take = |name: String, problems: &mut Vec<String>| {
        let found = stored.remove(&name);
        if found.is_none() {
            problems.push(format!("{name}: missing from the file"));
        }
        found
    };
    for vector in &vectors {
        let name = vector.name;
        let built = build(vector);
        if let Some((line, records)) = take(format!("records/{name}"), &mut problems)
            && records != built.records
        {
            problems.push(format!(
                "records/{name} (line {line}): the events encode as {} but the file has {} ({})",
                hex(&built.records),
                hex(&records),
                first_difference(&built.records, &records)
            ));
        }
        if let Some((line, digest)) = take(format!("digest/{name}"), &mut problems)
            && digest != built.digest.0
        {
            problems.push(format!(
                "digest/{name} (line {line}): S(last) is {} but the file has {}",
                built.digest,
                hex(&digest)
            ));
        }
        if let Some((line, packed)) = take(format!("packed/{name}"), &mut problems)
            && packed != built.packed
        {
            problems.push(format!(
                "packed/{name} (line {line}): pack::pack writes {} but the file has {} ({})",
                hex(&built.packed),
                hex(&packed),
                first_difference(&built.packed, &packed)
            ));
        }
        if let Some((line, block)) = take(format!("block/{name}"), &mut problems) {
            if block != built.block {
                problems.push(format!(
                    "block/{name} (line {line}): encode_block writes {} but the file has {} ({})",
                    hex(&built.block),
                    hex(&block),
                    first_difference(&built.block, &block)
                ));
            }
            check_block(name, &block, &built, &mut problems);
        }
    }
    for (name, bytes) in &invalid {
        if let Some((line, stored_bytes)) = take(name.to_string(), &mut problems) {
            if stored_bytes != *bytes {
                problems.push(format!(
                    "{name} (line {line}): this build gives {} but the file has {}",
                    hex(bytes),
                    hex(&stored_bytes)
                ));
            }
            if let Err(e) = check_invalid(name, &stored_bytes) {
                problems.push(format!("{e} (line {line})"));
            }
        }
    }
    for (name, (line, _)) in stored {
        problems.push(format!(
            "{name} (line {line}): in the file but not in the test"
        ));
    }
    fail_if_any(&problems);
}

/// The worked example of schema/FORMAT.md §4.2 is what the writer packs, byte for byte.
#[test]
fn the_format_md_example_packs_as_documented() {
    let vector = vectors()
        .into_iter()
        .find(|v| v.name == "run/format-md-example")
        .expect("the vector");
    let built = build(&vector);
    assert_eq!(
        hex(&built.packed),
        "140602d00f0101010003060202030148656c6c6f21",
        "FORMAT.md §4.2's worked example"
    );
    assert_eq!(built.block[BLOCK_HEADER_LEN], 0, "stored packed, kind 0");
    assert_eq!(built.block[BLOCK_HEADER_LEN + 1..], built.packed[..]);
}

/// Every shape of the packed form has a vector that shows it, and no vector name is used twice.
#[test]
fn every_shape_has_a_vector() {
    let vectors = vectors();
    let mut names = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for vector in &vectors {
        assert!(names.insert(vector.name), "vector {} twice", vector.name);
        let built = build(vector);
        let walked = walk_block(&built.block)
            .unwrap_or_else(|e| panic!("vector {}: the reader refuses it: {e}", vector.name));
        seen.extend(shapes(&walked));
    }
    let missing: Vec<Shape> = Shape::ALL
        .into_iter()
        .filter(|s| !seen.contains(s))
        .collect();
    assert!(missing.is_empty(), "no vector shows {missing:?}");
    // The list is the whole enum: a shape added to the enum but not to ALL would go unchecked.
    assert_eq!(
        Shape::ALL.iter().collect::<BTreeSet<_>>().len(),
        Shape::ALL.len()
    );
}

/// The rest of the format the vectors rely on: the first seq is not in the block value (the
/// same value parses at any seq), and the independent reader refuses every invalid vector too.
#[test]
fn the_first_seq_is_not_stored_and_the_reader_agrees_on_refusals() {
    for vector in vectors() {
        let built = build(&vector);
        let block = Block::parse(BlockFormat::V2, session(), 1_000_000, &built.block)
            .unwrap_or_else(|e| panic!("vector {}: {e}", vector.name));
        assert_eq!(*block.records, built.records[..], "vector {}", vector.name);
        assert_eq!(
            block.last_seq(1_000_000),
            1_000_000 + u64::from(built.count) - 1
        );
    }
    for (name, bytes) in invalid_vectors() {
        // The independent reader does not check the header's count against the body's bytes
        // or refuse an empty body; the rest it refuses by itself.
        let header_only = matches!(
            name,
            "invalid/count-zero"
                | "invalid/count-past-the-record-bytes"
                | "invalid/empty-packed-body"
        );
        if !header_only {
            assert!(
                walk_block(&bytes).is_err(),
                "{name}: the independent reader accepts it"
            );
        }
    }
}
