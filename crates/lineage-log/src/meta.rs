//! Session metadata: a title and `key=value` tags a host sets on a session, recorded in its log.
//!
//! Metadata is a `custom` event of type [`SESSION_META_EVENT`], marked ignorable, whose payload
//! is a JSON object with two optional members:
//!
//! ```json
//! {"title": "Fix the parser", "tags": {"user": "alice", "ticket": null}}
//! ```
//!
//! - `title`: a string sets the title, `null` clears it; absent, the title is unchanged.
//! - `tags`: an object; each member sets that tag (a string) or removes it (`null`); tags it
//!   does not name are unchanged.
//!
//! Members of other names are ignored (room for later additions). An event whose payload does not
//! have this shape changes nothing ([`SessionMeta::apply`] says why). The fold
//! ([`fold_session_meta`]) applies the events of the session's own suffix in order, so the last
//! word on each field wins; a fork does not inherit its parent's title or tags (they are in its
//! inherited prefix, which is context only).
//!
//! A host sets metadata with [`MetaUpdate`]: a live agent records its event with
//! `Agent::record(update.to_custom()?)` (lineage-agent), a stored session gets it appended after
//! its last event (what `lineage tag` does), and `Store::session_meta` or `lineage ls` read it back.

use std::collections::BTreeMap;

use crate::{Custom, Event, EventBody, own_suffix};

/// The `custom` event type that records session metadata (ignorable).
pub const SESSION_META_EVENT: &str = "lineage.session/meta";

/// The longest tag key, in bytes.
pub const MAX_TAG_KEY_BYTES: usize = 128;
/// The longest tag value or title, in bytes.
pub const MAX_META_VALUE_BYTES: usize = 4096;

/// A session's title and tags, folded from its own events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionMeta {
    /// The title, if one is set.
    pub title: Option<String>,
    /// The tags, by key.
    pub tags: BTreeMap<String, String>,
}

/// Why a metadata update was refused, or a metadata event's payload does not apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// A tag key is empty, too long, or holds `=`, whitespace or a control character.
    #[error("tag key {key:?} is not valid: {reason}")]
    InvalidTagKey {
        /// The key.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A title or tag value is longer than [`MAX_META_VALUE_BYTES`] or holds a control character.
    #[error("the {field} is not valid: {reason}")]
    InvalidValue {
        /// `title` or `tag <key>`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A stored metadata event's payload does not have the documented shape.
    #[error("the payload of {SESSION_META_EVENT} is malformed: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
}

impl SessionMeta {
    /// Applies one `custom` event: returns `Ok(true)` when it is a metadata event and was
    /// applied, `Ok(false)` when it is another type, and an error (changing nothing) when it is a
    /// metadata event whose payload does not have the documented shape.
    pub fn apply(&mut self, custom: &Custom) -> Result<bool, MetaError> {
        if custom.type_name.as_str() != SESSION_META_EVENT {
            return Ok(false);
        }
        let update = parse_update(custom.payload.as_str())?;
        if let Some(title) = update.title {
            self.title = title;
        }
        for (key, value) in update.tags {
            match value {
                Some(value) => self.tags.insert(key, value),
                None => self.tags.remove(&key),
            };
        }
        Ok(true)
    }

    /// Whether every `key=value` in `wanted` is one of the tags.
    pub fn matches<'a>(&self, wanted: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
        wanted
            .into_iter()
            .all(|(key, value)| self.tags.get(key).is_some_and(|v| v == value))
    }
}

/// The title and tags of a session: its own suffix's metadata events, applied in order (the last
/// word on each field wins). Malformed metadata events are skipped.
pub fn fold_session_meta(events: &[Event]) -> SessionMeta {
    let mut meta = SessionMeta::default();
    for event in own_suffix(events) {
        if let EventBody::Custom(custom) = &event.body {
            // A malformed event changes nothing: the fold is what the well-formed ones say.
            let _ = meta.apply(custom);
        }
    }
    meta
}

/// A change to a session's metadata, which [`MetaUpdate::to_custom`] turns into the event that
/// records it. Only what it names changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaUpdate {
    /// `Some(Some(title))` sets the title, `Some(None)` clears it, `None` leaves it.
    pub title: Option<Option<String>>,
    /// Each key's new value, or `None` to remove the tag.
    pub tags: BTreeMap<String, Option<String>>,
}

impl MetaUpdate {
    /// An update that changes nothing yet.
    pub fn new() -> MetaUpdate {
        MetaUpdate::default()
    }

    /// Sets the title.
    pub fn title(mut self, title: impl Into<String>) -> MetaUpdate {
        self.title = Some(Some(title.into()));
        self
    }

    /// Clears the title.
    pub fn clear_title(mut self) -> MetaUpdate {
        self.title = Some(None);
        self
    }

