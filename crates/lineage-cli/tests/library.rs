//! `lineage_cli::run`, the whole command in-process: the arguments in, both streams as buffers,
//! the exit code out.

use lineage_log::{Header, SessionId};
use lineage_store::Store;
use lineage_testkit::realistic_session;

/// Runs `lineage args` in-process, returning the exit code, stdout and stderr.
fn run(args: &[&str]) -> (i32, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let argv = std::iter::once("lineage").chain(args.iter().copied());
    let code = lineage_cli::run(argv, &mut out, &mut err);
    (
        code,
        String::from_utf8(out).expect("UTF-8 stdout"),
        String::from_utf8(err).expect("UTF-8 stderr"),
    )
}

#[test]
fn help_and_version_are_written_to_the_output_buffer() {
    let (code, out, err) = run(&["--version"]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(out.starts_with("lineage "), "{out}");
    let (code, out, err) = run(&["--help"]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(out.contains("Exit codes:"), "{out}");
}

#[test]
fn failures_are_one_sentence_in_the_error_buffer_with_their_exit_code() {
    let (code, out, err) = run(&[]);
    assert_eq!(code, 2);
    assert_eq!(out, "");
    assert_eq!(err, "lineage: no command given; try 'lineage --help'\n");

    let (code, _, err) = run(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.starts_with("lineage: unrecognized subcommand"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.lineage");
    let (code, out, err) = run(&["ls", absent.to_str().unwrap()]);
    assert_eq!(code, 3);
    assert_eq!(out, "");
    assert!(
        err.starts_with("lineage: ") && err.contains("no such file"),
        "{err}"
    );
    assert!(!absent.exists());
}

#[test]
fn a_command_writes_its_output_to_the_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lineage");
    let id = SessionId::new();
    {
        let store = Store::open(&path).unwrap();
        store
            .import(
                Header::new(id, 1_750_000_000_000),
                &realistic_session(3, 200),
            )
            .unwrap();
        store.close().unwrap();
    }
    let (code, out, err) = run(&["export", path.to_str().unwrap(), &id.to_string()]);
    assert_eq!((code, err.as_str()), (0, ""));
    // The session line, then one line per event.
    assert_eq!(
        out.lines().count() as u64,
        Store::open_read_only(&path).unwrap().info(id).unwrap().len + 1
    );
}
