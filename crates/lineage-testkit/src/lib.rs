//! A test kit for Lineage session logs: deterministic realistic sessions, proptest strategies for
//! random valid logs and batch partitions, random events of every variant, and short event
//! constructors for hand-written logs.
//!
//! Everything here is deterministic: the generators draw from [`SplitMix64`] seeded by the caller
//! (or by proptest), never from the clock, so a seed or a proptest failure reproduces exactly.
//! Every log the generators produce satisfies `lineage_log::check_seed`, and so does each of its
//! prefixes.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod arb;
mod build;
pub mod ev;
mod random;
mod realistic;
mod rng;
mod words;

pub use arb::{
    arb_balanced_log, arb_event, arb_partition, arb_valid_log, balanced_cuts, split_batches,
    valid_log_from_ops,
};
pub use build::{LogBuilder, running_digests};
pub use random::{OPAQUE_TAG_BASE, random_event_body};
pub use realistic::realistic_session;
pub use rng::SplitMix64;
