//! `lineage upgrade STORE`: a store in store format 1 (before packed blocks) is rewritten in this
//! build's format, then verified; until then every inspection command reads it and every writing
//! command refuses it, naming the upgrade. A `lineage upgrade` killed with SIGKILL at any moment
//! leaves the old store or the new one, whole, at the path, and the next upgrade completes and
//! removes what the killed one left.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{run, s};
use lineage_log::{Event, Header, SessionId};
use lineage_store::{SessionInfo, Store, StoreError};
use lineage_testkit::files::names_in;
use lineage_testkit::store_v1::{golden_copy, write_store};
use lineage_testkit::{SplitMix64, realistic_session};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// The golden sessions `…a1`, `…b2` and `…c3`.
const A1: &str = "019b76da-a800-7000-8000-0000000000a1";
const B2: &str = "019b76da-a800-7000-8000-0000000000b2";
const C3: &str = "019b76da-a800-7000-8000-0000000000c3";

/// Held by every test here: the crash test times an upgrade and kills at moments of it, which the
/// other tests' processes would skew.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Serializes the tests of this file (a failed test's poison is no reason to fail the others).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The store format version in a closed store file's `meta` table.
fn format_version(path: &Path) -> u32 {
    let meta: TableDefinition<&str, &[u8]> = TableDefinition::new("lineage/meta");
    let db = redb::Database::open(path).expect("a redb file");
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(meta).unwrap();
    let version = table
        .get("format_version")
        .unwrap()
        .expect("a format version");
    u32::from_le_bytes(version.value().try_into().expect("4 bytes"))
}

/// `lineage upgrade` on the golden format-1 store: exit 0, one line saying what it rewrote (`from
/// format v1 to v2: 3 session(s), 6057 events`), then the verify of the upgraded store, clean; with
/// `--json`, the same as fields. A second run says the store is in format v2 already and verifies
/// it again. Every session reads the same through `lineage export` before and after.
#[test]
fn upgrade_rewrites_the_golden_store_and_verifies_it() {
    let _serial = serial();
    let (dir, path) = golden_copy("sessions.redb");
    let exports: Vec<String> = [A1, B2, C3]
        .iter()
        .map(|id| run(&["export", s(&path), id]).ok().stdout)
        .collect();

    let r = run(&["upgrade", s(&path)]).ok();
    assert_eq!(
        r.stdout,
        format!(
            "upgraded {} from format v1 to v2: 3 session(s), 6057 events\n\
             verify: ok, 3 sessions intact\n",
            path.display()
        )
    );
    assert_eq!(format_version(&path), 2);
    assert_eq!(
        names_in(dir.path()),
        ["sessions.redb"],
        "no temporary file left"
    );
    for (id, before) in [A1, B2, C3].iter().zip(&exports) {
        let after = run(&["export", s(&path), id]).ok().stdout;
        assert!(&after == before, "{id} exports the same after the upgrade");
    }

    let r = run(&["upgrade", s(&path)]).ok();
    assert_eq!(
        r.stdout,
        format!(
            "{} is in format v2 already\nverify: ok, 3 sessions intact\n",
            path.display()
        )
    );

    let (_dir, path) = golden_copy("sessions.redb");
    let json = run(&["upgrade", s(&path), "--json"]).ok().json();
    assert_eq!(
        json,
        serde_json::json!({
            "from": 1,
            "to": 2,
            "sessions": 3,
            "events": 6057,
            "verify": {"ok": true, "sessions": 3, "problems": []},
        })
    );
    let json = run(&["upgrade", s(&path), "--json"]).ok().json();
    assert_eq!(
        json,
        serde_json::json!({
            "from": 2,
            "to": 2,
            "sessions": 0,
            "events": 0,
            "verify": {"ok": true, "sessions": 3, "problems": []},
        })
    );
}

