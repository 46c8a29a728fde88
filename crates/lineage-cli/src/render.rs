//! Human formatting: aligned tables, short quoted texts, turn-end reasons, and events one per line.
//!
//! Nothing here writes colour or other terminal escapes, so the output reads the same in a
//! terminal, a pipe or a file.

use std::io::{self, Write};

use lineage_log::{
    AbortCause, BlockType, ContentBlock, DescriptorMode, Event, EventBody, InboxTarget, Message,
    MessageSource, PolicySource, StreamChunk, SubagentDescriptor, ToolFilter, TurnEndReason,
};

use crate::time;

/// How many characters of a text a line shows before it is cut with `…` (unless `--full`).
pub const TEXT_LIMIT: usize = 80;

/// Rows of cells printed as aligned columns.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
    /// Whether the column titles are printed.
    titled: bool,
}

impl Table {
    /// A table with these column titles; columns named in `right` are right-aligned (numbers).
    pub fn new(header: &[&'static str], right: &[&'static str]) -> Self {
        Table {
            header: header.to_vec(),
            right: header.iter().map(|h| right.contains(h)).collect(),
            rows: Vec::new(),
            titled: true,
        }
    }

    /// The same table without its title line: for key-value listings.
    pub fn untitled(mut self) -> Self {
        self.titled = false;
        self
    }

