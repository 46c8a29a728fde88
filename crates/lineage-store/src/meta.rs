//! `Store::session_meta`: a session's title and tags without decoding its whole log.

use lineage_log::{EventBody, EventKind, Records, SessionId, SessionMeta, decode_record};

use crate::error::Engine;
use crate::layout::{Block, EVENTS};
use crate::read::read_record;
use crate::store::{Store, guard};
use crate::{Result, StoreError};

impl Store {
    /// The title and tags of a stored session: the fold of the `lineage.session/meta` events of
    /// its own suffix ([`lineage_log::fold_session_meta`]), last word wins.
    ///
    /// Cost: one range scan over the blocks of the own suffix (from the block holding `seed_len`);
    /// every record is framed but only `custom` records are decoded, and block digests are not
    /// checked (`verify` checks them). So a listing pays a read of each session's bytes, not a
    /// replay. A malformed metadata event is skipped, as the fold does.
    pub fn session_meta(&self, session: SessionId) -> Result<SessionMeta> {
        guard(|| {
            let txn = self.begin_read()?;
            let record = read_record(&txn, session)?;
            let seed_len = record.header.seed_len;
            let table = txn.open_table(EVENTS).engine()?;
            let id = session.as_u128();
            // The block holding `seed_len` is the last one starting at or before it.
            let start = match table.range((id, 0)..=(id, seed_len)).engine()?.next_back() {
                Some(entry) => entry.engine()?.0.value().1,
                None => 0,
            };
            let mut meta = SessionMeta::default();
            for entry in table.range((id, start)..=(id, u64::MAX)).engine()? {
                let (key, value) = entry.engine()?;
                let first_seq = key.value().1;
                let block = Block::parse(session, first_seq, value.value())?;
                for item in Records::new(block.records, first_seq) {
                    let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
                    if seq < seed_len || raw.kind() != Some(EventKind::Custom) {
                        continue;
                    }
                    let event =
                        decode_record(seq, &raw).map_err(|e| StoreError::from_log(session, e))?;
                    if let EventBody::Custom(custom) = &event.body {
                        // A malformed metadata event changes nothing, as in the fold.
                        let _ = meta.apply(custom);
                    }
                }
            }
            Ok(meta)
        })
    }
}
