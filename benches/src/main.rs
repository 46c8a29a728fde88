//! `lineage-bench`: runs every measurement against every baseline in one process, prints the
//! comparison table and writes it as JSON.
//!
//! ```text
//! lineage-bench [--sizes 1k,100k,1.3m] [--quick] [--json PATH]
//! ```
//!
//! `--quick` runs the smallest size with few repetitions (what CI runs, so the benchmarks never rot).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use lineage_bench::fixture::{Fixture, file_size};
use lineage_bench::measure::{peak_rss_bytes, time, time_per_call};
use lineage_bench::report::{Row, machine, table, write_json};
use lineage_bench::{hosts, jsonl, limits, sqlite};
use lineage_log::{Digest, Encoder, Event, ForkSpec, Header, SessionId, SessionLineage};
use lineage_store::{Store, StoreOptions};
use serde_json::{Value, json};

struct Config {
    sizes: Vec<usize>,
    quick: bool,
    json: PathBuf,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim().to_ascii_lowercase();
    let (number, scale) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1_000.0),
        Some('m') => (&s[..s.len() - 1], 1_000_000.0),
        _ => (&s[..], 1.0),
    };
    let value: f64 = number.parse().map_err(|_| format!("bad size {s:?}"))?;
    Ok((value * scale) as usize)
}

