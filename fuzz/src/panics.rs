//! Which panics end a fuzzing run.
//!
//! libFuzzer's Rust runtime (`libfuzzer_sys::initialize`) installs a panic hook that aborts the
//! process on every panic, before unwinding starts, so that the fuzzer sees the stack of the panic
//! site. The store contains the storage engine's panics on damaged pages with `catch_unwind`
//! (reporting them as `StoreError::Damaged`), but that hook runs first and aborts, so a target would
//! stop at the first damaged page it met.
//!
//! [`contain_engine_panics`] wraps that hook. A panic raised in the storage engine's own source, on
//! a thread that is inside [`store_call`] or [`store_drop`], is recorded and left to unwind to the
//! store's guard. Every other panic still aborts at once, with its stack intact: one raised in
//! Lineage's code (the guard is for the engine, so a panic of Lineage's own is a bug even where the
//! guard would catch it), in a target's assertions, on another thread (the store's writer thread
//! has no guard), or in the engine outside a store call. After the call, a recorded panic must have
//! come back as `StoreError::Damaged`; one that unwinds out of the call has escaped the store, and
//! the process aborts after printing it.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::atomic::{AtomicUsize, Ordering};

use lineage_store::StoreError;

/// Engine panics seen since the process started, on every thread.
static ENGINE_PANICS: AtomicUsize = AtomicUsize::new(0);

/// How many times the storage engine has panicked in this process. After a panic the engine may
/// refuse a handle for good (a poisoned lock): reads the target expects to succeed may then fail
/// as `StoreError::Damaged`.
pub fn engine_panics() -> usize {
    ENGINE_PANICS.load(Ordering::Relaxed)
}

thread_local! {
    static IN_STORE: Cell<bool> = const { Cell::new(false) };
    static CONTAINED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Whether `file` (a panic location) is in the storage engine's source: a path with a component
/// `redb-<version>`, as cargo unpacks registry crates.
pub fn is_engine_file(file: &str) -> bool {
    file.split(['/', '\\']).any(|part| {
        part.strip_prefix("redb-")
            .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// Replaces the current panic hook (libFuzzer's, which aborts) with one that lets an engine panic
/// inside a store call unwind, and hands every other panic to the previous hook. Call it once, from
/// the target's `init:`.
pub fn contain_engine_panics() {
    let abort = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
        let in_engine = raised_in_engine(info);
        if in_engine {
            ENGINE_PANICS.fetch_add(1, Ordering::Relaxed);
        }
        if in_engine && on_writer_thread() {
            // The writer contains every engine call it makes and reports a panic as a failed
            // commit (`StoreError::CommitFailed`), which the caller that flushed receives.
            return;
        }
        if in_engine && IN_STORE.with(Cell::get) {
            // Captured only when RUST_BACKTRACE asks for it, so contained panics stay cheap.
            let backtrace = std::backtrace::Backtrace::capture();
            CONTAINED.with(|c| c.borrow_mut().push(format!("{info}\n{backtrace}")));
            return;
        }
        abort(info);
    }));
}

/// Whether the storage engine raised the panic: it was raised in the engine's source, or in the
/// standard library (a slice index, an `unwrap` of a poisoned lock) called from the engine, which
/// the innermost source file of the backtrace outside the standard library and this hook tells
/// (frames inlined into the engine carry their own file, so files, not symbols, decide).
fn raised_in_engine(info: &PanicHookInfo<'_>) -> bool {
    let Some(location) = info.location() else {
        return false;
    };
    if is_engine_file(location.file()) {
        return true;
    }
    if !is_std_file(location.file()) {
        return false;
    }
    let backtrace = std::backtrace::Backtrace::force_capture().to_string();
    innermost_caller(&backtrace).is_some_and(is_engine_file)
}

/// Whether `file` is in the standard library's source (`/rustc/<hash>/library/...`).
fn is_std_file(file: &str) -> bool {
    file.contains("/rustc/") || file.starts_with("library/")
}

/// The innermost source file of a rendered backtrace that is neither the standard library's nor
/// this module's.
fn innermost_caller(backtrace: &str) -> Option<&str> {
    backtrace
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("at "))
        .map(|at| at.trim())
        .find(|file| !is_std_file(file) && !in_this_module(file))
}

/// Whether a backtrace's `file:line:column` is in this module.
fn in_this_module(file: &str) -> bool {
    file.split(':')
        .next()
        .is_some_and(|path| path.ends_with("src/panics.rs"))
}

