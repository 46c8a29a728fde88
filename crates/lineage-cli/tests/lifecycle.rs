//! The commands that change a store, run as processes: `rm` (refused with descendants unless
//! `--subtree`), `tag` and `ls --tag`, and `prune` by age and by count; each followed by
//! `lineage verify`. A store that a host holds for writing is refused with one sentence.

mod common;

use std::path::{Path, PathBuf};

use common::{run, s};
use lineage_log::{Event, Header, SessionId};
use lineage_store::Store;
use lineage_testkit::ev::{self, fork_spec};
use lineage_testkit::process::{
    Helper, after_marker, helper_job, report_line, rerun_this_test, wait_for_line,
};
use serde_json::Value;

/// Creation time of every session built here: 2025-06-15T15:06:40Z.
const T0: i64 = 1_750_000_000_000;
const DAY: i64 = 86_400_000;

/// `lineage verify STORE` passes, and says how many sessions it checked.
fn verify_clean(path: &Path, sessions: usize) {
    let report = run(&["verify", s(path), "--json"]).ok().json();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["sessions"], sessions, "{report}");
}

/// `turns` completed turns from seq 0, one event a second from `start_ms`.
fn turns(turns: u32, start_ms: i64) -> Vec<Event> {
    let mut bodies = Vec::new();
    for turn in 1..=turns {
        let n = u64::from(turn) * 2;
        bodies.extend(ev::completed_turn(
            turn,
            ev::mid(n),
            &format!("question {turn}"),
            ev::mid(n + 1),
            "answer",
        ));
    }
    ev::numbered(0, start_ms, 1_000, bodies)
}

fn root(store: &Store, start_ms: i64) -> SessionId {
    let id = SessionId::new();
    let header = Header::new(id, u64::try_from(T0).unwrap()).with_cwd("/work/project");
    store.import(header, &turns(2, start_ms)).unwrap();
    id
}

fn fork(store: &Store, parent: SessionId, time_ms: i64) -> SessionId {
    let child = SessionId::new();
    store
        .fork(
            parent,
            &fork_spec(child, None, u64::try_from(time_ms).unwrap(), 0),
        )
        .unwrap();
    child
}

fn ls_ids(path: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["ls", s(path), "--json"];
    args.extend_from_slice(extra);
    run(&args)
        .ok()
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["id"].as_str().unwrap().to_owned())
        .collect()
}

fn temp_store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.lineage");
    (dir, path)
}

#[test]
fn rm_refuses_a_session_with_descendants_deletes_a_leaf_and_a_subtree_and_verify_stays_clean() {
    let (_dir, path) = temp_store();
    let store = Store::open(&path).unwrap();
    let r = root(&store, T0);
    let f = fork(&store, r, T0 + 60_000);
    let g = fork(&store, f, T0 + 120_000);
    let o = root(&store, T0);
    store.close().unwrap();
    let p = s(&path);

    // The default rule refuses, naming the session and its descendants; nothing changes.
    let r_id = r.to_string();
    run(&["rm", p, &r_id]).fails(2, &[&r_id, "2 stored session(s)", "--subtree"]);
    assert_eq!(ls_ids(&path, &[]).len(), 4);
    verify_clean(&path, 4);

    // A leaf goes alone; the command verifies the store itself.
    let json = run(&["rm", p, &g.to_string(), "--json"]).ok().json();
    assert_eq!(json["deleted"], serde_json::json!([g.to_string()]));
    assert_eq!(
        json["events"], 14,
        "13 inherited and its own session/lineage"
    );
    assert!(json["bytes"].as_u64().unwrap() > 0);
    assert_eq!(json["verify"]["ok"], true);
    assert_eq!(json["verify"]["sessions"], 3);
    verify_clean(&path, 3);

    // The subtree, by an id prefix: the root and its fork.
    let prefix = &r_id[..r_id.len() - 4];
    let text = run(&["rm", p, prefix, "--subtree"]).ok().stdout;
    assert!(text.contains(&format!("deleted {r}")), "{text}");
    assert!(text.contains(&format!("deleted {f}")), "{text}");
    assert!(text.contains("2 session(s), 25 events"), "{text}");
    assert!(text.contains("verify: ok, 1 sessions intact"), "{text}");
    verify_clean(&path, 1);
    assert_eq!(ls_ids(&path, &[]), [o.to_string()]);
    let tree = run(&["tree", p]).ok().stdout;
    assert!(!tree.contains(&r_id), "{tree}");

    // Gone: naming it again is a usage error.
    run(&["rm", p, &r_id]).fails(2, &[&r_id, "is not in"]);
    run(&["rm", p, "zz"]).fails(2, &["not a session id"]);
    // The survivor is untouched.
    let listed = run(&["ls", p, "--json"]).ok().json();
    assert_eq!(listed[0]["events"], 12);
}