fn parse_args() -> Result<Config, String> {
    let mut config = Config {
        sizes: vec![1_000, 100_000, 1_300_000],
        quick: false,
        json: PathBuf::from("target/lineage-bench.json"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--sizes" => {
                let list = args.next().ok_or("--sizes needs a list")?;
                config.sizes = list.split(',').map(parse_size).collect::<Result<_, _>>()?;
            }
            "--quick" => {
                config.quick = true;
                config.sizes = vec![1_000];
            }
            "--json" => config.json = PathBuf::from(args.next().ok_or("--json needs a path")?),
            "--help" | "-h" => {
                println!("lineage-bench [--sizes 1k,100k,1.3m] [--quick] [--json PATH]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(config)
}

fn main() {
    if run_child() {
        return;
    }
    let config = match parse_args() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("lineage-bench: {e}");
            std::process::exit(2);
        }
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut kinds: Vec<Value> = Vec::new();
    let runs = if config.quick { 3 } else { 7 };
    let largest = config.sizes.iter().copied().max().unwrap_or(1_000);

    let mut on_postgres = Vec::new();
    for &size in &config.sizes {
        eprintln!("building the {size}-event fixture");
        let fixture = Fixture::build(size, 42);
        let replayed = measure_replay(&fixture, size == largest, runs, &mut rows, &mut kinds);
        let forked =
            (size == 100_000 || size == largest).then(|| measure_fork(&fixture, runs, &mut rows));
        if size == largest {
            on_postgres.push((fixture, replayed, forked));
        }
    }
    let appended = measure_append(config.quick, &mut rows);
    measure_listing(config.quick, &mut rows);
    for (fixture, replayed, forked) in &on_postgres {
        measure_postgres(
            fixture,
            replayed,
            *forked,
            &appended,
            config.quick,
            runs,
            &mut rows,
        );
    }

    print!("{}", table(&rows, "Lineage"));
    let json = json!({
        "machine": machine(),
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "bytes_by_kind": kinds,
    });
    write_json(&config.json, &json);
}

fn label(size: usize) -> String {
    match size {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// The redb engine's and SQLite's figures of one session, which the PostgreSQL rows compare with.
struct Replayed {
    cold: Duration,
    sqlite_cold: Duration,
    tail: Duration,
    sqlite_tail: Duration,
}

fn measure_replay(
    fixture: &Fixture,
    largest: bool,
    runs: usize,
    rows: &mut Vec<Row>,
    kinds: &mut Vec<Value>,
) -> Replayed {
    let n = fixture.events.len();
    let size = label(n);
    let session = fixture.session;
    let key = *session.as_uuid().as_bytes();
    eprintln!("replay, {size} events");

    // Each contender loads in fresh processes, as after a restart: the time from opening the
    // store to holding every event, and the process's peak memory.
    let cold = |what: &str, path: &Path| cold_load(what, path, session, runs);
    let (lineage, lineage_rss) = cold("lineage", &fixture.lineage);
    let (jsonl, jsonl_rss) = cold("jsonl", &fixture.jsonl);
    let (sqlite, sqlite_rss) = cold("sqlite", &fixture.sqlite);
    let (_, floor_rss) = cold("none", &fixture.lineage);
    let limit_a = time(runs, || limits::decode_buffer(&fixture.records, n));
    let floor_b = time(runs, || limits::floor(&fixture.raw).expect("floor"));
    let mut row = Row::time(
        format!("cold load in a fresh process, {size} events"),
        lineage,
        vec![
            ("JSON Lines", jsonl),
            ("SQLite", sqlite),
            ("limit (a) in-memory decode", limit_a.median),
            ("floor (b) page cache + hash", floor_b.median),
        ],
    );
    if n >= 1_000_000 {
        let ms = row.lineage;
        let ok = ms <= 250.0
            && row.advantage(row.others[0].1) >= 5.0
            && row.advantage(row.others[1].1) >= 2.0
            && ms / row.others[2].1 <= 1.5;
        row.target = Some((
            "≤ 250 ms, ≥ 5× JSONL, ≥ 2× SQLite, ≤ 1.5× limit (a)".into(),
            ok,
        ));
    }
    rows.push(row);

    if largest {
        // The same fresh-process loads while this process keeps one core busy: a host's load
        // competes with its other work, and Lineage decodes large sessions on two threads.
        let (lineage_busy, jsonl_busy, sqlite_busy) = with_busy_core(|| {
            (
                cold("lineage", &fixture.lineage).0,
                cold("jsonl", &fixture.jsonl).0,
                cold("sqlite", &fixture.sqlite).0,
            )
        });
        rows.push(Row::time(
            format!("cold load in a fresh process, other core busy, {size} events"),
            lineage_busy,
            vec![
                ("JSON Lines", jsonl_busy),
                ("SQLite", sqlite_busy),
                ("Lineage, cores free", lineage),
            ],
        ));

        let mut row = Row {
            figure: format!("peak RSS of a load, {size} events"),
            unit: "MiB",
            lineage: lineage_rss,
            others: vec![
                ("JSON Lines", jsonl_rss),
                ("SQLite", sqlite_rss),
                ("no load (process floor)", floor_rss),
            ],
            target: None,
            higher_is_better: false,
        };
        if n >= 1_000_000 {
            row.target = Some(("≤ 400 MiB".into(), row.lineage <= 400.0));
        }
        rows.push(row);
    }

    eprintln!("tail read, {size} events");
    let store = Store::open_read_only(&fixture.lineage).expect("open read-only");
    let from = n.saturating_sub(50) as u64;
    let budget = Duration::from_millis(300);
    let lineage_tail = time_per_call(budget, 20, || store.read_from(session, from).expect("tail"));
    let conn = sqlite::open(&fixture.sqlite).expect("sqlite");
    let sqlite_tail = time_per_call(budget, 20, || {
        sqlite::load_from(&conn, &key, from).expect("tail")
    });
    let jsonl_tail = time(runs.min(3), || {
        let (_, events) = jsonl::load(&fixture.jsonl).expect("jsonl");
        events[from as usize..].to_vec()
    });
    let mut row = Row {
        figure: format!("tail read of 50 events, {size} events"),
        unit: "µs",
        lineage: lineage_tail.as_secs_f64() * 1e6,
        others: vec![
            ("JSON Lines (parse all)", jsonl_tail.secs() * 1e6),
            ("SQLite", sqlite_tail.as_secs_f64() * 1e6),
        ],
        target: None,
        higher_is_better: false,
    };
    if largest {
        row.target = Some(("≤ 50 µs".into(), row.lineage <= 50.0));
    }
    rows.push(row);

    eprintln!("verify and size, {size} events");
    let verify = time(runs.min(3), || store.verify().expect("verify"));
    rows.push(Row::time(
        format!("verify whole store, {size} events"),
        verify.median,
        vec![],
    ));
    let stats = store.stats().expect("stats");
    let sqlite_bytes =
        file_size(&fixture.sqlite) + file_size(&fixture.sqlite.with_extension("sqlite-wal"));
    rows.push(Row {
        figure: format!("bytes on disk per event, {size} events"),
        unit: "B",
        lineage: stats.file_bytes.unwrap_or(0) as f64 / n as f64,
        others: vec![
            ("JSON Lines", file_size(&fixture.jsonl) as f64 / n as f64),
            ("SQLite", sqlite_bytes as f64 / n as f64),
            ("records alone", stats.record_bytes as f64 / n as f64),
        ],
        target: None,
        higher_is_better: false,
    });
    if largest {
        for (kind, k) in &stats.by_kind {
            kinds.push(json!({
                "kind": kind.name(),
                "events": k.events,
                "record_bytes": k.bytes,
                "bytes_per_event": k.bytes as f64 / k.events.max(1) as f64,
            }));
        }
    }
    Replayed {
        cold: lineage,
        sqlite_cold: sqlite,
        tail: lineage_tail,
        sqlite_tail,
    }
}

/// Loads the session with `what` in `runs` fresh processes: the median load time and the largest
/// peak resident memory, in MiB.
fn cold_load(what: &str, path: &Path, session: SessionId, runs: usize) -> (Duration, f64) {
    let exe = std::env::current_exe().expect("current exe");
    let mut times = Vec::with_capacity(runs);
    let mut peak = 0u64;
    for _ in 0..runs.max(1) {
        let out = Command::new(&exe)
            .env("LINEAGE_BENCH_CHILD", what)
            .env("LINEAGE_BENCH_PATH", path)
            .env("LINEAGE_BENCH_SESSION", session.to_string())
            .output()
            .expect("run the child");
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| {
                    panic!(
                        "child {what} failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    )
                })
        };
        times.push(Duration::from_nanos(field("elapsed_ns=")));
        peak = peak.max(field("peak_rss="));
    }
    times.sort();
    (times[times.len() / 2], peak as f64 / (1024.0 * 1024.0))
}

/// Runs `f` while a thread of this process spins on one core (started before `f`, stopped after
/// it), so the fresh processes `f` starts compete with it for the machine's cores.
fn with_busy_core<T>(f: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    let started = Barrier::new(2);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            started.wait();
            // Arithmetic the optimizer cannot drop, checking the flag every few thousand steps.
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..4_096 {
                    x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) ^ (x >> 29));
                }
            }
            std::hint::black_box(x);
        });
        started.wait();
        let out = f();
        stop.store(true, Ordering::Relaxed);
        out
    })
}

