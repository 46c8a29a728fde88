//! The `lineage` binary run as a process on stores built here: each command's text and JSON
//! output, exit codes and error sentences, a damaged copy of a store, and a store that another
//! process keeps appending to while the commands read it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{run, s};
use lineage_log::{
    AbortCause, ApprovalPolicy, DescriptorMode, Digest, Event, EventBody, Header, InboxSpliced,
    InboxTarget, PolicySource, SessionId, SubagentDescriptor, Text, ToolFilter, TurnEndReason,
    TurnNo,
};
use lineage_store::Store;
use lineage_testkit::ev::{self, fork_spec, spawned_child};
use lineage_testkit::process::{
    Helper, helper_arg, helper_job, report_line, rerun_this_test, wait_for_line,
};
use serde_json::Value;

/// Creation time of every session built here: 2025-06-15T15:06:40Z.
const T0: u64 = 1_750_000_000_000;
/// [`T0`] as the `ls` column shows it.
const T0_ISO: &str = "2025-06-15T15:06:40Z";

// ---------------------------------------------------------------------------------------------
// Running the binary.

/// The `lineage` binary with `args`.
fn lineage(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lineage"));
    command.args(args).stdin(Stdio::null());
    command
}

// ---------------------------------------------------------------------------------------------
// Building stores.

fn header(id: SessionId) -> Header {
    Header::new(id, T0).with_cwd("/work/project")
}

fn mid(n: u64) -> lineage_log::MessageId {
    lineage_log::MessageId::derived(&[b"lineage-cli-tests", &n.to_le_bytes()])
}

/// `bodies` as consecutive events from `first_seq`, a second apart.
fn numbered(first_seq: u64, bodies: Vec<EventBody>) -> Vec<Event> {
    ev::numbered(first_seq, T0 as i64, 1_000, bodies)
}

/// One completed turn of six events: turn/start, step/start, the user's `text`, an answer,
/// step/end, turn/end.
fn simple_turn(turn: TurnNo, first_seq: u64, text: &str) -> Vec<Event> {
    let answer = format!("answer to {text}");
    let bodies = ev::completed_turn(turn, mid(first_seq), text, mid(first_seq + 1), &answer);
    numbered(first_seq, bodies)
}

/// The root session's log (21 events): turn 1 queued and claimed through the inbox, a grep call
/// and its result, a second step answering; turn 2 a shell call that fails with `TOOL_TIMEOUT`,
/// aborted by the user.
fn root_log() -> Vec<Event> {
    let prompt = ev::user_text_message(mid(100), "Find the bug in parser.rs");
    numbered(
        0,
        vec![
            InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed: 0,
                inserted: vec![prompt.clone()],
                canceled: false,
            }
            .into(),
            ev::turn_start(1),
            InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed: 1,
                inserted: Vec::new(),
                canceled: false,
            }
            .into(),
            ev::step_start(1, 1),
            EventBody::from(prompt),
            ev::assistant(
                1,
                1,
                mid(101),
                vec![ev::call_block("c1", "grep", r#"{"pattern":"unwrap"}"#)],
            ),
            ev::tool_call(1, 1, "c1", "grep", r#"{"pattern":"unwrap"}"#),
            ev::tool_result(1, 1, mid(102), "c1", "src/parser.rs:12: value.unwrap()"),
            ev::step_end(1, 1),
            ev::step_start(1, 2),
            ev::assistant_text(
                1,
                2,
                mid(103),
                "The unwrap on line 12 panics on empty input.",
            ),
            ev::step_end(1, 2),
            ev::turn_completed(1),
            ev::turn_start(2),
            ev::step_start(2, 1),
            ev::user(mid(104), "Run the tests"),
            ev::assistant(
                2,
                1,
                mid(105),
                vec![ev::call_block(
                    "c2",
                    "run_shell",
                    r#"{"command":"cargo test"}"#,
                )],
            ),
            ev::tool_call(2, 1, "c2", "run_shell", r#"{"command":"cargo test"}"#),
            ev::tool_error(2, 1, mid(106), "c2", "Timeout", "TOOL_TIMEOUT"),
            ev::step_end(2, 1),
            ev::turn_end(
                2,
                TurnEndReason::Aborted {
                    cause: AbortCause::User,
                },
            ),
        ],
    )
}

/// Turn 1 completed, then turn 2 open in a step where the model asked for `c1` (started) and
/// `c2` (never started): 11 events, and crash repair would add 4 closers.
fn open_log() -> Vec<Event> {
    let mut events = simple_turn(1, 0, "first question");
    events.extend(numbered(
        6,
        vec![
            ev::turn_start(2),
            ev::step_start(2, 1),
            ev::user(mid(200), "second question"),
            ev::assistant_calls(2, 1, mid(201), &[("c1", "grep"), ("c2", "read_file")]),
            ev::tool_call(2, 1, "c1", "grep", r#"{"pattern":"x"}"#),
        ],
    ));
    events
}

/// A store of five sessions: a root; a continuable child forked from its whole log with a
/// descriptor and delegated policy, which then ran turn 3; a plain fork of the root's first turn;
/// a one-shot child spawned fresh (seed length 0); and an unrelated session ending mid-turn.
struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    root: SessionId,
    child: SessionId,
    fork: SessionId,
    spawned: SessionId,
    open: SessionId,
}

/// The root's log length, which is the continuable child's seed length.
const ROOT_LEN: u64 = 21;

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.lineage");
    let store = Store::open(&path).unwrap();
    let root = SessionId::new();
    store.import(header(root), &root_log()).unwrap();

    let child = SessionId::new();
    let descriptor = SubagentDescriptor {
        label: Some("reviewer".into()),
        endpoint: Some("example".into()),
        model: Some("example-model-1".into()),
        persona: Some("A careful reviewer.".into()),
        tool_filter: Some(ToolFilter {
            allow: Some(vec![Text::from("grep"), Text::from("read_file")]),
            deny: None,
        }),
        ..SubagentDescriptor::new(DescriptorMode::Continuable, "fork")
    };
    let forked = store
        .fork_with_setup(
            root,
            &fork_spec(child, None, T0 + 60_000, 1),
            vec![
                EventBody::from(descriptor),
                ev::sandbox("read-only", PolicySource::Delegation),
                ev::approval(ApprovalPolicy::NEVER, PolicySource::Delegation),
            ],
        )
        .unwrap();
    assert_eq!(forked.seed_len, ROOT_LEN);
    store
        .append(child, &simple_turn(3, ROOT_LEN + 4, "Review the fix"))
        .unwrap();

    let fork = SessionId::new();
    store
        .fork(root, &fork_spec(fork, Some(12), T0 + 120_000, 0))
        .unwrap();

    let spawned = SessionId::new();
    let (spawned_header, lineage) = spawned_child(header(spawned), root);
    let mut spawned_log = numbered(
        0,
        vec![
            lineage,
            SubagentDescriptor {
                label: Some("scout".into()),
                ..SubagentDescriptor::new(DescriptorMode::OneShot, "spawn")
            }
            .into(),
        ],
    );
    spawned_log.extend(simple_turn(1, 2, "Look around"));
    store.import(spawned_header, &spawned_log).unwrap();

    let open = SessionId::new();
    store.import(header(open), &open_log()).unwrap();
    store.close().unwrap();
    Fixture {
        _dir: dir,
        path,
        root,
        child,
        fork,
        spawned,
        open,
    }
}

/// The line of `text` that contains `needle`.
fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line contains {needle:?} in:\n{text}"))
}

