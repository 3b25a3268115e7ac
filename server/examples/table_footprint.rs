//! Measures the lease table's memory per held lease, without gRPC:
//! `cargo run --release -p bagel-server --example table_footprint -- 1000000`.
//! Prints RSS before and after granting N single-name leases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bagel_proto::Micros;
use bagel_server::table::{AcquireSpec, LeaseTable, Mode, TableConfig};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.shards = 256;
    let table = LeaseTable::new(cfg);
    let now = Micros::from_micros(1_800_000_000_000_000);
    let owner: Arc<str> = Arc::from("bench");
    let before = rss_bytes();
    let start = Instant::now();
    for i in 0..n {
        let spec = AcquireSpec {
            names: vec![Arc::from(format!("tenant-{i:08}").as_str())],
            deadline: now.saturating_add(Duration::from_secs(5)),
            owner: Arc::clone(&owner),
            mode: Mode::Full,
            peer: None,
            holder_key: None,
        };
        table.acquire(&spec, now).expect("free name");
    }
    let took = start.elapsed();
    let after = rss_bytes();
    println!(
        "{n} held leases: RSS {} -> {} MiB, {} bytes/lease, {:.0} acquires/s (table only, one thread)",
        before >> 20,
        after >> 20,
        (after - before) / n as u64,
        n as f64 / took.as_secs_f64()
    );
}
