//! Truncated and garbled store files: every command refuses them with exit 3 and one sentence of
//! Lineage's own that names the file and says what is wrong, never the storage engine's words
//! (nor a panic's).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lineage_log::{Header, SessionId};
use lineage_store::Store;
use lineage_testkit::{SplitMix64, realistic_session};

/// Words of the storage engine (and of the I/O errors it passes on) that must never reach a
/// person: they describe its internals, not the file.
const ENGINE_WORDS: &[&str] = &[
    "redb",
    "I/O error",
    "failed to fill whole buffer",
    "Previous I/O error",
    "close and re-open",
    "magic number",
    "DB corrupted",
    "storage error",
    "Storage backend",
    "panicked",
    "unreachable",
    "backtrace",
    "btree",
    "read past the end of the storage",
];

/// The page size of the files the store writes.
const PAGE: usize = 4096;

fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}

/// What one run of `lineage` did.
struct Run {
    args: Vec<String>,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lineage"));
    command.args(args);
    collect(args, command)
}

/// Runs `command` (the `lineage` binary given `args`, however it is started) to its end.
fn collect(args: &[&str], mut command: Command) -> Run {
    let output = command
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    Run {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

impl Run {
    /// Asserts that nothing printed carries the engine's words, and that stderr is at most one
    /// sentence `lineage: …`.
    fn speaks_lineage(&self) -> &Self {
        for word in ENGINE_WORDS {
            assert!(
                !self.stderr.contains(word) && !self.stdout.contains(word),
                "{:?} printed the engine's {word:?}:\nstdout: {}\nstderr: {}",
                self.args,
                self.stdout,
                self.stderr
            );
        }
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert!(
            lines.len() <= 1 && lines.iter().all(|l| l.starts_with("lineage: ")),
            "{:?}: at most one sentence on stderr: {:?}",
            self.args,
            self.stderr
        );
        self
    }

    /// Asserts exit 3 and one sentence that names `path` and contains `what`.
    fn refuses(&self, path: &Path, what: &str) -> &Self {
        self.speaks_lineage();
        assert_eq!(
            self.code,
            Some(3),
            "{:?}: exit 3 expected\nstdout: {}\nstderr: {}",
            self.args,
            self.stdout,
            self.stderr
        );
        assert!(
            self.stderr.contains(s(path)),
            "{:?}: the sentence names the file: {}",
            self.args,
            self.stderr
        );
        assert!(
            self.stderr.contains(what),
            "{:?}: the sentence says {what:?}: {}",
            self.args,
            self.stderr
        );
        self
    }
}

/// A store of one large realistic session (most of the file) and two small ones, closed.
fn store(dir: &Path) -> (PathBuf, SessionId, Vec<u8>) {
    let path = dir.join("intact.lineage");
    let store = Store::open(&path).unwrap();
    let large = SessionId::new();
    store
        .import(
            Header::new(large, 1_750_000_000_000),
            &realistic_session(31, 4_000),
        )
        .unwrap();
    for seed in [32, 33] {
        store
            .import(
                Header::new(SessionId::new(), 1_750_000_000_000),
                &realistic_session(seed, 60),
            )
            .unwrap();
    }
    store.close().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    (path, large, bytes)
}

/// Every command on `path` (about `session` where one is named).
fn every_command(path: &Path, session: SessionId) -> Vec<Run> {
    let p = s(path);
    let id = session.to_string();
    vec![
        run(&["ls", p]),
        run(&["tree", p]),
        run(&["show", p, &id]),
        run(&["show", p, &id, "--json"]),
        run(&["fold", p, &id]),
        run(&["verify", p]),
        run(&["tail", p, &id]),
        run(&["export", p, &id]),
        run(&["stats", p]),
    ]
}

#[test]
fn a_truncated_store_is_said_to_be_cut_short_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let (_, session, bytes) = store(dir.path());
    let len = bytes.len();
    let cut = dir.path().join("cut.lineage");
    // Inside the engine's header, inside its first pages, and through the session's blocks.
    for at in [
        100,
        2_000,
        PAGE + 10,
        3 * PAGE,
        len / 4,
        len / 2,
        len * 3 / 4,
    ] {
        std::fs::write(&cut, &bytes[..at]).unwrap();
        for r in every_command(&cut, session) {
            // `tree` reads only headers and `tail` only the last events: what they need may be
            // whole. Every other command reads every block of the session or of the store.
            let partial = matches!(r.args[0].as_str(), "tree" | "tail");
            if partial && r.code == Some(0) {
                r.speaks_lineage();
                continue;
            }
            r.refuses(&cut, "is cut short");
            assert!(
                r.stderr.contains(&format!("it holds {at} bytes")),
                "{}",
                r.stderr
            );
        }
    }
}

#[test]
fn a_store_with_garbled_pages_is_said_to_be_damaged_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let (_, session, bytes) = store(dir.path());
    let mut rng = SplitMix64::new(0x9a7b);
    let mut noise = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.next_u64() as u8).collect() };

    // Every page after the engine's header overwritten with noise: the tables are gone.
    let garbled = dir.path().join("garbled.lineage");
    let mut copy = bytes.clone();
    let rest = copy.len() - PAGE;
    copy[PAGE..].copy_from_slice(&noise(rest));
    std::fs::write(&garbled, &copy).unwrap();
    for r in every_command(&garbled, session) {
        r.refuses(&garbled, "is damaged");
    }

    // The engine's header overwritten: it could be any file.
    let headless = dir.path().join("headless.lineage");
    let mut copy = bytes.clone();
    copy[..512].copy_from_slice(&noise(512));
    std::fs::write(&headless, &copy).unwrap();
    for r in every_command(&headless, session) {
        r.refuses(
            &headless,
            "is not a Lineage store, or its header is damaged",
        );
    }
}