/// The JSON object of `items` whose `key` is `value`.
fn find<'a>(items: &'a Value, key: &str, value: &str) -> &'a Value {
    items
        .as_array()
        .expect("an array")
        .iter()
        .find(|item| item[key] == value)
        .unwrap_or_else(|| panic!("no item with {key} = {value} in {items:#}"))
}

// ---------------------------------------------------------------------------------------------
// Commands on an intact store.

#[test]
fn ls_lists_every_session_with_its_facts() {
    let f = fixture();
    let text = run(&["ls", s(&f.path)]).ok().stdout;
    let first = text.lines().next().unwrap();
    for column in [
        "ID",
        "CREATED",
        "PARENT",
        "ORIGIN",
        "DEPTH",
        "EVENTS",
        "TURNS",
        "LAST STOP",
        "OPEN TURN",
        "SIZE",
    ] {
        assert!(first.contains(column), "{first}");
    }
    assert_eq!(text.lines().count(), 6, "a title and five rows:\n{text}");
    let root = line_with(&text, &format!("{}  {T0_ISO}", f.root));
    assert!(
        root.contains(" 21 ") && root.contains("aborted(user)"),
        "{root}"
    );
    let child = line_with(&text, &format!("{}  ", f.child));
    assert!(child.contains(&f.root.to_string()), "{child}");
    assert!(
        child.contains("subagent") && child.contains("completed"),
        "{child}"
    );
    let open = line_with(&text, &format!("{}  ", f.open));
    assert!(
        open.contains("turn 2") && open.contains("completed"),
        "{open}"
    );

    let json = run(&["ls", s(&f.path), "--json"]).ok().json();
    assert_eq!(json.as_array().unwrap().len(), 5);
    let root = find(&json, "id", &f.root.to_string());
    assert_eq!(root["events"], 21);
    assert_eq!(root["turns"], 2);
    assert_eq!(root["last_stop"], "aborted(user)");
    assert_eq!(root["open_turn"], Value::Null);
    assert_eq!(root["parent"], Value::Null);
    assert_eq!(root["created"], T0_ISO);
    assert_eq!(root["created_at_ms"], T0);
    let child = find(&json, "id", &f.child.to_string());
    assert_eq!(child["parent"], f.root.to_string());
    assert_eq!(child["origin"], "subagent");
    assert_eq!(child["delegation_depth"], 1);
    assert_eq!(child["seed_len"], ROOT_LEN);
    assert_eq!(child["events"], ROOT_LEN + 4 + 6);
    assert_eq!(child["turns"], 3);
    assert_eq!(child["last_stop"], "completed");
    let fork = find(&json, "id", &f.fork.to_string());
    assert_eq!(fork["origin"], Value::Null);
    assert_eq!(fork["events"], 14);
    assert_eq!(fork["turns"], 1);
    let open = find(&json, "id", &f.open.to_string());
    assert_eq!(open["open_turn"], 2);
    assert_eq!(open["turns"], 2);
    assert_eq!(open["last_stop"], "completed");
    // Every session's size is its blocks' bytes: together, the store's.
    let sizes: u64 = json
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["bytes"].as_u64().expect("a size"))
        .sum();
    let stats = Store::open_read_only(&f.path).unwrap().stats().unwrap();
    assert_eq!(sizes, stats.block_bytes);
    assert!(root["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn tree_shows_children_with_mode_label_provider_and_depth() {
    let f = fixture();
    let text = run(&["tree", s(&f.path)]).ok().stdout;
    let root = line_with(&text, &f.root.to_string());
    assert!(
        root.starts_with(&f.root.to_string()) && root.contains("root"),
        "{root}"
    );
    let child = line_with(&text, &f.child.to_string());
    assert!(
        child.starts_with("├─ ") || child.starts_with("└─ "),
        "{child}"
    );
    for fact in ["continuable", "reviewer", "fork", " 1 "] {
        assert!(child.contains(fact), "{fact} in {child}");
    }
    let spawned = line_with(&text, &f.spawned.to_string());
    for fact in ["one-shot", "scout", "spawn"] {
        assert!(spawned.contains(fact), "{fact} in {spawned}");
    }
    let fork = line_with(&text, &f.fork.to_string());
    assert!(fork.contains(" fork "), "{fork}");
    assert!(line_with(&text, &f.open.to_string()).starts_with(&f.open.to_string()));

    let json = run(&["tree", s(&f.path), "--json"]).ok().json();
    assert_eq!(json.as_array().unwrap().len(), 2, "two roots: {json:#}");
    let root = find(&json, "id", &f.root.to_string());
    assert_eq!(root["mode"], "root");
    let kids = &root["children"];
    assert_eq!(kids.as_array().unwrap().len(), 3);
    let child = find(kids, "id", &f.child.to_string());
    assert_eq!(child["mode"], "continuable");
    assert_eq!(child["label"], "reviewer");
    assert_eq!(child["provider"], "fork");
    assert_eq!(child["model"], "example-model-1");
    assert_eq!(child["delegation_depth"], 1);
    assert_eq!(child["seed_len"], ROOT_LEN);
    let fork = find(kids, "id", &f.fork.to_string());
    assert_eq!(fork["mode"], "fork");
    assert_eq!(fork["label"], Value::Null);
    assert_eq!(find(kids, "id", &f.spawned.to_string())["mode"], "one-shot");

    // From a given root, with the id shortened to a unique prefix.
    let prefix = &f.child.to_string()[..30];
    let json = run(&["tree", s(&f.path), prefix, "--json"]).ok().json();
    assert_eq!(json.as_array().unwrap().len(), 1);
    assert_eq!(json[0]["id"], f.child.to_string());
    assert_eq!(json[0]["children"].as_array().unwrap().len(), 0);
}

#[test]
fn show_prints_events_readably_with_the_prefix_set_apart() {
    let f = fixture();
    let text = run(&["show", s(&f.path), &f.child.to_string()]).ok().stdout;
    let inherited = format!("── inherited from {} (seq 0..{}) ──", f.root, ROOT_LEN - 1);
    let own = format!("── own suffix (seq {ROOT_LEN}..) ──");
    let at_inherited = text
        .find(&inherited)
        .unwrap_or_else(|| panic!("{inherited}\n{text}"));
    let at_own = text.find(&own).unwrap_or_else(|| panic!("{own}\n{text}"));
    assert!(at_inherited < at_own);
    // The own suffix starts with the lineage, then the setup events.
    let after = &text[at_own..];
    let lineage = line_with(after, "session/lineage");
    assert!(
        lineage.trim_start().starts_with(&ROOT_LEN.to_string()),
        "{lineage}"
    );
    assert!(lineage.contains(&format!("parent {}", f.root)), "{lineage}");
    assert!(
        lineage.contains(&format!("seed_len {ROOT_LEN}")),
        "{lineage}"
    );
    assert!(line_with(after, "subagent/descriptor").contains("continuable via fork"));
    assert!(line_with(after, "sandbox/mode").contains("read-only (delegation)"));
    assert!(line_with(after, "approval/policy").contains("never (delegation)"));
    // Messages, calls with arguments, results with error codes, turn ends, inbox splices.
    let before = &text[..at_own];
    assert!(line_with(before, "user/message").contains("[user] \"Find the bug in parser.rs\""));
    assert!(line_with(before, "tool/call").contains(r#"grep c1 {"pattern":"unwrap"}"#));
    assert!(line_with(before, "asks grep c1").contains(r#"{"pattern":"unwrap"}"#));
    assert!(line_with(before, "c1 ok").contains("src/parser.rs:12"));
    assert!(line_with(before, "c2 error").contains("TOOL_TIMEOUT (Timeout)"));
    assert!(line_with(before, "turn 2: aborted(user)").contains("turn/end"));
    assert!(line_with(before, "turn 1: completed").contains("turn/end"));
    assert!(line_with(before, "inserted 1").contains("next-turn at 0"));
    assert!(line_with(before, "removed 1").contains("(claimed)"));
    assert!(text.contains("+ [user] \"Find the bug in parser.rs\""));
    // Turn and step indentation.
    assert!(line_with(before, "turn/start").contains("  turn/start"));
    assert!(line_with(before, "step/start").contains("    step/start"));
    assert!(line_with(before, "tool/call").contains("      tool/call"));
    // Event times in UTC.
    assert!(line_with(before, "inbox/spliced").contains("2025-06-15T15:06:40.000Z"));

    // A window of the log, as JSON.
    let json = run(&[
        "show",
        s(&f.path),
        &f.root.to_string(),
        "--from",
        "3",
        "--limit",
        "2",
        "--json",
    ])
    .ok()
    .json();
    assert_eq!(json["session"], f.root.to_string());
    assert_eq!(json["len"], 21);
    let events = json["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["seq"], 3);
    assert_eq!(events[0]["body"]["type"], "step/start");
    assert_eq!(events[1]["body"]["type"], "user/message");

    // Starting inside the own suffix prints only its rule.
    let tail = run(&[
        "show",
        s(&f.path),
        &f.child.to_string(),
        "--from",
        &(ROOT_LEN + 4).to_string(),
    ])
    .ok()
    .stdout;
    assert!(
        tail.contains(&own) && !tail.contains("inherited from"),
        "{tail}"
    );
    assert!(tail.contains("showing seq 25..=30"), "{tail}");

    // A session ending mid-turn says so.
    let open = run(&["show", s(&f.path), &f.open.to_string()]).ok().stdout;
    assert!(
        open.contains(
            "the log ends inside turn 2: resuming would first close it with 4 repair events"
        ),
        "{open}"
    );
}

#[test]
fn fold_reports_what_resume_would_rebuild() {
    let f = fixture();
    let text = run(&["fold", s(&f.path), &f.child.to_string()]).ok().stdout;
    assert!(line_with(&text, "parent").contains(&f.root.to_string()));
    assert!(line_with(&text, "seed_len").contains(&ROOT_LEN.to_string()));
    assert!(line_with(&text, "delegation depth").ends_with('1'));
    assert!(line_with(&text, "approval").contains("never (delegation)"));
    assert!(line_with(&text, "sandbox").contains("read-only (delegation)"));
    assert!(line_with(&text, "descriptor").contains("continuable via fork, label \"reviewer\""));
    assert!(line_with(&text, "turns").contains("3 (1 in the own suffix)"));
    assert!(line_with(&text, "last stop").contains("completed"));
    assert!(line_with(&text, "balanced").ends_with("yes"));

    let json = run(&["fold", s(&f.path), &f.child.to_string(), "--json"])
        .ok()
        .json();
    assert_eq!(json["lineage"]["parent"], f.root.to_string());
    assert_eq!(json["lineage"]["seed_len"], ROOT_LEN);
    assert_eq!(json["lineage"]["seed_digest"].as_str().unwrap().len(), 64);
    assert_eq!(json["delegation_depth"], 1);
    assert_eq!(json["policy"]["approval"]["policy"], "never");
    assert_eq!(json["policy"]["approval"]["source"], "delegation");
    assert_eq!(json["policy"]["sandbox"]["mode"], "read-only");
    assert_eq!(json["descriptor"]["mode"], "Continuable");
    assert_eq!(json["descriptor"]["label"], "reviewer");
    assert_eq!(json["turns"], 3);
    assert_eq!(json["own_turns"], 1);
    assert_eq!(json["last_stop"], "completed");
    assert_eq!(json["balanced"], true);
    assert_eq!(json["closers"], 0);
    assert_eq!(json["header_agrees_with_log"], true);
    assert_eq!(json["final_output"], "answer to Review the fix");

    // The plain fork inherits no authority: no descriptor, no policy, depth 0.
    let fork = run(&["fold", s(&f.path), &f.fork.to_string(), "--json"])
        .ok()
        .json();
    assert_eq!(fork["lineage"]["seed_len"], 13);
    assert_eq!(fork["descriptor"], Value::Null);
    assert_eq!(fork["policy"]["approval"], Value::Null);
    assert_eq!(fork["delegation_depth"], 0);

    // A session torn mid-turn: what crash repair would add.
    let open = run(&["fold", s(&f.path), &f.open.to_string()]).ok().stdout;
    assert!(
        line_with(&open, "balanced")
            .contains("no: turn 2 is open; crash repair would add 4 closers"),
        "{open}"
    );
    assert!(open.contains("TOOL_OUTCOME_UNKNOWN") && open.contains("TOOL_NOT_STARTED"));
    assert!(line_with(&open, "would add seq 14").contains("turn/end: turn 2: interrupted"));
    let json = run(&["fold", s(&f.path), &f.open.to_string(), "--json"])
        .ok()
        .json();
    assert_eq!(json["balanced"], false);
    assert_eq!(json["open_turn"], 2);
    assert_eq!(json["closers"], 4);
    assert_eq!(json["closer_events"][3]["body"]["type"], "turn/end");
    assert_eq!(json["parent"], Value::Null);
}

#[test]
fn verify_passes_an_intact_store() {
    let f = fixture();
    let text = run(&["verify", s(&f.path)]).ok().stdout;
    let total = 21 + 31 + 14 + 8 + 11;
    assert!(
        text.ends_with(&format!("5 sessions, {total} events checked, 0 problems\n")),
        "{text}"
    );
    assert!(line_with(&text, &f.open.to_string()).contains("ends inside turn 2"));
    let json = run(&["verify", s(&f.path), "--json"]).ok().json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["sessions"], 5);
    assert_eq!(json["events"], total);
    assert_eq!(json["problems"], 0);
    let one = run(&["verify", s(&f.path), &f.child.to_string()])
        .ok()
        .stdout;
    assert!(
        one.ends_with("1 session, 31 events checked, 0 problems\n"),
        "{one}"
    );
}

#[test]
fn tail_prints_the_last_events() {
    let f = fixture();
    let text = run(&["tail", "-n", "3", s(&f.path), &f.root.to_string()])
        .ok()
        .stdout;
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.lines().last().unwrap().contains("aborted(user)"));
    let json = run(&["tail", "-n", "2", "--json", s(&f.path), &f.root.to_string()]).ok();
    let seqs: Vec<u64> = json
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [19, 20]);
}

#[test]
fn export_writes_one_json_object_per_event() {
    let f = fixture();
    let out = run(&["export", s(&f.path), &f.child.to_string()])
        .ok()
        .stdout;
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    // The session line, then the 31 events (schema/JSON.md).
    assert_eq!(lines.len(), 32);
    assert_eq!(lines[0]["type"], "lineage/session");
    assert_eq!(lines[0]["id"], f.child.to_string());
    assert_eq!(lines[0]["events"], 31);
    let events = &lines[1..];
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"], i as u64);
        assert!(e["time_ms"].is_i64());
        assert!(e["type"].is_string() && !e["data"].is_null());
        assert_eq!(e["digest"].as_str().map(str::len), Some(64));
    }
    assert_eq!(events[ROOT_LEN as usize]["type"], "session/lineage");
    assert_eq!(
        events[ROOT_LEN as usize]["data"]["parent"],
        f.root.to_string()
    );
    // The export is the log itself: it reads back into the same events.
    let parsed = lineage_log::session_from_json_lines(&out).unwrap();
    let store = Store::open_read_only(&f.path).unwrap();
    assert_eq!(parsed.events, store.read_from(f.child, 0).unwrap());
    assert_eq!(parsed.digest, store.info(f.child).unwrap().head);
}

#[test]
fn stats_sums_the_store() {
    let f = fixture();
    let text = run(&["stats", s(&f.path)]).ok().stdout;
    assert!(line_with(&text, "sessions").ends_with(" 5"), "{text}");
    assert!(line_with(&text, "events").ends_with(" 85"), "{text}");
    assert!(line_with(&text, "turn/start").contains("%"));
    let json = run(&["stats", s(&f.path), "--json"]).ok().json();
    assert_eq!(json["sessions"], 5);
    assert_eq!(json["events"], 85);
    assert!(json["record_bytes"].as_u64().unwrap() > 0);
    let turn_starts = find(&json["by_kind"], "kind", "turn/start");
    // root 2, child 2 inherited + 1, fork 1, spawned 1, open 2.
    assert_eq!(turn_starts["events"], 9);
    assert!(turn_starts["bytes_per_event"].as_f64().unwrap() > 0.0);
}

#[test]
fn help_documents_examples_and_exit_codes() {
    let help = run(&["--help"]).ok().stdout;
    for needle in [
        "Examples:",
        "lineage tail -f",
        "Exit codes:",
        "3  cannot open",
    ] {
        assert!(help.contains(needle), "{needle}:\n{help}");
    }
    for command in [
        "ls", "tree", "show", "fold", "verify", "tail", "export", "stats",
    ] {
        assert!(help.contains(&format!("  {command} ")), "{command}");
        run(&[command, "--help"]).ok();
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

#[test]
fn a_missing_file_is_reported_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.lineage");
    for command in ["ls", "tree", "stats", "verify"] {
        run(&[command, s(&path)]).fails(3, &["no such file"]);
    }
    run(&["show", s(&path), &SessionId::new().to_string()]).fails(3, &["no such file"]);
    assert!(!path.exists(), "the read-only open created nothing");
}

#[test]
fn files_that_are_not_lineage_stores_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "these are not sessions\n").unwrap();
    run(&["ls", s(&text)]).fails(3, &["is not a Lineage store"]);
    let empty = dir.path().join("empty.lineage");
    std::fs::write(&empty, "").unwrap();
    run(&["stats", s(&empty)]).fails(3, &["is not a Lineage store"]);
    assert_eq!(
        std::fs::metadata(&empty).unwrap().len(),
        0,
        "left untouched"
    );
    run(&["ls", s(dir.path())]).fails(3, &["is a directory"]);

    // A redb database, but with someone else's tables.
    let foreign = dir.path().join("foreign.redb");
    {
        let db = redb::Database::create(&foreign).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("counters");
            txn.open_table(def).unwrap().insert("a", 1).unwrap();
        }
        txn.commit().unwrap();
    }
    run(&["ls", s(&foreign)]).fails(3, &["is not a Lineage store"]);
}

