//! The lease cycles of every system: each (names, concurrency) point, the
//! paced point at a fraction of the peak, the round-trip floor and, for
//! bagel's unary calls, the CPU floor, run system by system on a server of
//! its own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use bagel_client::Transport;

use crate::args::System;
use crate::bench::{Bench, data_note, version_of};
use crate::cpu_floor::CpuFloorRow;
use crate::driver::{LeaseDriver, LoadSpec, run_load};
use crate::floor::FloorRow;
use crate::procs::Server;
use crate::report::Row;
use crate::{bagel, etcd, redis, s3};

impl Bench {
    pub(crate) fn spec(&self, system: System, names: usize, concurrency: usize) -> LoadSpec {
        LoadSpec {
            concurrency,
            names_per_cycle: names,
            keyspace: self.args.keyspace,
            ttl: self.args.ttl,
            warmup: self.settings.warmup,
            duration: self.settings.duration,
            max_cycles: self.args.max_cycles,
            prefix: format!("bench-{}-n{names}-c{concurrency}-", system.label()),
            op_timeout: Duration::from_secs(10),
            max_errors: 1000,
            rate: None,
        }
    }

    /// A system's single-name cycle paced at a fraction (`--paced-fraction`,
    /// default half) of its own measured peak (for bagel, of the same
    /// variant: unary, batched or session), for the "p99 acquire at half of
    /// peak" goal. Redis gets the same point as a control: what this machine
    /// and this load generator allow a fast server's tail to be.
    async fn paced<D: LeaseDriver>(
        &mut self,
        system: System,
        driver: Arc<D>,
        server: &mut Server,
    ) -> Result<()> {
        // The peak and the number of clients that reached it: the paced
        // run gets as many, so it can have as many cycles in flight.
        let (peak, concurrency) = self
            .report
            .rows
            .iter()
            .filter(|r| {
                r.system == system.name()
                    && r.transport == system.transport()
                    && r.names_per_cycle == 1
                    && !r.paced
                    && r.round == self.round
            })
            .map(|r| (r.cycles_per_s, r.concurrency))
            .fold((0.0, 1), |best, p| if p.0 > best.0 { p } else { best });
        if peak <= 0.0 {
            bail!("no single-name {} throughput to take half of", system.label());
        }
        server.check_alive()?;
        let mut spec = self.spec(system, 1, concurrency);
        spec.prefix = format!("bench-{}-paced-", system.label());
        let rate = peak * self.args.paced_fraction;
        spec.rate = Some(rate);
        let r = run_load(driver, &spec, Some(server.pid)).await;
        let mut row = Row::from_load(
            system.name(),
            system.transport(),
            1,
            concurrency,
            system.requests_per_cycle(1),
            &r,
        )
        .paced_at(rate, self.args.paced_fraction);
        row.round = self.round;
        eprintln!(
            "  {} at {} of its peak ({:.0}/s): {:.0} cycles/s, acquire p50 {} µs p99 {} µs p99.9 {} µs",
            system.label(),
            self.args.paced_fraction,
            rate,
            row.cycles_per_s,
            row.acquire_p50_us,
            row.acquire_p99_us,
            row.acquire_p999_us
        );
        self.report.rows.push(row);
        Ok(())
    }

    /// Runs every (names, concurrency) point of one system on `server`.
    async fn sweep<D: LeaseDriver>(
        &mut self,
        system: System,
        driver: Arc<D>,
        server: &mut Server,
    ) -> Result<()> {
        for &names in &self.args.names.clone() {
            if names > driver.max_names() {
                eprintln!(
                    "  {}: {names}-name sets not supported (max {}), skipped",
                    system.label(),
                    driver.max_names()
                );
                continue;
            }
            for &c in &self.args.concurrency.clone() {
                server.check_alive()?;
                let spec = self.spec(system, names, c);
                let r = run_load(driver.clone(), &spec, Some(server.pid)).await;
                let mut row = Row::from_load(
                    system.name(),
                    system.transport(),
                    names,
                    c,
                    system.requests_per_cycle(names),
                    &r,
                );
                row.round = self.round;
                eprintln!(
                    "  {:13} names={names} clients={c:3}: {:>9.0} cycles/s  p50 {:>6} µs  p99 {:>7} µs  p99.9 {:>7} µs  server CPU {} ({} µs/cycle, client {} µs/cycle)  conflicts {} errors {}{}",
                    system.label(),
                    row.cycles_per_s,
                    row.p50_us,
                    row.p99_us,
                    row.p999_us,
                    row.server_cpu_cores.map_or("?".into(), |v| format!("{v:.2}")),
                    row.server_us_per_cycle.map_or("?".into(), |v| format!("{v:.1}")),
                    row.client_us_per_cycle.map_or("?".into(), |v| format!("{v:.1}")),
                    row.conflicts,
                    row.errors,
                    row.first_error
                        .as_deref()
                        .map_or(String::new(), |e| format!(" (first: {e})")),
                );
                self.report.rows.push(row);
            }
        }
        Ok(())
    }

