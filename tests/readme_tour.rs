//! The README's tour, run as written (in a temporary directory), so the first code a user reads
//! stays true.

use lineage::log::{Event, ForkSpec, Header, SessionId, TurnStart};
use lineage::store::{Store, StoreError};

#[test]
fn the_readme_tour_runs_as_written() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let now_ms: u64 = 1_780_000_000_000;
    let store = Store::open(dir.path().join("sessions.lineage"))?;
    let id = SessionId::new();
    store.create(Header::new(id, now_ms))?;
    store.append(id, &[Event::new(0, now_ms as i64, TurnStart { turn: 1 })])?;
    let loaded = store.load(id)?;
    assert_eq!(loaded.closers, 1);
    let spec = ForkSpec {
        child: SessionId::new(),
        boundary: None,
        time_ms: now_ms,
        delegation_depth: 1,
        agent_preset: None,
    };
    let child = store.fork(id, &spec)?;
    assert_eq!(child.seed_len, 2);
    assert!(store.verify()?.is_ok());
    Ok(())
}
