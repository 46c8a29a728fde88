//! `lineage-crash`: a crash harness at scale for the Lineage store.
//!
//! Each cycle starts a writer (this program re-executed as `lineage-crash writer …`) on a real
//! store file, lets it work (several sessions, appends, admits sharing group commits, forks, loads
//! with repair), kills it with SIGKILL at a moment chosen from the seed, and checks the file: it
//! opens read-only and writable, verifies, holds every acknowledged event byte for byte and
//! nothing the writer did not write, and every fork's prefix is its parent's. See RELIABILITY.md.

#![forbid(unsafe_code)]

mod check;
mod faults;
mod harness;
mod model;
mod plan;
mod report;
mod writer;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use harness::{Config, Totals};
use writer::WriterArgs;

const USAGE: &str = "\
usage: lineage-crash --kills N [--seed S] [--dir D]
       lineage-crash faults [--quick] [--seed S] [--dir D] [--plan KIND:MODE:N:SHAPE]

Starts N writers on one store file, each killed with SIGKILL at a moment chosen from the seed
(creating the store, right after open, mid-append, mid-flush, mid-fork, mid-repair, at random),
and checks the store after every kill. Exits 0 when nothing failed, 1 when something did.

  --kills N   how many writers to kill
  --seed S    the seed of every choice (decimal or 0x hex; default 0x5eedcafe)
  --dir D     the work directory, kept afterwards (default: a new temporary directory, removed
              unless something failed); a store file already there is replaced

