//! The AnthropicMessages wire format. (Being written.)

use lineage_agent::{ModelError, ModelRequest};
use lineage_log::StreamChunk;

use super::{Translate, Wire, bad_response};
use crate::sse::Event;

/// The request body.
pub(crate) fn body(request: &ModelRequest, default_max_tokens: u32) -> serde_json::Value {
    let _ = (request, default_max_tokens);
    serde_json::Value::Null
}

/// Reads one answer.
#[derive(Debug, Default)]
pub(crate) struct Translator {}

impl Translate for Translator {
    fn event(&mut self, _event: &Event, _out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        Err(bad_response(Wire::AnthropicMessages, "not yet readable"))
    }

    fn is_done(&self) -> bool {
        false
    }

    fn end(&mut self, _out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        Err(bad_response(Wire::AnthropicMessages, "not yet readable"))
    }
}
