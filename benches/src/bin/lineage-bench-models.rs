//! `lineage-bench-models`: the model adapters' throughput and first-chunk latency over real
//! sockets, for every wire format, each beside its baselines measured in the same run (a raw TCP
//! read of the same bytes and the in-memory decode); prints the comparison table and writes it
//! as JSON.
//!
//! ```text
//! lineage-bench-models [--deltas 200k] [--runs 200] [--quick] [--json PATH]
//! ```
//!
//! `--quick` streams 20k deltas and times 20 first chunks (what CI runs, so the benchmark never
//! rots). See `lineage_bench::models` for what each figure measures and on which runtime.

use std::path::PathBuf;
use std::time::Duration;

use lineage_bench::models::{self, Runtimes};
use lineage_bench::report::{Row, machine, table, write_json};
use lineage_models::Wire;
use serde_json::{Value, json};

struct Config {
    deltas: usize,
    latency_runs: usize,
    throughput_runs: usize,
    json: PathBuf,
}

fn parse_count(s: &str) -> Result<usize, String> {
    let s = s.trim().to_ascii_lowercase();
    let (number, scale) = match s.strip_suffix('k') {
        Some(n) => (n, 1_000.0),
        None => (&s[..], 1.0),
    };
    let value: f64 = number.parse().map_err(|_| format!("bad count {s:?}"))?;
    Ok((value * scale) as usize)
}

fn parse_args() -> Result<Config, String> {
    let mut config = Config {
        deltas: 200_000,
        latency_runs: 200,
        throughput_runs: 5,
        json: PathBuf::from("target/lineage-bench-models.json"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--deltas" => {
                config.deltas = parse_count(&args.next().ok_or("--deltas needs a count")?)?
            }
            "--runs" => {
                config.latency_runs = parse_count(&args.next().ok_or("--runs needs a count")?)?
            }
            "--quick" => {
                config.deltas = 20_000;
                config.latency_runs = 20;
                config.throughput_runs = 3;
            }
            "--json" => config.json = PathBuf::from(args.next().ok_or("--json needs a path")?),
            "--help" | "-h" => {
                println!(
                    "lineage-bench-models [--deltas 200k] [--runs 200] [--quick] [--json PATH]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if config.deltas == 0 || config.latency_runs == 0 {
        return Err("--deltas and --runs must be at least 1".into());
    }
    Ok(config)
}

/// The pause between the response head and the first body byte in the latency runs: long enough
/// for the client to have read the head and be waiting for the body.
const HEAD_PAUSE: Duration = Duration::from_millis(2);

/// The text deltas of each latency run's answer.
const LATENCY_DELTAS: usize = 50;

fn run(config: &Config) -> Result<(Vec<Row>, Vec<Value>), String> {
    let rt = Runtimes::new().map_err(|e| format!("the runtimes do not start: {e}"))?;
    let mut rows = Vec::new();
    let mut answers = Vec::new();
    for wire in Wire::ALL {
        eprintln!("{wire}: {} deltas through every path", config.deltas);
        let answer = models::answer(wire, config.deltas);
        let throughput = models::throughput(&rt, answer.clone(), config.throughput_runs)?;
        eprintln!("{wire}: {} first chunks", config.latency_runs);
        // The first chunk does not wait for the rest: a short answer keeps the runs short.
        let short = models::answer(wire, LATENCY_DELTAS);
        let latency = models::latency(&rt, short, config.latency_runs, HEAD_PAUSE)?;
        rows.extend(models::throughput_rows(wire, config.deltas, &throughput));
        rows.extend(models::latency_rows(wire, &latency));
        let split = models::decode_split(&answer, config.throughput_runs)?;
        rows.push(models::split_row(
            wire,
            config.deltas,
            &throughput.decode,
            &split,
        ));
        rows.push(models::per_chunk_row(wire, &throughput, &split));
        answers.push(models::answer_json(&answer, &throughput, &latency, &split));
    }
    Ok((rows, answers))
}

fn main() {
    let config = match parse_args() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("lineage-bench-models: {e}");
            std::process::exit(2);
        }
    };
    let (rows, answers) = match run(&config) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("lineage-bench-models: {e}");
            std::process::exit(1);
        }
    };
    print!("{}", table(&rows, "HttpModel"));
    let json = json!({
        "machine": machine(),
        "runtime": "consumer on a current-thread runtime (and a 2-worker multi-thread one where \
                    named); servers on a 1-worker runtime of their own",
        "server_write_bytes": models::SERVER_WRITE,
        "decode_piece_bytes": models::DECODE_PIECE,
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "answers": answers,
    });
    write_json(&config.json, &json);
}