/// The child side of [`cold_load`]; returns whether this process is such a child.
fn run_child() -> bool {
    let Ok(what) = std::env::var("LINEAGE_BENCH_CHILD") else {
        return false;
    };
    let path = PathBuf::from(std::env::var("LINEAGE_BENCH_PATH").expect("path"));
    let session: SessionId = std::env::var("LINEAGE_BENCH_SESSION")
        .expect("session")
        .parse()
        .expect("a session id");
    let start = Instant::now();
    // The events stay alive until the time is taken: freeing them is not part of a load.
    let events: Vec<Event> = match what.as_str() {
        // The path is a postgres:// URL for the PostgreSQL engine.
        "lineage" | "postgres" => {
            let store = Store::open(&path).expect("open");
            store.load(session).expect("load").events
        }
        "jsonl" => jsonl::load(&path).expect("jsonl").1,
        "sqlite" => {
            let conn = sqlite::open(&path).expect("sqlite");
            sqlite::load_from(&conn, session.as_uuid().as_bytes(), 0).expect("load")
        }
        _ => Vec::new(),
    };
    println!("elapsed_ns={}", start.elapsed().as_nanos());
    println!("events={}", events.len());
    println!("peak_rss={}", peak_rss_bytes().unwrap_or(0));
    // The process ends here; the operating system reclaims the events at once.
    std::mem::forget(events);
    true
}

