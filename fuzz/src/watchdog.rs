//! Times store calls: names what an input that hangs was doing, and tells a target when an input
//! has spent its time.
//!
//! libFuzzer stops an input that runs past `-timeout` and saves it, but says nothing about where it
//! was, and a store file that hangs is too large to be sure of recreating from a truncated log. So
//! every store call ([`crate::panics::store_call`] and its kin) is timed here, and a thread of its
//! own prints, once per hang, the call in progress when its input's store calls have run for
//! [`HANG_AFTER`], and the slow calls of that input before it. The lines start with `lineage-fuzz: hang:` so `fuzz/ci.sh` can put
//! them in its summary.
//!
//! Slow is not hung. A damaged page reference can name a page of up to 4 GiB, and the storage
//! engine allocates and zero-fills the whole page before it finds it past the end of the file:
//! about a second a read, and every call that reads past that page pays again. A target that makes
//! many calls per input checks [`spent`] and stops exploring an input that has used
//! [`INPUT_BUDGET`] in store calls, so the fuzzer moves on instead of timing out; a call that never
//! returns is still a hang.

use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// How long an input's store calls, the one in progress included, may run before the watchdog
/// speaks: well under `fuzz/ci.sh`'s 30 s timeout, so the lines come before libFuzzer stops.
pub const HANG_AFTER: Duration = Duration::from_secs(15);

/// How long the store calls of one input may take before a target stops exploring it.
pub const INPUT_BUDGET: Duration = Duration::from_secs(5);

/// A finished call this slow is named in the report.
const SLOW: Duration = Duration::from_millis(500);

struct Watch {
    /// The call in progress: its name, when it began, and whether its hang was reported.
    current: Option<(String, Instant, bool)>,
    /// This input's finished slow calls: name and time taken.
    slow: Vec<(String, Duration)>,
    /// What this input's finished calls took.
    input: Duration,
}

static WATCH: Mutex<Watch> = Mutex::new(Watch {
    current: None,
    slow: Vec::new(),
    input: Duration::ZERO,
});
static START: Once = Once::new();

fn watch() -> std::sync::MutexGuard<'static, Watch> {
    WATCH.lock().unwrap_or_else(|p| p.into_inner())
}

/// Marks the start of an input (every target that makes store calls calls it first): its store
/// calls' time counts from zero.
pub fn begin_input() {
    let mut watch = watch();
    watch.input = Duration::ZERO;
    watch.slow.clear();
}

/// Whether this input's store calls have taken [`INPUT_BUDGET`].
pub fn spent() -> bool {
    watch().input >= INPUT_BUDGET
}

/// Marks the start of the store call `what` (on the target's thread; calls do not nest).
pub fn begin(what: &str) {
    START.call_once(|| {
        std::thread::Builder::new()
            .name("lineage-fuzz-watchdog".into())
            .spawn(patrol)
            .expect("the watchdog thread starts");
    });
    watch().current = Some((what.to_owned(), Instant::now(), false));
}

/// Marks the end of the call in progress.
pub fn end() {
    let mut watch = watch();
    if let Some((what, began, _)) = watch.current.take() {
        let took = began.elapsed();
        watch.input += took;
        if took >= SLOW {
            watch.slow.push((what, took));
        }
    }
}

/// Wakes every second and reports, once, a call whose input has run its store calls for
/// [`HANG_AFTER`].
fn patrol() {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let mut watch = watch();
        let Watch {
            current,
            slow,
            input,
        } = &mut *watch;
        let Some((what, began, reported)) = current else {
            continue;
        };
        let running = began.elapsed();
        if *reported || running + *input < HANG_AFTER {
            continue;
        }
        *reported = true;
        let earlier: Vec<String> = slow
            .iter()
            .map(|(what, took)| format!("{what} {:.1} s", took.as_secs_f64()))
            .collect();
        eprintln!(
            "lineage-fuzz: hang: the store call `{what}` has run {:.1} s, after {:.1} s of this \
             input's calls; the slow ones: {}",
            running.as_secs_f64(),
            input.as_secs_f64(),
            if earlier.is_empty() {
                "none".to_owned()
            } else {
                earlier.join(", ")
            }
        );
    }
}
