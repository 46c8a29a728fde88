//! Messages, their content blocks and where they came from.

use serde::{Deserialize, Serialize};

use crate::{CallId, MessageId, SessionId, Text};

/// How deep tool results may nest inside tool results. Real logs nest once (a result holds text);
/// the bound keeps decoding and encoding of any record within a fixed stack depth.
pub const MAX_NESTING: usize = 8;

mod nested {
    use std::cell::Cell;

    use serde::de::{Deserialize, Deserializer, Error};

    use super::{ContentBlock, MAX_NESTING};

    thread_local! {
        /// Tool-result levels being decoded on this thread right now.
        static DEPTH: Cell<usize> = const { Cell::new(0) };
    }

    struct Level;

    impl Drop for Level {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get() - 1));
        }
    }

    pub(super) fn blocks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ContentBlock>, D::Error> {
        let depth = DEPTH.with(|d| {
            d.set(d.get() + 1);
            d.get()
        });
        let _level = Level;
        if depth > MAX_NESTING {
            return Err(D::Error::custom(format!(
                "tool results nest deeper than {MAX_NESTING} levels"
            )));
        }
        Vec::<ContentBlock>::deserialize(d)
    }
}

/// Who speaks a message in the model's history.
///
/// Tool results are spoken by the user side, as model APIs expect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// The human, the host, the runtime or a tool result.
    User,
    /// The model.
    Assistant,
}

/// One piece of a message's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: Text,
    },
    /// The model's visible reasoning.
    Reasoning {
        /// The reasoning text.
        text: Text,
    },
    /// An image, held by the host and referred to here.
    Image {
        /// The media type, for example `image/png`.
        media_type: Text,
        /// Where the host keeps the image: a URI or an attachment id.
        attachment: Text,
    },
    /// A tool call the model asked for.
    ToolCall {
        /// The call's id, as the model chose it.
        id: CallId,
        /// The tool's name.
        name: Text,
        /// The arguments: a raw JSON string, kept exactly as the model wrote it.
        arguments: Text,
    },
    /// The result of a tool call.
    ToolResult {
        /// The call this answers.
        tool_call_id: CallId,
        /// The result's content. Tool results nest at most [`MAX_NESTING`] deep, so that
        /// decoding a hostile record cannot exhaust the stack.
        #[serde(deserialize_with = "nested::blocks")]
        content: Vec<ContentBlock>,
        /// Whether the call failed.
        is_error: bool,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<Text>) -> Self {
        ContentBlock::Text { text: text.into() }
    }

    /// How many tool results nest in this block (0 for a block that is not a tool result).
    pub fn nesting(&self) -> usize {
        // Iterative, so that a deep value built in memory cannot exhaust the stack either.
        let mut deepest = 0;
        let mut stack: Vec<(&ContentBlock, usize)> = vec![(self, 0)];
        while let Some((block, depth)) = stack.pop() {
            if let ContentBlock::ToolResult { content, .. } = block {
                deepest = deepest.max(depth + 1);
                stack.extend(content.iter().map(|b| (b, depth + 1)));
            }
        }
        deepest
    }
}

/// Where a message came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MessageSource {
    /// Typed by the user.
    User,
    /// Produced by a model.
    Model {
        /// The model endpoint (a named model service: its wire format, address and credentials).
        endpoint: Text,
        /// The model.
        model: Text,
    },
    /// The result of a tool call.
    Tool {
        /// The call it answers.
        call_id: CallId,
    },
    /// Sent by a coordinating agent (a parent's `send_message`).
    Coordinator {
        /// The sending session.
        sender: SessionId,
    },
    /// A report a child sent to its parent.
    SubagentReport {
        /// The reporting child.
        sender: SessionId,
    },
    /// The runtime's notice that a child settled.
    SubagentSettled {
        /// The child that settled.
        sender: SessionId,
        /// What it settled with.
        summary: Text,
    },
    /// Contributed by a host extension.
    Plugin {
        /// The extension's name.
        name: Text,
    },
}