/// Whether this is the store's writer thread (named so by `lineage_store`): the one thread of
/// the store's own that calls the engine outside a store call.
fn on_writer_thread() -> bool {
    std::thread::current().name() == Some("lineage-store-writer")
}

fn fail(what: &str, why: &str, panics: &[String]) -> ! {
    eprintln!("lineage-fuzz: {what}: {why}");
    for panic in panics {
        eprintln!("lineage-fuzz: the engine {panic}");
    }
    std::process::abort();
}

/// Runs `f` as a store call: engine panics inside it may unwind (see the module docs). Returns what
/// it returned and the engine panics it raised; aborts if one of them escaped.
fn within_store<R>(what: &str, f: impl FnOnce() -> R) -> (R, Vec<String>) {
    let outer = IN_STORE.with(|c| c.replace(true));
    assert!(!outer, "{what}: store calls do not nest");
    CONTAINED.with(|c| c.borrow_mut().clear());
    crate::watchdog::begin(what);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(f));
    crate::watchdog::end();
    IN_STORE.with(|c| c.set(false));
    let panics = CONTAINED.with(|c| std::mem::take(&mut *c.borrow_mut()));
    match outcome {
        Ok(value) => (value, panics),
        Err(_) => fail(what, "a panic escaped the store", &panics),
    }
}

/// Calls the store. An engine panic the store contained must come back as `StoreError::Damaged`;
/// anything else (a panic that escapes, or one swallowed into another outcome) aborts.
pub fn store_call<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let (result, panics) = within_store(what, f);
    if !panics.is_empty() && !matches!(result, Err(StoreError::Damaged { .. })) {
        let outcome = match &result {
            Ok(_) => "Ok".to_owned(),
            Err(e) => format!("{e:?}"),
        };
        fail(
            what,
            &format!(
                "the engine panicked but the call returned {outcome}, not StoreError::Damaged"
            ),
            &panics,
        );
    }
    result
}

/// Drops `value` (a store, or what holds one) as a store call: a panic may not escape the drop.
pub fn store_drop<T>(what: &str, value: T) {
    within_store(what, move || drop(value));
}

/// Runs `f`, code that calls the store and handles its errors itself (the `lineage` command), as
/// a store call: engine panics inside it may unwind to the store's guard, but none may escape `f`.
/// Returns what `f` returned and how many engine panics the store contained meanwhile.
pub fn contained<R>(what: &str, f: impl FnOnce() -> R) -> (R, usize) {
    let (value, panics) = within_store(what, f);
    (value, panics.len())
}

#[cfg(test)]
mod tests {
    use super::is_engine_file;

    #[test]
    fn a_standard_library_panic_belongs_to_its_innermost_caller() {
        let from_engine = "   0: std::backtrace::Backtrace::force_capture
             at /rustc/abc/library/std/src/backtrace.rs:1:1
   1: lineage_fuzz::panics::raised_in_engine
             at /work/main/fuzz/src/panics.rs:70:5
   2: core::slice::index::slice_index_fail
             at /rustc/abc/library/core/src/slice/index.rs:912:5
   3: remove
             at /root/.cargo/registry/src/x/redb-4.6.0/src/tree_store/btree_base.rs:313:29
   4: lineage_store::writer::commit
             at /work/main/crates/lineage-store/src/writer.rs:300:9";
        let caller = super::innermost_caller(from_engine).unwrap();
        assert!(super::is_engine_file(caller), "{caller}");
        let from_lineage = "   0: core::panicking::panic_bounds_check
             at /rustc/abc/library/core/src/panicking.rs:1:1
   1: lineage_store::layout::Block::parse
             at /work/main/crates/lineage-store/src/layout.rs:90:1";
        let caller = super::innermost_caller(from_lineage).unwrap();
        assert!(!super::is_engine_file(caller), "{caller}");
    }

    #[test]
    fn engine_files_are_told_from_others() {
        assert!(is_engine_file(
            "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/redb-4.6.0/src/tree_store/btree_base.rs"
        ));
        assert!(!is_engine_file(
            "/work/main/crates/lineage-store/src/read.rs"
        ));
        assert!(!is_engine_file(
            "/rustc/abc/library/core/src/slice/index.rs"
        ));
        assert!(!is_engine_file("/src/redb-fork/src/lib.rs"));
    }
}