#[test]
fn tag_records_title_and_tags_and_ls_shows_and_filters_by_them() {
    let (_dir, path) = temp_store();
    let store = Store::open(&path).unwrap();
    let a = root(&store, T0);
    let b = root(&store, T0);
    let a_fork = fork(&store, a, T0 + 60_000);
    // A session whose log ends inside a turn is tagged without being repaired.
    let open = SessionId::new();
    let mut open_log = turns(1, T0);
    open_log.extend(ev::numbered(
        6,
        T0,
        1_000,
        [ev::turn_start(2), ev::step_start(2, 1)],
    ));
    store
        .import(Header::new(open, 1_750_000_000_000), &open_log)
        .unwrap();
    store.close().unwrap();
    let p = s(&path);
    let (a_id, b_id) = (a.to_string(), b.to_string());

    let json = run(&[
        "tag",
        p,
        &a_id,
        "user=alice",
        "team=core",
        "--title",
        "Parser fix",
        "--json",
    ])
    .ok()
    .json();
    assert_eq!(json["id"], a_id);
    assert_eq!(json["seq"], 12);
    assert_eq!(json["title"], "Parser fix");
    assert_eq!(
        json["tags"],
        serde_json::json!({"team": "core", "user": "alice"})
    );
    run(&["tag", p, &b_id, "user=bob"]).ok();
    let text = run(&["tag", p, &open.to_string(), "user=alice", "note=a=b c"])
        .ok()
        .stdout;
    assert!(text.contains("tags:  note=a=b c,user=alice"), "{text}");
    verify_clean(&path, 4);

    // ls shows them (the fork inherits none), and filters: every --tag must match.
    let listed = run(&["ls", p, "--json"]).ok().json();
    let row = |id: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(row(&a_id)["title"], "Parser fix");
    assert_eq!(row(&a_id)["tags"]["user"], "alice");
    assert_eq!(row(&a_fork.to_string())["title"], Value::Null);
    assert_eq!(row(&a_fork.to_string())["tags"], serde_json::json!({}));
    assert_eq!(row(&open.to_string())["open_turn"], 2, "not repaired");
    let table = run(&["ls", p]).ok().stdout;
    let header = table.lines().next().unwrap();
    assert!(
        header.contains("TITLE") && header.contains("TAGS"),
        "{header}"
    );
    let a_line = table.lines().find(|l| l.starts_with(&a_id)).unwrap();
    assert!(
        a_line.contains("Parser fix") && a_line.contains("team=core,user=alice"),
        "{a_line}"
    );

    let mut alice = ls_ids(&path, &["--tag", "user=alice"]);
    alice.sort();
    let mut want = vec![a_id.clone(), open.to_string()];
    want.sort();
    assert_eq!(alice, want);
    assert_eq!(
        ls_ids(&path, &["--tag", "user=alice", "--tag", "team=core"]),
        [a_id.as_str()]
    );
    assert!(ls_ids(&path, &["--tag", "user=bob", "--tag", "team=core"]).is_empty());
    assert_eq!(ls_ids(&path, &["--tag", "user=bob"]), [b_id.as_str()]);
    let filtered = run(&["ls", p, "--tag", "user=bob"]).ok().stdout;
    assert_eq!(
        filtered.lines().count(),
        2,
        "a title and one row:\n{filtered}"
    );

    // Changes: remove a tag and clear the title; last word wins.
    let json = run(&[
        "tag",
        p,
        &a_id,
        "--untag",
        "team",
        "--clear-title",
        "--json",
    ])
    .ok()
    .json();
    assert_eq!(json["title"], Value::Null);
    assert_eq!(json["tags"], serde_json::json!({"user": "alice"}));
    assert!(ls_ids(&path, &["--tag", "team=core"]).is_empty());
    // Without changes, tag only shows (and needs no writable open).
    let shown = run(&["tag", p, &b_id]).ok().stdout;
    assert!(
        shown.contains("title: -") && shown.contains("tags:  user=bob"),
        "{shown}"
    );

    // Bad input is a usage error, and nothing is written.
    let before = run(&["ls", p, "--json"]).ok().json();
    run(&["tag", p, &a_id, "useralice"]).fails(2, &["useralice", "KEY=VALUE"]);
    run(&["tag", p, &a_id, "a b=c"]).fails(2, &["a b", "whitespace"]);
    run(&["tag", p, &a_id, "=x"]).fails(2, &["empty"]);
    run(&["tag", p, &a_id, "--title", "x", "--clear-title"]).fails(2, &["--clear-title"]);
    run(&["ls", p, "--tag", "user"]).fails(2, &["--tag", "KEY=VALUE"]);
    assert_eq!(run(&["ls", p, "--json"]).ok().json(), before);
    verify_clean(&path, 4);
}

