//! Micro-benchmarks of the pieces every grant pays for on the server, so a
//! change to one can be judged in seconds instead of a `bagel-bench` run:
//!
//! * the lease table: a one-name acquire then its release, also with 256
//!   idle watchers (what any watcher costs every event);
//! * the witness body: built from a grant and encoded (what is hashed and
//!   signed), and written straight from the grant (what the server runs);
//! * a Merkle batch: the leaves, tree and paths of `n` bodies plus the one
//!   signature (`sign_witness_batch`, what `Batch` and `Session` groups pay);
//! * one ed25519 signature alone (what an ungrouped unary grant pays).
//!
//! `cargo bench -p bagel-server --bench hot` (add `-- table` to run one).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bagel_proto::clock::SystemClock;
use bagel_proto::{Micros, Signer, pb, sign_witness_batch};
use bagel_server::Config;
use bagel_server::table::{AcquireSpec, LeaseTable, Mode, ReleaseSpec, TableConfig};
use bagel_server::timekeeper::TimeKeeper;
use bagel_server::witness::WitnessSigner;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use prost::Message as _;

// The server binary's allocator: with the system one, allocation was
// 40 % of a Merkle batch here and the numbers misled.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const T0: u64 = 1_700_000_000_000_000;

fn signer() -> Signer {
    Signer::new(ed25519_dalek::SigningKey::from_bytes(&[7; 32]))
}

fn spec(name: &str) -> AcquireSpec {
    AcquireSpec {
        names: vec![Arc::from(name)],
        deadline: Micros::from_micros(T0 + 5_000_000),
        owner: Arc::from("bench-owner"),
        mode: Mode::Full,
        peer: None,
        holder_key: Some(Arc::new([9; 32])),
    }
}

fn table(c: &mut Criterion) {
    let table = LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10)));
    let now = Micros::from_micros(T0);
    // A name that was held before: its record (previous lease, history)
    // exists, as in a steady benchmark run.
    let names: Vec<AcquireSpec> = (0..1024).map(|i| spec(&format!("bench-name-{i}"))).collect();
    let mut i = 0;
    c.bench_function("table: acquire + release, one name", |b| {
        b.iter(|| {
            i = (i + 1) % names.len();
            let grant = table.acquire(&names[i], now).expect("free name");
            table
                .release(grant.lease, &grant.token, ReleaseSpec::default(), now)
                .expect("held");
        });
    });
}

/// The same cycle while 256 watchers watch names that never change: what
/// any watcher costs every grant and release (the hub records every
/// event once it is awake, and tracks every live lease's deadline for
/// the expiry events), the "watcher tax" of issue 52.
fn table_watched(c: &mut Criterion) {
    use bagel_server::watch::Filter;
    let table = LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10)));
    let now = Micros::from_micros(T0);
    let _watchers: Vec<_> = (0..256)
        .map(|i| {
            let names = std::iter::once(Arc::from(format!("quiet-{i}").as_str())).collect();
            table.watch(Filter::Names(names), None, now).expect("a watcher")
        })
        .collect();
    let names: Vec<AcquireSpec> = (0..1024).map(|i| spec(&format!("bench-name-{i}"))).collect();
    let mut i = 0;
    c.bench_function("table: acquire + release, one name, 256 idle watchers", |b| {
        b.iter(|| {
            i = (i + 1) % names.len();
            let grant = table.acquire(&names[i], now).expect("free name");
            table
                .release(grant.lease, &grant.token, ReleaseSpec::default(), now)
                .expect("held");
        });
    });
}

fn witness(c: &mut Criterion) {
    let keeper = TimeKeeper::new(Arc::new(SystemClock), signer(), &Config::default());
    let time = keeper.signed().expect("local time");
    let ws = WitnessSigner::new(signer(), "bench-server".into(), Micros::from_micros(T0));
    let table = LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10)));
    let now = Micros::from_micros(T0);
    let grant = table.acquire(&spec("bench-name"), now).expect("free name");
    c.bench_function("witness body: build + encode", |b| {
        b.iter(|| {
            black_box(
                ws.body(&grant, pb::WitnessKind::Acquire, now, &time)
                    .encode_to_vec(),
            )
        });
    });
    // What the server runs: the same bytes, written without the body.
    c.bench_function("witness body: written", |b| {
        b.iter(|| black_box(ws.encode_body(&grant, pb::WitnessKind::Acquire, now, &time)));
    });
    let body = ws.encode_body(&grant, pb::WitnessKind::Acquire, now, &time);
    let mut group = c.benchmark_group("merkle batch + one signature");
    for n in [1usize, 8, 32, 128, 512] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("{n} witnesses"), |b| {
            b.iter_batched(
                || vec![body.clone(); n],
                |bodies| black_box(sign_witness_batch(&ws.signer, bodies)),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
    c.bench_function("ed25519: one signature of a body", |b| {
        use ed25519_dalek::Signer as _;
        b.iter(|| black_box(ws.signer.signing_key().sign(&body)));
    });
}

criterion_group!(hot, table, table_watched, witness);
criterion_main!(hot);