/// A format-1 store is read-only until it is upgraded: `lineage tag`, a writing command, exits 3
/// with one sentence saying the store opens read-only and to run `lineage upgrade` on it, leaving
/// the session untagged; every inspection command (`ls`, `tree`, `show`, `fold`, `verify`, `tail`,
/// `export`, `stats`) exits 0 on it and shows its sessions. After `lineage upgrade` the same tag is
/// written.
#[test]
fn a_format_1_store_is_read_only_until_upgraded() {
    let _serial = serial();
    let (_dir, path) = golden_copy("sessions.redb");
    let p = s(&path);
    let r = run(&["tag", p, C3, "reviewed=yes"]).fails(3, &["read-only", "lineage upgrade", p]);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert_eq!(format_version(&path), 1, "still format 1");

    let ls = run(&["ls", p]).ok().stdout;
    for id in [A1, B2, C3] {
        assert!(ls.contains(id), "ls lists {id}:\n{ls}");
    }
    let tree = run(&["tree", p]).ok().stdout;
    assert!(tree.contains(A1) && tree.contains(B2), "{tree}");
    let shown = run(&["show", p, C3]).ok().stdout;
    assert!(shown.contains("hello"), "{shown}");
    run(&["show", p, A1, "--from", "3000"]).ok();
    run(&["fold", p, B2]).ok();
    let verified = run(&["verify", p]).ok().stdout;
    assert!(verified.contains("3 sessions"), "{verified}");
    let tail = run(&["tail", p, A1, "-n", "3"]).ok().stdout;
    assert!(!tail.is_empty());
    let exported = run(&["export", p, B2]).ok().stdout;
    assert_eq!(
        exported.lines().count(),
        1 + 3029,
        "a session line, then every event"
    );
    let stats = run(&["stats", p, "--json"]).ok().json();
    assert_eq!(stats["sessions"], 3, "{stats}");
    assert_eq!(stats["events"], 6057, "{stats}");
    let tags = run(&["tag", p, C3, "--json"]).ok().json();
    assert!(tags.to_string().contains("golden"), "{tags}");
    assert_eq!(format_version(&path), 1, "inspection changed nothing");

    run(&["upgrade", p]).ok();
    run(&["tag", p, C3, "reviewed=yes"]).ok();
    let tags = run(&["tag", p, C3, "--json"]).ok().json();
    assert!(tags.to_string().contains("reviewed"), "{tags}");
    run(&["verify", p]).ok();
}

/// What a store holds, session by session: its info (header, length, head digest, revision) and
/// its stored events.
type Contents = BTreeMap<SessionId, (SessionInfo, Vec<Event>)>;

/// How much [`assert_holds`] reads.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// `verify` (every block's digest, the rules, the headers) and every event compared.
    Whole,
    /// The sessions' info only: each length and head digest (which a verify the caller saw has
    /// checked against every block's records) stands for the events.
    Info,
}

/// Reads `path` read-only and fails unless every session's info (header, length, head digest,
/// revision) is `expected`'s and, with [`Check::Whole`], `verify` finds the store intact and every
/// event is `expected`'s, read by a checked scan.
fn assert_holds(path: &Path, expected: &Contents, check: Check, when: &str) {
    let store = Store::open_read_only(path)
        .unwrap_or_else(|e| panic!("{when}: the store does not open read-only: {e}"));
    if check == Check::Whole {
        let report = store.verify().expect("verify runs");
        assert!(report.is_ok(), "{when}: verify found problems: {report:?}");
    }
    let list = store.list().unwrap();
    assert_eq!(
        list.iter().map(|i| i.header.id).collect::<Vec<_>>(),
        expected.keys().copied().collect::<Vec<_>>(),
        "{when}: the sessions"
    );
    for (info, (id, (want, events))) in list.iter().zip(expected) {
        assert_eq!(info, want, "{when}: {id}'s header, len, head and revision");
        if check == Check::Whole {
            let mut seq = 0;
            for (event, want) in store.scan(*id, 0).unwrap().zip(events) {
                assert!(
                    event.expect("a checked read") == *want,
                    "{when}: {id}'s event {seq}"
                );
                seq += 1;
            }
            assert_eq!(seq, events.len(), "{when}: {id}'s events");
        }
    }
}

/// How a killed upgrade left the store at its path.
#[derive(Debug, PartialEq)]
enum Left {
    /// The old store (format 1): a writable open is refused, naming the upgrade.
    Old,
    /// The new store (format 2): it opens for writing.
    New,
}

/// Whether the store at `path` is the old one or the new one, by opening it for writing.
fn which(path: &Path, when: &str) -> Left {
    match Store::open(path) {
        Err(StoreError::UpgradeRequired { found: 1, .. }) => Left::Old,
        Ok(store) => {
            store.close().unwrap();
            Left::New
        }
        Err(e) => panic!("{when}: the store neither refuses nor takes a writer: {e}"),
    }
}

