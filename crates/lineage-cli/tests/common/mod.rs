//! Running the `lineage` binary as a process and checking how it ended, for the suites of the
//! commands. Each suite uses what it needs of it.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// What one run of `lineage` did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The stdout as one JSON document.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is JSON ({e}):\n{}", self.stdout))
    }

    /// Asserts exit 0 and an empty stderr.
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "exit 0 expected\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert!(self.stderr.is_empty(), "no stderr: {}", self.stderr);
        self
    }

    /// Asserts exit 0 and, as the only stderr line, the note that `path` awaits recovery by its
    /// next writer.
    pub fn noted(self, path: &Path) -> Run {
        assert_eq!(
            self.code, 0,
            "exit 0 expected\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert_eq!(
            self.stderr,
            format!(
                "lineage: note: {} awaits recovery by its next writer (a writer stopped without \
                 closing it); showing its last durable commit\n",
                path.display()
            )
        );
        self
    }

    /// Asserts exit `code` and one stderr sentence `lineage: …` containing every needle, and no
    /// sign of a panic.
    pub fn fails(self, code: i32, needles: &[&str]) -> Run {
        assert_eq!(
            self.code, code,
            "exit {code} expected\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one sentence on stderr: {:?}", self.stderr);
        assert!(lines[0].starts_with("lineage: "), "{:?}", lines[0]);
        for needle in needles {
            assert!(
                lines[0].contains(needle),
                "{:?} should contain {needle:?}",
                lines[0]
            );
        }
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        self
    }
}

/// Runs `lineage args`, its stdin `stdin` (closed when none).
pub fn run_with_stdin(args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lineage"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(text.as_bytes()).expect("stdin is written");
    }
    let output = child.wait_with_output().expect("the binary ends");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// Runs `lineage args` with stdin closed.
pub fn run(args: &[&str]) -> Run {
    run_with_stdin(args, None)
}

/// `path` as an argument.
pub fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}
