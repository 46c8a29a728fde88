//! What the fuzz targets share: the panic policy that lets the store contain the storage engine's
//! panics without hiding anyone else's, a storage backend several stores can open in turn, and the
//! builders of valid logs from arbitrary bytes, and a watchdog that names the store call an input
//! hangs in.

pub mod backend;
pub mod logs;
pub mod panics;
pub mod seeds;
pub mod watchdog;