#[test]
fn prune_deletes_root_trees_by_last_activity_or_count_and_verifies() {
    let (_dir, path) = temp_store();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let store = Store::open(&path).unwrap();
    // Old and idle since: the root and its fork.
    let old = root(&store, now - 90 * DAY);
    let old_fork = fork(&store, old, now - 80 * DAY);
    // Old, but a fork of it was active an hour ago: the tree is recent.
    let revived = root(&store, now - 90 * DAY);
    let _revived_fork = fork(&store, revived, now - 3_600_000);
    // Recent, an hour and a half ago.
    let recent = root(&store, now - 5_400_000);
    store.close().unwrap();
    let p = s(&path);

    // A dry run says what would go and changes nothing.
    let json = run(&["prune", p, "--older-than", "30d", "--dry-run", "--json"])
        .ok()
        .json();
    assert_eq!(json["dry_run"], true);
    assert_eq!(json["deleted"].as_array().unwrap().len(), 1);
    assert_eq!(json["deleted"][0]["root"], old.to_string());
    assert_eq!(json["deleted"][0]["sessions"], 2);
    assert_eq!(json["roots_kept"], 2);
    assert_eq!(json["verify"], Value::Null);
    assert_eq!(ls_ids(&path, &[]).len(), 5);

    let json = run(&["prune", p, "--older-than", "30d", "--json"])
        .ok()
        .json();
    assert_eq!(json["dry_run"], false);
    assert_eq!(json["roots_deleted"], 1);
    assert_eq!(json["sessions_deleted"], 2);
    assert_eq!(json["events_deleted"], 12 + 13);
    assert_eq!(json["verify"]["ok"], true);
    assert_eq!(json["verify"]["sessions"], 3);
    verify_clean(&path, 3);
    let left = ls_ids(&path, &[]);
    assert!(!left.contains(&old.to_string()) && !left.contains(&old_fork.to_string()));

    // Nothing older than a day is left but the revived tree's root, whose tree is recent.
    let text = run(&["prune", p, "--older-than", "1d"]).ok().stdout;
    assert!(text.contains("pruned 0 of 2 root trees"), "{text}");
    assert!(text.contains("verify: ok, 3 sessions intact"), "{text}");

    // Keep the most recently active tree: the revived one (an hour ago) beats the recent root.
    let text = run(&["prune", p, "--keep", "1"]).ok().stdout;
    assert!(text.contains(&format!("deleted {recent}")), "{text}");
    assert!(text.contains("pruned 1 of 2 root trees"), "{text}");
    verify_clean(&path, 2);
    assert!(!ls_ids(&path, &[]).contains(&recent.to_string()));

    run(&["prune", p]).fails(2, &["--older-than", "--keep"]);
    run(&["prune", p, "--older-than", "5x"]).fails(2, &["\"5x\"", "duration"]);
    verify_clean(&path, 2);
}

/// The holder (the held-store test re-run with the store's path as its job): opens the store
/// for writing, says `holding`, and waits to be killed.
fn hold(path: &str) {
    let _store = Store::open(path).expect("the holder opens the store");
    report_line("holding");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_store_a_host_holds_for_writing_is_refused_by_the_writing_commands() {
    if let Some(path) = helper_job() {
        return hold(&path);
    }
    let (_dir, path) = temp_store();
    let store = Store::open(&path).unwrap();
    let a = root(&store, T0);
    store.close().unwrap();
    let p = s(&path);
    let mut holder = Helper::spawn(&mut rerun_this_test(&path));
    let lines = holder.lines();
    wait_for_line(&lines, |l| after_marker(l, "holding").map(drop));

    let a_id = a.to_string();
    let held = "is open for writing by another process";
    run(&["rm", p, &a_id]).fails(3, &[p, held]);
    run(&["tag", p, &a_id, "user=alice"]).fails(3, &[p, held]);
    run(&["prune", p, "--keep", "0"]).fails(3, &[p, held]);
    // Reading needs no writer: ls, a dry run and showing tags still work.
    assert_eq!(ls_ids(&path, &[]), [a_id.as_str()]);
    run(&["prune", p, "--keep", "0", "--dry-run"]).ok();
    run(&["tag", p, &a_id]).ok();
    holder.kill();
    // Once the host is gone, the writing commands work (the first recovers the file).
    run(&["tag", p, &a_id, "user=alice"]).ok();
    verify_clean(&path, 1);
    run(&["prune", p, "--keep", "0"]).ok();
    verify_clean(&path, 0);
}
