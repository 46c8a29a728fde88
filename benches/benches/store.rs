//! Criterion benchmarks of the store's hot paths against the baselines, on one fixture.
//!
//! The fixture size comes from `LINEAGE_BENCH_EVENTS` (default 1000); `lineage-bench` runs the full
//! comparison at every size and prints the table.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use lineage_bench::fixture::Fixture;
use lineage_bench::{jsonl, limits, sqlite};
use lineage_log::{ForkSpec, SessionId};
use lineage_store::Store;

fn events() -> usize {
    std::env::var("LINEAGE_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

fn replay(c: &mut Criterion) {
    let fixture = Fixture::build(events(), 42);
    let n = fixture.events.len();
    let key = *fixture.session.as_uuid().as_bytes();
    let mut group = c.benchmark_group("cold load");
    group.sample_size(10);
    group.bench_function(BenchmarkId::new("lineage", n), |b| {
        b.iter(|| {
            let store = Store::open(&fixture.lineage).expect("open");
            black_box(store.load(fixture.session).expect("load"))
        })
    });
    group.bench_function(BenchmarkId::new("jsonl", n), |b| {
        b.iter(|| black_box(jsonl::load(&fixture.jsonl).expect("jsonl")))
    });
    group.bench_function(BenchmarkId::new("sqlite", n), |b| {
        b.iter(|| {
            let conn = sqlite::open(&fixture.sqlite).expect("sqlite");
            black_box(sqlite::load_from(&conn, &key, 0).expect("load"))
        })
    });
    group.bench_function(BenchmarkId::new("limit-a", n), |b| {
        b.iter(|| black_box(limits::decode_buffer(&fixture.records, n)))
    });
    group.bench_function(BenchmarkId::new("floor-b", n), |b| {
        b.iter(|| black_box(limits::floor(&fixture.raw).expect("floor")))
    });
    group.finish();

    let store = Store::open_read_only(&fixture.lineage).expect("open");
    let from = n.saturating_sub(50) as u64;
    let conn = sqlite::open(&fixture.sqlite).expect("sqlite");
    let mut group = c.benchmark_group("tail read of 50");
    group.bench_function(BenchmarkId::new("lineage", n), |b| {
        b.iter(|| black_box(store.read_from(fixture.session, from).expect("tail")))
    });
    group.bench_function(BenchmarkId::new("sqlite", n), |b| {
        b.iter(|| black_box(sqlite::load_from(&conn, &key, from).expect("tail")))
    });
    group.finish();
}

fn fork(c: &mut Criterion) {
    let fixture = Fixture::build(events(), 43);
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("fork.lineage");
    std::fs::copy(&fixture.lineage, &path).expect("copy");
    let store = Store::open(&path).expect("open");
    let boundary = fixture.last_turn_end();
    let mut group = c.benchmark_group("fork at the last completed turn");
    group.sample_size(10);
    group.bench_function(BenchmarkId::new("lineage", fixture.events.len()), |b| {
        b.iter(|| {
            let spec = ForkSpec {
                child: SessionId::new(),
                boundary: Some(boundary),
                time_ms: 1_780_000_000_000,
                delegation_depth: 1,
                agent_preset: None,
            };
            black_box(store.fork(fixture.session, &spec).expect("fork"))
        })
    });
    group.finish();
}

criterion_group!(benches, replay, fork);
criterion_main!(benches);