/// Forks the fixture's session at its last completed turn in each contender; returns the redb
/// engine's and SQLite's median times.
fn measure_fork(fixture: &Fixture, runs: usize, rows: &mut Vec<Row>) -> (Duration, Duration) {
    let n = fixture.events.len();
    let size = label(n);
    eprintln!("fork, {size} events");
    let boundary = fixture.last_turn_end();
    let seed_len = boundary + 1;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("fork.lineage");
    std::fs::copy(&fixture.lineage, &path).expect("copy store");
    let store = Store::open(&path).expect("open");
    let lineage = time(runs, || {
        store
            .fork(fixture.session, &fork_spec(boundary))
            .expect("fork")
    });
    let db = dir.path().join("fork.sqlite");
    std::fs::copy(&fixture.sqlite, &db).expect("copy sqlite");
    let mut conn = sqlite::open(&db).expect("sqlite");
    let key = *fixture.session.as_uuid().as_bytes();
    let sqlite = time(runs, || {
        let child = *SessionId::new().as_uuid().as_bytes();
        sqlite::fork(&mut conn, &key, &child, seed_len).expect("fork")
    });
    let mut i = 0;
    let jsonl = time(runs, || {
        i += 1;
        jsonl::fork(
            &fixture.jsonl,
            &dir.path().join(format!("child-{i}.jsonl")),
            seed_len as usize,
        )
        .expect("fork")
    });
    let mut row = Row::time(
        format!("fork at the last completed turn, {size} events"),
        lineage.median,
        vec![("JSON Lines", jsonl.median), ("SQLite", sqlite.median)],
    );
    // The target is the 100k session's (the fork of the 1.3M one is measured for the PostgreSQL
    // engine's comparison).
    if (100_000..1_000_000).contains(&n) {
        row.target = Some(("≤ 50 ms".into(), row.lineage <= 50.0));
    }
    rows.push(row);
    (lineage.median, sqlite.median)
}

/// The fork [`measure_fork`] times: a new child at the last completed turn.
fn fork_spec(boundary: u64) -> ForkSpec {
    ForkSpec {
        child: SessionId::new(),
        boundary: Some(boundary),
        time_ms: 1_780_000_000_000,
        delegation_depth: 1,
        agent_preset: None,
    }
}

/// The redb engine's and SQLite's append rates, which the PostgreSQL rows compare with.
struct Appended {
    batches: f64,
    sqlite_batches: f64,
    single: f64,
    sqlite_single: f64,
    group: f64,
}

/// The appends [`measure_append`] times: a realistic session, and how many of its events go one
/// per commit.
fn append_workload(quick: bool) -> (Vec<Event>, usize) {
    let events = lineage_testkit::realistic_session(7, if quick { 4_000 } else { 100_000 });
    (events, if quick { 50 } else { 1_000 })
}

