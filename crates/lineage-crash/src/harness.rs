//! The parent: runs cycles of start a writer, kill it at the planned moment, check the store.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read as _};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use lineage_testkit::SplitMix64;

use crate::check::{Found, check};
use crate::model::Model;
use crate::plan::{Moment, Plan, Trigger, hit};
use crate::report::{Phase, Report, parse};

/// The store file's name in the work directory.
pub const STORE_FILE: &str = "sessions.lineage";
/// Where each writer's standard error goes.
const STDERR_FILE: &str = "writer.stderr";
/// A writer that has neither met its trigger nor finished its steps after this long is hung (it
/// finishes them in about a second).
const TRIGGER_TIMEOUT: Duration = Duration::from_secs(30);
/// A check that takes longer than this is hung (it takes a few tens of milliseconds).
const CHECK_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a creation is taken to last until one has been measured.
const GUESSED_CREATION: Duration = Duration::from_millis(3);
/// Once the store holds this many events, the next cycle starts from no file.
const FRESH_AT: u64 = 30_000;
/// At most this many damaged store files are kept for inspection.
const KEEP_DAMAGED: usize = 5;
/// The steps a writer takes before it waits to be killed (far more than any plan needs).
const WRITER_STEPS: u32 = 1_000;

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// How many writers to kill.
    pub kills: u32,
    /// The seed of every cycle's plan and writer.
    pub seed: u64,
    /// The work directory (the store file, the writers' stderr, damaged files kept).
    pub dir: PathBuf,
}

/// One failure, with what is needed to find it again.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The cycle (from 1).
    pub cycle: u32,
    /// The cycle's seed.
    pub seed: u64,
    /// The moment aimed at.
    pub planned: Moment,
    /// What the writer was doing when it died.
    pub hit: &'static str,
    /// The class of failure.
    pub kind: &'static str,
    /// What broke.
    pub what: String,
}

/// The totals of a run.
#[derive(Debug, Default)]
pub struct Totals {
    /// Writers killed.
    pub kills: u32,
    /// Acknowledged events checked after their writer's kill.
    pub acknowledged: u64,
    /// Stored events compared in all, re-checks of earlier cycles' events included.
    pub compared: u64,
    /// Acknowledged events missing or different.
    pub lost: u64,
    /// Kills after which the store file did not open for writing.
    pub unopenable: u32,
    /// Kills that left no store file (creation killed before the file existed).
    pub no_file: u32,
    /// Kills after which the read-only open said the file awaits recovery.
    pub awaiting_recovery: u32,
    /// Forks checked (each stored child, at every check).
    pub forks: u64,
    /// Events durable without their acknowledgement having reached the parent.
    pub unacknowledged: u64,
    /// Report lines cut by the kill (ignored).
    pub torn: u32,
    /// Cycles started from no file.
    pub fresh: u32,
    /// Kills whose trigger never came (the writer was killed once it had done all its steps).
    pub late: u32,
    /// Planned moments.
    pub planned: BTreeMap<Moment, u32>,
    /// Moments hit.
    pub hits: BTreeMap<&'static str, u32>,
    /// Failures, in order.
    pub failures: Vec<Failure>,
    /// Every cycle's duration, the writer's part and the check's part.
    pub cycles: Vec<(Duration, Duration, Duration)>,
    /// Files other than the store seen in the work directory after a check.
    pub strays: BTreeMap<String, u32>,
    /// How long creating a store takes here, as measured (the mean of the last few creations).
    pub creation: Option<Duration>,
}

/// A line from the writer's pipe.
enum Line {
    Whole(Instant, String),
    Torn,
}

fn read_lines(out: ChildStdout, lines: mpsc::Sender<Line>) {
    let mut out = BufReader::new(out);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match out.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let at = Instant::now();
                let line = if buf.last() == Some(&b'\n') {
                    buf.pop();
                    Line::Whole(at, String::from_utf8_lossy(&buf).into_owned())
                } else {
                    Line::Torn
                };
                if lines.send(line).is_err() {
                    return;
                }
            }
        }
    }
}

/// How a writer's run ended before it was killed.
enum End {
    Triggered,
    Done,
    Late,
    Exited,
    Failed(String),
}