`faults` runs the store in-process over a file whose n-th write, fsync, resize or torn write
(or every operation) fails, once or until cleared, for n swept over a workload of concurrent
sessions; after each plan the file is reopened plainly and every acknowledged event compared.
Exits 0 when nothing was lost and no contract was broken, 1 otherwise.

  --quick     the bounded sweep CI runs (the default is the full sweep)
  --plan P    runs only this plan, as a failure prints it (kind:mode:n:shape)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("writer") {
        match parse_writer(&args[1..]) {
            Ok(writer_args) => writer::run(&writer_args),
            Err(e) => {
                eprintln!("lineage-crash writer: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if args.first().map(String::as_str) == Some("faults") {
        return run_faults(&args[1..]);
    }
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    run_mode("lineage-crash", parse_run(&args), |config| {
        let started = Instant::now();
        let totals = harness::run(config, |line| println!("{line}"))?;
        print!("{}", summary(config, &totals, started.elapsed()));
        Ok((totals.failures.is_empty(), config.dir.as_path()))
    })
}

/// Runs one mode named `program` on its parsed arguments (the config and whether its work
/// directory is temporary): `run` prints its progress and summary and says whether nothing failed
/// and where it worked. A usage error or a failure to run exits 2; otherwise success removes a
/// temporary work directory, and a failure keeps it and says where.
fn run_mode<C>(
    program: &str,
    parsed: Result<(C, bool), String>,
    run: impl FnOnce(&C) -> Result<(bool, &Path), String>,
) -> ExitCode {
    let (config, temporary) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{program}: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&config) {
        Ok((true, dir)) => {
            if temporary {
                let _ = std::fs::remove_dir_all(dir);
            }
            ExitCode::SUCCESS
        }
        Ok((false, dir)) => {
            println!("the work directory is kept: {}", dir.display());
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::from(2)
        }
    }
}

/// `lineage-crash faults …`: the I/O-fault sweep (see `faults`).
fn run_faults(args: &[String]) -> ExitCode {
    run_mode("lineage-crash faults", parse_faults(args), |config| {
        let started = Instant::now();
        let totals = faults::run(config, |line| println!("{line}"))?;
        print!("{}", faults::summary(config, &totals, started.elapsed()));
        Ok((totals.ok(), config.dir.as_path()))
    })
}

/// The work directory given, or a new temporary one named after `prefix`; whether it is temporary.
fn work_dir(dir: Option<PathBuf>, prefix: &str) -> (PathBuf, bool) {
    match dir {
        Some(dir) => (dir, false),
        None => (
            std::env::temp_dir().join(format!("{prefix}-{}", std::process::id())),
            true,
        ),
    }
}

fn parse_faults(args: &[String]) -> Result<(faults::Config, bool), String> {
    let (mut quick, mut seed, mut dir, mut only) = (false, 0x5eed_cafe, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--seed" => seed = number("--seed", it.next())?,
            "--dir" => dir = Some(PathBuf::from(it.next().ok_or("--dir needs a value")?)),
            "--plan" => {
                only = Some(faults::FaultPlan::parse(
                    it.next().ok_or("--plan needs a value")?,
                )?)
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let (dir, temporary) = work_dir(dir, "lineage-faults");
    Ok((
        faults::Config {
            quick,
            seed,
            dir,
            only,
        },
        temporary,
    ))
}

fn number(flag: &str, value: Option<&String>) -> Result<u64, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    parsed.map_err(|_| format!("{flag} takes a number, not {value:?}"))
}

fn parse_run(args: &[String]) -> Result<(Config, bool), String> {
    let (mut kills, mut seed, mut dir) = (None, 0x5eed_cafe, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--kills" => kills = Some(number("--kills", it.next())?),
            "--seed" => seed = number("--seed", it.next())?,
            "--dir" => dir = Some(PathBuf::from(it.next().ok_or("--dir needs a value")?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let kills = kills.ok_or("--kills is required")?;
    let kills = u32::try_from(kills).map_err(|_| format!("--kills {kills} is too many"))?;
    let (dir, temporary) = work_dir(dir, "lineage-crash");
    Ok((Config { kills, seed, dir }, temporary))
}

fn parse_writer(args: &[String]) -> Result<WriterArgs, String> {
    let mut parsed = WriterArgs {
        store: PathBuf::new(),
        seed: 0,
        hold: false,
        window_ms: 5,
        block_events: 512,
        steps: 4_000,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--store" => parsed.store = PathBuf::from(it.next().ok_or("--store needs a value")?),
            "--seed" => parsed.seed = number("--seed", it.next())?,
            "--hold" => parsed.hold = true,
            "--window-ms" => parsed.window_ms = number("--window-ms", it.next())?,
            "--block-events" => {
                parsed.block_events = number("--block-events", it.next())?.max(1) as usize
            }
            "--steps" => parsed.steps = number("--steps", it.next())?.min(u32::MAX.into()) as u32,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.store.as_os_str().is_empty() {
        return Err("--store is required".into());
    }
    Ok(parsed)
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn summary(config: &Config, t: &Totals, took: Duration) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let n = t.cycles.len().max(1) as u32;
    let mean = |pick: fn(&(Duration, Duration, Duration)) -> Duration| {
        t.cycles.iter().map(pick).sum::<Duration>() / n
    };
    let slowest = t.cycles.iter().map(|c| c.0).max().unwrap_or_default();
    let _ = writeln!(
        s,
        "lineage-crash: {} kills in {} (seed {:#x}, {} cores)",
        t.kills,
        secs(took),
        config.seed,
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    let _ = writeln!(
        s,
        "  time per cycle: {} mean (writer {}, check {}), slowest {}",
        secs(mean(|c| c.0)),
        secs(mean(|c| c.1)),
        secs(mean(|c| c.2)),
        secs(slowest)
    );
    let _ = writeln!(
        s,
        "  events checked: {} acknowledged events compared byte for byte after their writer's kill \
         ({} stored events compared in all, earlier cycles' included; {} more were durable before \
         their acknowledgement was read)",
        t.acknowledged, t.compared, t.unacknowledged
    );
    let others = t.failures.len()
        - t.failures
            .iter()
            .filter(|f| matches!(f.kind, "lost" | "altered" | "unopenable"))
            .count();
    let _ = writeln!(
        s,
        "  lost: {}   unopenable: {}   other failures: {}",
        t.lost, t.unopenable, others
    );
    let _ = writeln!(
        s,
        "  read-only opens that said the file awaits recovery: {}; forks checked: {}; cycles from \
         no file: {}; kills that left no file: {}; a creation takes about {:.1} ms here; report \
         lines cut by a kill: {}; kills after the writer ran out of work: {}",
        t.awaiting_recovery,
        t.forks,
        t.fresh,
        t.no_file,
        t.creation.unwrap_or_default().as_secs_f64() * 1000.0,
        t.torn,
        t.late
    );
    let list = |counts: Vec<(String, u32)>| {
        counts
            .into_iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "  moments aimed at: {}",
        list(t.planned.iter().map(|(m, c)| (m.to_string(), *c)).collect())
    );
    let _ = writeln!(
        s,
        "  moments hit: {}",
        list(t.hits.iter().map(|(m, c)| (m.to_string(), *c)).collect())
    );
    if !t.strays.is_empty() {
        let names: Vec<&str> = t.strays.keys().take(3).map(String::as_str).collect();
        let _ = writeln!(
            s,
            "  files left beside the store after a writable open (not by the harness): {} ({}{})",
            t.strays.len(),
            names.join(", "),
            if t.strays.len() > 3 { ", …" } else { "" }
        );
    }
    if !t.failures.is_empty() {
        let mut kinds: std::collections::BTreeMap<&str, u32> = Default::default();
        for f in &t.failures {
            *kinds.entry(f.kind).or_default() += 1;
        }
        let _ = writeln!(
            s,
            "  failures by kind: {}",
            list(kinds.into_iter().map(|(k, c)| (k.to_string(), c)).collect())
        );
        let _ = writeln!(s, "  first failures:");
        for f in t.failures.iter().take(10) {
            let _ = writeln!(
                s,
                "    cycle {} (seed {:#018x}, aimed {}, hit {}): {}: {}",
                f.cycle, f.seed, f.planned, f.hit, f.kind, f.what
            );
        }
    }
    s
}
