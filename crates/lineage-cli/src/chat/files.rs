//! The chat's two read-only file tools, `read_file` and `list_dir`, confined to one directory
//! (the working directory the chat started in).
//!
//! Confinement: a path must be relative and hold no `..` component; it is then joined to the
//! root, canonicalized (every symlink resolved) and must still lie under the canonical root. So
//! a symlink inside the directory that leads outside it is refused like `../x` is, and nothing
//! outside the root is ever opened or listed.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use lineage_agent::{BoxFuture, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};

/// The most bytes `read_file` returns from one call.
pub const MAX_READ_BYTES: usize = 64 * 1024;
/// The most entries `list_dir` returns from one call.
pub const MAX_LIST_ENTRIES: usize = 1000;

/// The error name of every refusal of these tools.
const ERROR_NAME: &str = "FileToolError";

const READ_DESCRIPTION: &str = "Reads a text file in the working directory and returns its \
contents. `path` is relative to the working directory; absolute paths, `..` and links leading \
outside it are refused. At most 65536 bytes come back per call: when the file is longer the \
result says so and gives the offset to continue from.";

const LIST_DESCRIPTION: &str = "Lists a directory inside the working directory: one entry per \
line, sorted by name, directories marked with a trailing `/`. `path` is relative to the working \
directory (omit it, or give `.`, for the working directory itself); absolute paths, `..` and \
links leading outside it are refused.";

/// The directory the tools are confined to, canonicalized once.
#[derive(Clone, Debug)]
pub struct Root {
    dir: PathBuf,
}

/// Why a path was refused or could not be read: a code for programs and a sentence.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `OUTSIDE_ROOT`, `NOT_FOUND`, `NOT_A_FILE`, `NOT_A_DIRECTORY`, `NOT_TEXT` or `IO`.
    pub code: &'static str,
    /// What went wrong, naming the path.
    pub message: String,
}

impl Refusal {
    fn new(code: &'static str, message: String) -> Refusal {
        Refusal { code, message }
    }

    fn output(self) -> ToolOutput {
        ToolOutput::error(ERROR_NAME, self.code, self.message)
    }
}

impl Root {
    /// The tools' root: `dir`, canonicalized.
    pub fn new(dir: &Path) -> std::io::Result<Root> {
        Ok(Root {
            dir: dir.canonicalize()?,
        })
    }

    /// The canonical path `relative` names under the root, or why it is refused.
    pub fn resolve(&self, relative: &str) -> Result<PathBuf, Refusal> {
        let given = Path::new(relative);
        let outside = || {
            Refusal::new(
                "OUTSIDE_ROOT",
                format!(
                    "{relative:?} is outside the working directory: give a path relative to it, \
                     without `..`"
                ),
            )
        };
        for component in given.components() {
            match component {
                Component::Normal(_) | Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(outside());
                }
            }
        }
        let joined = self.dir.join(given);
        let canonical = joined.canonicalize().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Refusal::new("NOT_FOUND", format!("{relative:?} does not exist"))
            }
            _ => Refusal::new("IO", format!("{relative:?} cannot be resolved: {e}")),
        })?;
        // A symlink inside the root may lead anywhere: what counts is where it ends.
        if !canonical.starts_with(&self.dir) {
            return Err(outside());
        }
        Ok(canonical)
    }

    /// Up to [`MAX_READ_BYTES`] of the text file `relative`, from byte `offset`: the text, and
    /// the offset to continue from when the file goes on. A cut never splits a UTF-8 character.
    pub fn read(&self, relative: &str, offset: u64) -> Result<(String, Option<u64>), Refusal> {
        let path = self.resolve(relative)?;
        if !path.is_file() {
            return Err(Refusal::new(
                "NOT_A_FILE",
                format!("{relative:?} is not a regular file"),
            ));
        }
        let io = |e: std::io::Error| Refusal::new("IO", format!("reading {relative:?}: {e}"));
        let mut file = std::fs::File::open(&path).map_err(io)?;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset)).map_err(io)?;
        let mut bytes = Vec::with_capacity(MAX_READ_BYTES.min(64 * 1024) + 1);
        // One byte more than is returned tells whether the file goes on.
        file.take(MAX_READ_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        let more = bytes.len() > MAX_READ_BYTES;
        bytes.truncate(MAX_READ_BYTES);
        let text = match std::str::from_utf8(&bytes) {
            Ok(text) => text,
            // A character cut by the bound (at most 3 bytes short) ends the text early; any
            // other invalid byte means the file is not text.
            Err(e) if more && e.error_len().is_none() => {
                std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(e) => {
                return Err(Refusal::new(
                    "NOT_TEXT",
                    format!(
                        "{relative:?} is not UTF-8 text (an invalid byte at offset {})",
                        offset + e.valid_up_to() as u64
                    ),
                ));
            }
        };
        let next = more.then(|| offset + text.len() as u64);
        Ok((text.to_owned(), next))
    }

    /// The entries of the directory `relative` (the root itself when empty), sorted, with a
    /// trailing `/` on directories, at most [`MAX_LIST_ENTRIES`]; and how many were left off.
    pub fn list(&self, relative: &str) -> Result<(Vec<String>, usize), Refusal> {
        let relative = if relative.is_empty() { "." } else { relative };
        let path = self.resolve(relative)?;
        if !path.is_dir() {
            return Err(Refusal::new(
                "NOT_A_DIRECTORY",
                format!("{relative:?} is not a directory"),
            ));
        }
        let io = |e: std::io::Error| Refusal::new("IO", format!("listing {relative:?}: {e}"));
        // The first entries in sorted order, kept in a bounded heap: a huge directory costs
        // its walk, not its size in memory.
        let mut kept = std::collections::BinaryHeap::with_capacity(MAX_LIST_ENTRIES + 1);
        let mut total = 0usize;
        for entry in std::fs::read_dir(&path).map_err(io)? {
            let entry = entry.map_err(io)?;
            let mut name = entry.file_name().to_string_lossy().into_owned();
            // Followed, so a link to a directory reads as one (listing it is still confined).
            if entry.path().is_dir() {
                name.push('/');
            }
            total += 1;
            kept.push(name);
            if kept.len() > MAX_LIST_ENTRIES {
                kept.pop();
            }
        }
        let entries = kept.into_sorted_vec();
        let left_off = total - entries.len();
        Ok((entries, left_off))
    }
}

