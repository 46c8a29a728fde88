//! `lineage tag`: set a session's title and tags (`key=value`), recorded in its log as a
//! `lineage.session/meta` event; without changes, show them.
//!
//! The event is appended after the session's last stored event. It is ignorable and allowed
//! anywhere in a log, so a session whose log ends inside a turn is tagged without being repaired.

use std::io::Write;

use lineage_log::{Event, MetaUpdate, SessionMeta};
use serde_json::{Value, json};

use super::lifecycle::now_ms;
use super::write_json;
use crate::cli::TagArgs;
use crate::error::{CliError, EXIT_OK};
use crate::open::{Opened, open, open_writable};

/// Applies the changes `args` asks for (none: only shows the metadata).
pub fn run(args: &TagArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let update = update_of(args)?;
    let (opened, seq) = if update.is_empty() {
        (open(&args.store)?, None)
    } else {
        let opened = open_writable(&args.store)?;
        let seq = append(&opened, &args.session, &update)?;
        (opened, Some(seq))
    };
    let info = opened.resolve(&args.session)?;
    let id = info.header.id;
    let meta = opened.store.session_meta(id).map_err(|e| opened.fail(e))?;
    if args.output.json {
        write_json(
            out,
            &json!({
                "id": id.to_string(),
                "seq": seq,
                "title": meta.title,
                "tags": tags_json(&meta),
            }),
        )?;
    } else {
        writeln!(out, "session {id}")?;
        writeln!(out, "title: {}", meta.title.as_deref().unwrap_or("-"))?;
        writeln!(out, "tags:  {}", tags_text(&meta))?;
    }
    Ok(EXIT_OK)
}

/// Appends the event recording `update` to the session `arg` names; returns its seq.
fn append(opened: &Opened, arg: &str, update: &MetaUpdate) -> Result<u64, CliError> {
    let info = opened.resolve(arg)?;
    let id = info.header.id;
    let custom = update
        .to_custom()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let event = Event::new(info.len, now_ms(), custom);
    opened
        .store
        .append(id, std::slice::from_ref(&event))
        .map_err(|e| opened.fail(e))?;
    Ok(info.len)
}

/// The update the arguments ask for, checked.
fn update_of(args: &TagArgs) -> Result<MetaUpdate, CliError> {
    let mut update = MetaUpdate::new();
    if let Some(title) = &args.title {
        update = update.title(title.clone());
    }
    if args.clear_title {
        update = update.clear_title();
    }
    for pair in &args.tags {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(CliError::Usage(format!(
                "{pair:?} is not a tag: write KEY=VALUE (use --untag KEY to remove one)"
            )));
        };
        update = update.tag(key, value);
    }
    for key in &args.untag {
        update = update.untag(key.clone());
    }
    update
        .validate()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(update)
}

/// Tags as a JSON object.
pub fn tags_json(meta: &SessionMeta) -> Value {
    Value::Object(
        meta.tags
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// Tags as `k=v,k2=v2`, or `-` when there are none.
pub fn tags_text(meta: &SessionMeta) -> String {
    if meta.tags.is_empty() {
        return "-".to_owned();
    }
    meta.tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
