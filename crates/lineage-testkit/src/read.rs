//! Readers of logs for assertions: what kinds of events a log holds, how its turns ended, what
//! was said, and what the tools answered. They read; they never repair or reorder.

use lineage_log::{
    ContentBlock, Event, EventBody, Message, MessageSource, SessionId, TurnEndReason, check_seed,
    is_balanced,
};

/// The display names of `events` (`turn/start`, `tool/result`, …), in log order.
pub fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().name()).collect()
}

/// What `pick` takes from the bodies of `events`, in log order.
fn of_bodies<T>(events: &[Event], pick: impl FnMut(&EventBody) -> Option<T>) -> Vec<T> {
    events.iter().map(|e| &e.body).filter_map(pick).collect()
}

/// The text blocks among `blocks`, in order, each as one string.
fn texts(blocks: &[ContentBlock]) -> impl Iterator<Item = String> + '_ {
    blocks.iter().filter_map(|b| match b {
        ContentBlock::Text { text } => Some(text.to_string()),
        _ => None,
    })
}

/// The reasons of every `turn/end` in `events`, in log order.
pub fn turn_ends(events: &[Event]) -> Vec<TurnEndReason> {
    of_bodies(events, |body| match body {
        EventBody::TurnEnd(end) => Some(end.reason.clone()),
        _ => None,
    })
}

/// The settlement notices that entered the inbox in `events` (`inbox/spliced` insertions of
/// `subagent-settled` messages), once per insertion, in log order.
pub fn settled_notices(events: &[Event]) -> Vec<Message> {
    let inserted = of_bodies(events, |body| match body {
        EventBody::InboxSpliced(s) => Some(s.inserted.clone()),
        _ => None,
    });
    inserted
        .into_iter()
        .flatten()
        .filter(|m| matches!(m.source, MessageSource::SubagentSettled { .. }))
        .collect()
}

/// The child a settlement notice speaks of. Panics on any other message.
pub fn notice_sender(notice: &Message) -> SessionId {
    match notice.source {
        MessageSource::SubagentSettled { sender, .. } => sender,
        _ => panic!("not a settlement notice: {:?}", notice.source),
    }
}

/// The texts of the user messages that entered the history (`user/message` events), in order.
pub fn user_texts(events: &[Event]) -> Vec<String> {
    of_bodies(events, |body| match body {
        EventBody::UserMessage(m) => Some(m.text()),
        _ => None,
    })
}

/// The texts of the assistant messages (`assistant/message` events), in order.
pub fn assistant_texts(events: &[Event]) -> Vec<String> {
    of_bodies(events, |body| match body {
        EventBody::AssistantMessage(m) => Some(m.message.text()),
        _ => None,
    })
}

/// One tool result: the call it answers, its text, whether it failed and its error code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The call id the result answers.
    pub call: String,
    /// The text blocks of the result, concatenated.
    pub text: String,
    /// The result block's `is_error`.
    pub is_error: bool,
    /// The error code of the `tool/result`, if it carries an error.
    pub code: Option<String>,
}

/// The tool results (`tool/result` events) of `events`, in order. Panics if a result's message is
/// not exactly one tool-result block, which the log's shape rules forbid.
pub fn tool_answers(events: &[Event]) -> Vec<Answer> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolResult(r) => match r.message.content.as_slice() {
                [
                    ContentBlock::ToolResult {
                        tool_call_id,
                        content,
                        is_error,
                    },
                ] => Some(Answer {
                    call: tool_call_id.to_string(),
                    text: texts(content).collect(),
                    is_error: *is_error,
                    code: r.error.as_ref().map(|e| e.code.to_string()),
                }),
                _ => panic!(
                    "the tool result at seq {} holds {} blocks, not one tool-result block",
                    e.seq,
                    r.message.content.len()
                ),
            },
            _ => None,
        })
        .collect()
}

/// The answer to `call` among `answers` (the first, if several); panics naming the call when
/// there is none.
pub fn answer_to(answers: &[Answer], call: &str) -> Answer {
    answers
        .iter()
        .find(|a| a.call == call)
        .unwrap_or_else(|| panic!("no answer to {call}"))
        .clone()
}

/// Asserts the log keeps the seed contract (every event valid where it stands) and has no open
/// turn; the failure names the first invalid event or lists the log's kinds.
pub fn assert_balanced(events: &[Event]) {
    if let Err(e) = check_seed(events) {
        panic!("the log is valid: {e}");
    }
    assert!(
        is_balanced(events),
        "the log ends with an open turn: {:?}",
        kinds(events)
    );
}

/// The text blocks of `message`, in order, each as one string (other blocks are skipped).
pub fn text_blocks(message: &Message) -> Vec<String> {
    texts(&message.content).collect()
}

/// The text blocks of `message` joined with newlines, so that text from different blocks never
/// runs together (unlike `Message::text`, which concatenates).
pub fn text_lines(message: &Message) -> String {
    text_blocks(message).join("\n")
}