/// `read_file`.
#[derive(Debug)]
pub struct ReadFileTool {
    root: Root,
}

impl ReadFileTool {
    /// The tool, confined to `root`.
    pub fn new(root: Root) -> Arc<ReadFileTool> {
        Arc::new(ReadFileTool { root })
    }
}

impl Tool for ReadFileTool {
    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        READ_DESCRIPTION
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file, relative to the working directory."},
                "offset": {"type": "integer", "minimum": 0, "description": "The byte to start at (default 0), to continue a long file."},
            },
            "required": ["path"],
            "additionalProperties": false,
        })
    }

    fn parallel_safe(&self, _: &Value) -> bool {
        true
    }

    fn call(&self, _ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let Some(path) = arguments.get("path").and_then(Value::as_str) else {
                return bad_arguments("read_file needs a string `path`");
            };
            let offset = match arguments.get("offset") {
                None | Some(Value::Null) => 0,
                Some(v) => match v.as_u64() {
                    Some(n) => n,
                    None => return bad_arguments("`offset` must be a non-negative integer"),
                },
            };
            let (root, path) = (self.root.clone(), path.to_owned());
            match off_the_runtime(move || root.read(&path, offset)).await {
                Ok((text, None)) => ToolOutput::text(text),
                Ok((text, Some(next))) => ToolOutput::text(format!(
                    "{text}\n[truncated: {MAX_READ_BYTES} bytes shown; the file goes on, read \
                     again with offset {next}]"
                )),
                Err(refusal) => refusal.output(),
            }
        })
    }
}

/// `list_dir`.
#[derive(Debug)]
pub struct ListDirTool {
    root: Root,
}

impl ListDirTool {
    /// The tool, confined to `root`.
    pub fn new(root: Root) -> Arc<ListDirTool> {
        Arc::new(ListDirTool { root })
    }
}

impl Tool for ListDirTool {
    fn name(&self) -> &str {
        "list_dir"
    }

    fn description(&self) -> &str {
        LIST_DESCRIPTION
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The directory, relative to the working directory (default `.`)."},
            },
            "additionalProperties": false,
        })
    }

    fn parallel_safe(&self, _: &Value) -> bool {
        true
    }

    fn call(&self, _ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let path = match arguments.get("path") {
                None | Some(Value::Null) => ".",
                Some(v) => match v.as_str() {
                    Some(path) => path,
                    None => return bad_arguments("`path` must be a string"),
                },
            };
            let (root, path) = (self.root.clone(), path.to_owned());
            match off_the_runtime(move || root.list(&path)).await {
                Ok((entries, 0)) if entries.is_empty() => ToolOutput::text("(empty directory)"),
                Ok((entries, 0)) => ToolOutput::text(entries.join("\n")),
                Ok((entries, left_off)) => ToolOutput::text(format!(
                    "{}\n[truncated: {left_off} more entries not shown]",
                    entries.join("\n")
                )),
                Err(refusal) => refusal.output(),
            }
        })
    }
}

