//! The embedded file's tables (`schema/FORMAT.md` §6): every change here is a format change.

use lineage_log::SessionId;
use redb::TableDefinition;

/// `meta`: store-wide facts, by name.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("lineage/meta");
/// `sessions`: session id (as a big-endian integer) → [`SessionRecord`].
pub(crate) const SESSIONS: TableDefinition<u128, &[u8]> = TableDefinition::new("lineage/sessions");
/// `events`: (session, first seq) → one block.
pub(crate) const EVENTS: TableDefinition<(u128, u64), &[u8]> =
    TableDefinition::new("lineage/events");
/// `children`: (parent, child) → nothing; lists a parent's children without a scan.
pub(crate) const CHILDREN: TableDefinition<(u128, u128), ()> =
    TableDefinition::new("lineage/children");

/// The key range of one session's blocks.
pub(crate) fn session_blocks(session: SessionId) -> std::ops::RangeInclusive<(u128, u64)> {
    let id = session.as_u128();
    (id, 0)..=(id, u64::MAX)
}

/// Changes the `nth` block of `session` in the closed store file at `path` by `damage`, and
/// returns its first seq and its value as it was: for tests that plant damage.
#[cfg(test)]
pub(crate) fn damage_block(
    path: &std::path::Path,
    session: SessionId,
    nth: usize,
    damage: impl FnOnce(&mut Vec<u8>),
) -> (u64, Vec<u8>) {
    use redb::ReadableTable;
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    let found = {
        let mut table = txn.open_table(EVENTS).unwrap();
        let (key, before) = {
            let (key, value) = table
                .range(session_blocks(session))
                .unwrap()
                .nth(nth)
                .unwrap()
                .unwrap();
            (key.value(), value.value().to_vec())
        };
        let mut after = before.clone();
        damage(&mut after);
        table.insert(key, after.as_slice()).unwrap();
        (key.1, before)
    };
    txn.commit().unwrap();
    found
}
