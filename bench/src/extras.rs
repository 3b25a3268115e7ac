//! What the lease sweep does not show: memory with many held leases,
//! a server's restart to its first grant, and the cluster client against
//! several servers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bagel_client::Transport;

use crate::args::System;
use crate::bench::Bench;
use crate::report::RestartRow;
use crate::{bagel, cluster, redis, rss};

/// How often a restart-to-ready probe asks again (the probe answering is the event).
const POLL_EVERY: Duration = Duration::from_millis(5);

impl Bench {
    /// bagel and Redis RSS with `n` concurrently held single-name leases,
    /// each on a fresh server.
    pub(crate) async fn memory(&mut self, n: u64) -> Result<()> {
        // Every lease must still be held when the last one is taken.
        let hold_ttl = Duration::from_secs(if n > 200_000 { 590 } else { 290 });
        let conc = 64;
        if self
            .args
            .systems
            .iter()
            .any(|s| matches!(s, System::Bagel | System::BagelBatched | System::BagelSession))
        {
            let opts = bagel::ServerOpts {
                max_ttl: hold_ttl + Duration::from_secs(10),
                skip_restart_wait: true,
                acl: None,
            };
            let r = async {
                let server = bagel::start(&self.work, &self.args.bagel_server(), &opts).await?;
                // Batched, so that 10^6 grants fit in the TTL; the server
                // holds the same records either way.
                let driver =
                    Arc::new(bagel::BagelBatchedDriver::connect(server.addr, Transport::Batch).await?);
                let mut row =
                    rss::held_lease_memory("bagel", driver, server.pid, n, conc * 4, hold_ttl).await;
                if let Ok(r) = &mut row {
                    r.server_cpus = server.cpus.as_ref().map(ToString::to_string);
                }
                server.stop().await;
                row
            }
            .await;
            match r {
                Ok(row) => {
                    eprintln!(
                        "  bagel: {n} held leases: RSS {:.1} MiB, {:.0} bytes/lease",
                        row.rss_after_mib(),
                        row.bytes_per_lease
                    );
                    self.report.memory.push(row);
                }
                Err(e) => self.missing(format!("bagel RSS with {n} held leases"), format!("{e:#}")),
            }
        }
        if self.args.systems.contains(&System::Redis) {
            let r = async {
                let server = redis::start(&self.work, &self.args.redis_bin, 1).await?;
                let driver = Arc::new(redis::RedisDriver::connect(server.addr, self.args.connections).await?);
                let mut row = rss::held_lease_memory("redis", driver, server.pid, n, conc, hold_ttl).await;
                if let Ok(r) = &mut row {
                    r.server_cpus = server.cpus.as_ref().map(ToString::to_string);
                }
                server.stop().await;
                row
            }
            .await;
            match r {
                Ok(row) => {
                    eprintln!(
                        "  redis: {n} held keys: RSS {:.1} MiB, {:.0} bytes/lease",
                        row.rss_after_mib(),
                        row.bytes_per_lease
                    );
                    self.report.memory.push(row);
                }
                Err(e) => self.missing(format!("redis RSS with {n} held leases"), format!("{e:#}")),
            }
        }
        Ok(())
    }

    /// The cycle through the cluster client against 1, 2 and 4 servers
    /// (see [`cluster`]); single-name and 4-name sets.
    pub(crate) async fn cluster(&mut self) {
        let mut spec = self.spec(System::Bagel, 1, self.args.cluster_clients);
        spec.max_errors = 100;
        let bin = self.args.bagel_server();
        let b = cluster::ClusterBench {
            work: &self.work,
            bagel_server: &bin,
            spec,
        };
        let mut rows = Vec::new();
        let mut failed = Vec::new();
        for &n in &self.args.cluster_servers {
            eprintln!("== bagel, {n} server(s), through the cluster client");
            match cluster::measure(&b, n, &[1, 4]).await {
                Ok(r) => rows.extend(r),
                Err(e) => failed.push((n, format!("{e:#}"))),
            }
        }
        self.report.cluster = rows;
        for (n, why) in failed {
            self.missing(format!("cycles/s against {n} server(s)"), why);
        }
    }

    /// Time from spawning bagel-server (no skip flag) to its first grant.
    pub(crate) async fn restart(&mut self, max_ttl: Duration) -> Result<RestartRow> {
        let opts = bagel::ServerOpts {
            max_ttl,
            skip_restart_wait: false,
            acl: None,
        };
        let spawned = Instant::now();
        let mut server = bagel::spawn(&self.work, &self.args.bagel_server(), &opts)?;
        let bound = max_ttl * 3 + Duration::from_secs(30);
        let result = async {
            // First the port answers at all...
            let driver = loop {
                server.check_alive()?;
                if let Ok(d) = bagel::BagelDriver::connect(server.addr, 1).await {
                    break d;
                }
                if spawned.elapsed() > bound {
                    bail!("bagel-server never listened");
                }
                tokio::time::sleep(POLL_EVERY).await;
            };
            // ...then grants are refused until the restart wait is over.
            let ttl = (max_ttl / 2).max(Duration::from_millis(500)).min(max_ttl);
            loop {
                server.check_alive()?;
                if driver.try_grant("restart-probe", ttl).await? {
                    return Ok(spawned.elapsed());
                }
                if spawned.elapsed() > bound {
                    bail!("no grant within {bound:?}");
                }
                tokio::time::sleep(POLL_EVERY).await;
            }
        }
        .await;
        server.stop().await;
        let ready = result?;
        Ok(RestartRow {
            max_ttl_s: max_ttl.as_secs_f64(),
            ready_after_s: ready.as_secs_f64(),
            ready_over_max_ttl: ready.as_secs_f64() / max_ttl.as_secs_f64(),
        })
    }
}
