//! Any bytes as a store file on disk, inspected through the `lineage` command in-process
//! (`lineage_cli::run`): `ls`, `tree`, `verify`, `stats`, and for each listed session (the first
//! few) `show`, `fold`, `verify <id>`, `tail` and `export`, in text and JSON. The store's
//! contained engine panics are a normal outcome here (see `lineage_fuzz::panics`); any other panic
//! crashes the fuzzer. What must hold:
//!
//! - every command exits 0, 1, 2 or 3, and says why on stderr in lines prefixed `lineage: ` when
//!   it exits 2 or 3; a command naming a listed session never exits 2 (usage);
//! - `verify` never exits 0 when the storage engine failed under it;
//! - JSON output of a command that exited 0 parses, and `ls --json` lists the sessions
//!   `Store::open_read_only` lists;
//! - nothing is written: the file keeps its bytes and no other file appears beside it.
//!
//! An input whose commands have spent their time (`lineage_fuzz::watchdog::spent`: a damaged page
//! reference costs about a second a read) has its remaining sessions left unshown; the file is
//! still checked for writes.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lineage_fuzz::panics::{contain_engine_panics, contained, store_call, store_drop};
use lineage_fuzz::watchdog;
use lineage_store::Store;

/// Sessions past this many are listed but not shown one by one, so one execution stays short.
const SESSIONS_SHOWN: usize = 3;

/// A directory of this process's own, holding only the store file.
fn workdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lineage-fuzz-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    })
}

struct Outcome {
    code: i32,
    out: Vec<u8>,
    err: String,
}

fn lineage(args: &[&str]) -> Outcome {
    let mut argv = vec!["lineage"];
    argv.extend_from_slice(args);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (code, engine_panics) = contained(&argv.join(" "), || {
        lineage_cli::run(argv.iter().copied(), &mut out, &mut err)
    });
    let err = String::from_utf8(err).expect("stderr is UTF-8");
    assert!(
        matches!(code, 0..=3),
        "{argv:?} exited {code}, not one of the documented codes 0-3; stderr: {err}"
    );
    if code >= 2 {
        assert!(
            !err.is_empty(),
            "{argv:?} exited {code} without a word on stderr"
        );
    }
    for line in err.lines() {
        assert!(
            line.starts_with("lineage: "),
            "{argv:?} wrote a stray stderr line: {line:?}"
        );
    }
    if args[0] == "verify" && engine_panics > 0 {
        assert_ne!(
            code, 0,
            "{argv:?} exited 0 although the storage engine failed under it"
        );
    }
    Outcome { code, out, err }
}

fn json_ok(args: &[&str]) -> Option<serde_json::Value> {
    let o = lineage(args);
    if o.code != 0 {
        return None;
    }
    let text = String::from_utf8(o.out).expect("stdout is UTF-8");
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{args:?} exited 0 with output that is not JSON ({e}): {text}"));
    Some(value)
}

fuzz_target!(init: contain_engine_panics(), |data: &[u8]| {
    let dir = workdir();
    let file = dir.join("store.lineage");
    std::fs::write(&file, data).expect("the store file is written");
    let path = file.to_str().expect("a UTF-8 temporary path");
    watchdog::begin_input();

    let listed = match store_call("open_read_only", || Store::open_read_only(&file)) {
        Ok(store) => {
            let listed = store_call("list", || store.list()).ok();
            store_drop("drop", store);
            listed
        }
        Err(_) => None,
    };

    if let Some(ls) = json_ok(&["ls", path, "--json"]) {
        let ids: Vec<&str> = ls
            .as_array()
            .expect("ls --json prints an array")
            .iter()
            .map(|row| row["id"].as_str().expect("each row has an id"))
            .collect();
        let listed = listed.as_ref().expect("ls succeeded, so the store lists");
        let expected: Vec<String> = listed.iter().map(|i| i.header.id.to_string()).collect();
        assert_eq!(ids, expected, "ls --json lists what the store lists");
    }
    lineage(&["ls", path]);
    lineage(&["tree", path]);
    json_ok(&["tree", path, "--json"]);
    lineage(&["verify", path]);
    json_ok(&["verify", path, "--json"]);
    lineage(&["stats", path]);
    json_ok(&["stats", path, "--json"]);

    for info in listed.iter().flatten().take(SESSIONS_SHOWN) {
        if watchdog::spent() {
            break;
        }
        let id = info.header.id.to_string();
        let id = id.as_str();
        for args in [
            &["show", path, id][..],
            &["show", path, id, "--chunks", "--full", "--from", "1", "--limit", "8"],
            &["fold", path, id],
            &["verify", path, id],
            &["tail", "-n", "3", path, id],
            &["tree", path, id],
            &["export", path, id],
        ] {
            let o = lineage(args);
            assert_ne!(o.code, 2, "{args:?} names a listed session but exits 2: {}", o.err);
        }
        json_ok(&["show", path, id, "--json"]);
        json_ok(&["fold", path, id, "--json"]);
    }

    let after = std::fs::read(&file).expect("the store file reads back");
    assert!(after == data, "a read-only command changed the store file");
    let entries: Vec<_> = std::fs::read_dir(dir)
        .expect("the scratch directory lists")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(entries, ["store.lineage"], "a read-only command created a file");
});
