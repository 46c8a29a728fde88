//! `lineage export` and `lineage import` as processes: every session of a store exported and
//! imported into a fresh store comes back with the same header, length and digest, and the store
//! verifies; a session file of deepseek-harness's JSON Lines store imports and verifies; a changed,
//! cut or malformed file is refused naming its line, and nothing is written.

mod common;

use std::path::{Path, PathBuf};

use common::{run, run_with_stdin, s};
use lineage_log::{
    ApprovalPolicy, Custom, DescriptorMode, EventBody, ForkSpec, Header, Opaque, PolicySource,
    SessionId, SubagentDescriptor,
};
use lineage_store::Store;
use lineage_testkit::ev::{self, fork_spec};
use serde_json::Value;

/// Creation time of every session built here.
const T0: u64 = 1_750_000_000_000;

fn fixture_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deepseek-harness-session.jsonl")
}

fn mid(n: u64) -> lineage_log::MessageId {
    lineage_log::MessageId::derived(&[b"lineage-cli import tests", &n.to_le_bytes()])
}

/// A store of four sessions: a root with a custom and an opaque record; a continuable child
/// forked from it with setup events, which then ran a turn; a one-shot child spawned fresh; and a
/// session that ends inside an open turn. Returns the store's path and the ids.
fn store(dir: &Path) -> (PathBuf, Vec<SessionId>) {
    let path = dir.join("source.lineage");
    let store = Store::open(&path).unwrap();
    let t0 = T0 as i64;

    let root = SessionId::new();
    let mut bodies = ev::completed_turn(1, mid(1), "Find the bug", mid(2), "Line 12 panics.");
    bodies.push(
        Custom {
            type_name: "todo/write".into(),
            payload: r#"{"todos":[{"content":"fix it","status":"pending"}]}"#.into(),
            ignorable: true,
        }
        .into(),
    );
    bodies.push(
        Opaque {
            tag: 1 << 20,
            payload: vec![0, 1, 2, 0xfe, 0xff].into(),
        }
        .into(),
    );
    bodies.extend(ev::completed_turn(2, mid(3), "Fix it", mid(4), "Fixed."));
    let root_len = bodies.len() as u64;
    store
        .import(
            Header::new(root, T0).with_cwd("/work/project"),
            &ev::numbered(0, t0, 1_000, bodies),
        )
        .unwrap();

    let child = SessionId::new();
    store
        .fork_with_setup(
            root,
            &ForkSpec {
                agent_preset: Some("reviewer".into()),
                ..fork_spec(child, None, T0 + 60_000, 1)
            },
            vec![
                EventBody::from(SubagentDescriptor {
                    label: Some("reviewer".into()),
                    ..SubagentDescriptor::new(DescriptorMode::Continuable, "fork")
                }),
                ev::approval(ApprovalPolicy::NEVER, PolicySource::Delegation),
            ],
        )
        .unwrap();
    let next = root_len + 3;
    store
        .append(
            child,
            &ev::numbered(
                next,
                t0 + 60_000,
                1_000,
                ev::completed_turn(3, mid(5), "Review", mid(6), "Looks right."),
            ),
        )
        .unwrap();

    let open = SessionId::new();
    let mut bodies = ev::completed_turn(1, mid(7), "First", mid(8), "One.");
    bodies.extend([
        ev::turn_start(2),
        ev::step_start(2, 1),
        ev::user(mid(9), "Second"),
        ev::assistant_calls(2, 1, mid(10), &[("c1", "grep")]),
        ev::tool_call(2, 1, "c1", "grep", r#"{"pattern":"x"}"#),
    ]);
    store
        .import(Header::new(open, T0), &ev::numbered(0, t0, 1_000, bodies))
        .unwrap();
    store.close().unwrap();
    (path, vec![root, child, open])
}

fn export(path: &Path, session: SessionId) -> String {
    run(&["export", s(path), &session.to_string()]).ok().stdout
}

#[test]
fn export_then_import_gives_the_same_sessions_byte_for_byte_and_the_store_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (source, ids) = store(dir.path());
    let target = dir.path().join("target.lineage");
    for id in &ids {
        let text = export(&source, *id);
        let file = dir.path().join(format!("{id}.jsonl"));
        std::fs::write(&file, &text).unwrap();
        let out = run(&["import", s(&target), s(&file), "--json"]).ok().json();
        assert_eq!(out["status"], "imported");
        assert_eq!(out["session"], id.to_string());
        assert_eq!(out["source"], "lineage");
        // The second export is the first, byte for byte.
        assert_eq!(export(&target, *id), text);
    }
    let before = Store::open_read_only(&source).unwrap();
    let after = Store::open_read_only(&target).unwrap();
    for id in &ids {
        let (a, b) = (before.info(*id).unwrap(), after.info(*id).unwrap());
        assert_eq!(b.header, a.header, "{id}");
        assert_eq!(b.len, a.len, "{id}");
        assert_eq!(b.head, a.head, "the digests are identical for {id}");
        assert_eq!(
            after.read_from(*id, 0).unwrap(),
            before.read_from(*id, 0).unwrap()
        );
    }
    drop((before, after));
    let verified = run(&["verify", s(&target), "--json"]).ok().json();
    assert_eq!(verified["ok"], true, "{verified:#}");
    assert_eq!(verified["sessions"], 3);
}