/// A message in a session's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The message's id, unique within its session.
    pub id: MessageId,
    /// Who speaks it.
    pub role: Role,
    /// Its content, in order.
    pub content: Vec<ContentBlock>,
    /// Where it came from.
    pub source: MessageSource,
}

impl Message {
    /// A user-role text message from `source`.
    pub fn user_text(text: impl Into<Text>, source: MessageSource) -> Self {
        Message {
            id: MessageId::new(),
            role: Role::User,
            content: vec![ContentBlock::text(text)],
            source,
        }
    }

    /// The concatenation of the message's text blocks (reasoning excluded).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for block in &self.content {
            if let ContentBlock::Text { text } = block {
                out.push_str(text);
            }
        }
        out
    }

    /// The tool calls the message asks for, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = (&CallId, &str, &str)> {
        self.content.iter().filter_map(|block| match block {
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => Some((id, name.as_str(), arguments.as_str())),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, EventBody, LogError, check_shape, decode_record, split_record};

    fn nested(depth: usize) -> ContentBlock {
        let mut block = ContentBlock::text("innermost");
        for _ in 0..depth {
            block = ContentBlock::ToolResult {
                tool_call_id: CallId::new("c"),
                content: vec![block],
                is_error: false,
            };
        }
        block
    }

    fn user_message(content: ContentBlock) -> Event {
        let message = Message {
            id: MessageId::from_u128(1),
            role: Role::User,
            content: vec![content],
            source: MessageSource::User,
        };
        Event::new(0, 0, EventBody::from(message))
    }

    #[test]
    fn nesting_counts_tool_result_levels() {
        assert_eq!(ContentBlock::text("x").nesting(), 0);
        assert_eq!(nested(1).nesting(), 1);
        assert_eq!(nested(MAX_NESTING).nesting(), MAX_NESTING);
    }

    #[test]
    fn shape_check_refuses_nesting_past_the_limit() {
        assert!(check_shape(&user_message(nested(MAX_NESTING))).is_ok());
        let err = check_shape(&user_message(nested(MAX_NESTING + 1))).unwrap_err();
        assert!(err.contains("nest"), "{err}");
    }

    #[test]
    fn decoding_refuses_nesting_past_the_limit() {
        let ok = crate::encode_record(&user_message(nested(MAX_NESTING)));
        let (raw, _) = split_record(&ok, 0).unwrap();
        assert!(decode_record(0, &raw).is_ok());
        let deep = crate::encode_record(&user_message(nested(MAX_NESTING + 1)));
        let (raw, _) = split_record(&deep, 0).unwrap();
        assert!(matches!(
            decode_record(0, &raw),
            Err(LogError::Corrupt { seq: 0, .. })
        ));
    }

    #[test]
    fn a_hostile_deeply_nested_record_is_an_error_not_a_stack_overflow() {
        // A user message payload: id (length-prefixed 16 bytes), role, one content block, then a
        // hundred thousand tool-result levels, each `variant 4, empty call id, one block`. The
        // record is cut off after them: decoding must stop at the nesting limit first.
        let mut payload = vec![16];
        payload.extend_from_slice(&[0u8; 16]);
        payload.extend_from_slice(&[0, 1]);
        for _ in 0..100_000 {
            payload.extend_from_slice(&[4, 0, 1]);
        }
        let mut body = vec![5, 0, 0]; // tag user/message, flags, time 0
        body.extend_from_slice(&payload);
        let mut record = Vec::new();
        crate::put_varint(&mut record, body.len() as u64);
        record.extend_from_slice(&body);
        let (raw, _) = split_record(&record, 3).unwrap();
        assert!(matches!(
            decode_record(3, &raw),
            Err(LogError::Corrupt { seq: 3, .. })
        ));
    }
}
