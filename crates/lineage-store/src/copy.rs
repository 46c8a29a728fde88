//! Copying sessions between stores, whatever their engines: blocks and rows byte for byte.

use std::collections::{BTreeMap, HashSet};

use lineage_log::{Chain, SessionId};

use crate::layout::{Block, BlockFormat, SessionRecord};
use crate::read::{StoredLog, read_log};
use crate::store::{Store, guard};
use crate::writer::{PendingBlock, Tail};
use crate::{Result, StoreError};

/// What [`Store::copy_into`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// The sessions written to the destination, parents before their children.
    pub copied: Vec<SessionId>,
    /// The sessions the destination already held, identical.
    pub present: Vec<SessionId>,
    /// The events of the copied sessions.
    pub events: u64,
    /// The sessions not copied because their stored row is damaged, with what is wrong (the
    /// others are copied all the same).
    pub damaged: Vec<(SessionId, String)>,
}

impl Store {
    /// Copies every session of this store into `destination` (any engine to any engine), parents
    /// before their children, each in one commit: the same blocks byte for byte and the same row
    /// (header, length, head digest, revision), so digests and a fork's proof of its inheritance
    /// hold there as here. Every source block's digest, the row against its blocks and the log's
    /// rules are checked before a session is written.
    ///
    /// A session the destination already holds identically is left alone, so copying twice
    /// changes nothing; one it holds otherwise (another log under the same id, or a shorter or
    /// longer one) is refused with [`StoreError::CopyDiverged`], naming it, before anything of it
    /// is written. A snapshot of this store is copied: commits made meanwhile are not. A session
    /// whose row is damaged is not copied and is named in [`Copied::damaged`].
    pub fn copy_into(&self, destination: &Store) -> Result<Copied> {
        destination.writable()?;
        guard(|| {
            let view = self.view()?;
            let mut records = BTreeMap::new();
            let mut copied = Copied::default();
            for (session, row) in view.rows()? {
                match SessionRecord::decode(session, &row) {
                    Ok(record) => {
                        records.insert(session, record);
                    }
                    Err(e) => copied.damaged.push((session, e.to_string())),
                }
            }
            for session in parents_first(&records) {
                let record = &records[&session];
                match destination.info(session) {
                    Ok(there) => {
                        let same = there.header == record.header
                            && there.len == record.next_seq
                            && there.head == record.head;
                        if !same {
                            return Err(StoreError::CopyDiverged {
                                session,
                                source_len: record.next_seq,
                                destination_len: there.len,
                            });
                        }
                        copied.present.push(session);
                        continue;
                    }
                    Err(StoreError::UnknownSession { .. }) => {}
                    Err(e) => return Err(e),
                }
                // The whole check of a load: digests, the row against the blocks, the rules.
                let stored = read_log(&*view, self.inner.format, session)?;
                let mut blocks = Vec::new();
                let mut chain = Chain::new();
                for block in view.blocks(session, 0)? {
                    let (first_seq, value) = block?;
                    let parsed = Block::parse(self.inner.format, session, first_seq, &value)?;
                    let start = chain.clone();
                    chain.update(&parsed.records);
                    blocks.push(PendingBlock {
                        first_seq,
                        count: parsed.count,
                        records: parsed.records.into_owned(),
                        digest: parsed.digest,
                        start,
                        ticket: 0,
                    });
                }
                // Blocks of this build's format are kept as they are; older ones are laid out anew.
                let verbatim = self.inner.format == BlockFormat::V2;
                destination.write_copy(stored, blocks, verbatim)?;
                copied.events += record.next_seq;
                copied.copied.push(session);
            }
            Ok(copied)
        })
    }

    /// Writes a copied session, its blocks as they are and its row as the source's, durably.
    fn write_copy(
        &self,
        stored: StoredLog,
        blocks: Vec<PendingBlock>,
        verbatim: bool,
    ) -> Result<()> {
        let StoredLog {
            record,
            structure,
            chain,
            ..
        } = stored;
        let session = record.header.id;
        let queue = &self.inner.queue;
        let mut state = queue.lock();
        if state.tails.contains_key(&session) {
            return Err(StoreError::SessionExists { session });
        }
        if blocks.is_empty() {
            // A stored session has at least one event; a row without blocks is not a session.
            return Err(StoreError::CorruptHeader {
                session,
                reason: "the row records no events".into(),
            });
        }
        state.tails.insert(
            session,
            Tail {
                header: record.header,
                row_written: false,
                // The commit writes the next revision: the source's.
                revision: record.revision.saturating_sub(1),
                next_seq: record.next_seq,
                structure,
                chain,
                pending: Vec::new(),
                last_ticket: 0,
                verbatim,
            },
        );
        let ticket = queue.enqueue(&mut state, session, blocks);
        queue.wait_durable(state, Some(session), ticket)
    }
}

/// Every session, each after its parent when its parent is stored (so the destination's children
/// index is written as the source's); otherwise in id order.
fn parents_first(records: &BTreeMap<SessionId, SessionRecord>) -> Vec<SessionId> {
    let mut children: BTreeMap<SessionId, Vec<SessionId>> = BTreeMap::new();
    let mut roots = Vec::new();
    for (&session, record) in records {
        match record.header.parent {
            Some(parent) if records.contains_key(&parent) && parent != session => {
                children.entry(parent).or_default().push(session);
            }
            _ => roots.push(session),
        }
    }
    let mut order = Vec::with_capacity(records.len());
    let mut seen = HashSet::new();
    let mut next = 0;
    order.extend(roots.iter().copied());
    seen.extend(roots);
    while next < order.len() {
        for &child in children.get(&order[next]).into_iter().flatten() {
            if seen.insert(child) {
                order.push(child);
            }
        }
        next += 1;
    }
    // Sessions on a cycle of parents (damage) are reached from no root: copied last, as they are.
    order.extend(records.keys().filter(|s| !seen.contains(s)));
    order
}