#[test]
fn the_export_states_the_session_and_each_digest() {
    let dir = tempfile::tempdir().unwrap();
    let (source, ids) = store(dir.path());
    let text = export(&source, ids[1]);
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let info = Store::open_read_only(&source)
        .unwrap()
        .info(ids[1])
        .unwrap();
    assert_eq!(lines[0]["type"], "lineage/session");
    assert_eq!(lines[0]["json_form"], 1);
    assert_eq!(lines[0]["id"], ids[1].to_string());
    assert_eq!(lines[0]["parent"], ids[0].to_string());
    assert_eq!(lines[0]["origin"], "subagent");
    assert_eq!(lines[0]["agent_preset"], "reviewer");
    assert_eq!(lines[0]["events"], info.len);
    assert_eq!(lines[0]["digest"], info.head.to_string());
    assert_eq!(lines.len() as u64, info.len + 1);
    assert_eq!(lines.last().unwrap()["digest"], info.head.to_string());
    let lineage = &lines[1 + info.header.seed_len as usize];
    assert_eq!(lineage["type"], "session/lineage");
    assert_eq!(lineage["data"]["parent"], ids[0].to_string());
    let opaque = lines.iter().find(|l| l["type"] == "opaque").unwrap();
    assert_eq!(opaque["data"]["payload"], "000102feff");
}

#[test]
fn importing_the_same_session_again_is_a_no_op_and_other_content_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (source, ids) = store(dir.path());
    let text = export(&source, ids[0]);
    let file = dir.path().join("root.jsonl");
    std::fs::write(&file, &text).unwrap();
    // Into the store it came from: identical, nothing written.
    let out = run(&["import", s(&source), s(&file)]).ok().stdout;
    assert!(out.contains("identical"), "{out}");
    assert!(out.contains("nothing written"), "{out}");

    // The same id with a shorter log: refused.
    let mut lines: Vec<&str> = text.lines().collect();
    let shorter_len = lines.len() - 1 - 7; // the root without its second turn and the opaque
    lines.truncate(1 + shorter_len);
    let store = Store::open_read_only(&source).unwrap();
    let events = store.read_from(ids[0], 0).unwrap();
    drop(store);
    let shorter = lineage_log::session_to_json_lines(
        &Header::new(ids[0], T0).with_cwd("/work/project"),
        &events[..shorter_len],
    );
    std::fs::write(&file, shorter).unwrap();
    run(&["import", s(&source), s(&file)]).fails(
        1,
        &[
            &ids[0].to_string(),
            "already in",
            "other content",
            "nothing was written",
        ],
    );
}

#[test]
fn a_changed_line_is_refused_naming_it_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (source, ids) = store(dir.path());
    let text = export(&source, ids[0]);
    // Line 4 holds seq 2, the user's question.
    assert!(text.lines().nth(3).unwrap().contains("Find the bug"));
    let tampered = text.replacen("Find the bug", "Find the bugs", 1);
    let file = dir.path().join("tampered.jsonl");
    std::fs::write(&file, &tampered).unwrap();
    let target = dir.path().join("target.lineage");
    run(&["import", s(&target), s(&file)]).fails(
        1,
        &[
            "tampered.jsonl",
            "line 4 (seq 2)",
            "digest differs",
            "nothing",
        ],
    );
    assert!(!target.exists(), "a refused import creates no store");

    // A line taken out: the next one has the wrong seq.
    let mut lines: Vec<&str> = text.lines().collect();
    lines.remove(5);
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    run(&["import", s(&target), s(&file)]).fails(1, &["line 6 (seq 5)", "seq 4 was expected"]);

    // The last line lost: the count differs.
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&file, lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    run(&["import", s(&target), s(&file)]).fails(1, &["line 1", "the file holds"]);

    // Not JSON at all.
    std::fs::write(&file, format!("{}\n{{\"seq\": 0,\n", lines[0])).unwrap();
    run(&["import", s(&target), s(&file)]).fails(1, &["line 2", "not JSON"]);
    assert!(!target.exists());

    // A missing file cannot be read.
    run(&["import", s(&target), s(&dir.path().join("none.jsonl"))])
        .fails(3, &["none.jsonl", "no such file"]);
}

