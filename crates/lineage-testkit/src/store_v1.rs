//! Stores in store format 1, the layout before packed blocks, for the tests that read and upgrade
//! them: the golden files the format-1 writer wrote (`schema/golden/store-v1`), and a writer of the
//! layout for larger ones, independent of the store's own writer.

use std::path::{Path, PathBuf};

use lineage_log::{Chain, Digest, Encoder, Event, Header};
use redb::TableDefinition;
use serde::Serialize;

/// The golden format-1 store `name` (`schema/golden/store-v1/README.md` says what each holds).
pub fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../schema/golden/store-v1")
        .join(name)
}

/// A copy of the golden store `name` in a fresh directory (the golden files never change).
pub fn golden_copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    std::fs::copy(golden(name), &path).expect("the golden store copies");
    (dir, path)
}

/// The record count at which the format-1 writer cut a block (`schema/FORMAT.md` §4.4).
pub const BLOCK_EVENTS: usize = 512;
/// The record bytes at which the format-1 writer cut a block (a larger record got one alone).
pub const BLOCK_BYTES: usize = 32_256;

/// The block sizes [`write_store`] cuts in turn, capped by [`BLOCK_EVENTS`] and [`BLOCK_BYTES`]:
/// full blocks and the small ones that commits of a few events left, so an upgrade meets both.
pub const BATCHES: [usize; 7] = [512, 1, 7, 64, 512, 300, 2];

/// A session row as the store writes it (postcard of these fields in this order).
#[derive(Serialize)]
struct Row<'a> {
    header: &'a Header,
    next_seq: u64,
    head: Digest,
    revision: u64,
}

/// Writes a store in store format 1 at `path` (which must not exist) holding `sessions`, with
/// redb directly, as the format-1 writer laid it out (`schema/FORMAT.md` §4.4, §6): `meta` with
/// the magic, `format_version` 1 (u32 LE) and a new store id; per session its blocks of canonical
/// records back to back (`count: u32 LE ‖ S(last) ‖ records`, cut at [`BATCHES`] sizes), its row
/// (header, next seq, head digest, revision: one per block, as if each block had been its own
/// commit) and, for a session with a parent, the parent's children index entry. Each log must be
/// non-empty and valid; a child's header must already carry its seed facts. Returns the store id.
pub fn write_store(path: &Path, sessions: &[(Header, Vec<Event>)]) -> uuid::Uuid {
    let meta: TableDefinition<&str, &[u8]> = TableDefinition::new("lineage/meta");
    let rows: TableDefinition<u128, &[u8]> = TableDefinition::new("lineage/sessions");
    let blocks: TableDefinition<(u128, u64), &[u8]> = TableDefinition::new("lineage/events");
    let children: TableDefinition<(u128, u128), ()> = TableDefinition::new("lineage/children");
    assert!(!path.exists(), "{} exists already", path.display());
    let store_id = uuid::Uuid::now_v7();
    let db = redb::Database::create(path).expect("a new redb file");
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(meta).unwrap();
        meta.insert("magic", b"lineage store".as_slice()).unwrap();
        meta.insert("format_version", 1u32.to_le_bytes().as_slice())
            .unwrap();
        meta.insert("store_id", store_id.as_bytes().as_slice())
            .unwrap();
        let mut rows = txn.open_table(rows).unwrap();
        let mut blocks = txn.open_table(blocks).unwrap();
        let mut children = txn.open_table(children).unwrap();
        let mut encoder = Encoder::new();
        for (header, events) in sessions {
            assert!(!events.is_empty(), "a stored session has events");
            let id = header.id.as_u128();
            let mut chain = Chain::new();
            let mut revision = 0u64;
            let mut batch = BATCHES.iter().cycle();
            let mut next = 0usize;
            while next < events.len() {
                let want = (*batch.next().unwrap()).min(BLOCK_EVENTS);
                let first_seq = next as u64;
                let mut records = Vec::new();
                let mut count = 0usize;
                while count < want && next < events.len() {
                    let mut record = Vec::new();
                    encoder.encode(&events[next], &mut record);
                    if count > 0 && records.len() + record.len() > BLOCK_BYTES {
                        break;
                    }
                    records.extend_from_slice(&record);
                    count += 1;
                    next += 1;
                }
                chain.update(&records);
                let mut value = (count as u32).to_le_bytes().to_vec();
                value.extend_from_slice(&chain.digest().0);
                value.extend_from_slice(&records);
                blocks.insert((id, first_seq), value.as_slice()).unwrap();
                revision += 1;
            }
            let row = Row {
                header,
                next_seq: events.len() as u64,
                head: chain.digest(),
                revision,
            };
            rows.insert(id, postcard::to_stdvec(&row).unwrap().as_slice())
                .unwrap();
            if let Some(parent) = header.parent {
                children.insert((parent.as_u128(), id), ()).unwrap();
            }
        }
    }
    txn.commit().unwrap();
    store_id
}