/// Runs file-system `work` on tokio's blocking pool: a slow disk or a huge directory must not
/// stall the runtime thread that streams the model's answer and hears Ctrl-C.
async fn off_the_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Refusal::new("IO", format!("the file work failed: {e}"))))
}

fn bad_arguments(message: &str) -> ToolOutput {
    ToolOutput::error(ERROR_NAME, lineage_agent::INVALID_ARGUMENTS, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().expect("temp dir");
        let inside = dir.path().join("work");
        std::fs::create_dir_all(inside.join("sub")).expect("dirs");
        std::fs::write(inside.join("notes.txt"), "hello").expect("file");
        std::fs::write(dir.path().join("secret.txt"), "outside").expect("file");
        let root = Root::new(&inside).expect("root");
        (dir, root)
    }

    #[test]
    fn a_relative_path_inside_the_root_is_read() {
        let (_dir, root) = root();
        assert_eq!(root.read("notes.txt", 0), Ok(("hello".into(), None)));
        assert_eq!(
            root.read("./sub/../notes.txt", 0).unwrap_err().code,
            "OUTSIDE_ROOT"
        );
    }

    #[test]
    fn absolute_paths_parent_steps_and_escaping_links_are_refused() {
        let (dir, root) = root();
        for path in ["../secret.txt", "sub/../../secret.txt", "/etc/passwd"] {
            assert_eq!(
                root.read(path, 0).unwrap_err().code,
                "OUTSIDE_ROOT",
                "{path}"
            );
        }
        let absolute = dir.path().join("work/notes.txt");
        assert_eq!(
            root.read(absolute.to_str().expect("utf-8"), 0)
                .unwrap_err()
                .code,
            "OUTSIDE_ROOT",
            "even an absolute path that lies inside"
        );
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("secret.txt"), dir.path().join("work/link"))
                .expect("symlink");
            assert_eq!(root.read("link", 0).unwrap_err().code, "OUTSIDE_ROOT");
            std::os::unix::fs::symlink(dir.path(), dir.path().join("work/up")).expect("symlink");
            assert_eq!(root.list("up").unwrap_err().code, "OUTSIDE_ROOT");
        }
    }

    #[test]
    fn a_long_file_is_cut_at_the_bound_and_says_where_to_go_on() {
        let (dir, root) = root();
        // A two-byte character straddles the bound.
        let mut text = "a".repeat(MAX_READ_BYTES - 1);
        text.push('é');
        text.push_str("tail");
        std::fs::write(dir.path().join("work/long.txt"), &text).expect("file");
        let (first, next) = root.read("long.txt", 0).expect("read");
        assert_eq!(
            first.len(),
            MAX_READ_BYTES - 1,
            "the cut character is left whole for later"
        );
        assert_eq!(next, Some(MAX_READ_BYTES as u64 - 1));
        let (rest, end) = root.read("long.txt", next.unwrap()).expect("read");
        assert_eq!((rest.as_str(), end), ("étail", None));
    }

    #[test]
    fn the_descriptions_state_the_bound_in_force() {
        assert!(READ_DESCRIPTION.contains(&format!("At most {MAX_READ_BYTES} bytes")));
    }

    #[test]
    fn a_binary_file_is_refused_as_not_text() {
        let (dir, root) = root();
        std::fs::write(dir.path().join("work/blob"), [0x66, 0xff, 0x00]).expect("file");
        assert_eq!(root.read("blob", 0).unwrap_err().code, "NOT_TEXT");
    }

    #[test]
    fn a_listing_is_sorted_with_directories_marked() {
        let (_dir, root) = root();
        assert_eq!(
            root.list("").expect("list"),
            (vec!["notes.txt".to_owned(), "sub/".to_owned()], 0)
        );
        assert_eq!(root.list("notes.txt").unwrap_err().code, "NOT_A_DIRECTORY");
        assert_eq!(root.list("missing").unwrap_err().code, "NOT_FOUND");
    }
}