/// `lineage upgrade` killed with SIGKILL at many moments of its run leaves, every time, either the
/// old format-1 store or the new format-2 store at the path, never neither and never a mix: it
/// opens read-only, verify finds it intact, and every session's header, length, head digest,
/// revision and events are the original's. A fresh `lineage upgrade` then completes (saying what
/// it rewrote, or that the store is in format v2 already), the store holds the same again, and no
/// temporary file of the killed upgrade is left beside it.
///
/// The kills land at 30 moments spread evenly over 1.2 times an uninterrupted run's duration (the
/// median of the last three timed runs, as the machine's load changes), and 6 more drawn with a
/// fixed seed; a few more drawn ones only while one side of the rename is still unseen. The test
/// fails unless both sides were seen, some kill leaving the old store and some kill of a process
/// still running leaving the new one, and some kill left a temporary file for the next upgrade to
/// remove.
#[test]
fn a_killed_upgrade_leaves_the_old_store_or_the_new_one() {
    let _serial = serial();
    let test_started = Instant::now();
    let work = tempfile::tempdir().unwrap();
    let original = work.path().join("original.redb");
    let sessions: Vec<(Header, Vec<Event>)> = (1..=SESSIONS)
        .map(|n| {
            let id = SessionId::from_u128(0x019b_76da_a800_7000_8000_0000_0000_0000 | n as u128);
            let header = Header::new(id, 1_767_225_600_000 + n).with_cwd("/work/crash");
            (header, realistic_session(n, EVENTS_PER_SESSION))
        })
        .collect();
    write_store(&original, &sessions);
    let total: usize = sessions.iter().map(|(_, e)| e.len()).sum();
    let expected: Contents = {
        let store = Store::open_read_only(&original).unwrap();
        sessions
            .iter()
            .map(|(header, events)| {
                let info = store.info(header.id).unwrap();
                assert_eq!(&info.header, header);
                (header.id, (info, events.clone()))
            })
            .collect()
    };
    assert_holds(&original, &expected, Check::Whole, "the original");
    let store_name = "store.redb";
    let fresh_copy = |attempt: &str| -> (PathBuf, PathBuf) {
        let dir = work.path().join(attempt);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join(store_name);
        std::fs::copy(&original, &path).unwrap();
        (dir, path)
    };
    let spawn = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_lineage"))
            .arg("upgrade")
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lineage runs")
    };

    // Uninterrupted runs, to learn how long an upgrade takes. The machine's load changes while
    // the test runs (other tests, builds), so every later uninterrupted upgrade (the one after a
    // kill that left the old store) is timed too, and the kills are placed by the median of the
    // last three.
    let mut samples: Vec<Duration> = Vec::new();
    for run in 0..3 {
        let (dir, path) = fresh_copy(&format!("calibration-{run}"));
        let started = Instant::now();
        let output = spawn(&path).wait_with_output().unwrap();
        samples.push(started.elapsed());
        assert!(output.status.success(), "{output:?}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            stdout.contains(&format!(
                "from format v1 to v2: {SESSIONS} session(s), {total} events"
            )),
            "{stdout}"
        );
        assert_holds(&path, &expected, Check::Info, "an uninterrupted upgrade");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    let estimate = |samples: &[Duration]| {
        let mut last: Vec<Duration> = samples[samples.len() - 3..].to_vec();
        last.sort();
        last[1]
    };
    eprintln!(
        "uninterrupted upgrades of {total} events took {samples:?}: kills spread over 1.2 x {:?}",
        estimate(&samples)
    );

    // Where in a run each kill lands, as a fraction of the estimated duration: evenly spread, then
    // drawn with a fixed seed; then, only while one side of the rename has not been seen yet (a
    // sudden change of load), more drawn ones, up to a bound.
    let mut rng = SplitMix64::new(0x5eed_c4a5);
    let mut draw = move || rng.below(1_200_000) as f64 / 1_000_000.0;
    let mut fractions: Vec<f64> = (0..EVEN_KILLS)
        .map(|i| 1.2 * i as f64 / EVEN_KILLS as f64)
        .collect();
    fractions.extend((0..RANDOM_KILLS).map(|_| draw()));

    let (mut old, mut new, mut finished, mut leftovers, mut extra) = (0, 0, 0, 0, 0);
    let (mut check_time, mut upgrade_time) = (Duration::ZERO, Duration::ZERO);
    let mut attempt = 0;
    loop {
        let fraction = match fractions.get(attempt) {
            Some(&fraction) => fraction,
            None if (old == 0 || new == 0) && extra < MAX_EXTRA_KILLS => {
                extra += 1;
                draw()
            }
            None => break,
        };
        let offset = estimate(&samples).mul_f64(fraction);
        let when = format!("kill {attempt} at {offset:?} ({fraction:.3} of a run)");
        let (dir, path) = fresh_copy(&format!("attempt-{attempt}"));
        let mut child = spawn(&path);
        std::thread::sleep(offset);
        let _ = child.kill();
        let status = child.wait().unwrap();
        let killed = status.code().is_none();
        if !killed {
            assert!(status.success(), "{when}: the upgrade failed: {status:?}");
        }
        let names = names_in(&dir);
        let temporary = format!(".{store_name}.upgrading.");
        for name in &names {
            assert!(
                name == store_name || name.starts_with(&temporary),
                "{when}: unexpected file {name}"
            );
        }
        let leftover = names.iter().any(|n| n.starts_with(&temporary));
        leftovers += usize::from(leftover);

        // Everything after the kill; after the next upgrade (which verified the store) the head
        // digests stand for the events, read whole every eighth time.
        let checking = Instant::now();
        assert_holds(&path, &expected, Check::Whole, &when);
        check_time += checking.elapsed();
        let left = which(&path, &when);
        match (&left, killed) {
            (Left::Old, _) => old += 1,
            (Left::New, true) => new += 1,
            (Left::New, false) => finished += 1,
        }
        assert!(
            left == Left::New || killed,
            "{when}: a finished upgrade left the old store"
        );
        assert!(
            !(leftover && left == Left::New),
            "{when}: a temporary file beside the new store: {names:?}"
        );
        assert_eq!(format_version(&path), if left == Left::Old { 1 } else { 2 });

        let upgrading = Instant::now();
        let r = run(&["upgrade", s(&path)]).ok();
        let took = upgrading.elapsed();
        upgrade_time += took;
        let said = match left {
            Left::Old => {
                samples.push(took);
                format!("from format v1 to v2: {SESSIONS} session(s), {total} events")
            }
            Left::New => "is in format v2 already".to_owned(),
        };
        assert!(r.stdout.contains(&said), "{when}: {}", r.stdout);
        assert!(
            r.stdout
                .contains(&format!("verify: ok, {SESSIONS} sessions intact")),
            "{when}: {}",
            r.stdout
        );
        assert_eq!(
            names_in(&dir),
            [store_name],
            "{when}: the upgrade removed what the killed one left"
        );
        let check = if attempt % 8 == 0 {
            Check::Whole
        } else {
            Check::Info
        };
        assert_holds(&path, &expected, check, &format!("{when}, upgraded"));
        assert_eq!(which(&path, &when), Left::New);
        std::fs::remove_dir_all(&dir).unwrap();
        attempt += 1;
    }
    eprintln!(
        "{attempt} kills ({extra} beyond the planned {}): {old} left the old store ({leftovers} \
         with a temporary file beside it), {new} the new one, {finished} came after the upgrade \
         finished",
        EVEN_KILLS + RANDOM_KILLS
    );
    eprintln!(
        "checks after the kills {check_time:?}, upgrades after them {upgrade_time:?}, \
         {:?} in all",
        test_started.elapsed()
    );
    assert!(old > 0, "no kill landed before the rename");
    assert!(
        new > 0,
        "no kill landed after the rename while the upgrade still ran"
    );
    assert!(
        leftovers > 0,
        "no kill left a temporary file for the next upgrade to remove"
    );
}

/// Sessions of the crash test's store, each `realistic_session(n, EVENTS_PER_SESSION)`.
const SESSIONS: u64 = 4;
/// Events per session of the crash test's store: enough that an upgrade of the test build (whose
/// own crates are not optimized) takes about half a second, few enough that the test's three dozen
/// kills, each checked and upgraded again, stay well under a minute on two cores.
const EVENTS_PER_SESSION: usize = 8_000;
/// Kills at evenly spread moments.
const EVEN_KILLS: usize = 30;
/// Kills at moments drawn with a fixed seed.
const RANDOM_KILLS: usize = 6;
/// The most kills added while one side of the rename has not been seen.
const MAX_EXTRA_KILLS: usize = 12;
