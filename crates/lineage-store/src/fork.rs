//! Forking a stored session: the child's prefix is copied record for record in one transaction.

use lineage_log::{
    Chain, EventBody, EventKind, ForkSpec, Header, Records, SessionLineage, Structure, TurnMarker,
    child_header, decode_record, origin_of, resolve_fork_boundary, setup_events,
};

use crate::layout::Block;
use crate::read::read_record;
use crate::store::Store;
use crate::writer::{PendingBlock, Tail};
use crate::{Result, StoreError};

impl Store {
    /// Forks `spec`'s parent session at `spec.boundary` into the new session `spec.child`.
    ///
    /// The child's log is the parent's events `0..=boundary`, copied verbatim (whole blocks as they
    /// are, the boundary block re-framed up to the boundary), then `session/lineage` at
    /// `seq == seed_len` with the parent's running digest at `seed_len - 1`. Everything is written
    /// in one transaction, and the children index gains `(parent, child)`. Refuses a taken child id
    /// first, then a boundary past the log or inside an open turn; the parent is untouched.
    ///
    /// A parent created but never written forks with nothing inherited (`seed_len` 0, any boundary
    /// past its empty log); it stays unwritten, and from then on is never forgotten (see
    /// [`Store::forget_unwritten`]).
    pub fn fork(&self, parent: lineage_log::SessionId, spec: &ForkSpec) -> Result<Header> {
        self.fork_with_setup(parent, spec, Vec::new())
    }

    /// [`Store::fork`], with `setup` events written right after `session/lineage`, in the same
    /// transaction: a delegated child's `subagent/descriptor` and delegated policy overrides. The
    /// child's header is the fold of its own suffix (a descriptor makes its origin `Subagent`).
    pub fn fork_with_setup(
        &self,
        parent: lineage_log::SessionId,
        spec: &ForkSpec,
        setup: Vec<EventBody>,
    ) -> Result<Header> {
        crate::store::guard(|| self.fork_guarded(parent, spec, setup))
    }

    fn fork_guarded(
        &self,
        parent: lineage_log::SessionId,
        spec: &ForkSpec,
        setup: Vec<EventBody>,
    ) -> Result<Header> {
        if self.is_read_only() {
            return Err(StoreError::ReadOnly);
        }
        let child = spec.child;
        self.ensure_new(child)?;
        self.flush_before_read(parent)?;
        // A parent created but never written has no row: its header is its tail's, and it has no
        // events to inherit.
        let unwritten = {
            let state = self.inner.queue.lock();
            state
                .tails
                .get(&parent)
                .filter(|tail| !tail.row_written && tail.next_seq == 0)
                .map(|tail| tail.header.clone())
        };
        let view = self.view()?;
        let (parent_header, len) = match unwritten.clone() {
            Some(header) => (header, 0),
            None => {
                let record = read_record(&*view, parent)?;
                (record.header, record.next_seq)
            }
        };
        // The inclusive boundary, if any event is inherited.
        let last = match spec.boundary {
            None => len.checked_sub(1),
            Some(b) if b >= len => {
                return Err(StoreError::from_log(
                    parent,
                    lineage_log::LogError::InvalidBoundary { boundary: b, len },
                ));
            }
            Some(b) => Some(b),
        };
        let mut blocks = Vec::new();
        let mut chain = Chain::new();
        let mut marker: Option<TurnMarker> = None;
        let mut last_turn = 0;
        if let Some(last) = last {
            for block in view.blocks(parent, 0)? {
                let (first_seq, value) = block?;
                if first_seq > last {
                    break;
                }
                let block = Block::parse(self.inner.format, parent, first_seq, &value)?;
                let block_last = block.last_seq(first_seq);
                let mut end = 0usize;
                for item in Records::new(&block.records, first_seq) {
                    let (seq, raw) = item.map_err(|e| StoreError::from_log(parent, e))?;
                    if seq > last {
                        break;
                    }
                    end += raw.bytes.len();
                    // Only turn boundaries are decoded: the rest is copied as bytes.
                    if let Some(EventKind::TurnStart | EventKind::TurnEnd) = raw.kind() {
                        let event = decode_record(seq, &raw)
                            .map_err(|e| StoreError::from_log(parent, e))?;
                        match event.body {
                            EventBody::TurnStart(t) => marker = Some(TurnMarker::Start(t.turn)),
                            EventBody::TurnEnd(t) => {
                                last_turn = t.turn;
                                marker = Some(TurnMarker::End);
                            }
                            _ => {}
                        }
                    }
                }
                let records = &block.records[..end];
                let whole = block_last <= last;
                let start = chain.clone();
                // A boundary block is copied only in part, but its digest covers it whole: check
                // it on a copy of the chain, so a damaged record is never inherited.
                let intact = if whole {
                    chain.update(records);
                    chain.digest() == block.digest
                } else {
                    let mut full = chain.clone();
                    full.update(&block.records);
                    chain.update(records);
                    full.digest() == block.digest
                };
                if !intact {
                    return Err(StoreError::CorruptBlock {
                        session: parent,
                        first_seq,
                        last_seq: block_last,
                        reason: "digest mismatch: the block's records are not the ones written"
                            .into(),
                    });
                }
                blocks.push(PendingBlock {
                    first_seq,
                    count: (block_last.min(last) + 1 - first_seq) as u32,
                    records: records.to_vec(),
                    digest: chain.digest(),
                    start,
                    ticket: 0,
                });
            }
        }
        drop(view);
        let seed_len = resolve_fork_boundary(len, spec.boundary, |_| marker)
            .map_err(|e| StoreError::from_log(parent, e))?;
        let lineage = SessionLineage {
            parent,
            seed_len,
            seed_digest: chain.digest(),
            delegation_depth: spec.delegation_depth,
        };
        let mut header = child_header(&parent_header, spec, &lineage);
        let mut own = vec![lineage_log::Event::new(
            seed_len,
            spec.lineage_time(),
            lineage,
        )];
        own.extend(setup_events(seed_len + 1, spec.lineage_time(), setup));
        header.origin = origin_of(&own);
        let mut structure = Structure::balanced_at(seed_len, last_turn);
        let mut own_records = Vec::new();
        let mut encoder = lineage_log::Encoder::new();
        for event in &own {
            structure
                .admit(event)
                .map_err(|e| StoreError::from_log(child, e))?;
            encoder.encode(event, &mut own_records);
        }
        let start = chain.clone();
        chain.update(&own_records);
        blocks.push(PendingBlock {
            first_seq: seed_len,
            count: own.len() as u32,
            records: own_records,
            digest: chain.digest(),
            start,
            ticket: 0,
        });

        let queue = &self.inner.queue;
        let mut state = queue.lock();
        if state.tails.contains_key(&child) {
            return Err(StoreError::SessionExists { session: child });
        }
        // An unwritten parent forgotten meanwhile, or a parent deleted since it was read, is gone:
        // the child would name a free id.
        if (unwritten.is_some() && !state.tails.contains_key(&parent))
            || state.deleted.contains(&parent)
        {
            return Err(StoreError::UnknownSession { session: parent });
        }
        state.tails.insert(
            child,
            Tail {
                header: header.clone(),
                row_written: false,
                revision: 0,
                next_seq: seed_len + own.len() as u64,
                structure,
                chain,
                pending: Vec::new(),
                last_ticket: 0,
                verbatim: false,
            },
        );
        let ticket = queue.enqueue(&mut state, child, blocks);
        queue.wait_durable(state, Some(child), ticket)?;
        Ok(header)
    }
}
