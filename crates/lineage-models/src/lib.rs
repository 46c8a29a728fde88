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
