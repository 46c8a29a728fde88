//! The Lineage session store: many session logs in one embedded redb file, or in a PostgreSQL
//! database that many hosts share (the `postgres` feature; [`Store::open`] of a `postgres://` URL).
//!
//! Sessions are stored as blocks of framed records keyed by `(session, first seq)`, each block
//! carrying the session's running digest at its last record; both engines hold the same blocks.
//! Writes go through one writer thread that group-commits every session's admitted batches in one
//! transaction with one fsync, each session's write conditional on where its log ends; reads are
//! one range scan per session. See `schema/FORMAT.md` for the layout.
//!
//! On a shared store, one host at a time writes a session: owning it ([`Store::own`]) takes its
//! lease, every write carries the lease's fencing token, and a host whose lease was taken over is
//! refused ([`StoreError::Fenced`]). Hosts reach sessions another host keeps through the store's
//! mailbox ([`Store::post`]). On an embedded file the same calls hold with one writer.
//!
//! The store is synchronous: it spawns its own writer thread and needs no async runtime (the
//! PostgreSQL engine runs one of its own, on its own thread).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod copy;
mod delete;
mod engine;
mod error;
mod fill;
mod fork;
#[cfg(test)]
mod golden;
mod layout;
mod lease;
mod meta;
mod owners;
mod pack;
mod read;
mod scan;
mod store;
mod upgrade;
mod verify;
mod writer;

pub use copy::Copied;
pub use delete::{DeleteRule, Deleted};
pub use engine::{LeaseState, Mail, display_location, is_database_url};
pub use error::{EngineError, EngineErrorKind, NotDurable, Result, StoreError};
pub use layout::{MAX_BLOCK_BYTES, MAX_BLOCK_RECORDS, MAX_RECORD_BYTES};
pub use lease::LeaseLoss;
pub use owners::SessionOwner;
pub use scan::Scan;
pub use store::{
    DEFAULT_BLOCK_BYTES, DEFAULT_BLOCK_EVENTS, DEFAULT_CACHE_BYTES, DEFAULT_COMMIT_WINDOW,
    DEFAULT_LEASE_TTL, KindStats, Loaded, PostgresTimeouts, STORE_FORMAT_VERSION, SessionInfo,
    Store, StoreOptions, StoreStats,
};
pub use upgrade::Upgraded;
pub use verify::{Problem, SessionReport, VerifyReport};
