//! `verify`: rebuild every cache from the log and report each difference.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use crate::Result;
use crate::engine::View;
use crate::layout::{Block, BlockFormat, SessionRecord};
use crate::store::Store;
use lineage_log::{
    Chain, Digest, Encoder, EventBody, FORMAT_VERSION, Header, Records, SessionId, SessionLineage,
    Structure, decode_record, with_log_facts,
};

/// What `verify` found wrong with one session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The session's row does not decode.
    UndecodableHeader {
        /// Why.
        reason: String,
    },
    /// The session's header is in a log format this build does not read, so its events are not
    /// checked: `verify` cannot vouch for what it cannot read.
    UnsupportedFormat {
        /// The header's format version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// A block's records do not reproduce its digest (or the block does not parse). Digests of
    /// later blocks cannot be checked once the chain is broken.
    CorruptBlock {
        /// The block's first seq.
        first_seq: u64,
        /// The block's last seq.
        last_seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// A record does not decode; the rest of its block cannot be framed.
    CorruptRecord {
        /// The record's seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// Blocks are not contiguous.
    SeqGap {
        /// The first seq the next block should have.
        expected: u64,
        /// The first seq it has.
        found: u64,
    },
    /// An event breaks the log's rules (only the first such event is reported).
    InvalidEvent {
        /// The event's seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// The row's event count or head digest differs from the blocks.
    HeadMismatch {
        /// What differs.
        reason: String,
    },
    /// A header field differs from the fold of the log.
    HeaderMismatch {
        /// The field.
        field: &'static str,
        /// What the header says.
        stored: String,
        /// What the log says.
        folded: String,
    },
    /// The parent is in the store but its children index lacks this session.
    MissingChildIndex {
        /// The parent.
        parent: SessionId,
    },
    /// The children index lists a child that is not stored or names another parent.
    StrayChildIndex {
        /// The listed child.
        child: SessionId,
    },
    /// The inherited prefix is not the parent's: the digests at `seed_len - 1` differ.
    SeedDigestMismatch {
        /// The parent.
        parent: SessionId,
        /// The seed length.
        seed_len: u64,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::UndecodableHeader { reason } => write!(f, "header does not decode: {reason}"),
            Problem::UnsupportedFormat { found, supported } if found > supported => write!(
                f,
                "log format {found} is newer than this build reads ({supported}): its events \
                 were not checked; upgrade Lineage to verify it"
            ),
            Problem::UnsupportedFormat { found, supported } => write!(
                f,
                "log format {found} is older than this build reads ({supported}): its events \
                 were not checked"
            ),
            Problem::CorruptBlock {
                first_seq,
                last_seq,
                reason,
            } => write!(
                f,
                "block of seqs {first_seq}..={last_seq} is corrupt: {reason}"
            ),
            Problem::CorruptRecord { seq, reason } => {
                write!(f, "record at seq {seq} is corrupt: {reason}")
            }
            Problem::SeqGap { expected, found } => {
                write!(
                    f,
                    "seq gap: expected a block at seq {expected}, found one at {found}"
                )
            }
            Problem::InvalidEvent { seq, reason } => write!(f, "event at seq {seq}: {reason}"),
            Problem::HeadMismatch { reason } => write!(f, "head mismatch: {reason}"),
            Problem::HeaderMismatch {
                field,
                stored,
                folded,
            } => write!(f, "header {field} is {stored} but the log says {folded}"),
            Problem::MissingChildIndex { parent } => {
                write!(f, "parent {parent} does not list this session as its child")
            }
            Problem::StrayChildIndex { child } => write!(
                f,
                "the children index lists {child}, which is not stored or names another parent"
            ),
            Problem::SeedDigestMismatch { parent, seed_len } => write!(
                f,
                "the first {seed_len} events are not parent {parent}'s: seed digests differ"
            ),
        }
    }
}

/// One session's verification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionReport {
    /// The session.
    pub session: SessionId,
    /// Events read.
    pub events: u64,
    /// Blocks read.
    pub blocks: u64,
    /// The open tail turn, if the log ends mid-turn (what `load` would close; not a problem).
    pub open_turn: Option<u32>,
    /// What is wrong; empty when the session is intact.
    pub problems: Vec<Problem>,
}

/// A whole store's verification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Every session, in id order.
    pub sessions: Vec<SessionReport>,
}

impl VerifyReport {
    /// Whether no session has a problem.
    pub fn is_ok(&self) -> bool {
        self.sessions.iter().all(|s| s.problems.is_empty())
    }

    /// The sessions with problems.
    pub fn failures(&self) -> impl Iterator<Item = &SessionReport> {
        self.sessions.iter().filter(|s| !s.problems.is_empty())
    }
}

