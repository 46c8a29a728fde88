//! Memory storage that outlives the stores opened over it.

use std::sync::Arc;

use redb::StorageBackend;
use redb::backends::InMemoryBackend;

/// A memory backend shared by clones: dropping a store and opening another over a clone reopens
/// the same bytes. It has no range locks, so the store opens it in the engine's exclusive-writer
/// mode, and a target opens one store over it at a time.
#[derive(Clone, Debug, Default)]
pub struct SharedMemory(Arc<InMemoryBackend>);

impl SharedMemory {
    /// Memory holding `bytes`, as if they were a file's.
    pub fn holding(bytes: &[u8]) -> std::io::Result<SharedMemory> {
        let memory = SharedMemory::default();
        memory.0.set_len(bytes.len() as u64)?;
        memory.0.write(0, bytes)?;
        Ok(memory)
    }

    /// The bytes it holds now.
    pub fn bytes(&self) -> std::io::Result<Vec<u8>> {
        let mut out = vec![0; usize::try_from(self.0.len()?).unwrap_or(usize::MAX)];
        self.0.read(0, &mut out)?;
        Ok(out)
    }
}

impl StorageBackend for SharedMemory {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        self.0.write(offset, data)
    }
}
