//! Lineage: durable, event-sourced sessions and subagent delegation for AI-agent hosts.
//!
//! This facade re-exports the crates most hosts need:
//!
//! - [`log`]: the session log model (events, messages, rules, repair, fork, folds, codec);
//! - [`store`]: the redb-backed store (append, load, inspect, fork, verify, group commit);
//! - [`agent`]: the agent runtime on tokio (inbox, turn loop, model and tool traits, registry);
//! - [`subagent`]: delegation (providers, spawn and fork, one-shot and continuable children);
//! - `models` (feature `models`): model adapters for real endpoints (Chat Completions,
//!   Responses, Anthropic Messages) and a router. Off by default: it brings an HTTP client and
//!   TLS, which a host with its own models does not need.
//!
//! A host runs a prompt to completion (the root agent and every child it delegates to quiet)
//! and shuts down in one call:
//!
//! ```
//! use lineage::agent::{AgentSpec, CreateAgent, Response, ScriptedModel};
//! use lineage::subagent::Host;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("sessions.lineage");
//! let model = ScriptedModel::new([Response::text("four")]); // or a real endpoint's adapter
//! let host = Host::open(&path, model)?;
//! let spec = AgentSpec::new("scripted", "any"); // the endpoint and model its requests name
//! let root = host.agents.create(CreateAgent::fresh(spec)).await?;
//! let outcome = host.run(&root, "what is 2 + 2?").await?;
//! assert_eq!(outcome.text(), "four");
//! host.close().await?; // children drained, agents disposed, the store flushed
//! # Ok(())
//! # }
//! ```
//!
//! The store on its own:
//!
//! ```no_run
//! use lineage::log::{Event, Header, SessionId, TurnStart};
//! use lineage::store::Store;
//!
//! # fn main() -> Result<(), lineage::store::StoreError> {
//! let store = Store::open("sessions.lineage")?;
//! let id = SessionId::new();
//! store.create(Header::new(id, 1_700_000_000_000))?;
//! store.append(id, &[Event::new(0, 1_700_000_000_000, TurnStart { turn: 1 })])?;
//! let loaded = store.load(id)?; // the open turn is closed by crash repair
//! assert_eq!(loaded.closers, 1);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use lineage_agent as agent;
pub use lineage_log as log;
#[cfg(feature = "models")]
pub use lineage_models as models;
pub use lineage_store as store;
pub use lineage_subagent as subagent;
