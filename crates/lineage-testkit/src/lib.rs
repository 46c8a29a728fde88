//! Shared test scaffolding for Lineage, so a new suite starts from one place.
//!
//! Without features: deterministic realistic sessions, an endless seeded stream of turns for
//! writer processes ([`TurnStream`]), proptest strategies for random valid logs
//! and batch partitions, random events of every variant, short event and turn constructors for
//! hand-written logs ([`ev`]), readers of logs and directories for assertions ([`read`], [`files`]), the golden vector files' hex ([`golden`]), helper processes a
//! test binary re-runs itself as, to crash or to run beside ([`process`]), the external
//! agent products, installed on first use ([`products`]), a private PostgreSQL server
//! ([`postgres`]), and a TCP proxy that cuts a connection where a test says ([`proxy`]). These
//! depend on `lineage-log` and the standard library only.
//!
//! Feature `agent` adds the agent harness (module `agent`: a store, a scripted model, a registry, tools
//! from closures); feature `subagent` adds the delegation harness (module `subagent`: a routing model,
//! a subagent runtime, a canned provider); feature `loopback` adds the loopback model server
//! (module `loopback`: a real HTTP server on 127.0.0.1 that answers from a script and records
//! every request); feature `store-v1` adds stores in store format 1 (module `store_v1`: the golden
//! files and a writer of the layout). Library crates take this crate only as a
//! dev-dependency, and it takes them only through these features, so dependencies point one way.
//!
//! Everything here is deterministic: the generators draw from [`SplitMix64`] seeded by the caller
//! (or by proptest), never from the clock, so a seed or a proptest failure reproduces exactly.
//! Every log the generators produce satisfies `lineage_log::check_seed`, and so does each of its
//! prefixes.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "agent")]
pub mod agent;
mod arb;
mod build;
#[cfg(feature = "subagent")]
pub mod continuation;
pub mod ev;
pub mod files;
pub mod golden;
#[cfg(feature = "loopback")]
pub mod loopback;
pub mod postgres;
pub mod process;
pub mod products;
pub mod proxy;
mod random;
pub mod read;
mod realistic;
mod rng;
#[cfg(feature = "store-v1")]
pub mod store_v1;
mod stream;
#[cfg(feature = "subagent")]
pub mod subagent;
mod words;

pub use arb::{
    arb_balanced_log, arb_event, arb_partition, arb_valid_log, balanced_cuts, split_batches,
    valid_log_from_ops,
};
pub use build::{LogBuilder, running_digests};
pub use random::{OPAQUE_TAG_BASE, random_event_body};
pub use realistic::realistic_session;
pub use rng::SplitMix64;
pub use stream::{STREAM_T0, TurnStream, last_turn};