    /// A system's sweep, then its paced point (single-name cycles).
    async fn sweep_then_pace<D: LeaseDriver>(
        &mut self,
        system: System,
        driver: Arc<D>,
        server: &mut Server,
    ) -> Result<()> {
        self.sweep(system, driver.clone(), server).await?;
        if self.args.names.contains(&1) {
            self.paced(system, driver, server).await?;
        }
        Ok(())
    }

    /// bagel's unary sweep, then its CPU floor on the same server (unless
    /// `--no-cpu-floor`), then its paced point. `token`: the sweep's bearer
    /// token (`--bagel-acl`), with which the CPU floor's connections are
    /// identified (see `BareCallDriver::connect`).
    async fn unary_sweep(
        &mut self,
        driver: Arc<bagel::BagelDriver>,
        token: Option<&str>,
        server: &mut Server,
    ) -> Result<()> {
        let system = System::Bagel;
        self.sweep(system, driver.clone(), server).await?;
        if !self.args.no_cpu_floor
            && let Err(e) = self.cpu_floor(server, token).await
        {
            self.missing("unary CPU floor", format!("{e:#}"));
        }
        if self.args.names.contains(&1) {
            self.paced(system, driver, server).await?;
        }
        Ok(())
    }

    /// Bare unary calls at each client count of the sweep, in the sweep's
    /// shape (see `cpu_floor`): one row per count, for this round.
    async fn cpu_floor(&mut self, server: &mut Server, token: Option<&str>) -> Result<()> {
        let driver =
            Arc::new(bagel::BareCallDriver::connect(server.addr, self.args.connections, token).await?);
        for &c in &self.args.concurrency.clone() {
            server.check_alive()?;
            let mut spec = self.spec(System::Bagel, 1, c);
            spec.prefix = "bench-bare-".into();
            let r = run_load(driver.clone(), &spec, Some(server.pid)).await;
            let mut row = CpuFloorRow::from_load(System::Bagel.name(), c, &r);
            row.round = self.round;
            eprintln!(
                "  {:13} clients={c:3}: {:>9.0} calls/s  server CPU {} ({} µs/call, floor {} µs/cycle)  errors {}{}",
                "bare calls",
                row.calls_per_s,
                row.server_cpu_cores.map_or("?".into(), |v| format!("{v:.2}")),
                row.server_us_per_call.map_or("?".into(), |v| format!("{v:.1}")),
                row.floor_us_per_cycle.map_or("?".into(), |v| format!("{v:.1}")),
                row.errors,
                row.first_error
                    .as_deref()
                    .map_or(String::new(), |e| format!(" (first: {e})")),
            );
            if row.floor_us_per_cycle.is_none() {
                self.missing(
                    format!("unary CPU floor at {c} clients"),
                    row.first_error.clone().unwrap_or_else(|| {
                        "no server CPU figure (the window was cut short or no call completed)".into()
                    }),
                );
            }
            self.report.cpu_floor.push(row);
        }
        Ok(())
    }

