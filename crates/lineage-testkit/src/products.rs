//! The external agent products (Codex, Claude Code) for tests that drive them for real.
//!
//! [`products`] installs them on first use with `scripts/install-products` (the pinned versions,
//! from the npm registry) into `target/products`, or into `$LINEAGE_PRODUCTS_DIR` when set, and
//! returns their programs. A machine that cannot install them fails the test that asked, with
//! the installer's output: a product test never passes by skipping.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The installed products' programs.
#[derive(Clone, Debug)]
pub struct Products {
    /// Codex's `codex`.
    pub codex: PathBuf,
    /// Claude Code's `claude`.
    pub claude: PathBuf,
}

/// The products, installed on first use (once per test process; the installer itself takes a
/// lock, so test processes running at once do not install twice).
///
/// # Panics
///
/// When the installer fails (no `npm`, no registry): the test that asked fails with its output.
pub fn products() -> &'static Products {
    static PRODUCTS: OnceLock<Products> = OnceLock::new();
    PRODUCTS.get_or_init(install)
}

fn install() -> Products {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::var_os("LINEAGE_PRODUCTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/products"));
    let script = root.join("scripts/install-products");
    let output = Command::new(&script)
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} {} failed ({}); the product tests need Node.js, npm and the npm registry:\n{}{}",
        script.display(),
        dir.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    let bin = dir.join("node_modules/.bin");
    Products {
        codex: bin.join("codex"),
        claude: bin.join("claude"),
    }
}

/// The live processes whose environment holds `name=value`: a test gives a product a variable
/// of its own, and after teardown asks whether any process still carries it (whatever process
/// group or session it moved to).
pub fn processes_with_env(name: &str, value: &str) -> Vec<u32> {
    let entry = format!("{name}={value}").into_bytes();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // A zombie's environment reads empty: only live processes match.
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == entry.as_slice()))
        })
        .collect()
}
