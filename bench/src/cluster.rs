//! Many servers: the lease cycle through `bagel-client`'s `Cluster` (names
//! routed by rendezvous hashing) against 1, 2 and 4 bagel servers, with
//! single-name cycles (one server each) and 4-name cycles (spread over
//! several servers: tentative on each in key-id order, then upgraded).
//!
//! Every server runs on this machine, so the servers and the load
//! generator share its cores: on a small machine the rows show the cost of
//! spreading (more round trips per multi-server cycle), on a large one also
//! the gain (more cores serving).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bagel_client::{Cluster, LeaseOptions, ServerSpec};
use serde::Serialize;

use crate::driver::{LeaseDriver, LoadSpec, run_load};
use crate::procs::{Server, WorkDir};

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRow {
    pub servers: usize,
    pub names_per_cycle: usize,
    pub concurrency: usize,
    pub cycles_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub cycles: u64,
    pub conflicts: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// How many servers a cycle touched on average (1 for single names).
    pub servers_per_cycle: f64,
}

/// The cycle through the cluster client, as users take it: the lease
/// handle, witnesses verified, no renewal (a cycle is too short).
#[derive(Debug)]
pub struct ClusterDriver {
    cluster: Cluster,
    owner: String,
}

impl LeaseDriver for ClusterDriver {
    type Held = bagel_client::Lease;

    fn max_names(&self) -> usize {
        16
    }

    async fn acquire(&self, _worker: usize, names: &[String], ttl: Duration) -> Result<Option<Self::Held>> {
        let acquired = self
            .cluster
            .acquire(names.iter().cloned())
            .ttl(ttl)
            .owner(&self.owner)
            .options(LeaseOptions::default().with_auto_renew(false))
            .send()
            .await;
        crate::bagel::held_or_busy(acquired)
    }

    async fn release(&self, _worker: usize, held: Self::Held) -> Result<()> {
        held.release(None).await?;
        Ok(())
    }
}

/// What [`measure`] needs from the bench.
pub struct ClusterBench<'a> {
    pub work: &'a WorkDir,
    pub bagel_server: &'a std::path::Path,
    pub spec: LoadSpec,
}

/// Cycles/s through the cluster client against `servers` fresh bagel
/// servers, for each of `names` (names per cycle).
pub async fn measure(b: &ClusterBench<'_>, servers: usize, names: &[usize]) -> Result<Vec<ClusterRow>> {
    let opts = crate::bagel::ServerOpts {
        max_ttl: Duration::from_secs(10).max(b.spec.ttl * 2),
        skip_restart_wait: true,
        acl: None,
    };
    let mut started: Vec<Server> = Vec::with_capacity(servers);
    let result = async {
        for _ in 0..servers {
            started.push(crate::bagel::start(b.work, b.bagel_server, &opts).await?);
        }
        let specs: Vec<ServerSpec> = started
            .iter()
            .map(|s| ServerSpec {
                id: None,
                url: format!("http://{}", s.addr),
                key: None,
            })
            .collect();
        let cluster = Cluster::connect(&specs).await.context("connecting the cluster client")?;
        let mut rows = Vec::new();
        for &n in names {
            for s in &mut started {
                s.check_alive()?;
            }
            let driver = Arc::new(ClusterDriver {
                cluster: cluster.clone(),
                owner: format!("bench-{}", std::process::id()),
            });
            let mut spec = b.spec.clone();
            spec.names_per_cycle = n;
            spec.prefix = format!("bench-cluster{servers}-n{n}-");
            let r = run_load(driver, &spec, None).await;
            let secs = r.elapsed.as_secs_f64();
            let row = ClusterRow {
                servers,
                names_per_cycle: n,
                concurrency: spec.concurrency,
                cycles_per_s: if secs > 0.0 { r.cycles as f64 / secs } else { 0.0 },
                p50_us: r.cycle_us.value_at_quantile(0.5),
                p99_us: r.cycle_us.value_at_quantile(0.99),
                cycles: r.cycles,
                conflicts: r.conflicts,
                errors: r.errors,
                first_error: r.first_error.clone(),
                servers_per_cycle: servers_touched(&cluster, &spec, n),
            };
            eprintln!(
                "  {servers} server(s), names={n} clients={}: {:>8.0} cycles/s  p50 {:>6} µs  p99 {:>7} µs  ({:.2} servers per cycle) errors {}",
                spec.concurrency, row.cycles_per_s, row.p50_us, row.p99_us, row.servers_per_cycle, row.errors
            );
            rows.push(row);
        }
        anyhow::Ok(rows)
    }
    .await;
    for s in started {
        s.stop().await;
    }
    result
}

/// The mean number of servers an `n`-name set from the key space touches,
/// by routing a sample (the load loop draws names the same way).
fn servers_touched(cluster: &Cluster, spec: &LoadSpec, n: usize) -> f64 {
    use rand::{Rng as _, SeedableRng as _};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let samples = 2_000;
    let mut total = 0usize;
    for _ in 0..samples {
        let mut owners: Vec<String> = (0..n)
            .map(|_| {
                let name = format!("{}{}", spec.prefix, rng.gen_range(0..spec.keyspace));
                cluster.route(&name).current.1
            })
            .collect();
        owners.sort();
        owners.dedup();
        total += owners.len();
    }
    total as f64 / samples as f64
}

/// The "Many servers" table of `results.md`.
pub fn markdown(rows: &[ClusterRow], md: &mut String) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Many servers (cluster client, rendezvous routing)\n");
    let _ = writeln!(
        md,
        "| servers | names/cycle | servers/cycle | clients | cycles/s | × 1 server | p50 µs | p99 µs | errors |"
    );
    let _ = writeln!(md, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.servers == 1 && b.names_per_cycle == r.names_per_cycle)
            .map(|b| b.cycles_per_s)
            .filter(|&b| b > 0.0);
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {} | {:.0} | {} | {} | {} | {} |",
            r.servers,
            r.names_per_cycle,
            r.servers_per_cycle,
            r.concurrency,
            r.cycles_per_s,
            base.map_or("–".into(), |b| format!("{:.2}", r.cycles_per_s / b)),
            r.p50_us,
            r.p99_us,
            r.errors
        );
    }
}
