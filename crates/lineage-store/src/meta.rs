//! `Store::session_meta`: a session's title and tags without decoding its whole log.

use lineage_log::{EventBody, EventKind, Records, SessionId, SessionMeta, decode_record};

use crate::layout::Block;
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
            let view = self.view()?;
            let record = read_record(&*view, session)?;
            let seed_len = record.header.seed_len;
            let start = view.block_start(session, seed_len)?;
            let mut meta = SessionMeta::default();
            for block in view.blocks(session, start)? {
                let (first_seq, value) = block?;
                let block = Block::parse(self.inner.format, session, first_seq, &value)?;
                for item in Records::new(&block.records, first_seq) {
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