fn measure_append(quick: bool, rows: &mut Vec<Row>) -> Appended {
    let (events, singles) = append_workload(quick);
    let dir = tempfile::tempdir().expect("dir");
    eprintln!("durable append, 512-event batches");
    let batches: Vec<&[Event]> = events.chunks(512).collect();
    let header = |id| Header::new(id, 1_780_000_000_000);

    // Lineage.
    let store = Store::open(dir.path().join("append.lineage")).expect("open");
    let id = SessionId::new();
    store.create(header(id)).expect("create");
    let start = Instant::now();
    for batch in &batches {
        store.append(id, batch).expect("append");
    }
    let lineage = events.len() as f64 / start.elapsed().as_secs_f64();
    // SQLite.
    let mut conn = sqlite::open(&dir.path().join("append.sqlite")).expect("sqlite");
    let key = *SessionId::new().as_uuid().as_bytes();
    let mut encoder = Encoder::new();
    let mut buf = Vec::new();
    let start = Instant::now();
    for batch in &batches {
        buf.clear();
        encoder.encode_all(batch.iter(), &mut buf);
        sqlite::append(&mut conn, &key, batch[0].seq, &buf).expect("append");
    }
    let sqlite_rate = events.len() as f64 / start.elapsed().as_secs_f64();
    // JSON Lines.
    let path = dir.path().join("append.jsonl");
    jsonl::write(&path, &header(SessionId::new()), &[]).expect("jsonl");
    let start = Instant::now();
    for batch in &batches {
        jsonl::append(&path, batch, &mut buf).expect("append");
    }
    let jsonl_rate = events.len() as f64 / start.elapsed().as_secs_f64();
    rows.push(Row {
        figure: "durable append, 512-event batches".into(),
        unit: "events/s",
        lineage,
        others: vec![("JSON Lines", jsonl_rate), ("SQLite", sqlite_rate)],
        target: Some(("≥ 500k events/s".into(), lineage >= 500_000.0)),
        higher_is_better: true,
    });

    eprintln!("durable append, single events");
    let id = SessionId::new();
    store.create(header(id)).expect("create");
    let start = Instant::now();
    for event in &events[..singles] {
        store
            .append(id, std::slice::from_ref(event))
            .expect("append");
    }
    let lineage_single = singles as f64 / start.elapsed().as_secs_f64();
    let key = *SessionId::new().as_uuid().as_bytes();
    let start = Instant::now();
    for event in &events[..singles] {
        buf.clear();
        encoder.encode(event, &mut buf);
        sqlite::append(&mut conn, &key, event.seq, &buf).expect("append");
    }
    let sqlite_single = singles as f64 / start.elapsed().as_secs_f64();
    let path = dir.path().join("single.jsonl");
    jsonl::write(&path, &header(SessionId::new()), &[]).expect("jsonl");
    let start = Instant::now();
    for event in &events[..singles] {
        jsonl::append(&path, std::slice::from_ref(event), &mut buf).expect("append");
    }
    let jsonl_single = singles as f64 / start.elapsed().as_secs_f64();
    rows.push(Row {
        figure: "durable append, one event per commit".into(),
        unit: "events/s",
        lineage: lineage_single,
        others: vec![("JSON Lines", jsonl_single), ("SQLite", sqlite_single)],
        target: None,
        higher_is_better: true,
    });

    eprintln!("group commit, 8 sessions");
    let writers = 8;
    let ids: Vec<SessionId> = (0..writers).map(|_| SessionId::new()).collect();
    for &id in &ids {
        store.create(header(id)).expect("create");
    }
    let barrier = Arc::new(Barrier::new(writers + 1));
    let events = Arc::new(events[..singles].to_vec());
    let threads: Vec<_> = ids
        .iter()
        .map(|&id| {
            let (store, barrier, events) = (store.clone(), barrier.clone(), events.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for event in events.iter() {
                    store
                        .append(id, std::slice::from_ref(event))
                        .expect("append");
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for t in threads {
        t.join().expect("writer");
    }
    let group = (writers * singles) as f64 / start.elapsed().as_secs_f64();
    rows.push(Row {
        figure: "group commit, 8 sessions appending one event per commit".into(),
        unit: "events/s",
        lineage: group,
        others: vec![("Lineage, one session", lineage_single)],
        target: None,
        higher_is_better: true,
    });
    Appended {
        batches: lineage,
        sqlite_batches: sqlite_rate,
        single: lineage_single,
        sqlite_single,
        group,
    }
}

/// Appends `events` to a new session of `store`, 512 at a time, each batch durable; events/s.
fn append_batches(store: &Store, events: &[Event]) -> f64 {
    let id = SessionId::new();
    store
        .create(Header::new(id, 1_780_000_000_000))
        .expect("create");
    let start = Instant::now();
    for batch in events.chunks(512) {
        store.append(id, batch).expect("append");
    }
    events.len() as f64 / start.elapsed().as_secs_f64()
}

/// `writers` new sessions of `store` each appending `events` one per durable commit, at once;
/// events/s over all of them.
fn append_singles(store: &Store, events: &[Event], writers: usize) -> f64 {
    let ids: Vec<SessionId> = (0..writers).map(|_| SessionId::new()).collect();
    for &id in &ids {
        store
            .create(Header::new(id, 1_780_000_000_000))
            .expect("create");
    }
    let barrier = Barrier::new(writers + 1);
    let elapsed = std::thread::scope(|scope| {
        let handles: Vec<_> = ids
            .iter()
            .map(|&id| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    for event in events {
                        store
                            .append(id, std::slice::from_ref(event))
                            .expect("append");
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for handle in handles {
            handle.join().expect("writer");
        }
        start.elapsed()
    });
    (writers * events.len()) as f64 / elapsed.as_secs_f64()
}

/// The PostgreSQL engine beside the redb engine and SQLite, in the same run: a private server on
/// loopback (started here, stopped when the process ends), the largest session copied in.
fn measure_postgres(
    fixture: &Fixture,
    replayed: &Replayed,
    forked: Option<(Duration, Duration)>,
    appended: &Appended,
    quick: bool,
    runs: usize,
    rows: &mut Vec<Row>,
) {
    let n = fixture.events.len();
    let size = label(n);
    let session = fixture.session;
    eprintln!("PostgreSQL: starting a private server");
    let server = lineage_testkit::postgres::postgres();
    let url = server.create_database();
    let store = Store::open(&url).expect("open the database");
    eprintln!("PostgreSQL: copying the {size}-event session in");
    let source = Store::open_read_only(&fixture.lineage).expect("open read-only");
    source.copy_into(&store).expect("copy");

    let (cold, _) = cold_load("postgres", Path::new(&url), session, runs);
    let mut row = Row::time(
        format!("PostgreSQL engine: cold load in a fresh process, {size} events"),
        cold,
        vec![
            ("Lineage on redb", replayed.cold),
            ("SQLite", replayed.sqlite_cold),
        ],
    );
    if n >= 1_000_000 {
        let ok = row.lineage <= 4.0 * row.others[0].1;
        row.target = Some(("≤ 4× the redb engine".into(), ok));
    }
    rows.push(row);

    let from = n.saturating_sub(50) as u64;
    let tail = time_per_call(Duration::from_millis(300), 20, || {
        store.read_from(session, from).expect("tail")
    });
    rows.push(Row {
        figure: format!("PostgreSQL engine: tail read of 50 events, {size} events"),
        unit: "µs",
        lineage: tail.as_secs_f64() * 1e6,
        others: vec![
            ("Lineage on redb", replayed.tail.as_secs_f64() * 1e6),
            ("SQLite", replayed.sqlite_tail.as_secs_f64() * 1e6),
        ],
        target: Some(("≤ 1 ms".into(), tail <= Duration::from_millis(1))),
        higher_is_better: false,
    });

    if let Some((redb_fork, sqlite_fork)) = forked {
        let boundary = fixture.last_turn_end();
        let fork = time(runs, || {
            store.fork(session, &fork_spec(boundary)).expect("fork")
        });
        rows.push(Row::time(
            format!("PostgreSQL engine: fork at the last completed turn, {size} events"),
            fork.median,
            vec![("Lineage on redb", redb_fork), ("SQLite", sqlite_fork)],
        ));
    }

    eprintln!("PostgreSQL: durable appends");
    let (events, singles) = append_workload(quick);
    let batches = append_batches(&store, &events);
    rows.push(Row {
        figure: "PostgreSQL engine: durable append, 512-event batches".into(),
        unit: "events/s",
        lineage: batches,
        others: vec![
            ("Lineage on redb", appended.batches),
            ("SQLite", appended.sqlite_batches),
        ],
        target: Some(("≥ 200k events/s".into(), batches >= 200_000.0)),
        higher_is_better: true,
    });
    let single = append_singles(&store, &events[..singles], 1);
    rows.push(Row {
        figure: "PostgreSQL engine: durable append, one event per commit".into(),
        unit: "events/s",
        lineage: single,
        others: vec![
            ("Lineage on redb", appended.single),
            ("SQLite", appended.sqlite_single),
        ],
        target: None,
        higher_is_better: true,
    });
    let group = append_singles(&store, &events[..singles], 8);
    rows.push(Row {
        figure: "PostgreSQL engine: group commit, 8 sessions appending one event per commit".into(),
        unit: "events/s",
        lineage: group,
        others: vec![
            ("Lineage on redb", appended.group),
            ("PostgreSQL, one session", single),
        ],
        target: None,
        higher_is_better: true,
    });

    let follow_ups = if quick { 20 } else { 200 };
    eprintln!("PostgreSQL: {follow_ups} follow-ups across hosts, woken and polled");
    let woken = hosts::measure(&server.create_database(), true, follow_ups);
    let polled = hosts::measure(&server.create_database(), false, follow_ups);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    rows.push(Row {
        figure: "PostgreSQL engine: a follow-up accepted across hosts, median".into(),
        unit: "ms",
        lineage: ms(woken.median),
        others: vec![("polling alone", ms(polled.median))],
        target: Some(("≤ 10 ms".into(), woken.median <= Duration::from_millis(10))),
        higher_is_better: false,
    });
    rows.push(Row {
        figure: "PostgreSQL engine: a follow-up accepted across hosts, p90".into(),
        unit: "ms",
        lineage: ms(woken.p90),
        others: vec![("polling alone", ms(polled.p90))],
        target: None,
        higher_is_better: false,
    });
}

fn measure_listing(quick: bool, rows: &mut Vec<Row>) {
    let dir = tempfile::tempdir().expect("dir");
    let children = if quick { 100 } else { 1_000 };
    let fanout = 10usize;
    let depth = if quick { 2 } else { 4 };
    eprintln!("listing: {children} children, a tree of fan-out {fanout} and depth {depth}");
    let options = StoreOptions::default();
    let store = Store::open_with(dir.path().join("tree.lineage"), options).expect("open");
    let conn = sqlite::open(&dir.path().join("tree.sqlite")).expect("sqlite");
    conn.execute_batch("BEGIN").expect("begin");
    let jsonl_dir = dir.path().join("jsonl");
    std::fs::create_dir_all(&jsonl_dir).expect("dir");

    let add = |id: SessionId, parent: Option<SessionId>, jsonl_too: bool| {
        let mut header = Header::new(id, 1_780_000_000_000);
        let mut events = Vec::new();
        if let Some(parent) = parent {
            header.parent = Some(parent);
            header.seed_digest = Some(Digest::of_empty());
            header.delegation_depth = 1;
            events.push(Event::new(
                0,
                1_780_000_000_000,
                SessionLineage {
                    parent,
                    seed_len: 0,
                    seed_digest: Digest::of_empty(),
                    delegation_depth: 1,
                },
            ));
        } else {
            events.push(Event::new(
                0,
                1_780_000_000_000,
                lineage_log::TurnStart { turn: 1 },
            ));
            events.push(Event::new(
                1,
                1_780_000_000_000,
                lineage_log::TurnEnd {
                    turn: 1,
                    reason: lineage_log::TurnEndReason::Completed,
                },
            ));
        }
        store.create(header.clone()).expect("create");
        store.admit(id, &events).expect("admit");
        let parent_key = parent.map(|p| *p.as_uuid().as_bytes());
        sqlite::add_session(&conn, id.as_uuid().as_bytes(), parent_key.as_ref()).expect("sqlite");
        if jsonl_too {
            jsonl::write(&jsonl_dir.join(format!("{id}.jsonl")), &header, &events).expect("jsonl");
        }
    };
    let parent = SessionId::new();
    add(parent, None, true);
    for _ in 0..children {
        add(SessionId::new(), Some(parent), true);
    }
    let root = SessionId::new();
    add(root, None, false);
    let mut level = vec![root];
    let mut nodes = 0;
    for _ in 0..depth {
        let mut next = Vec::new();
        for &p in &level {
            for _ in 0..fanout {
                let id = SessionId::new();
                add(id, Some(p), false);
                next.push(id);
                nodes += 1;
            }
        }
        level = next;
    }
    store.flush_all().expect("flush");
    conn.execute_batch("COMMIT").expect("commit");

    let budget = Duration::from_millis(300);
    let key = *parent.as_uuid().as_bytes();
    let lineage = time_per_call(budget, 5, || {
        let list = store.children(parent).expect("children");
        assert_eq!(list.len(), children);
        list
    });
    let sqlite_children = time_per_call(budget, 5, || {
        sqlite::children(&conn, &key).expect("children")
    });
    let jsonl_children = time_per_call(budget, 2, || {
        let mut found = 0usize;
        for entry in std::fs::read_dir(&jsonl_dir).expect("dir") {
            let path = entry.expect("entry").path();
            let bytes = std::fs::read(&path).expect("read");
            let first = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
            let header: Header = serde_json::from_slice(first).expect("header");
            found += usize::from(header.parent == Some(parent));
        }
        assert_eq!(found, children);
        found
    });
    rows.push(Row {
        figure: format!("children of a parent with {children} children"),
        unit: "µs",
        lineage: lineage.as_secs_f64() * 1e6,
        others: vec![
            (
                "JSON Lines (scan headers)",
                jsonl_children.as_secs_f64() * 1e6,
            ),
            ("SQLite (indexed)", sqlite_children.as_secs_f64() * 1e6),
        ],
        target: None,
        higher_is_better: false,
    });
    let walk = time_per_call(budget, 3, || {
        let all = store.descendants(root).expect("descendants");
        assert_eq!(all.len(), nodes);
        all
    });
    let root_key = *root.as_uuid().as_bytes();
    let sqlite_walk = time_per_call(budget, 3, || {
        let mut stmt = conn
            .prepare_cached(
                "WITH RECURSIVE tree(id) AS (
                     SELECT id FROM sessions WHERE parent = ?1
                     UNION ALL SELECT s.id FROM sessions s JOIN tree t ON s.parent = t.id)
                 SELECT count(*) FROM tree",
            )
            .expect("prepare");
        let count: i64 = stmt.query_row([&root_key[..]], |r| r.get(0)).expect("walk");
        assert_eq!(count as usize, nodes);
        count
    });
    rows.push(Row {
        figure: format!("descendant walk of {nodes} nodes"),
        unit: "ms",
        lineage: walk.as_secs_f64() * 1e3,
        others: vec![("SQLite (recursive CTE)", sqlite_walk.as_secs_f64() * 1e3)],
        target: None,
        higher_is_better: false,
    });
}
