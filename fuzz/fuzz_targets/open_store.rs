//! Any bytes as a store file: opening, listing, loading and verifying return errors, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lineage_store::{Store, StoreOptions};

fuzz_target!(|data: &[u8]| {
    let backend = redb::backends::InMemoryBackend::new();
    if redb::StorageBackend::set_len(&backend, data.len() as u64).is_err()
        || redb::StorageBackend::write(&backend, 0, data).is_err()
    {
        return;
    }
    let Ok(store) = Store::with_backend(backend, StoreOptions::default()) else { return };
    if let Ok(sessions) = store.list() {
        for info in sessions {
            let _ = store.inspect(info.header.id);
        }
    }
    let _ = store.verify();
});
