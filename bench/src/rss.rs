//! Server memory with many concurrently held leases: resident set size
//! (`VmRSS`) of the server process before and after acquiring `count`
//! distinct names and keeping them, and the difference per lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::driver::{LeaseDriver, hold_many};
use crate::procs::rss_bytes;

#[derive(Debug, Clone, Serialize)]
pub struct MemRow {
    pub system: String,
    pub leases: u64,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
    pub bytes_per_lease: f64,
    /// How long taking them all took, with `concurrency` clients.
    pub fill_s: f64,
    pub concurrency: usize,
    /// The CPUs the server was pinned to (`--server-cpus`), if any: its
    /// baseline grows with its worker threads (per-thread allocator heaps).
    pub server_cpus: Option<String>,
}

impl MemRow {
    pub fn rss_after_mib(&self) -> f64 {
        self.rss_after_bytes as f64 / (1024.0 * 1024.0)
    }
}

/// Acquires `count` names on a fresh server `pid` and measures its RSS.
pub async fn held_lease_memory<D: LeaseDriver>(
    system: &str,
    driver: Arc<D>,
    pid: u32,
    count: u64,
    concurrency: usize,
    ttl: Duration,
) -> Result<MemRow> {
    let before = rss_bytes(pid).context("reading server RSS")?;
    let start = Instant::now();
    let held = hold_many(
        driver,
        &format!("held-{count}-"),
        count,
        concurrency,
        ttl,
        Duration::from_secs(10),
    )
    .await?;
    let fill = start.elapsed();
    let after = rss_bytes(pid).context("reading server RSS")?;
    anyhow::ensure!(
        fill < ttl,
        "filling took {fill:?}, longer than the lease TTL {ttl:?}: not all were held at once"
    );
    let row = MemRow {
        system: system.to_string(),
        leases: held.len() as u64,
        rss_before_bytes: before,
        rss_after_bytes: after,
        bytes_per_lease: after.saturating_sub(before) as f64 / held.len().max(1) as f64,
        fill_s: fill.as_secs_f64(),
        concurrency,
        server_cpus: None,
    };
    // The holds are dropped without release; the caller stops the server.
    drop(held);
    Ok(row)
}
