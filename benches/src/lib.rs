//! Benchmarks of Lineage's store against the obvious alternatives and the physical limits, on
//! identical workloads.
//!
//! - [`fixture`] builds a session with the realistic generator and writes it to every contender.
//! - [`jsonl`]: JSON Lines, one file per session, parsed in full (the shape of the upstream
//!   default store).
//! - [`sqlite`]: SQLite with `events(session, seq, body)` keyed by `(session, seq)`, holding the
//!   same encoded records Lineage stores.
//! - [`limits`]: (a) decode and digest the same records from one in-memory buffer; (b) the floor:
//!   read the bytes from the page cache, hash them in bulk and split the frames without decoding.
//! - [`hosts`]: a follow-up accepted across two hosts of a PostgreSQL store, woken by the
//!   database's notifications against polling alone.
//! - [`measure`]: timing and peak resident memory.
//! - [`report`]: comparison rows, the table and the JSON both benchmark binaries write.
//! - [`models`]: the model adapters over real sockets against a raw read and the in-memory
//!   decode (the `lineage-bench-models` binary).

#![forbid(unsafe_code)]

pub mod fixture;
pub mod hosts;
pub mod jsonl;
pub mod limits;
pub mod measure;
pub mod models;
pub mod report;
pub mod sqlite;