/// A writer process that is killed and reaped if the harness unwinds past it.
struct Writer(Child);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `config.kills` cycles; `progress` gets a line now and then and one per failure.
pub fn run(config: &Config, mut progress: impl FnMut(&str)) -> Result<Totals, String> {
    std::fs::create_dir_all(&config.dir)
        .map_err(|e| format!("cannot create {}: {e}", config.dir.display()))?;
    let path = config.dir.join(STORE_FILE);
    remove(&path)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut master = SplitMix64::new(config.seed);
    let mut model = Model::default();
    let mut totals = Totals::default();
    let mut kept = 0usize;
    let mut reset = false;
    for cycle in 1..=config.kills {
        let started = Instant::now();
        let seed = master.next_u64();
        let mut rng = SplitMix64::new(seed);
        let plan = Plan::choose(&mut rng);
        let window_ms = [1u64, 5, 20][rng.below(3) as usize];
        let block_events = [16usize, 128, 512][rng.below(3) as usize];
        *totals.planned.entry(plan.moment).or_default() += 1;
        if plan.fresh || reset || model.confirmed_events() >= FRESH_AT {
            remove(&path)?;
            model = Model::default();
            totals.fresh += 1;
            reset = false;
        }

        let stderr = File::create(config.dir.join(STDERR_FILE))
            .map_err(|e| format!("cannot create the writer's stderr file: {e}"))?;
        let mut command = Command::new(&exe);
        command
            .arg("writer")
            .arg("--store")
            .arg(&path)
            .args(["--seed", &seed.to_string()])
            .args(["--window-ms", &window_ms.to_string()])
            .args(["--block-events", &block_events.to_string()])
            .args(["--steps", &WRITER_STEPS.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        if plan.holds_after_open() {
            command.arg("--hold");
        }
        let mut writer = Writer(
            command
                .spawn()
                .map_err(|e| format!("cannot start a writer: {e}"))?,
        );
        let out = writer.0.stdout.take().ok_or("the writer has no stdout")?;
        let (send, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || read_lines(out, send));

        let mut reports: Vec<Report> = Vec::new();
        let mut garbled: Vec<String> = Vec::new();
        let mut trigger = Trigger::new(plan);
        let mut creating_at = None;
        let end = loop {
            let left = TRIGGER_TIMEOUT.saturating_sub(started.elapsed());
            match lines.recv_timeout(left) {
                Ok(Line::Whole(at, text)) => {
                    let report = match parse(&text) {
                        Ok(report) => report,
                        Err(e) => {
                            garbled.push(format!("{e}: {text:.120}"));
                            continue;
                        }
                    };
                    match report {
                        Report::Phase(Phase::Creating) => creating_at = Some(at),
                        Report::Phase(Phase::Opened) => {
                            if let Some(from) = creating_at {
                                let took = at.duration_since(from);
                                totals.creation = Some(match totals.creation {
                                    Some(mean) => (mean * 3 + took) / 4,
                                    None => took,
                                });
                            }
                        }
                        _ => {}
                    }
                    let fired = trigger.see(&report);
                    let done = match &report {
                        Report::Phase(Phase::Done) => Some(End::Done),
                        Report::Error(what) => Some(End::Failed(what.clone())),
                        _ => None,
                    };
                    reports.push(report);
                    if fired {
                        let creation = totals.creation.unwrap_or(GUESSED_CREATION);
                        std::thread::sleep(plan.delay(creation));
                        break End::Triggered;
                    }
                    if let Some(done) = done {
                        break done;
                    }
                }
                Ok(Line::Torn) => totals.torn += 1,
                Err(RecvTimeoutError::Timeout) => break End::Late,
                Err(RecvTimeoutError::Disconnected) => break End::Exited,
            }
        };
        let _ = writer.0.kill();
        let status = writer.0.wait();
        let writer_took = started.elapsed();
        // Every whole line still in the pipe was printed before the kill.
        drain(&lines, &mut reports, &mut garbled, &mut totals);
        let _ = reader.join();
        totals.kills += 1;
        let hit = hit(reports.last());
        *totals.hits.entry(hit).or_default() += 1;

        let mut found: Vec<Found> = Vec::new();
        for line in garbled {
            found.push(Found {
                kind: "report",
                what: format!("a report line does not parse: {line}"),
            });
        }
        let killed = matches!(&status, Ok(s) if s.signal() == Some(9));
        match end {
            End::Failed(what) => found.push(Found {
                kind: "writer",
                what: format!("the writer stopped on an error: {what}"),
            }),
            End::Exited if !killed => found.push(Found {
                kind: "writer",
                what: format!(
                    "the writer exited by itself ({}): {}",
                    status.map_or_else(|e| e.to_string(), |s| s.to_string()),
                    stderr_tail(&config.dir.join(STDERR_FILE))
                ),
            }),
            End::Late => found.push(Found {
                kind: "hang",
                what: format!(
                    "the writer neither met its trigger nor finished its steps in {} s (it was \
                     last {hit})",
                    TRIGGER_TIMEOUT.as_secs()
                ),
            }),
            End::Done => totals.late += 1,
            End::Triggered | End::Exited => {}
        }
        for report in &reports {
            model.apply(report);
        }

        let checking = Instant::now();
        let opened = reports.contains(&Report::Phase(Phase::Opened));
        // On its own thread, so that a check that hangs (an open or a read that never returns) is
        // reported instead of stopping the run silently.
        let (done, checked) = mpsc::channel();
        let store_path = path.clone();
        let mut checked_model = std::mem::take(&mut model);
        std::thread::spawn(move || {
            let outcome = check(&store_path, &mut checked_model, opened);
            let _ = done.send((checked_model, outcome));
        });
        let outcome = match checked.recv_timeout(CHECK_TIMEOUT) {
            Ok((checked_model, outcome)) => {
                model = checked_model;
                outcome
            }
            Err(_) => {
                let what = format!(
                    "the check did not finish in {} s; the run stops here",
                    CHECK_TIMEOUT.as_secs()
                );
                progress(&format!(
                    "cycle {cycle} (seed {seed:#018x}, aimed {}, hit {hit}): hang: {what}",
                    plan.moment
                ));
                totals.failures.push(Failure {
                    cycle,
                    seed,
                    planned: plan.moment,
                    hit,
                    kind: "hang",
                    what,
                });
                return Ok(totals);
            }
        };
        let check_took = checking.elapsed();
        totals.acknowledged += outcome.acknowledged;
        totals.compared += outcome.compared;
        totals.lost += outcome.lost;
        totals.unopenable += u32::from(outcome.unopenable);
        totals.no_file += u32::from(outcome.no_file);
        totals.awaiting_recovery += u32::from(outcome.awaiting_recovery);
        totals.forks += outcome.forks;
        totals.unacknowledged += outcome.unacknowledged;
        found.extend(outcome.found);
        if outcome.damaged || outcome.unopenable {
            // Keep the file for inspection; later cycles start from a new one.
            if kept < KEEP_DAMAGED && path.exists() {
                let copy = config.dir.join(format!("damaged-cycle-{cycle}.lineage"));
                if std::fs::copy(&path, &copy).is_ok() {
                    kept += 1;
                }
            }
            reset = true;
        }
        // A creator killed before it linked the store leaves its temporary file until the next
        // writable open, which the check makes whenever the store exists: only then must the
        // directory hold nothing else.
        if !outcome.no_file {
            note_strays(&config.dir, &mut totals.strays);
        }
        for f in found {
            let failure = Failure {
                cycle,
                seed,
                planned: plan.moment,
                hit,
                kind: f.kind,
                what: f.what,
            };
            progress(&format!(
                "cycle {cycle} (seed {seed:#018x}, aimed {}, hit {hit}): {}: {}",
                failure.planned, failure.kind, failure.what
            ));
            totals.failures.push(failure);
        }
        totals
            .cycles
            .push((started.elapsed(), writer_took, check_took));
        if cycle % 100 == 0 || cycle == config.kills {
            progress(&format!(
                "{cycle}/{} kills, {} acknowledged events checked, {} failures",
                config.kills,
                totals.acknowledged,
                totals.failures.len()
            ));
        }
    }
    Ok(totals)
}

fn drain(
    lines: &Receiver<Line>,
    reports: &mut Vec<Report>,
    garbled: &mut Vec<String>,
    totals: &mut Totals,
) {
    while let Ok(line) = lines.recv() {
        match line {
            Line::Whole(_, text) => match parse(&text) {
                Ok(report) => reports.push(report),
                Err(e) => garbled.push(format!("{e}: {text:.120}")),
            },
            Line::Torn => totals.torn += 1,
        }
    }
}

fn remove(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

/// The last few hundred bytes the writer printed on stderr.
fn stderr_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    let text = text.trim();
    let start = text.char_indices().rev().nth(400).map_or(0, |(i, _)| i);
    if text.is_empty() {
        "nothing on stderr".into()
    } else {
        text[start..].replace('\n', " | ")
    }
}

/// Counts files in the work directory that neither the harness nor the store being open put there.
fn note_strays(dir: &Path, strays: &mut BTreeMap<String, u32>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == STORE_FILE || name == STDERR_FILE || name.starts_with("damaged-cycle-") {
            continue;
        }
        *strays.entry(name).or_default() += 1;
    }
}
