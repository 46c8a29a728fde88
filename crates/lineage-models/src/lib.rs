//! Model adapters for Lineage agents.
//!
//! This crate is where the HTTP adapters behind lineage-agent's `Model` trait are built.
//!
//! - [`wire`]: the three wire formats (Chat Completions, Responses, Anthropic Messages): the
//!   request each writes and how its event stream becomes chunks;
//! - [`sse`]: an incremental decoder of server-sent events, fed whatever byte chunks the
//!   connection delivers (a split inside a line, a CRLF or a UTF-8 character is no matter);
//! - [`failure`]: the stable failure codes a host can act on, the classification of an HTTP
//!   error response into one of them, and `Retry-After` in both of its forms.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod failure;
pub mod sse;
pub mod wire;

pub use wire::{AnswerReader, Wire};
