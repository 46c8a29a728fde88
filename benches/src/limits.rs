//! The limits a store cannot beat.

use std::path::Path;

use lineage_log::{Chain, Digest, Event, Records, decode_records};

/// Limit (a): no storage at all. Digest the records of one in-memory buffer and decode them into
/// the same types a load returns.
pub fn decode_buffer(records: &[u8], expected: usize) -> Vec<Event> {
    let mut chain = Chain::new();
    chain.update(records);
    std::hint::black_box(chain.digest());
    let mut events = Vec::with_capacity(expected);
    decode_records(records, 0, &mut events).expect("the fixture's records decode");
    events
}

/// Limit (b), the physical floor: read the bytes from the page cache, hash them with one call and
/// split every frame, borrowing (no payload is decoded, nothing is allocated per record).
pub fn floor(path: &Path) -> std::io::Result<(Digest, u64)> {
    let bytes = std::fs::read(path)?;
    let mut chain = Chain::new();
    chain.update(&bytes);
    let mut count = 0u64;
    let mut time_sum = 0i64;
    for item in Records::new(&bytes, 0) {
        let (_, raw) = item.map_err(std::io::Error::other)?;
        time_sum = time_sum.wrapping_add(raw.time_ms);
        count += 1;
    }
    std::hint::black_box(time_sum);
    Ok((chain.digest(), count))
}
