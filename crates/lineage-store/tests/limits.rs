//! The store's size limits: a record over `MAX_RECORD_BYTES` is refused at admission, one just
//! under it is kept, and a stored block whose recorded length lies or that is a decompression bomb
//! is damage named by session and seqs, read within the limits (never allocated from its claim).

mod common;

use common::*;
use lineage_store::{MAX_BLOCK_BYTES, MAX_RECORD_BYTES, Problem, Store, StoreError};
use redb::ReadableTable;

#[test]
fn a_record_over_the_limit_is_refused_naming_its_seq_and_one_under_it_is_kept() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header).unwrap();
    let mut log = completed_turn(1, 0, "first");
    store.append(id, &log).unwrap();
    let big = completed_turn(2, 6, &"x".repeat(MAX_RECORD_BYTES));
    match store.append(id, &big) {
        Err(StoreError::RecordTooLarge {
            session,
            seq,
            bytes,
            limit,
        }) => {
            assert_eq!((session, limit), (id, MAX_RECORD_BYTES));
            assert!((6..12).contains(&seq), "{seq}");
            assert!(bytes > MAX_RECORD_BYTES);
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    assert_eq!(store.info(id).unwrap().len, 6, "nothing of the batch");
    // A 42 MB tool result's worth is well within it.
    let large = completed_turn(2, 6, &"y".repeat(42_000_000));
    store.append(id, &large).unwrap();
    log.extend(large);
    assert_eq!(store.read_from(id, 0).unwrap(), log);
    assert_intact(&store.verify().unwrap());
}

/// The block values planted: a compressed body recording 10 GiB; a real bomb (zeros compressing
/// 255 to 1) stating 80 MiB; and one stating a small length it decompresses past.
fn planted_blocks() -> Vec<(&'static str, Vec<u8>)> {
    let compressed = lz4_flex::block::compress(&vec![0u8; 80 << 20]);
    let value = |raw_len: u64, payload: &[u8]| {
        let mut value = 6u32.to_le_bytes().to_vec();
        value.extend_from_slice(&[0; 32]);
        value.push(1); // an LZ4 body
        lineage_log::put_varint(&mut value, raw_len);
        value.extend_from_slice(payload);
        value
    };
    vec![
        ("a lying length", value(10 << 30, &[0x5a; 4096])),
        ("a bomb", value(80 << 20, &compressed)),
        ("a bomb under a small length", value(4096, &compressed)),
    ]
}

#[test]
fn a_block_that_lies_about_its_size_is_damage_named_by_session_and_seqs() {
    for (what, value) in planted_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.lineage");
        let (id, header) = fresh();
        {
            let store = Store::open(&path).unwrap();
            store.import(header, &completed_turn(1, 0, "one")).unwrap();
            store.append(id, &completed_turn(2, 6, "two")).unwrap();
        }
        // The second turn's block becomes the planted one.
        let db = raw_db(&path);
        let txn = db.begin_write().unwrap();
        {
            let mut events = txn.open_table(EVENTS).unwrap();
            let keys: Vec<u64> = events
                .range((id.as_u128(), 0)..=(id.as_u128(), u64::MAX))
                .unwrap()
                .map(|e| e.unwrap().0.value().1)
                .collect();
            let last = *keys.last().unwrap();
            assert_eq!(last, 6, "{what}: the second turn is its own block");
            events
                .insert((id.as_u128(), last), value.as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        drop(db);

        let store = Store::open(&path).unwrap();
        match store.load(id) {
            Err(StoreError::CorruptBlock {
                session, first_seq, ..
            }) => assert_eq!((session, first_seq), (id, 6), "{what}"),
            other => panic!("{what}: expected a corrupt block, got {other:?}"),
        }
        assert!(store.read_from(id, 0).is_err(), "{what}");
        assert!(store.scan(id, 0).unwrap().any(|e| e.is_err()), "{what}");
        let report = store.verify().unwrap();
        let problems: Vec<&Problem> = report
            .sessions
            .iter()
            .filter(|s| s.session == id)
            .flat_map(|s| &s.problems)
            .collect();
        assert!(!problems.is_empty(), "{what}: verify names the block");
        assert!(
            problems
                .iter()
                .any(|p| p.to_string().contains("seqs 6") || p.to_string().contains("seq 6")),
            "{what}: {problems:?}"
        );
        // Listing does not open blocks at all.
        assert_eq!(store.list().unwrap().len(), 1, "{what}");
        const { assert!(MAX_BLOCK_BYTES < 80 << 20) };
    }
}