/// Folded while streaming one session.
#[derive(Default)]
struct Scan {
    events: u64,
    blocks: u64,
    lineage: Option<SessionLineage>,
    /// Whether a descriptor follows the last lineage event (or appears in a log without one).
    has_descriptor: bool,
    /// Digests at the requested seed boundaries: seed_len → S(seed_len - 1).
    captured: HashMap<u64, Digest>,
}

impl Store {
    /// Verifies every session in the store: each block's digest, contiguous seqs, every record
    /// decoding and keeping the log's rules, the header against the fold of its log, the children
    /// index, and each child's `seed_digest` against its parent's digest at `seed_len - 1` when the
    /// parent is in the store. An open tail turn is reported as open, not as a problem.
    pub fn verify(&self) -> Result<VerifyReport> {
        crate::store::guard(|| {
            let view = self.view()?;
            let mut records: BTreeMap<SessionId, std::result::Result<SessionRecord, String>> =
                BTreeMap::new();
            for (session, row) in view.rows()? {
                let record = SessionRecord::decode(session, &row).map_err(|e| e.to_string());
                records.insert(session, record);
            }
            let index: BTreeSet<(SessionId, SessionId)> = view.child_index()?.into_iter().collect();
            // Which digests each parent's scan must capture for its children.
            let mut wanted: HashMap<SessionId, BTreeSet<u64>> = HashMap::new();
            for record in records.values().flatten() {
                if let Some(parent) = record.header.parent
                    && records.contains_key(&parent)
                {
                    wanted
                        .entry(parent)
                        .or_default()
                        .insert(record.header.seed_len);
                }
            }

            let mut reports = Vec::with_capacity(records.len());
            let mut scans: HashMap<SessionId, Scan> = HashMap::new();
            for (&session, record) in &records {
                let mut report = SessionReport {
                    session,
                    events: 0,
                    blocks: 0,
                    open_turn: None,
                    problems: Vec::new(),
                };
                match record {
                    Err(reason) => report.problems.push(Problem::UndecodableHeader {
                        reason: reason.clone(),
                    }),
                    Ok(record) if record.header.format_version != FORMAT_VERSION => {
                        report.problems.push(Problem::UnsupportedFormat {
                            found: record.header.format_version,
                            supported: FORMAT_VERSION,
                        });
                    }
                    Ok(record) => {
                        let empty = BTreeSet::new();
                        let wants = wanted.get(&session).unwrap_or(&empty);
                        let scan = scan_session(
                            &*view,
                            self.inner.format,
                            session,
                            record,
                            wants,
                            &mut report,
                        )?;
                        check_header(&record.header, &scan, &mut report.problems);
                        report.events = scan.events;
                        report.blocks = scan.blocks;
                        scans.insert(session, scan);
                    }
                }
                reports.push(report);
            }

            // Cross-session checks: children index and seed digests.
            for report in &mut reports {
                let Some(Ok(record)) = records.get(&report.session) else {
                    continue;
                };
                if record.header.format_version != FORMAT_VERSION {
                    continue; // already reported; nothing of it was read
                }
                let session = report.session;
                if let Some(parent) = record.header.parent
                    && let Some(parent_scan) = scans.get(&parent)
                {
                    if !index.contains(&(parent, session)) {
                        report.problems.push(Problem::MissingChildIndex { parent });
                    }
                    let seed_len = record.header.seed_len;
                    let ours = scans
                        .get(&session)
                        .and_then(|s| s.lineage.as_ref())
                        .map(|l| l.seed_digest);
                    if parent_scan.captured.get(&seed_len).copied() != ours || ours.is_none() {
                        report
                            .problems
                            .push(Problem::SeedDigestMismatch { parent, seed_len });
                    }
                }
                for &(_, child) in index.range(
                    (session, SessionId::from_u128(0))..=(session, SessionId::from_u128(u128::MAX)),
                ) {
                    let names_us = matches!(records.get(&child), Some(Ok(r)) if r.header.parent == Some(session));
                    if !names_us {
                        report.problems.push(Problem::StrayChildIndex { child });
                    }
                }
            }
            Ok(VerifyReport { sessions: reports })
        })
    }
}