    /// Sets the tag `key` to `value`.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> MetaUpdate {
        self.tags.insert(key.into(), Some(value.into()));
        self
    }

    /// Removes the tag `key`.
    pub fn untag(mut self, key: impl Into<String>) -> MetaUpdate {
        self.tags.insert(key.into(), None);
        self
    }

    /// Whether the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self.title.is_none() && self.tags.is_empty()
    }

    /// Checks every key and value: a key is 1 to [`MAX_TAG_KEY_BYTES`] bytes without `=`,
    /// whitespace or control characters; a title or value is at most [`MAX_META_VALUE_BYTES`]
    /// bytes without control characters.
    pub fn validate(&self) -> Result<(), MetaError> {
        if let Some(Some(title)) = &self.title {
            check_value("title".to_owned(), title)?;
        }
        for (key, value) in &self.tags {
            check_tag_key(key)?;
            if let Some(value) = value {
                check_value(format!("tag {key}"), value)?;
            }
        }
        Ok(())
    }

    /// The ignorable `custom` event that records this update, after [`MetaUpdate::validate`].
    pub fn to_custom(&self) -> Result<Custom, MetaError> {
        self.validate()?;
        let mut payload = String::from("{");
        if let Some(title) = &self.title {
            payload.push_str("\"title\":");
            push_json_option(&mut payload, title.as_deref());
        }
        if !self.tags.is_empty() {
            if self.title.is_some() {
                payload.push(',');
            }
            payload.push_str("\"tags\":{");
            for (i, (key, value)) in self.tags.iter().enumerate() {
                if i > 0 {
                    payload.push(',');
                }
                push_json_string(&mut payload, key);
                payload.push(':');
                push_json_option(&mut payload, value.as_deref());
            }
            payload.push('}');
        }
        payload.push('}');
        Ok(Custom {
            type_name: SESSION_META_EVENT.into(),
            payload: payload.into(),
            ignorable: true,
        })
    }
}

/// Checks a tag key (see [`MetaUpdate::validate`]).
pub fn check_tag_key(key: &str) -> Result<(), MetaError> {
    let refuse = |reason| {
        Err(MetaError::InvalidTagKey {
            key: key.to_owned(),
            reason,
        })
    };
    if key.is_empty() {
        return refuse("it is empty");
    }
    if key.len() > MAX_TAG_KEY_BYTES {
        return refuse("it is longer than 128 bytes");
    }
    if key.contains('=') {
        return refuse("it holds '='");
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("it holds whitespace or a control character");
    }
    Ok(())
}

fn check_value(field: String, value: &str) -> Result<(), MetaError> {
    if value.len() > MAX_META_VALUE_BYTES {
        return Err(MetaError::InvalidValue {
            field,
            reason: format!(
                "it is {} bytes, more than {MAX_META_VALUE_BYTES}",
                value.len()
            ),
        });
    }
    if value.chars().any(char::is_control) {
        return Err(MetaError::InvalidValue {
            field,
            reason: "it holds a control character".to_owned(),
        });
    }
    Ok(())
}

fn push_json_option(out: &mut String, value: Option<&str>) {
    match value {
        Some(value) => push_json_string(out, value),
        None => out.push_str("null"),
    }
}

/// `value` as a JSON string: quotes, backslashes and control characters escaped.
fn push_json_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// What one metadata payload says.
struct Update {
    title: Option<Option<String>>,
    tags: Vec<(String, Option<String>)>,
}

/// Reads a metadata payload. Only the members it needs are built; other values are skipped.
fn parse_update(payload: &str) -> Result<Update, MetaError> {
    let mut p = Reader {
        bytes: payload.as_bytes(),
        at: 0,
    };
    let malformed = |reason: &str| MetaError::Malformed {
        reason: reason.to_owned(),
    };
    let mut update = Update {
        title: None,
        tags: Vec::new(),
    };
    p.ws();
    if !p.eat(b'{') {
        return Err(malformed("it is not a JSON object"));
    }
    p.members(|p, key| {
        match key.as_str() {
            "title" => update.title = Some(p.string_or_null("title")?),
            "tags" => {
                if p.null() {
                    return Ok(());
                }
                if !p.eat(b'{') {
                    return Err(malformed("`tags` is not an object"));
                }
                p.members(|p, key| {
                    let value = p.string_or_null("a tag's value")?;
                    update.tags.push((key, value));
                    Ok(())
                })?;
            }
            _ => p.skip_value()?,
        }
        Ok(())
    })?;
    p.ws();
    if p.at != p.bytes.len() {
        return Err(malformed("there is more after the object"));
    }
    Ok(update)
}

