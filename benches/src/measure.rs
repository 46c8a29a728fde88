//! Timing and memory measurement.

use std::time::{Duration, Instant};

/// Timings of repeated runs of one operation.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// The median run.
    pub median: Duration,
    /// The fastest run.
    pub min: Duration,
    /// How many runs.
    pub runs: usize,
}

impl Timing {
    /// The median in seconds.
    pub fn secs(&self) -> f64 {
        self.median.as_secs_f64()
    }
}

/// Runs `f` once to warm up, then `runs` times, and reports the median and the minimum.
pub fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> Timing {
    std::hint::black_box(f());
    let mut samples: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .collect();
    samples.sort();
    Timing {
        median: samples[samples.len() / 2],
        min: samples[0],
        runs: samples.len(),
    }
}

/// Runs `f` in a loop for at least `budget` (and at least `min_iters` times) and reports the mean
/// time per call: for operations too fast to time one by one.
pub fn time_per_call<T>(budget: Duration, min_iters: u64, mut f: impl FnMut() -> T) -> Duration {
    std::hint::black_box(f());
    let start = Instant::now();
    let mut iters = 0u64;
    while iters < min_iters || start.elapsed() < budget {
        std::hint::black_box(f());
        iters += 1;
    }
    start.elapsed() / iters as u32
}

/// This process's peak resident set size in bytes (`VmHWM`), where `/proc` provides it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
