//! Resident bytes per held one-name lease in the lease table alone (the
//! server's allocator, its default shards), so a change to the record, the
//! index or the names can be judged in seconds; `bagel-bench --held`
//! measures the whole server through gRPC.
//!
//! `cargo bench -p bagel-server --bench held [-- N]` (default 100,000; one
//! count per run, since freed pages stay resident).

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::Micros;
use bagel_server::table::{AcquireSpec, LeaseTable, Mode, TableConfig};

/// The server's allocator, so that its rounding and pages count.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Resident bytes of this process (`/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    pages * 4096
}

const T0: u64 = 1_700_000_000_000_000;

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let owner: Arc<str> = Arc::from("bench-owner");
    let key = Arc::new([9u8; 32]);
    let now = Micros::from_micros(T0);
    // The server's defaults: 256 shards, 2 M records.
    let defaults = bagel_server::Config::default();
    let table = LeaseTable::new(TableConfig {
        shards: defaults.shards,
        max_records: defaults.max_records.max(n as usize),
        ..TableConfig::for_tests(Duration::from_secs(10))
    });
    let before = rss();
    let mut grants = 0u64;
    for i in 0..n {
        // The names of `bagel-bench --held`, each its own allocation
        // as a request decoded makes it.
        let spec = AcquireSpec {
            names: vec![Arc::from(format!("held-{n}-{i}"))],
            deadline: Micros::from_micros(T0 + 5_000_000),
            owner: Arc::clone(&owner),
            mode: Mode::Full,
            peer: None,
            holder_key: Some(Arc::clone(&key)),
        };
        table.acquire(&spec, now).expect("a free name");
        grants += 1;
    }
    let after = rss();
    let per = after.saturating_sub(before) as f64 / grants as f64;
    println!("{n:>9} held: {per:6.1} resident bytes per lease (the table and the names)");
}
