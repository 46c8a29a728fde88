//! What the two agent hosts of this command (`lineage demo` and `lineage chat`) share: the
//! library's [`Host`] opened over a store file, and the words for a child's messages.

use std::path::Path;
use std::sync::Arc;

use lineage_agent::Model;
use lineage_log::{ContentBlock, Message, MessageSource};
use lineage_store::Store;
pub use lineage_subagent::Host;

/// Opens (or creates) the store at `path` with `model` answering every agent. With
/// `with_providers`, `spawn` and `fork` are registered, so agents can start children;
/// without, stored continuable children can still be resumed from their logs alone.
pub fn open_host(path: &Path, model: Arc<dyn Model>, with_providers: bool) -> Result<Host, String> {
    let store = Store::open(path).map_err(|e| format!("opening the store: {e}"))?;
    if with_providers {
        Host::new(store, model).map_err(|e| e.to_string())
    } else {
        Ok(Host::without_providers(store, model))
    }
}

/// What a child's message arriving in its parent's inbox says, for people: `report in: …` for
/// a report, `notice in: …` for a settlement notice; `None` for any other message.
pub fn child_message_line(message: &Message) -> Option<String> {
    match &message.source {
        MessageSource::SubagentReport { .. } => {
            let text: Vec<String> = message
                .content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::Text { text } => Some(text.to_string()),
                    _ => None,
                })
                .collect();
            Some(format!("report in: {}", one_line(&text.join(" "))))
        }
        MessageSource::SubagentSettled { summary, .. } => Some(format!("notice in: {summary}")),
        _ => None,
    }
}

/// The text of a tool result message (the texts inside its result blocks).
pub fn result_text(message: &Message) -> String {
    message
        .content
        .iter()
        .flat_map(|b| match b {
            ContentBlock::ToolResult { content, .. } => content.clone(),
            other => vec![other.clone()],
        })
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.to_string()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` on one line, cut to a readable length.
pub fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 110 {
        let mut cut: String = flat.chars().take(109).collect();
        cut.push('…');
        cut
    } else {
        flat
    }
}
