//! The SQLite baseline: `events(session, seq, body)` keyed by `(session, seq)`, holding the same
//! encoded records Lineage stores, one row per event. WAL journal with `synchronous=FULL`, as
//! durable as Lineage's commits.

use std::path::Path;

use lineage_log::{Chain, Event, Records, decode_record};
use rusqlite::{Connection, params};

/// Opens (creating if needed) a database with the baseline schema.
pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS events (
             session BLOB NOT NULL,
             seq INTEGER NOT NULL,
             body BLOB NOT NULL,
             PRIMARY KEY (session, seq)
         );
         CREATE TABLE IF NOT EXISTS sessions (
             id BLOB PRIMARY KEY,
             parent BLOB
         );
         CREATE INDEX IF NOT EXISTS sessions_by_parent ON sessions (parent);",
    )?;
    Ok(conn)
}

/// Appends records (one per event, back to back in `records`) in one transaction.
pub fn append(
    conn: &mut Connection,
    session: &[u8; 16],
    first_seq: u64,
    records: &[u8],
) -> rusqlite::Result<()> {
    let txn = conn.transaction()?;
    {
        let mut insert =
            txn.prepare_cached("INSERT INTO events (session, seq, body) VALUES (?1, ?2, ?3)")?;
        for item in Records::new(records, first_seq) {
            let (seq, raw) = item.map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
            insert.execute(params![&session[..], seq as i64, raw.bytes])?;
        }
    }
    txn.commit()
}

/// Registers a session row (for the listing benchmark).
pub fn add_session(
    conn: &Connection,
    id: &[u8; 16],
    parent: Option<&[u8; 16]>,
) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO sessions (id, parent) VALUES (?1, ?2)",
        params![&id[..], parent.map(|p| &p[..])],
    )?;
    Ok(())
}

/// Loads every event of a session with seq >= `from`: reads the rows in seq order, digests each
/// record into the running chain (when reading from 0) and decodes it.
pub fn load_from(conn: &Connection, session: &[u8; 16], from: u64) -> rusqlite::Result<Vec<Event>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, body FROM events WHERE session = ?1 AND seq >= ?2 ORDER BY seq",
    )?;
    let mut rows = stmt.query(params![&session[..], from as i64])?;
    let mut events = Vec::new();
    let mut chain = Chain::new();
    while let Some(row) = rows.next()? {
        let seq: i64 = row.get(0)?;
        let body = row.get_ref(1)?.as_blob()?;
        if from == 0 {
            chain.update(body);
        }
        let mut records = Records::new(body, seq as u64);
        let (seq, raw) = records
            .next()
            .ok_or(rusqlite::Error::InvalidQuery)?
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        let event = decode_record(seq, &raw)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        events.push(event);
    }
    std::hint::black_box(chain.digest());
    Ok(events)
}

/// Forks: copies the rows `0..seed_len` to a new session in one transaction.
pub fn fork(
    conn: &mut Connection,
    parent: &[u8; 16],
    child: &[u8; 16],
    seed_len: u64,
) -> rusqlite::Result<()> {
    let txn = conn.transaction()?;
    txn.execute(
        "INSERT INTO events (session, seq, body)
         SELECT ?2, seq, body FROM events WHERE session = ?1 AND seq < ?3",
        params![&parent[..], &child[..], seed_len as i64],
    )?;
    txn.commit()
}

/// The children of a session.
pub fn children(conn: &Connection, parent: &[u8; 16]) -> rusqlite::Result<Vec<Vec<u8>>> {
    let mut stmt = conn.prepare_cached("SELECT id FROM sessions WHERE parent = ?1 ORDER BY id")?;
    let rows = stmt.query_map(params![&parent[..]], |row| row.get::<_, Vec<u8>>(0))?;
    rows.collect()
}