fn scan_session(
    view: &dyn View,
    format: BlockFormat,
    session: SessionId,
    record: &SessionRecord,
    wants: &BTreeSet<u64>,
    report: &mut SessionReport,
) -> Result<Scan> {
    let problems = &mut report.problems;
    let mut scan = Scan::default();
    if wants.contains(&0) {
        scan.captured.insert(0, Digest::of_empty());
    }
    let mut chain = Chain::new();
    let mut chain_intact = true;
    let mut structure = Structure::new();
    let mut structure_intact = true;
    let mut expected = 0u64;
    let mut encoder = Encoder::new();
    let mut canonical = Vec::new();
    for block in view.blocks(session, 0)? {
        let (first_seq, value) = block?;
        scan.blocks += 1;
        let block = match Block::parse(format, session, first_seq, &value) {
            Ok(block) => block,
            Err(e) => {
                problems.push(Problem::CorruptBlock {
                    first_seq,
                    last_seq: first_seq,
                    reason: e.to_string(),
                });
                chain_intact = false;
                structure_intact = false;
                continue;
            }
        };
        let last_seq = block.last_seq(first_seq);
        if first_seq != expected {
            problems.push(Problem::SeqGap {
                expected,
                found: first_seq,
            });
            chain_intact = false;
            structure_intact = false;
        }
        expected = last_seq + 1;
        // Digest: whole block at once unless a child's seed boundary falls inside it.
        let inner_wants = wants.range(first_seq + 1..=last_seq + 1).next().is_some();
        if chain_intact && !inner_wants {
            chain.update(&block.records);
            if chain.digest() != block.digest {
                problems.push(Problem::CorruptBlock {
                    first_seq,
                    last_seq,
                    reason: "digest mismatch: the block's records are not the ones written".into(),
                });
                chain_intact = false;
            }
        }
        let mut records = Records::new(&block.records, first_seq);
        for item in records.by_ref() {
            let (seq, raw) = match item {
                Ok(item) => item,
                Err(e) => {
                    problems.push(Problem::CorruptRecord {
                        seq: records.next_seq(),
                        reason: e.to_string(),
                    });
                    chain_intact = false;
                    structure_intact = false;
                    break;
                }
            };
            if chain_intact && inner_wants {
                chain.update(raw.bytes);
                if wants.contains(&(seq + 1)) {
                    scan.captured.insert(seq + 1, chain.digest());
                }
            }
            scan.events += 1;
            let event = match decode_record(seq, &raw) {
                Ok(event) => event,
                Err(e) => {
                    problems.push(Problem::CorruptRecord {
                        seq,
                        reason: e.to_string(),
                    });
                    structure_intact = false;
                    continue;
                }
            };
            canonical.clear();
            encoder.encode(&event, &mut canonical);
            if canonical != raw.bytes {
                problems.push(Problem::CorruptRecord {
                    seq,
                    reason: "decodes, but does not re-encode to its stored bytes".into(),
                });
            }
            if structure_intact && let Err(e) = structure.admit(&event) {
                problems.push(Problem::InvalidEvent {
                    seq,
                    reason: e.to_string(),
                });
                structure_intact = false;
            }
            match event.body {
                EventBody::SessionLineage(lineage) => {
                    scan.lineage = Some(*lineage);
                    scan.has_descriptor = false;
                }
                EventBody::SubagentDescriptor(_) => scan.has_descriptor = true,
                _ => {}
            }
        }
        if chain_intact && inner_wants && chain.digest() != block.digest {
            problems.push(Problem::CorruptBlock {
                first_seq,
                last_seq,
                reason: "digest mismatch: the block's records are not the ones written".into(),
            });
            chain_intact = false;
        }
        if !wants.is_empty() && !chain_intact {
            // Digests past a break are unknowable; capture nothing rather than a wrong value.
            scan.captured.retain(|&len, _| len <= first_seq);
        }
    }
    if expected != record.next_seq {
        problems.push(Problem::HeadMismatch {
            reason: format!(
                "the row records {} events, the blocks hold {expected}",
                record.next_seq
            ),
        });
    } else if chain_intact && chain.digest() != record.head {
        problems.push(Problem::HeadMismatch {
            reason: "the row's head digest differs from the blocks'".into(),
        });
    }
    report.open_turn = structure.open_turn();
    Ok(scan)
}

fn check_header(header: &Header, scan: &Scan, problems: &mut Vec<Problem>) {
    let folded = with_log_facts(header, scan.lineage.as_ref(), scan.has_descriptor);
    let fields: [(&'static str, String, String); 5] = [
        (
            "parent",
            format!("{:?}", header.parent),
            format!("{:?}", folded.parent),
        ),
        (
            "seed_len",
            header.seed_len.to_string(),
            folded.seed_len.to_string(),
        ),
        (
            "seed_digest",
            format!("{:?}", header.seed_digest),
            format!("{:?}", folded.seed_digest),
        ),
        (
            "delegation_depth",
            header.delegation_depth.to_string(),
            folded.delegation_depth.to_string(),
        ),
        (
            "origin",
            format!("{:?}", header.origin),
            format!("{:?}", folded.origin),
        ),
    ];
    for (field, stored, folded) in fields {
        if stored != folded {
            problems.push(Problem::HeaderMismatch {
                field,
                stored,
                folded,
            });
        }
    }
}
