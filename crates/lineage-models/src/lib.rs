//! Model adapters for Lineage agents.
//!
//! [`HttpModel`] puts one endpoint (an OpenAI-compatible Chat Completions server, OpenAI
//! Responses, or Anthropic Messages) behind lineage-agent's `Model` trait; [`Models`] routes
//! each request to one of several by the request's endpoint name, and configures them from the
//! environment (`LINEAGE_MODEL=openai:gpt-4.1` and the endpoint's key variable).
//!
//! - [`endpoint`]: an endpoint's configuration: wire format, base URL, key, timeouts, retries;
//! - [`http`]: the adapter: request, retries before the first chunk, idle timeout,
//!   cancellation, the answer's chunks as they arrive;
//! - [`wire`]: the three wire formats (Chat Completions, Responses, Anthropic Messages): the
//!   request each writes and how its event stream becomes chunks;
//! - [`sse`]: an incremental decoder of server-sent events, fed whatever byte chunks the
//!   connection delivers (a split inside a line, a CRLF or a UTF-8 character is no matter);
//! - [`failure`]: the stable failure codes a host can act on, the classification of an HTTP
//!   error response into one of them, and `Retry-After` in both of its forms.

//!
//! An agent on a configured endpoint, in code:
//!
//! ```
//! use std::sync::Arc;
//!
//! use lineage_agent::{AgentOptions, AgentSpec, Agents, CreateAgent};
//! use lineage_models::{ApiKey, Endpoint, Models, Wire};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = lineage_store::Store::open(dir.path().join("sessions.lineage"))?;
//! let mut models = Models::new();
//! models.endpoint(
//!     Endpoint::new("deepseek", Wire::ChatCompletions, "https://api.deepseek.com/v1")
//!         .with_api_key(ApiKey::new("sk-...")),
//! )?;
//! let agents = Agents::new(store, Arc::new(models));
//! let options = AgentOptions {
//!     endpoint: Some("deepseek".into()),
//!     model: Some("deepseek-chat".into()),
//!     ..AgentOptions::default()
//! };
//! let agent = agents
//!     .create(CreateAgent::fresh(AgentSpec { options, ..AgentSpec::default() }))
//!     .await?;
//! // agent.followup(message) would now ask deepseek-chat, streaming into the session's log.
//! # drop(agent);
//! # Ok(())
//! # }
//! ```
//!
//! Or from the environment: `Models::from_env(None, |v| std::env::var(v).ok())` reads
//! `LINEAGE_MODEL=ENDPOINT:MODEL` and the endpoint's settings ([`Endpoint::from_env`]).
//!
//! TLS (feature `tls`, on by default) is rustls on the ring provider, given to each client this
//! crate builds. It enables reqwest's `rustls-no-provider`: a host that builds reqwest clients of
//! its own in the same build, without a provider feature of its own, installs a process-wide
//! provider first (`rustls::crypto::ring::default_provider().install_default()`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod endpoint;
pub mod failure;
pub mod http;
mod router;
pub mod sse;
pub mod wire;

pub use endpoint::{ApiKey, ConfigError, Endpoint, ModelChoice, RetryPolicy};
pub use http::HttpModel;
pub use router::{Models, UNKNOWN_ENDPOINT};
pub use wire::{AnswerReader, Wire};