/// A small JSON reader over a payload: strings are decoded, everything else is only skipped.
/// It never recurses (skipping counts brackets), so no payload can exhaust the stack.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn malformed(&self, what: &str) -> MetaError {
        MetaError::Malformed {
            reason: format!("{what} at byte {}", self.at),
        }
    }

    fn ws(&mut self) {
        while matches!(self.bytes.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.ws();
        if self.bytes.get(self.at) == Some(&byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn null(&mut self) -> bool {
        self.ws();
        if self.bytes[self.at.min(self.bytes.len())..].starts_with(b"null") {
            self.at += 4;
            true
        } else {
            false
        }
    }

    /// The members of an object whose `{` was just read, each handed to `member` with its key
    /// (which must read the value), through the closing `}`.
    fn members(
        &mut self,
        mut member: impl FnMut(&mut Self, String) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        if self.eat(b'}') {
            return Ok(());
        }
        loop {
            self.ws();
            let key = self.string()?;
            if !self.eat(b':') {
                return Err(self.malformed("a ':' was expected"));
            }
            member(self, key)?;
            if self.eat(b',') {
                continue;
            }
            if self.eat(b'}') {
                return Ok(());
            }
            return Err(self.malformed("a ',' or '}' was expected"));
        }
    }

    fn string_or_null(&mut self, what: &str) -> Result<Option<String>, MetaError> {
        if self.null() {
            return Ok(None);
        }
        self.ws();
        if self.bytes.get(self.at) != Some(&b'"') {
            return Err(MetaError::Malformed {
                reason: format!("{what} is neither a string nor null"),
            });
        }
        self.string().map(Some)
    }

    /// A JSON string at the current position, decoded.
    fn string(&mut self) -> Result<String, MetaError> {
        if self.bytes.get(self.at) != Some(&b'"') {
            return Err(self.malformed("a string was expected"));
        }
        self.at += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err(self.malformed("the string is not closed"));
            };
            self.at += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.bytes.get(self.at) else {
                        return Err(self.malformed("the string is not closed"));
                    };
                    self.at += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(self.malformed("an unknown escape")),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                b => out.push(b),
            }
        }
        String::from_utf8(out).map_err(|_| self.malformed("the string is not UTF-8"))
    }

    /// The character of a `\u` escape whose `u` was just read (a surrogate pair as one).
    fn unicode_escape(&mut self) -> Result<char, MetaError> {
        let high = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&high) {
            if !(self.bytes.get(self.at) == Some(&b'\\')
                && self.bytes.get(self.at + 1) == Some(&b'u'))
            {
                return Err(self.malformed("a lone surrogate"));
            }
            self.at += 2;
            let low = self.hex4()?;
            if !(0xDC00..0xE000).contains(&low) {
                return Err(self.malformed("a lone surrogate"));
            }
            0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
        } else {
            high
        };
        char::from_u32(code).ok_or_else(|| self.malformed("a lone surrogate"))
    }

    fn hex4(&mut self) -> Result<u32, MetaError> {
        let digits = self
            .bytes
            .get(self.at..self.at + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.malformed("a \\u escape needs four hex digits"))?;
        self.at += 4;
        Ok(digits)
    }

    /// Skips one value of any kind, nested containers included, counting brackets.
    fn skip_value(&mut self) -> Result<(), MetaError> {
        let mut depth = 0usize;
        loop {
            self.ws();
            match self.bytes.get(self.at) {
                Some(b'"') => {
                    self.string()?;
                }
                Some(b'{' | b'[') => {
                    depth += 1;
                    self.at += 1;
                    continue;
                }
                Some(b'}' | b']') if depth > 0 => {
                    depth -= 1;
                    self.at += 1;
                }
                Some(b',' | b':') if depth > 0 => {
                    self.at += 1;
                    continue;
                }
                Some(b) if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.') => {
                    while self.bytes.get(self.at).is_some_and(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.')
                    }) {
                        self.at += 1;
                    }
                }
                _ => return Err(self.malformed("a value was expected")),
            }
            if depth == 0 {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Digest, SessionId, SessionLineage, check_strict_json};

    fn custom_event(seq: u64, custom: Custom) -> Event {
        Event::new(seq, 0, EventBody::Custom(Box::new(custom)))
    }

    fn meta_event(seq: u64, payload: &str) -> Event {
        custom_event(
            seq,
            Custom {
                type_name: SESSION_META_EVENT.into(),
                payload: payload.into(),
                ignorable: true,
            },
        )
    }

    #[test]
    fn an_update_round_trips_through_its_event_as_strict_json() {
        let update = MetaUpdate::new()
            .title("Fix \"the\" parser\\ \u{e9}\u{1F600}")
            .tag("user", "alice")
            .tag("ticket", "T-1")
            .untag("old");
        let custom = update.to_custom().unwrap();
        assert_eq!(custom.type_name.as_str(), SESSION_META_EVENT);
        assert!(custom.ignorable);
        check_strict_json(custom.payload.as_str()).unwrap();
        let mut meta = SessionMeta::default();
        meta.tags.insert("old".into(), "x".into());
        assert!(meta.apply(&custom).unwrap());
        assert_eq!(
            meta.title.as_deref(),
            Some("Fix \"the\" parser\\ \u{e9}\u{1F600}")
        );
        assert_eq!(meta.tags.len(), 2);
        assert_eq!(meta.tags["user"], "alice");
        assert!(!meta.tags.contains_key("old"));
        // An empty update is the empty object, which changes nothing.
        let empty = MetaUpdate::new().to_custom().unwrap();
        assert_eq!(empty.payload.as_str(), "{}");
    }

    #[test]
    fn the_fold_is_last_wins_per_field_over_the_own_suffix_only() {
        let parent = SessionId::new();
        let events = vec![
            // Inherited: the parent's title and tag are context only.
            meta_event(0, r#"{"title":"parent","tags":{"user":"bob"}}"#),
            Event::new(
                1,
                0,
                SessionLineage {
                    parent,
                    seed_len: 1,
                    seed_digest: Digest::of_empty(),
                    delegation_depth: 0,
                },
            ),
            meta_event(
                2,
                r#"{"title":"first","tags":{"user":"alice","team":"core"}}"#,
            ),
            // Another custom type is not metadata.
            custom_event(
                3,
                Custom {
                    type_name: "todo/write".into(),
                    payload: r#"{"title":"not mine"}"#.into(),
                    ignorable: true,
                },
            ),
            // A malformed event changes nothing, not even its well-formed part.
            meta_event(4, r#"{"title":"bad","tags":[1]}"#),
            meta_event(
                5,
                r#"{"tags":{"team":null,"env":"prod"},"extra":[{"a":[1,2]},true]}"#,
            ),
            meta_event(6, r#"{"title":"second"}"#),
        ];
        let meta = fold_session_meta(&events);
        assert_eq!(meta.title.as_deref(), Some("second"));
        let tags: Vec<_> = meta
            .tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(tags, [("env", "prod"), ("user", "alice")]);
        assert!(meta.matches([("user", "alice"), ("env", "prod")]));
        assert!(!meta.matches([("user", "alice"), ("env", "dev")]));
        assert!(!meta.matches([("missing", "x")]));
        assert!(meta.matches([]));

        // Without a lineage every event is the session's own.
        let meta = fold_session_meta(&events[..1]);
        assert_eq!(meta.title.as_deref(), Some("parent"));
        // A null title clears it.
        let cleared = fold_session_meta(&[
            meta_event(0, r#"{"title":"x"}"#),
            meta_event(1, r#"{"title":null}"#),
        ]);
        assert_eq!(cleared, SessionMeta::default());
    }

    #[test]
    fn malformed_payloads_are_refused_without_panicking() {
        let cases = [
            "",
            "[]",
            "\"title\"",
            "{",
            r#"{"title":1}"#,
            r#"{"title":"x""#,
            r#"{"tags":"user=alice"}"#,
            r#"{"tags":{"user":1}}"#,
            r#"{"title":"\ud800"}"#,
            r#"{"title":"\u12"}"#,
            r#"{"title":"x"} {}"#,
            r#"{"other":[[[[}"#,
            "{\"title\":\"\\",
        ];
        for payload in cases {
            let mut meta = SessionMeta::default();
            let custom = Custom {
                type_name: SESSION_META_EVENT.into(),
                payload: payload.into(),
                ignorable: true,
            };
            assert!(
                matches!(meta.apply(&custom), Err(MetaError::Malformed { .. })),
                "{payload:?}"
            );
            assert_eq!(meta, SessionMeta::default(), "{payload:?}");
        }
        // Deep nesting in an ignored member is skipped without recursion.
        let deep = format!(
            r#"{{"x":{}{},"title":"ok"}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let mut meta = SessionMeta::default();
        let custom = Custom {
            type_name: SESSION_META_EVENT.into(),
            payload: deep.into(),
            ignorable: true,
        };
        assert!(meta.apply(&custom).unwrap());
        assert_eq!(meta.title.as_deref(), Some("ok"));
    }

    #[test]
    fn bad_keys_and_values_are_refused_naming_them() {
        for key in ["", "a=b", "a b", "a\tb", &"k".repeat(129)] {
            let err = MetaUpdate::new().tag(key, "v").to_custom().unwrap_err();
            assert!(
                matches!(&err, MetaError::InvalidTagKey { key: k, .. } if k == key),
                "{err}"
            );
        }
        let err = MetaUpdate::new()
            .tag("user", "a\nb")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("tag user"), "{err}");
        let err = MetaUpdate::new()
            .title("x".repeat(MAX_META_VALUE_BYTES + 1))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("title"), "{err}");
        assert!(MetaUpdate::new().tag("user.id", "a=b c").validate().is_ok());
    }
}