    pub(crate) async fn run_system(&mut self, system: System) -> Result<()> {
        let pool = self.args.connections;
        match system {
            System::Bagel | System::BagelBatched | System::BagelSession => {
                let bin = self.args.bagel_server();
                let acl = if self.args.bagel_acl {
                    Some(bagel::BenchAcl::write(&self.work)?)
                } else {
                    None
                };
                let token = acl.as_ref().map(bagel::BenchAcl::token);
                let opts = bagel::ServerOpts {
                    max_ttl: Duration::from_secs(10).max(self.args.ttl * 2),
                    skip_restart_wait: true,
                    acl: acl.as_ref().map(|a| a.path.clone()),
                };
                let mut server = bagel::start(&self.work, &bin, &opts).await?;
                // So that the results are never taken for a run without
                // a policy (the bagel variants share this note).
                let policy = if acl.is_some() {
                    ", with --acl (one bearer token, lease+read on every name)"
                } else {
                    ""
                };
                self.note_server(
                    "bagel",
                    format!("bagel-server (release), {}{policy}", data_note(&server)),
                );
                let r = match system {
                    System::Bagel => {
                        let driver =
                            Arc::new(bagel::BagelDriver::connect_with_token(server.addr, pool, token).await?);
                        self.unary_sweep(driver, token, &mut server).await
                    }
                    _ => {
                        let transport = if system == System::BagelSession {
                            Transport::Session
                        } else {
                            Transport::Batch
                        };
                        let options = self.args.coalesce(transport);
                        let driver = Arc::new(
                            bagel::BagelBatchedDriver::connect_with_token(server.addr, options, token)
                                .await?,
                        );
                        self.sweep_then_pace(system, driver, &mut server).await
                    }
                };
                if r.is_ok() {
                    let addr = server.addr;
                    self.floor("bagel", |w, d| bagel::floor(addr, w, d)).await;
                }
                server.stop().await;
                r
            }
            System::Etcd => {
                let mut server = etcd::start(&self.work, &self.args.etcd_bin).await?;
                self.note_server(
                    "etcd",
                    format!(
                        "{} (single member), {}",
                        version_of(&self.args.etcd_bin),
                        data_note(&server)
                    ),
                );
                let driver = Arc::new(etcd::EtcdDriver::connect(server.addr, pool).await?);
                let r = self.sweep(system, driver, &mut server).await;
                server.stop().await;
                r
            }
            System::Redis | System::RedisIo => {
                let io_threads = if system == System::RedisIo {
                    redis::IO_THREADS
                } else {
                    1
                };
                let mut server = redis::start(&self.work, &self.args.redis_bin, io_threads).await?;
                self.note_server(
                    system.name(),
                    format!(
                        "{} (persistence off{}), {}",
                        version_of(&self.args.redis_bin),
                        if io_threads > 1 {
                            format!(", io-threads up to {io_threads} with reads, one per server CPU at most")
                        } else {
                            String::new()
                        },
                        data_note(&server)
                    ),
                );
                let driver = Arc::new(redis::RedisDriver::connect(server.addr, pool).await?);
                let r = self.sweep_then_pace(system, driver, &mut server).await;
                if r.is_ok() && system == System::Redis {
                    let addr = server.addr;
                    self.floor("redis", |w, d| redis::floor(addr, w, d)).await;
                }
                server.stop().await;
                r
            }
            System::S3 | System::BagelS3 => {
                // Same store, same run: with both selected, bagel's S3
                // backend runs right after the peer, on its server.
                let both = [System::S3, System::BagelS3]
                    .iter()
                    .all(|s| self.args.systems.contains(s));
                if both && system == System::BagelS3 {
                    eprintln!("  (ran beside s3, on its server)");
                    return Ok(());
                }
                let python = self.args.moto_python();
                let mut server = s3::start(&self.work, &python, &self.args.s3_script).await?;
                let note = "moto 5.2.5 behind one global lock (tests/support/s3_server.py), in RAM";
                self.note_server("s3", note.into());
                let mut r = Ok(());
                if system == System::S3 {
                    let driver = Arc::new(s3::S3Driver::new(s3::store(server.addr)?));
                    r = self.sweep(system, driver, &mut server).await;
                }
                if system == System::BagelS3 || both {
                    self.note_server("bagel-s3", format!("bagel-s3-lease on the same server ({note})"));
                    if both {
                        eprintln!("== bagel-s3 (round {}, beside s3 on its server)", self.round + 1);
                    }
                    let ttl = self.args.ttl;
                    let b = match s3::BagelS3Driver::open(s3::store(server.addr)?, ttl).await {
                        Ok(driver) => self.sweep(System::BagelS3, Arc::new(driver), &mut server).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = b {
                        self.missing("bagel-s3 lease cycles".to_owned(), format!("{e:#}"));
                    }
                }
                server.stop().await;
                r
            }
        }
    }

    /// Measures `system`'s round-trip floor with `probe(warmup, duration)`:
    /// once, in the first round, after the system's sweep (for bagel by the
    /// first variant that runs: the variants share the server and its
    /// transport). A failure is noted as a missing part; it does not undo
    /// the sweep's rows.
    async fn floor<F, Fut>(&mut self, system: &str, probe: F)
    where
        F: FnOnce(Duration, Duration) -> Fut,
        Fut: Future<Output = Result<FloorRow>>,
    {
        if self.round != 0 || self.report.floor.iter().any(|f| f.system == system) {
            return;
        }
        let (warmup, duration) = if self.args.quick {
            (Duration::from_millis(200), Duration::from_secs(1))
        } else {
            (Duration::from_millis(500), Duration::from_secs(3))
        };
        match probe(warmup, duration).await {
            Ok(row) => self.report.floor.push(row),
            Err(e) => self.missing(format!("round-trip floor ({system})"), format!("{e:#}")),
        }
    }
}