#[test]
fn an_upstream_json_lines_session_imports_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("imported.lineage");
    let fixture = fixture_file();
    let out = run(&["import", s(&target), s(&fixture), "--json"])
        .ok()
        .json();
    assert_eq!(out["status"], "imported");
    assert_eq!(out["source"], "upstream");
    assert_eq!(out["upstream"]["id"], "session-7");
    // 25 upstream events (the packed row holds three) and three closers for the open turn 2.
    assert_eq!(out["events"], 28);
    assert_eq!(out["upstream"]["closers"], 3);
    let custom = &out["upstream"]["kept_as_custom"];
    for kind in [
        "agent/inbox/spliced",
        "request/header",
        "assistant/chunk",
        "todo/write",
    ] {
        assert_eq!(custom[kind], 1, "{kind} in {custom}");
    }
    assert_eq!(out["upstream"]["left_out"]["meta"], 1);

    let verified = run(&["verify", s(&target), "--json"]).ok().json();
    assert_eq!(verified["ok"], true, "{verified:#}");

    let id: SessionId = out["session"].as_str().unwrap().parse().unwrap();
    let store = Store::open_read_only(&target).unwrap();
    let info = store.info(id).unwrap();
    assert_eq!(info.header.created_at_ms, T0);
    assert_eq!(info.header.cwd.as_deref(), Some("/home/ada/project"));
    assert_eq!(info.head.to_string(), out["digest"].as_str().unwrap());
    let events = store.read_from(id, 0).unwrap();
    assert!(lineage_log::is_balanced(&events));
    let history: Vec<String> = lineage_log::model_history(&events)
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(
        history[..4],
        [
            "What is in this directory?",
            "Let me look at the files.",
            "",
            "There is a README and a src directory."
        ]
    );
    // The packed row's three deltas, with their times.
    let deltas: Vec<(u64, i64)> = events
        .iter()
        .filter(|e| e.kind() == lineage_log::EventKind::AssistantChunk)
        .map(|e| (e.seq, e.time_ms))
        .collect();
    assert_eq!(
        deltas,
        [
            (5, T0 as i64 + 400),
            (6, T0 as i64 + 410),
            (7, T0 as i64 + 413),
            (8, T0 as i64 + 417)
        ]
    );
    drop(store);

    // The same file again: the same id, identical, nothing written. From stdin too.
    let text = std::fs::read_to_string(&fixture).unwrap();
    let again = run_with_stdin(&["import", s(&target), "-", "--json"], Some(&text))
        .ok()
        .json();
    assert_eq!(again["status"], "identical");
    assert_eq!(again["session"], out["session"]);

    // And it exports and imports like any session.
    let exported = export(&target, id);
    let copy = dir.path().join("copy.lineage");
    run_with_stdin(&["import", s(&copy), "-"], Some(&exported)).ok();
    assert_eq!(export(&copy, id), exported);
}

#[test]
fn upstream_lines_without_a_mapping_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("imported.lineage");
    let text = std::fs::read_to_string(fixture_file()).unwrap();
    let file = dir.path().join("upstream.jsonl");
    // Lines are numbered from the header (line 1); the packed row on line 8 holds seqs 6 to 8,
    // so from line 9 on a line holds the seq of its number.
    let cases: [(&str, &str, &[&str]); 5] = [
        (
            r#""surfaceOp":"append"}"#,
            r#""surfaceOp":{"op":"replace","start":3,"end":3}}"#,
            &["line 5 (seq 3)", "surface replacement"],
        ),
        (
            r#"{"type":"text","text":"Open the README."}"#,
            r#"{"type":"image","attachment":"att-1"}"#,
            &["line 22 (seq 22)", "image block"],
        ),
        (
            r#"{"kind":"completed"}"#,
            r#"{"kind":"aborted","reason":{"kind":"legacy"}}"#,
            &["line 18 (seq 18)", "abort cause \"legacy\""],
        ),
        (
            r#""type":"todo/write""#,
            r#""type":"todo/rewrite""#,
            &["line 17 (seq 17)", "todo/rewrite", "not marked ignorable"],
        ),
        (
            r#""delegationDepth":0"#,
            r#""parentSession":"session-1","seedLength":4,"delegationDepth":1"#,
            &["line 1", "child session"],
        ),
    ];
    for (from, to, needles) in cases {
        assert!(text.contains(from), "{from}");
        std::fs::write(&file, text.replacen(from, to, 1)).unwrap();
        run(&["import", s(&target), s(&file)]).fails(1, needles);
        assert!(!target.exists(), "nothing written for {to}");
    }
    // A step that closes twice breaks Lineage's rules where it stands.
    let broken = text.replacen(
        r#"{"type":"step/start","seq":14,"time":1750000000500,"data":{"turn":1,"step":2}}"#,
        r#"{"type":"step/end","seq":14,"time":1750000000500,"data":{"turn":1,"step":1}}"#,
        1,
    );
    assert_ne!(broken, text);
    std::fs::write(&file, broken).unwrap();
    run(&["import", s(&target), s(&file)]).fails(1, &["line 14 (seq 14)", "Lineage's rules"]);
}
