//! The store's layering: each engine's crate is named only in its own wing. Code outside
//! `src/engine/redb/` never names `redb`, and code outside `src/engine/postgres/` never names
//! `tokio_postgres`, so the seam (`src/engine/mod.rs`) and every operation above it work on any
//! engine. Comments may mention the engines; code may not.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The code of a line: what precedes a `//` comment (string contents included, which is
/// stricter than needed).
fn code_of(line: &str) -> &str {
    line.find("//").map_or(line, |at| &line[..at])
}

/// Whether `code` names the crate `name` as a path (`name::…` or `::name::…`), as opposed to a
/// module of the same name inside a longer path (`engine::redb::…`).
fn names_crate(code: &str, name: &str) -> bool {
    let pattern = format!("{name}::");
    code.match_indices(&pattern).any(|(at, _)| {
        let before = &code[..at];
        let before = before.strip_suffix("::").unwrap_or(before);
        !before.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
    })
}

/// The places outside `wing` whose code names `krate`.
fn outside_its_wing(krate: &str, wing: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let wing = src.join(wing);
    let mut found = Vec::new();
    let files = sources(&src);
    assert!(files.len() > 20, "the sources are at {}", src.display());
    for file in files.iter().filter(|f| !f.starts_with(&wing)) {
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            if names_crate(code_of(line), krate) {
                let shown = file.strip_prefix(&src).unwrap().display();
                found.push(format!("src/{shown}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn each_engine_crate_is_named_only_in_its_wing() {
    for (krate, wing) in [
        ("redb", "engine/redb"),
        ("tokio_postgres", "engine/postgres"),
    ] {
        let found = outside_its_wing(krate, wing);
        assert!(
            found.is_empty(),
            "{krate} named outside src/{wing}:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn a_crate_path_is_told_from_a_module_of_the_same_name() {
    assert!(names_crate("use redb::ReadableTable;", "redb"));
    assert!(names_crate("let db = ::redb::Database::open(p);", "redb"));
    assert!(names_crate("Err(redb::Error::Io(e))", "redb"));
    assert!(!names_crate("use crate::engine::redb::tables;", "redb"));
    assert!(!names_crate("engine::redb::open(p)", "redb"));
    assert!(!names_crate("let predb::x = 1;", "redb"));
    assert_eq!(code_of("let a = 1; // redb::Error"), "let a = 1; ");
}