#[test]
fn a_store_in_a_newer_format_is_refused() {
    let f = fixture();
    {
        let db = redb::Database::open(&f.path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let meta: redb::TableDefinition<&str, &[u8]> =
                redb::TableDefinition::new("lineage/meta");
            txn.open_table(meta)
                .unwrap()
                .insert(
                    "format_version",
                    (lineage_store::STORE_FORMAT_VERSION + 1)
                        .to_le_bytes()
                        .as_slice(),
                )
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let r = run(&["ls", s(&f.path)]).fails(3, &["newer"]);
    assert!(r.stderr.contains("upgrade Lineage"), "{}", r.stderr);
}

#[test]
fn verify_reports_a_session_in_a_newer_log_format_as_a_problem() {
    let f = fixture();
    // The row as the store writes it: postcard of these fields in this order.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Row {
        header: Header,
        next_seq: u64,
        head: Digest,
        revision: u64,
    }
    {
        let db = redb::Database::open(&f.path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let sessions: redb::TableDefinition<u128, &[u8]> =
                redb::TableDefinition::new("lineage/sessions");
            let mut table = txn.open_table(sessions).unwrap();
            let mut row: Row = {
                let bytes = redb::ReadableTable::get(&table, f.spawned.as_u128())
                    .unwrap()
                    .unwrap();
                postcard::from_bytes(bytes.value()).unwrap()
            };
            row.header.format_version = lineage_log::FORMAT_VERSION + 1;
            let bytes = postcard::to_stdvec(&row).unwrap();
            table.insert(f.spawned.as_u128(), bytes.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let r = run(&["verify", s(&f.path)]);
    assert_eq!(
        r.code, 1,
        "a session verify cannot read is a problem:\n{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!(
            "{}: log format 2 is newer than this build reads",
            f.spawned
        )),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("1 problem"), "{}", r.stdout);

    let r = run(&["verify", s(&f.path), "--json"]);
    assert_eq!(r.code, 1);
    let json = r.json();
    assert_eq!(json["ok"], false);
    let report = json["reports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["session"] == f.spawned.to_string())
        .unwrap();
    assert_eq!(report["problems"][0]["kind"], "unsupported-format");
}

#[test]
fn unknown_sessions_and_bad_usage_exit_2() {
    let f = fixture();
    let stranger = SessionId::new().to_string();
    for command in ["show", "fold", "tail", "export", "verify", "tree"] {
        run(&[command, s(&f.path), &stranger])
            .fails(2, &[&format!("session {stranger} is not in")]);
    }
    run(&["show", s(&f.path), "not-a-session"]).fails(2, &["is not a session id"]);
    run(&["show", s(&f.path), "ffff"]).fails(2, &["no session"]);
    // Every session here was created within the same second: a short prefix is ambiguous.
    run(&["show", s(&f.path), &f.root.to_string()[..4]]).fails(2, &["give more of the id"]);

    run(&[]).fails(2, &["no command given"]);
    run(&["frobnicate"]).fails(2, &["unrecognized subcommand"]);
    run(&["show", s(&f.path)]).fails(2, &["<SESSION>"]);
    run(&["ls", s(&f.path), "--bogus"]).fails(2, &["--bogus"]);
    run(&["show", s(&f.path), &f.root.to_string(), "--limit", "many"]).fails(2, &["--limit"]);
}

// ---------------------------------------------------------------------------------------------
// A damaged copy.

/// Flips a bit in the middle of every copy of `marker` in the file (redb may keep stale copies of
/// a page; the live one is among them). Returns how many were flipped.
fn flip_marker(path: &Path, marker: &str) -> usize {
    let mut bytes = std::fs::read(path).unwrap();
    let hits: Vec<usize> = bytes
        .windows(marker.len())
        .enumerate()
        .filter(|(_, w)| *w == marker.as_bytes())
        .map(|(i, _)| i)
        .collect();
    for &at in &hits {
        // 'A' ^ 0x02 == 'C': still valid UTF-8, so only the block digest can tell.
        bytes[at + marker.len() / 2] ^= 0x02;
    }
    std::fs::write(path, &bytes).unwrap();
    hits.len()
}

#[test]
fn verify_names_the_session_and_seqs_of_a_damaged_copy() {
    let f = fixture();
    // A session whose second batch (seqs 6..=11) holds a marker at seq 8.
    let victim = SessionId::new();
    let marker = format!("MARKER-{}-AAAA", victim.as_uuid().simple());
    {
        let store = Store::open(&f.path).unwrap();
        store
            .import(header(victim), &simple_turn(1, 0, "first"))
            .unwrap();
        store
            .append(victim, &simple_turn(2, 6, &format!("keep {marker} safe")))
            .unwrap();
        store.append(victim, &simple_turn(3, 12, "after")).unwrap();
        store.close().unwrap();
    }
    let copy = f.path.with_file_name("copy.lineage");
    std::fs::copy(&f.path, &copy).unwrap();
    assert!(flip_marker(&copy, &marker) >= 1);

    run(&["verify", s(&f.path)]).ok();
    let r = run(&["verify", s(&copy)]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let problem = line_with(&r.stdout, &victim.to_string());
    assert!(problem.contains("seqs 6..=11"), "{problem}");
    assert!(
        r.stdout
            .ends_with("6 sessions, 103 events checked, 1 problem\n"),
        "{}",
        r.stdout
    );

    let json = run(&["verify", s(&copy), &victim.to_string(), "--json"]);
    assert_eq!(json.code, 1);
    let json = json.json();
    assert_eq!(json["ok"], false);
    assert_eq!(json["problems"], 1);
    let problem = &json["reports"][0]["problems"][0];
    assert_eq!(problem["kind"], "corrupt-block");
    assert_eq!(problem["first_seq"], 6);
    assert_eq!(problem["last_seq"], 11);

    // Reads that check digests refuse the damaged session in one sentence; the others still read.
    let sentence = format!("corrupt block in session {victim}, seqs 6..=11");
    run(&["show", s(&copy), &victim.to_string()]).fails(1, &[&sentence]);
    run(&["fold", s(&copy), &victim.to_string()]).fails(1, &[&sentence]);
    run(&["export", s(&copy), &victim.to_string()]).fails(1, &[&sentence]);
    run(&["fold", s(&copy), &f.child.to_string()]).ok();
}

// ---------------------------------------------------------------------------------------------
// A live writer in another process.

/// The session the live writer fills.
const WRITER_SESSION_VAR: &str = "LINEAGE_CLI_TEST_WRITER_SESSION";

/// The live writer (the live-writer test re-run with the store's path as its job): opens the
/// store for writing, appends a turn, says `ready <len>`, then keeps appending a turn every few
/// milliseconds and saying `appended <len>`, until it is killed (or, as a backstop, after a
/// minute).
fn write_live(path: &str) {
    let session: SessionId = helper_arg(WRITER_SESSION_VAR);
    let store = Store::open(path).expect("the writer opens the store");
    let mut len = 0u64;
    let mut turn: TurnNo = 1;
    let first = simple_turn(turn, len, "live turn 1");
    store.import(header(session), &first).expect("first turn");
    len += first.len() as u64;
    report_line(&format!("ready {len}"));
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(20));
        turn += 1;
        let events = simple_turn(turn, len, &format!("live turn {turn}"));
        store.append(session, &events).expect("append");
        len += events.len() as u64;
        report_line(&format!("appended {len}"));
    }
}

/// The idle writer (the killed-writer test re-run with the store's path as its job): opens the
/// store for writing, says `opened`, and writes nothing until it is killed (or, as a backstop,
/// after a minute).
fn hold_idle(path: &str) {
    let _store = Store::open(path).expect("the writer opens the store");
    report_line("opened");
    std::thread::sleep(Duration::from_secs(60));
}

/// The length in a writer line `ready <len>` or `appended <len>`. The test harness may print its
/// own `test … ` before the first one on the same line.
fn written(line: &str) -> Option<u64> {
    ["ready ", "appended "].iter().find_map(|word| {
        let at = line.find(word)?;
        line[at + word.len()..].trim().parse().ok()
    })
}

#[test]
fn commands_read_a_store_while_another_process_appends_to_it() {
    if let Some(path) = helper_job() {
        return write_live(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.lineage");
    let session = SessionId::new();
    let mut writer =
        Helper::spawn(rerun_this_test(&path).env(WRITER_SESSION_VAR, session.to_string()));
    let writes = writer.lines();
    wait_for_line(&writes, |l| l.contains("ready ").then_some(()));
    let id = session.to_string();
    let p = s(&path);

    // Every inspection command works on the file while the writer holds it open and appends.
    let before = run(&["ls", p, "--json"]).ok().json()[0]["events"]
        .as_u64()
        .unwrap();
    run(&["show", p, &id]).ok();
    run(&["fold", p, &id, "--json"]).ok();
    run(&["tree", p]).ok();
    run(&["stats", p]).ok();
    run(&["export", p, &id]).ok();
    let verified = run(&["verify", p]).ok().stdout;
    assert!(verified.contains("1 session, ") && verified.ends_with(", 0 problems\n"));

    // The listing grows as the writer commits.
    let target = before + 30;
    wait_for_line(&writes, |l| written(l).filter(|&n| n >= target));
    let after = run(&["ls", p, "--json"]).ok().json()[0]["events"]
        .as_u64()
        .unwrap();
    assert!(
        after >= target,
        "the reader sees new commits: {before} then {after}"
    );

    // `tail -f` prints events committed after it started, in order, without gaps.
    let mut tail = Helper(
        lineage(&[
            "tail",
            "-f",
            "--json",
            "--interval",
            "50",
            "-n",
            "5",
            p,
            &id,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("tail starts"),
    );
    let followed = tail.lines();
    let first: Value = serde_json::from_str(&wait_for_line(&followed, |l| Some(l.to_owned())))
        .expect("JSON Lines");
    // The writer's latest length once tail has read: everything past it (and a margin for a
    // commit not yet reported) was appended while tail was following.
    let latest = writes
        .try_iter()
        .filter_map(|l| written(&l))
        .max()
        .unwrap_or(after);
    let goal = latest + 60;
    let mut seqs = vec![first["seq"].as_u64().expect("a seq")];
    let mut texts = Vec::new();
    wait_for_line(&followed, |line| {
        let event: Value = serde_json::from_str(line).expect("JSON Lines");
        let seq = event["seq"].as_u64().expect("a seq");
        if let Some(t) = event["body"]["data"]["content"][0]["Text"]["text"].as_str() {
            texts.push(t.to_owned());
        }
        seqs.push(seq);
        (seq >= goal).then_some(())
    });
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "contiguous: {seqs:?}"
    );
    assert!(
        texts.iter().any(|t| t.starts_with("live turn")),
        "{texts:?}"
    );
    // The follower is still running; the writer is still writing.
    assert!(
        tail.0.try_wait().unwrap().is_none(),
        "tail -f keeps following"
    );
    wait_for_line(&writes, |l| written(l).filter(|&n| n > goal));
    drop(tail);

    // A writer killed mid-work leaves the file for the next writer to recover; meanwhile every
    // command reads it as the writer left it, and says so.
    drop(writer);
    let listed = run(&["ls", p, "--json"]).noted(&path).json();
    assert!(listed[0]["events"].as_u64().unwrap() >= goal);
    let shown = run(&["show", p, &id, "--json"]).noted(&path).json();
    assert!(shown["len"].as_u64().unwrap() >= goal);
    let verified = run(&["verify", p]).noted(&path).stdout;
    assert!(verified.ends_with(", 0 problems\n"), "{verified}");
    // The next writer recovers it; then there is nothing to note.
    Store::open(&path).unwrap().close().unwrap();
    let verified = run(&["verify", p]).ok().stdout;
    assert!(verified.ends_with(", 0 problems\n"), "{verified}");
}

#[test]
fn commands_read_a_store_whose_writer_was_killed_right_after_opening_it() {
    if let Some(path) = helper_job() {
        return hold_idle(&path);
    }
    let f = fixture();
    let p = s(&f.path);
    let root = f.root.to_string();
    let open = f.open.to_string();
    let clean: Vec<(Vec<&str>, String)> = [
        vec!["ls", p, "--json"],
        vec!["show", p, &root],
        vec!["show", p, &open, "--json"],
        vec!["verify", p],
        vec!["tree", p],
        vec!["fold", p, &open],
        vec!["tail", p, &root],
        vec!["export", p, &root],
    ]
    .into_iter()
    .map(|args| {
        let out = run(&args).ok().stdout;
        (args, out)
    })
    .collect();

    // A writer opens the store, writes nothing, and is killed.
    let mut writer = Helper::spawn(&mut rerun_this_test(&f.path));
    let said = writer.lines();
    wait_for_line(&said, |l| l.contains("opened").then_some(()));
    drop(writer);
    let bytes = std::fs::read(&f.path).unwrap();

    // Every command reads it as it was, and notes that it awaits recovery.
    for (args, before) in &clean {
        let after = run(args).noted(&f.path).stdout;
        assert!(after == *before, "{args:?} printed otherwise:\n{after}");
    }
    assert!(
        std::fs::read(&f.path).unwrap() == bytes,
        "reading changed nothing in the file"
    );
    // A failing command says both.
    let stranger = SessionId::new().to_string();
    let r = run(&["show", p, &stranger]);
    assert_eq!(r.code, 2);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stderr);
    assert!(lines[0].starts_with("lineage: note: ") && lines[0].contains("awaits recovery"));
    assert!(lines[1].contains(&format!("session {stranger} is not in")));
}

// ---------------------------------------------------------------------------------------------
// The demo.

#[test]
fn the_demo_runs_to_its_end_and_its_store_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let output = lineage(&["demo"])
        .current_dir(dir.path())
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The default store is in the working directory, and the story is told in order.
    let path = dir.path().join("lineage-demo.lineage");
    assert!(path.exists());
    let mut at = 0;
    for milestone in [
        "== 1.",
        "lead calls subagent",
        "lead calls review",
        "report in: Background subagent",
        "notice in: Background subagent",
        "lead calls send_message",
        "lead calls interrupt_agent",
        "settled: aborted",
        "== 3.",
        "== 4.",
        "lead calls send_message",
        "== Verify",
        "4 sessions",
        "0 problems",
        "== Try next",
    ] {
        match stdout[at..].find(milestone) {
            Some(found) => at += found + milestone.len(),
            None => panic!("{milestone:?} after byte {at} of:\n{stdout}"),
        }
    }
    for mode in ["continuable", "one-shot", "spawn", "fork"] {
        assert!(stdout.contains(mode), "the tree shows {mode}");
    }
    // What it wrote verifies on its own, and the auditor resumed once after the restart.
    let store = Store::open_read_only(&path).unwrap();
    assert!(store.verify().unwrap().is_ok());
    let sessions = store.list().unwrap();
    assert_eq!(sessions.len(), 4);
    run(&["verify", s(&path)]).ok();
    // A second run adds a second tree to the same store.
    let again = lineage(&["demo", "--store", s(&path)]).output().unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(
        Store::open_read_only(&path).unwrap().list().unwrap().len(),
        8
    );
}