    /// Adds a row (as many cells as there are columns).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Writes the header and the rows, columns separated by two spaces, no trailing blanks.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self
            .header
            .iter()
            .map(|h| if self.titled { h.chars().count() } else { 0 })
            .collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let header: Vec<String> = self.header.iter().map(|h| (*h).to_owned()).collect();
        let titles = self.titled.then_some(&header);
        for row in titles.into_iter().chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate().take(columns) {
                let pad = widths[i].saturating_sub(cell.chars().count());
                let last = i + 1 == columns;
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if !last {
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// `text` on one line, in double quotes: newlines and other control characters escaped, cut at
/// [`TEXT_LIMIT`] characters with `…` unless `full`.
pub fn quote(text: &str, full: bool) -> String {
    let mut out = String::from("\"");
    for (shown, c) in text.chars().enumerate() {
        if !full && shown >= TEXT_LIMIT {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A stop reason as a short word: `completed`, `aborted(user|parent|hook|disposed)`, `blocked`,
/// `error`, `max-tokens`, `interrupted` or `budget`.
pub fn stop_label(reason: &TurnEndReason) -> String {
    match reason {
        TurnEndReason::Completed => "completed".into(),
        TurnEndReason::Aborted { cause } => format!(
            "aborted({})",
            match cause {
                AbortCause::User => "user",
                AbortCause::Parent => "parent",
                AbortCause::Hook { .. } => "hook",
                AbortCause::Disposed => "disposed",
                // A cause added after this build: shown as the log's own value.
                other => return format!("aborted({other:?})"),
            }
        ),
        TurnEndReason::Blocked => "blocked".into(),
        TurnEndReason::Error(_) => "error".into(),
        TurnEndReason::MaxTokens => "max-tokens".into(),
        TurnEndReason::Interrupted => "interrupted".into(),
        TurnEndReason::Budget(_) => "budget".into(),
        // A reason added after this build: shown as the log's own value.
        other => format!("{other:?}"),
    }
}

/// A stop reason with its details: the hook's reason, the error's code, message and provider
/// facts.
pub fn stop_detail(reason: &TurnEndReason, full: bool) -> String {
    match reason {
        TurnEndReason::Aborted {
            cause: AbortCause::Hook { reason },
        } => format!("aborted(hook) {}", quote(reason, full)),
        TurnEndReason::Error(e) => {
            let mut s = format!("error {} {}", e.code, quote(&e.message, full));
            if let Some(status) = e.status {
                s.push_str(&format!(", status {status}"));
            }
            if let Some(ms) = e.retry_after_ms {
                s.push_str(&format!(", retry after {ms} ms"));
            }
            if let Some(id) = &e.request_id {
                s.push_str(&format!(", request {id}"));
            }
            s
        }
        TurnEndReason::Budget(reached) => format!("budget {reached}"),
        other => stop_label(other),
    }
}

/// Who a message is from, for people.
pub fn source_label(source: &MessageSource, full: bool) -> String {
    match source {
        MessageSource::User => "user".into(),
        MessageSource::Model { endpoint, model } => format!("model {endpoint}/{model}"),
        MessageSource::Tool { call_id } => format!("tool {call_id}"),
        MessageSource::Coordinator { sender } => format!("from coordinator {sender}"),
        MessageSource::SubagentReport { sender } => format!("report from {sender}"),
        MessageSource::SubagentSettled { sender, summary } => {
            format!("{sender} settled: {}", quote(summary, full))
        }
        MessageSource::Plugin { name } => format!("plugin {name}"),
    }
}

/// `one-shot` or `continuable`.
pub fn mode_label(mode: DescriptorMode) -> &'static str {
    match mode {
        DescriptorMode::OneShot => "one-shot",
        DescriptorMode::Continuable => "continuable",
    }
}

/// `own` or `delegation`.
pub fn policy_source_label(source: PolicySource) -> &'static str {
    match source {
        PolicySource::Own => "own",
        PolicySource::Delegation => "delegation",
    }
}

/// `next-turn` or `next-step`.
fn target_label(target: InboxTarget) -> &'static str {
    match target {
        InboxTarget::NextTurn => "next-turn",
        InboxTarget::NextStep => "next-step",
    }
}

/// A tool filter as `allow [a, b] deny [c]`.
pub fn filter_label(filter: &ToolFilter) -> String {
    let list = |names: &[lineage_log::Text]| {
        names
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if let Some(allow) = &filter.allow {
        parts.push(format!("allow [{}]", list(allow)));
    }
    if let Some(deny) = &filter.deny {
        parts.push(format!("deny [{}]", list(deny)));
    }
    if parts.is_empty() {
        "no filter".into()
    } else {
        parts.join(" ")
    }
}

/// A descriptor on one line: mode, provider, label, model, persona, tools, version.
pub fn descriptor_label(d: &SubagentDescriptor, full: bool) -> String {
    let mut s = format!("{} via {}", mode_label(d.mode), d.provider);
    if let Some(label) = &d.label {
        s.push_str(&format!(", label {}", quote(label, full)));
    }
    match (&d.endpoint, &d.model) {
        (Some(p), Some(m)) => s.push_str(&format!(", model {p}/{m}")),
        (Some(p), None) => s.push_str(&format!(", endpoint {p}")),
        (None, Some(m)) => s.push_str(&format!(", model {m}")),
        (None, None) => {}
    }
    if let Some(persona) = &d.persona {
        s.push_str(&format!(", persona {}", quote(persona, full)));
    }
    if let Some(filter) = &d.tool_filter {
        s.push_str(&format!(", tools {}", filter_label(filter)));
    }
    s.push_str(&format!(" (v{})", d.version));
    s
}

/// A message's content on one line: its text quoted, then notes for reasoning and images; empty
/// when it has neither. Tool calls are rendered as lines of their own.
fn content_summary(content: &[ContentBlock], full: bool) -> String {
    let mut text = String::new();
    let mut notes = Vec::new();
    for block in content {
        match block {
            ContentBlock::Text { text: t } => text.push_str(t),
            ContentBlock::Reasoning { text: t } => {
                notes.push(format!("reasoning {} chars", t.chars().count()))
            }
            ContentBlock::Image {
                media_type,
                attachment,
            } => notes.push(format!("image {media_type} {attachment}")),
            ContentBlock::ToolResult { content, .. } => {
                text.push_str(&plain_text(content));
            }
            ContentBlock::ToolCall { .. } => {}
        }
    }
    let mut s = if text.is_empty() {
        String::new()
    } else {
        quote(&text, full)
    };
    if !notes.is_empty() {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&format!("[{}]", notes.join(", ")));
    }
    s
}

/// The text of blocks, tool results included (reasoning excluded).
fn plain_text(content: &[ContentBlock]) -> String {
    let mut out = String::new();
    for block in content {
        match block {
            ContentBlock::Text { text } => out.push_str(text),
            ContentBlock::ToolResult { content, .. } => out.push_str(&plain_text(content)),
            _ => {}
        }
    }
    out
}

/// A message's one-line form: `[source] "text"`.
pub fn message_line(message: &Message, full: bool) -> String {
    let content = content_summary(&message.content, full);
    let content = if content.is_empty() {
        "(no text)".to_owned()
    } else {
        content
    };
    format!("[{}] {content}", source_label(&message.source, full))
}

/// The detail of one event (everything but its seq, time and kind), and any continuation lines.
pub fn event_detail(event: &Event, full: bool) -> (String, Vec<String>) {
    let mut more = Vec::new();
    let detail = match &event.body {
        EventBody::TurnStart(t) => format!("turn {}", t.turn),
        EventBody::TurnEnd(t) => format!("turn {}: {}", t.turn, stop_detail(&t.reason, full)),
        EventBody::StepStart(s) => format!("turn {} step {}", s.turn, s.step),
        EventBody::StepEnd(s) => format!("turn {} step {}", s.turn, s.step),
        EventBody::UserMessage(m) => message_line(m, full),
        EventBody::AssistantChunk(c) => chunk_line(&c.chunk, full),
        EventBody::AssistantMessage(m) => {
            let mut s = format!("turn {} step {}", m.turn, m.step);
            let content = content_summary(&m.message.content, full);
            if !content.is_empty() {
                s.push_str(&format!(": {content}"));
            }
            if let Some(u) = &m.usage {
                s.push_str(&format!(
                    " (tokens in {} out {})",
                    u.input_tokens, u.output_tokens
                ));
            }
            if m.interrupted {
                s.push_str(" [interrupted]");
            }
            for (id, name, arguments) in m.message.tool_calls() {
                more.push(format!("asks {name} {id} {}", args_text(arguments, full)));
            }
            s
        }
        EventBody::ToolCall(c) => {
            format!("{} {} {}", c.name, c.call_id, args_text(&c.arguments, full))
        }
        EventBody::ToolResult(r) => {
            let (call, is_error) = r
                .message
                .content
                .iter()
                .find_map(|b| match b {
                    ContentBlock::ToolResult {
                        tool_call_id,
                        is_error,
                        ..
                    } => Some((tool_call_id.as_str(), *is_error)),
                    _ => None,
                })
                .unwrap_or(("?", false));
            let status = match (&r.error, is_error) {
                (Some(e), _) => format!("error {} ({})", e.code, e.name),
                (None, true) => "error".to_owned(),
                (None, false) => "ok".to_owned(),
            };
            let content = content_summary(&r.message.content, full);
            if content.is_empty() {
                format!("{call} {status}")
            } else {
                format!("{call} {status}: {content}")
            }
        }
        EventBody::InboxSpliced(s) => {
            let mut d = format!(
                "{} at {}: removed {}, inserted {}",
                target_label(s.target),
                s.start,
                s.removed,
                s.inserted.len()
            );
            if s.removed > 0 {
                d.push_str(if s.canceled {
                    " (canceled)"
                } else {
                    " (claimed)"
                });
            } else if s.canceled {
                d.push_str(" (canceled)");
            }
            for m in &s.inserted {
                more.push(format!("+ {}", message_line(m, full)));
            }
            d
        }
        EventBody::SessionLineage(l) => format!(
            "parent {}, seed_len {}, depth {}, seed digest {}",
            l.parent,
            l.seed_len,
            l.delegation_depth,
            short_digest(&l.seed_digest.to_string(), full)
        ),
        EventBody::SubagentDescriptor(d) => descriptor_label(d, full),
        EventBody::ApprovalPolicy(p) => {
            format!("{} ({})", p.policy, policy_source_label(p.source))
        }
        EventBody::SandboxMode(m) => format!("{} ({})", m.mode, policy_source_label(m.source)),
        EventBody::Custom(c) => format!(
            "{} {}{}",
            c.type_name,
            quote(&c.payload, full),
            if c.ignorable { " [ignorable]" } else { "" }
        ),
        EventBody::Opaque(o) => format!(
            "tag {}, {} payload bytes (a kind this build does not know, kept as written)",
            o.tag,
            o.payload.len()
        ),
        // A body added to the log after this renderer was written: shown as the log's own value.
        other => format!("{other:?}"),
    };
    (detail, more)
}

/// A digest's first 16 hex digits and `…`, or all of it when `full`.
fn short_digest(hex: &str, full: bool) -> String {
    if full || hex.len() <= 16 {
        hex.to_owned()
    } else {
        format!("{}…", &hex[..16])
    }
}

/// Raw JSON arguments on one line, unquoted, cut like texts.
fn args_text(arguments: &str, full: bool) -> String {
    let quoted = quote(arguments, full);
    // The arguments are JSON already: drop the outer quotes that `quote` adds.
    quoted[1..quoted.len() - 1].to_owned()
}

/// One stream chunk.
fn chunk_line(chunk: &StreamChunk, full: bool) -> String {
    match chunk {
        StreamChunk::BlockStart { index, block_type } => {
            let what = match block_type {
                BlockType::Text => "text",
                BlockType::Reasoning => "reasoning",
                BlockType::ToolCall => "tool call",
            };
            format!("block {index} starts ({what})")
        }
        StreamChunk::TextDelta { index, text } => {
            format!("block {index} text +{}", quote(text, full))
        }
        StreamChunk::ReasoningDelta { index, text } => {
            format!("block {index} reasoning +{}", quote(text, full))
        }
        StreamChunk::ToolCallDelta(d) => format!(
            "block {} call {}{} +{}",
            d.index,
            d.id,
            d.name.as_ref().map(|n| format!(" {n}")).unwrap_or_default(),
            quote(&d.arguments_delta, full)
        ),
        StreamChunk::BlockEnd { index, .. } => format!("block {index} ends"),
        StreamChunk::Usage(u) => format!("usage in {} out {}", u.input_tokens, u.output_tokens),
        StreamChunk::Finish { reason } => format!("finish {}", finish_label(reason)),
    }
}

/// A stream's finish reason.
fn finish_label(reason: &lineage_log::FinishReason) -> String {
    use lineage_log::FinishReason;
    match reason {
        FinishReason::Stop => "stop".into(),
        FinishReason::ToolCalls => "tool-calls".into(),
        FinishReason::MaxTokens => "max-tokens".into(),
        FinishReason::Error(f) => format!("error {} {}", f.code, quote(&f.message, false)),
        FinishReason::Aborted(f) => format!("aborted {} {}", f.code, quote(&f.message, false)),
        other => format!("{other:?}"),
    }
}

/// A run of consecutive stream chunks summed up on one line.
fn chunk_run_line(run: &[Event], full: bool) -> String {
    let mut text = String::new();
    let mut reasoning = 0usize;
    let mut calls = 0usize;
    let mut tail = Vec::new();
    for event in run {
        let EventBody::AssistantChunk(c) = &event.body else {
            continue;
        };
        match &c.chunk {
            StreamChunk::TextDelta { text: t, .. } => text.push_str(t),
            StreamChunk::ReasoningDelta { text: t, .. } => reasoning += t.chars().count(),
            StreamChunk::ToolCallDelta(_) => calls += 1,
            StreamChunk::Usage(u) => tail.push(format!(
                "usage in {} out {}",
                u.input_tokens, u.output_tokens
            )),
            StreamChunk::Finish { reason } => tail.push(format!("finish {}", finish_label(reason))),
            StreamChunk::BlockStart { .. } | StreamChunk::BlockEnd { .. } => {}
        }
    }
    let (first, last) = match (run.first(), run.last()) {
        (Some(f), Some(l)) => (f.seq, l.seq),
        _ => (0, 0),
    };
    let mut parts = Vec::new();
    if !text.is_empty() {
        parts.push(format!("text {}", quote(&text, full)));
    }
    if reasoning > 0 {
        parts.push(format!("reasoning {reasoning} chars"));
    }
    if calls > 0 {
        let what = if calls == 1 { "delta" } else { "deltas" };
        parts.push(format!("{calls} tool-call {what}"));
    }
    parts.extend(tail);
    let count = run.len();
    let what = if count == 1 { "chunk" } else { "chunks" };
    if parts.is_empty() {
        format!("{count} {what} (seq {first}..={last})")
    } else {
        format!(
            "{count} {what} (seq {first}..={last}): {}",
            parts.join(", ")
        )
    }
}

/// Options of the event printer.
#[derive(Clone, Copy, Debug, Default)]
pub struct EventStyle {
    /// Print every stream chunk on its own line instead of one line per run of chunks.
    pub chunks: bool,
    /// Print texts whole instead of cutting them at [`TEXT_LIMIT`] characters.
    pub full: bool,
}

/// Width of the seq column.
const SEQ_WIDTH: usize = 6;
/// Width of the (indented) kind column: two levels of indentation and the longest display name.
const KIND_WIDTH: usize = 4 + 19;
/// Width of the time column (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
const TIME_WIDTH: usize = 24;

/// Prints events one per line (`seq  time  kind  detail`), indented by turn and step, with a rule
/// where the inherited prefix ends and the session's own suffix starts. It keeps its place between
/// calls, so a follower can feed it new events as they arrive.
#[derive(Debug)]
pub struct EventPrinter {
    seed_len: u64,
    parent: Option<String>,
    style: EventStyle,
    /// 0 outside turns, 1 inside a turn, 2 inside a step; `None` until the first event.
    depth: Option<usize>,
    /// Whether the last printed event was in the own suffix; `None` until the first event.
    in_own: Option<bool>,
    /// The run of chunks [`EventPrinter::feed`] holds until it ends.
    run: Vec<Event>,
}

impl EventPrinter {
    /// A printer for a session whose own suffix starts at `seed_len`, inherited from `parent`.
    pub fn new(seed_len: u64, parent: Option<String>, style: EventStyle) -> Self {
        EventPrinter {
            seed_len,
            parent,
            style,
            depth: None,
            in_own: None,
            run: Vec::new(),
        }
    }

    /// Follows `events` (those before what will be printed) without printing them, so the
    /// indentation of the next event is right. The first printed event still gets the rule that
    /// says which side of the seed boundary it is on.
    pub fn skip(&mut self, events: &[Event]) {
        for event in events {
            self.advance(event);
        }
    }

    /// The depth at which `event` is printed, and the depth after it.
    fn advance(&mut self, event: &Event) -> usize {
        let depth = self.depth.unwrap_or(match event.body {
            EventBody::StepEnd(_)
            | EventBody::AssistantChunk(_)
            | EventBody::AssistantMessage(_)
            | EventBody::ToolCall(_)
            | EventBody::ToolResult(_) => 2,
            EventBody::StepStart(_) | EventBody::TurnEnd(_) => 1,
            _ => 0,
        });
        let (at, after) = match event.body {
            EventBody::TurnStart(_) => (0, 1),
            EventBody::StepStart(_) => (1, 2),
            EventBody::StepEnd(_) => (1, 1),
            EventBody::TurnEnd(_) => (0, 0),
            _ => (depth, depth),
        };
        self.depth = Some(after);
        at
    }

    /// Prints the rule lines due before `seq`.
    fn rules(&mut self, out: &mut dyn Write, seq: u64) -> io::Result<()> {
        if self.seed_len == 0 {
            return Ok(());
        }
        let own = seq >= self.seed_len;
        match (self.in_own, own) {
            (None, false) => {
                let parent = self.parent.as_deref().unwrap_or("the parent");
                writeln!(
                    out,
                    "── inherited from {parent} (seq 0..{}) ──",
                    self.seed_len - 1
                )?;
            }
            (None, true) | (Some(false), true) => {
                writeln!(out, "── own suffix (seq {}..) ──", self.seed_len)?;
            }
            _ => {}
        }
        self.in_own = Some(own);
        Ok(())
    }

    /// Prints `events`, which follow whatever was printed or skipped before.
    pub fn print(&mut self, out: &mut dyn Write, events: &[Event]) -> io::Result<()> {
        let mut i = 0;
        while i < events.len() {
            let event = &events[i];
            let is_chunk = matches!(event.body, EventBody::AssistantChunk(_));
            if is_chunk && !self.style.chunks {
                // The run stops at the seed boundary so the rule stays between its two sides.
                let own = event.seq >= self.seed_len;
                let end = events[i..]
                    .iter()
                    .position(|e| {
                        !matches!(e.body, EventBody::AssistantChunk(_))
                            || (e.seq >= self.seed_len) != own
                    })
                    .map_or(events.len(), |n| i + n);
                let run = &events[i..end];
                self.rules(out, event.seq)?;
                let mut depth = 0;
                for e in run {
                    depth = self.advance(e);
                }
                self.line(
                    out,
                    event,
                    depth,
                    &chunk_run_line(run, self.style.full),
                    &[],
                )?;
                i = end;
                continue;
            }
            self.rules(out, event.seq)?;
            let depth = self.advance(event);
            let (detail, more) = event_detail(event, self.style.full);
            self.line(out, event, depth, &detail, &more)?;
            i += 1;
        }
        Ok(())
    }

    /// Prints the next event of a stream, as [`EventPrinter::print`] would print it among its
    /// neighbours: a run of chunks is held (in memory, one run at most) until the event that ends
    /// it, so it still gets one line. Call [`EventPrinter::finish`] after the last event.
    pub fn feed(&mut self, out: &mut dyn Write, event: Event) -> io::Result<()> {
        let is_chunk = matches!(event.body, EventBody::AssistantChunk(_));
        if !is_chunk || self.style.chunks {
            self.finish(out)?;
            return self.print(out, std::slice::from_ref(&event));
        }
        let own = event.seq >= self.seed_len;
        if self
            .run
            .last()
            .is_some_and(|last| (last.seq >= self.seed_len) != own)
        {
            self.finish(out)?;
        }
        self.run.push(event);
        Ok(())
    }

    /// Prints the run of chunks [`EventPrinter::feed`] holds, if any.
    pub fn finish(&mut self, out: &mut dyn Write) -> io::Result<()> {
        if self.run.is_empty() {
            return Ok(());
        }
        let run = std::mem::take(&mut self.run);
        let printed = self.print(out, &run);
        self.run = run;
        self.run.clear();
        printed
    }

    /// Writes one event line and its continuation lines.
    fn line(
        &self,
        out: &mut dyn Write,
        event: &Event,
        depth: usize,
        detail: &str,
        more: &[String],
    ) -> io::Result<()> {
        let kind = format!("{}{}", "  ".repeat(depth), event.kind().name());
        writeln!(
            out,
            "{:>SEQ_WIDTH$}  {:<TIME_WIDTH$}  {:<KIND_WIDTH$}  {}",
            event.seq,
            time::iso_millis(event.time_ms),
            kind,
            detail
        )?;
        let pad = SEQ_WIDTH + 2 + TIME_WIDTH + 2 + KIND_WIDTH + 2;
        for line in more {
            writeln!(out, "{:pad$}{line}", "")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_escapes_and_cuts() {
        assert_eq!(quote("a\nb", false), "\"a\\nb\"");
        let long = "x".repeat(TEXT_LIMIT + 5);
        let q = quote(&long, false);
        assert!(q.ends_with("…\""));
        assert_eq!(q.chars().count(), TEXT_LIMIT + 3);
        assert_eq!(quote(&long, true).chars().count(), TEXT_LIMIT + 7);
        // Multi-byte characters are cut on a character boundary.
        assert!(quote(&"é".repeat(200), false).ends_with("é…\""));
    }

    #[test]
    fn table_aligns_and_right_aligns_numbers() {
        let mut t = Table::new(&["NAME", "N"], &["N"]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["long".into(), "100".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAME    N\na       1\nlong  100\n"
        );
    }
}