#[test]
fn a_garbled_page_anywhere_gets_one_sentence_of_lineage_s_own() {
    let dir = tempfile::tempdir().unwrap();
    let (_, session, bytes) = store(dir.path());
    let mut rng = SplitMix64::new(0x51ce);
    let one = dir.path().join("one-page.lineage");
    let id = session.to_string();
    // One page at a time: some land in a block (a digest catches it: exit 1, Lineage's sentence
    // about the session), some in the engine's pages (exit 3, the file is damaged), some in free
    // space (nothing to say). None may print the engine's words or a panic.
    let mut refused = 0;
    for page in 1..bytes.len() / PAGE {
        let mut copy = bytes.clone();
        for byte in &mut copy[page * PAGE..(page + 1) * PAGE] {
            *byte = rng.next_u64() as u8;
        }
        std::fs::write(&one, &copy).unwrap();
        for args in [
            vec!["ls", s(&one)],
            vec!["show", s(&one), &id],
            vec!["verify", s(&one)],
        ] {
            let r = run(&args);
            r.speaks_lineage();
            assert!(
                matches!(r.code, Some(0 | 1 | 3)),
                "{args:?}: exit {:?}\n{}",
                r.code,
                r.stderr
            );
            // Exit 3 is about the file, or (for a record whose flags a reader cannot know)
            // about a session.
            if r.code == Some(3) && r.stderr.contains(s(&one)) {
                r.refuses(&one, "damaged");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "some garbled page hit the engine's own pages");
}

/// The address space a command runs in below: a damaged block that asked for its claimed size
/// would not fit, while what the store's limits let one block take does.
const ADDRESS_SPACE_KIB: u64 = 1 << 20;

/// `lineage args…` in a shell that first limits its address space.
fn run_limited(args: &[&str]) -> Run {
    let script = format!("ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" \"$@\"");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_lineage"))
        .args(args);
    collect(args, command)
}

/// A block of the large session replaced by one whose compressed body records `raw_len` bytes
/// and holds `payload`, its record count kept. Returns the block's first seq.
fn plant(path: &Path, session: SessionId, raw_len: u64, payload: &[u8]) -> u64 {
    use redb::ReadableTable;
    const EVENTS: redb::TableDefinition<(u128, u64), &[u8]> =
        redb::TableDefinition::new("lineage/events");
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    let first_seq;
    {
        let mut events = txn.open_table(EVENTS).unwrap();
        let id = session.as_u128();
        let (key, count) = {
            let mut range = events.range((id, 0)..=(id, u64::MAX)).unwrap();
            let (key, value) = range.nth(2).expect("the session has blocks").unwrap();
            (key.value().1, value.value()[..4].to_vec())
        };
        first_seq = key;
        let mut value = count;
        value.extend_from_slice(&[0; 32]);
        value.push(1); // an LZ4 body
        let mut len = raw_len;
        while len >= 0x80 {
            value.push(len as u8 | 0x80);
            len >>= 7;
        }
        value.push(len as u8);
        value.extend_from_slice(payload);
        events.insert((id, key), value.as_slice()).unwrap();
    }
    txn.commit().unwrap();
    first_seq
}

/// A block whose recorded length lies (10 GiB from 4 MB of bytes) and a real decompression bomb
/// (zeros that expand 255 to 1): under a 1 GiB address space every command still answers, with
/// its own words and its usual exit code, and the commands that read the block name it.
#[test]
fn a_block_that_lies_about_its_size_is_read_within_the_memory_bound_by_every_command() {
    let bomb = lz4_flex::block::compress(&vec![0u8; 3 << 30 >> 2]);
    let noise: Vec<u8> = {
        let mut rng = SplitMix64::new(0x1ab);
        (0..4_200_000).map(|_| rng.next_u64() as u8).collect()
    };
    let cases: [(&str, u64, &[u8]); 2] = [
        ("a lying length", 10 << 30, &noise),
        ("a bomb", 3 << 30 >> 2, &bomb),
    ];
    for (what, raw_len, payload) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (path, session, _) = store(dir.path());
        let first_seq = plant(&path, session, raw_len, payload);
        let named = format!("{first_seq}");
        for r in every_command(&path, session).iter().map(|r| {
            let args: Vec<&str> = r.args.iter().map(String::as_str).collect();
            run_limited(&args)
        }) {
            r.speaks_lineage();
            assert!(
                matches!(r.code, Some(0 | 1 | 3)),
                "{what}: {:?} exit {:?}\nstdout: {}\nstderr: {}",
                r.args,
                r.code,
                r.stdout.chars().take(500).collect::<String>(),
                r.stderr
            );
            let reads_the_block =
                matches!(r.args[0].as_str(), "show" | "fold" | "verify" | "export");
            if reads_the_block {
                let said = format!("{}{}", r.stdout, r.stderr);
                assert!(
                    r.code != Some(0) && said.contains(&named),
                    "{what}: {:?} names the block at seq {first_seq}: exit {:?}\n{}",
                    r.args,
                    r.code,
                    said.chars()
                        .rev()
                        .take(600)
                        .collect::<String>()
                        .chars()
                        .rev()
                        .collect::<String>()
                );
            }
        }
    }
}
