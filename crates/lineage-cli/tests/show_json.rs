//! `lineage show --json` prints, window by window, exactly the document it has always printed:
//! one `serde_json` value of the session read whole, pretty printed, although it now writes the
//! document as it reads the session.

use std::path::Path;
use std::process::{Command, Stdio};

use lineage_log::{EventBody, EventKind, ForkSpec, Header, SessionId, fold_lineage, seed_len};
use lineage_store::Store;
use lineage_testkit::realistic_session;
use serde_json::{Value, json};

fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}

/// The document `show --json` has always printed for a whole session: one `serde_json` value
/// built from the session read whole (`Store::inspect`), pretty printed.
fn whole_document(store: &Store, id: SessionId, from: usize, limit: Option<usize>) -> String {
    let loaded = store.inspect(id).unwrap();
    let stored = &loaded.events[..loaded.events.len() - loaded.closers];
    let start = from.min(stored.len());
    let end = limit.map_or(stored.len(), |l| (start + l).min(stored.len()));
    let open_turn = (loaded.closers > 0)
        .then(|| {
            stored.iter().rev().find_map(|e| match &e.body {
                EventBody::TurnStart(t) => Some(t.turn),
                _ => None,
            })
        })
        .flatten();
    let events: Vec<Value> = stored[start..end]
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let document = json!({
        "session": id.to_string(),
        "parent": fold_lineage(stored).map(|l| l.parent.to_string()),
        "seed_len": seed_len(stored),
        "len": stored.len(),
        "from": start,
        "open_turn": open_turn,
        "events": events,
    });
    format!("{}\n", serde_json::to_string_pretty(&document).unwrap())
}

#[test]
fn show_json_prints_the_same_document_as_a_whole_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.lineage");
    let store = Store::open(&path).unwrap();
    let t0 = 1_750_000_000_000;
    let whole = SessionId::new();
    store
        .import(Header::new(whole, t0), &realistic_session(21, 1_500))
        .unwrap();
    // Torn inside a step, after a tool call whose result never came.
    let torn = SessionId::new();
    let mut log = realistic_session(22, 900);
    let call = log
        .iter()
        .rposition(|e| e.kind() == EventKind::ToolCall)
        .unwrap();
    log.truncate(call + 1);
    store.import(Header::new(torn, t0), &log).unwrap();
    // A fork, with a parent and an inherited prefix.
    let child = SessionId::new();
    store
        .fork(
            whole,
            &ForkSpec {
                child,
                boundary: None,
                time_ms: t0 + 1_000,
                delegation_depth: 0,
                agent_preset: None,
            },
        )
        .unwrap();
    store.close().unwrap();
    let store = Store::open_read_only(&path).unwrap();

    for id in [whole, torn, child] {
        let windows: [(usize, Option<usize>); 5] = [
            (0, None),
            (7, Some(30)),
            (1_499, None),
            (5_000, None),
            (3, Some(0)),
        ];
        for (from, limit) in windows {
            let mut args = vec![
                "show".to_owned(),
                s(&path).to_owned(),
                id.to_string(),
                "--json".to_owned(),
                "--from".to_owned(),
                from.to_string(),
            ];
            if let Some(limit) = limit {
                args.extend(["--limit".to_owned(), limit.to_string()]);
            }
            let output = Command::new(env!("CARGO_BIN_EXE_lineage"))
                .args(&args)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert_eq!(output.status.code(), Some(0), "{args:?}");
            assert!(output.stderr.is_empty(), "{args:?}");
            let printed = String::from_utf8(output.stdout).unwrap();
            // Compared as documents: the order of an object's keys is serde_json's to choose
            // (sorted, or as written when another crate in the build asks it to keep order).
            let printed: Value = serde_json::from_str(&printed).unwrap();
            let whole: Value =
                serde_json::from_str(&whole_document(&store, id, from, limit)).unwrap();
            assert!(printed == whole, "show {args:?} printed another document");
        }
    }
}
