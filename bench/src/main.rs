//! `bagel-bench`: bagel side by side with what its users would pick instead
//! (etcd, Redis, S3 conditional-write leases), on one machine, in one run.
//!
//! # Layout
//! * [`args`]: the command line, the systems compared, the settings.
//! * [`driver`]: the [`driver::LeaseDriver`] trait and the load loop (the same
//!   lease cycle for every system, hdrhistogram latencies).
//! * [`bagel`], [`etcd`], [`redis`], [`s3`]: one module per system: how to
//!   start its server and its client side of a lease cycle.
//! * [`procs`]: processes on 127.0.0.1, tmpfs data dirs, readiness probes,
//!   CPU and RSS from /proc.
//! * [`rss`]: memory with many concurrently held leases.
//! * [`cluster`]: the cluster client against 1, 2 and 4 servers.
//! * [`cpus`]: `--server-cpus` / `--client-cpus` pinning (sched_setaffinity).
//! * [`scaling`]: peak cycles/s against server cores (`--scaling`).
//! * [`bags`]: bagel-client's bag writer (POSIX writes/s, S3 PUTs per
//!   batch) and metronome (close lag); the bag path at scale (`--bag-path`:
//!   concurrent writers as tasks and processes on tmpfs, disk, S3 and NFS;
//!   a metronome over 1 to 1,000 logs).
//! * [`report`]: `results.md`, `results.json`, `summary.json`, PNG plots.
//!
//! Every run stops by itself: each point is bounded in time and in count,
//! every request has a timeout, and every server is killed at the end.

mod args;
mod bag_scale;
mod bagel;
mod bags;
mod cluster;
mod cpus;
mod driver;
mod etcd;
mod floor;
mod procs;
mod redis;
mod report;
mod rss;
mod s3;
mod scaling;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bagel_client::Transport;
use clap::Parser;

use crate::args::{Args, Settings, System};
use crate::cpus::Cpus;
use crate::driver::{LeaseDriver, LoadSpec, run_load};
use crate::floor::FloorRow;
use crate::procs::{Server, WorkDir};
use crate::report::{Missing, Report, RestartRow, Row};

/// How often a restart-to-ready probe asks again (the probe answering is the event).
const POLL_EVERY: Duration = Duration::from_millis(5);

/// The first line of `bin --version`, for the report.
fn version_of(bin: &str) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "version unknown".into())
}

fn data_note(server: &Server) -> &'static str {
    match &server.data {
        Some(d) if d.tmpfs => "data on tmpfs",
        Some(_) => "data on disk (tmpfs mount failed)",
        None => "no data directory (in RAM)",
    }
}

struct Bench {
    args: Args,
    settings: Settings,
    /// The lease sweep's current round (0-based); rows carry it until the
    /// rounds are merged.
    round: usize,
    work: WorkDir,
    report: Report,
}

impl Bench {
    fn spec(&self, system: System, names: usize, concurrency: usize) -> LoadSpec {
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

    async fn run_system(&mut self, system: System) -> Result<()> {
        let pool = self.args.connections;
        match system {
            System::Bagel | System::BagelBatched | System::BagelSession => {
                let bin = self.args.bagel_server();
                let opts = bagel::ServerOpts {
                    max_ttl: Duration::from_secs(10).max(self.args.ttl * 2),
                    skip_restart_wait: true,
                };
                let mut server = bagel::start(&self.work, &bin, &opts).await?;
                self.note_server("bagel", format!("bagel-server (release), {}", data_note(&server)));
                let r = match system {
                    System::Bagel => {
                        let driver = Arc::new(bagel::BagelDriver::connect(server.addr, pool).await?);
                        self.sweep_then_pace(system, driver, &mut server).await
                    }
                    _ => {
                        let transport = if system == System::BagelSession {
                            Transport::Session
                        } else {
                            Transport::Batch
                        };
                        let options = self.args.coalesce(transport);
                        let driver =
                            Arc::new(bagel::BagelBatchedDriver::connect_with(server.addr, options).await?);
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

    /// How `system`'s server ran, once per system (the bagel variants share
    /// one note).
    fn note_server(&mut self, system: &str, how: String) {
        if !self.report.servers.iter().any(|(s, _)| s == system) {
            self.report.servers.push((system.to_string(), how));
        }
    }

    /// Writes the tables so far (`results.md`, `results.json`,
    /// `summary.json`; no plots) into `--out`, so that a run stopped from
    /// outside (a time limit on a lent machine) still leaves what it
    /// measured. `merged`: the rows are already one per point.
    fn checkpoint(&mut self, merged: bool) {
        let raw = (!merged).then(|| self.report.rows.clone());
        if let Some(rows) = &raw {
            self.report.rows = report::median_of_rounds(rows.clone());
            report::fill_ratios(&mut self.report.rows);
        }
        if let Err(e) = self.report.write_tables(&self.args.out) {
            eprintln!("warning: could not write the results so far: {e:#}");
        }
        if let Some(rows) = raw {
            self.report.rows = rows;
        }
    }

    fn missing(&mut self, what: impl Into<String>, why: impl Into<String>) {
        let (what, why) = (what.into(), why.into());
        eprintln!("  not measured: {what}: {why}");
        // Once per part, however many rounds failed the same way.
        if !self.report.missing.iter().any(|m| m.what == what) {
            self.report.missing.push(Missing { what, why });
        }
    }

    /// bagel and Redis RSS with `n` concurrently held single-name leases,
    /// each on a fresh server.
    async fn memory(&mut self, n: u64) -> Result<()> {
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

    /// The bag measurements (see [`bags`]): POSIX writes/s on a tmpfs
    /// directory, S3 PUTs per batch on moto, metronome lag on both. A part
    /// that cannot run is listed as not measured.
    async fn bags(&mut self) {
        const BAG_GRACE: Duration = Duration::from_millis(200);
        let (writes_for, lag_for) = (self.settings.bag_writes, self.settings.bag_metronome);
        eprintln!("== bags on a POSIX directory");
        let posix = async {
            let dir = self.work.data_dir("bags")?;
            let medium = if dir.tmpfs { "tmpfs" } else { "disk" };
            let rows = bags::posix_writes(&dir.path, medium, &[1000, 100], writes_for).await?;
            let lag_root = dir.path.join("lag");
            std::fs::create_dir_all(&lag_root)?;
            let store = Arc::new(bagel_bags::directory::DirectoryStore::local(&lag_root, true));
            let lag =
                bags::metronome_lag(store, &format!("posix ({medium}, fsync)"), BAG_GRACE, lag_for).await?;
            anyhow::Ok((rows, lag))
        }
        .await;
        match posix {
            Ok((rows, lag)) => {
                self.report.bags.writes.extend(rows);
                self.report.bags.metronome.push(lag);
            }
            Err(e) => {
                self.missing(
                    "bag writes/s on a POSIX directory (100-byte payloads, batched)",
                    format!("{e:#}"),
                );
                self.missing("metronome lag (POSIX)", format!("{e:#}"));
            }
        }
        eprintln!("== bags on S3 (moto)");
        let python = self.args.moto_python();
        let s3 = async {
            let server = s3::start(&self.work, &python, &self.args.s3_script).await?;
            let r = async {
                let inner = s3::store(server.addr)?;
                let max = if self.args.quick { 300 } else { 2000 };
                let mut puts = Vec::new();
                for batch in [1000, 100] {
                    puts.push(bags::s3_puts(inner.clone(), batch, writes_for * 2, max).await?);
                }
                let (store, _) = bags::counted_s3(inner, "bags-lag").await?;
                let lag = bags::metronome_lag(store, "s3 (moto)", BAG_GRACE, lag_for).await?;
                anyhow::Ok((puts, lag))
            }
            .await;
            server.stop().await;
            r
        }
        .await;
        match s3 {
            Ok((puts, lag)) => {
                self.report.bags.s3_puts.extend(puts);
                self.report.bags.metronome.push(lag);
            }
            Err(e) => {
                self.missing("PUTs per batch on S3", format!("{e:#}"));
                self.missing("metronome lag (S3)", format!("{e:#}"));
            }
        }
        self.bag_path().await;
    }

    /// A bag-path point that cannot run: said loudly, listed in the
    /// bag-path tables and as not measured.
    fn skip_bag_path(&mut self, what: String, why: String) {
        eprintln!("!! SKIPPED {what}: {why}");
        self.report.bags.bag_path_skipped.push(bags::Skipped {
            what: what.clone(),
            why: why.clone(),
        });
        self.missing(what, why);
    }

    /// The bag path at scale (see [`bags::writers`] and
    /// [`bags::many_logs`]): concurrent writers on every store of
    /// `--bag-stores`, then a metronome over many logs on tmpfs and S3.
    async fn bag_path(&mut self) {
        let (writers_for, logs_for) = (self.settings.bag_writers, self.settings.bag_logs);
        let batch = self.args.bag_writer_batch.max(1);
        let procs = self.args.bag_writer_procs;
        let counts = self.args.bag_writers.clone();
        let stores = self.args.bag_stores.clone();
        let wants = |s: &str| stores.iter().any(|x| x == s);
        self.report.bags.bag_path_settings = Some(serde_json::json!({
            "batch": batch,
            "payload_bytes": bags::PAYLOAD_BYTES,
            "writers": counts,
            "writers_duration_s": writers_for.as_secs_f64(),
            "max_processes": procs,
            "stores": stores,
            "fsync": bagel_bags::BagConfig::default().sync,
            "logs": self.args.bag_logs,
            "logs_duration_s": logs_for.as_secs_f64(),
            "logs_writes_per_s": bags::many_logs::WRITES_PER_S,
            "logs_grace_ms": bags::many_logs::GRACE.as_millis() as u64,
        }));

        // The stores. A tmpfs: the harness's own mount, else /dev/shm.
        let tmp = self.work.data_dir("bag-path");
        let tmpfs_root = match &tmp {
            Ok(d) if d.tmpfs => Some((d.path.clone(), "tmpfs".to_owned())),
            _ if std::path::Path::new("/dev/shm").is_dir() => Some((
                std::path::PathBuf::from(format!("/dev/shm/bagel-bench-{}", std::process::id())),
                "tmpfs (/dev/shm)".to_owned(),
            )),
            _ => None,
        };
        let disk_root = self.work.path.join("bag-path-disk");
        let disk_medium = format!("disk ({})", fs_type(&self.work.path));
        let python = self.args.moto_python();
        let moto = if wants("s3") {
            match s3::start(&self.work, &python, &self.args.s3_script).await {
                Ok(server) => Some(server),
                Err(e) => {
                    let why = format!("moto did not start: {e:#}");
                    self.skip_bag_path("writers on S3 (moto)".into(), why.clone());
                    self.skip_bag_path("metronome over many logs on S3 (moto)".into(), why);
                    None
                }
            }
        } else {
            None
        };
        let mut targets = Vec::new();
        for s in &stores {
            match s.as_str() {
                "tmpfs" => match &tmpfs_root {
                    Some((root, medium)) => targets.push(bags::writers::Target::Dir {
                        root: root.join("writers"),
                        medium: medium.clone(),
                    }),
                    None => {
                        self.skip_bag_path("writers on tmpfs".into(), "no tmpfs to mount or /dev/shm".into())
                    }
                },
                "disk" => targets.push(bags::writers::Target::Dir {
                    root: disk_root.join("writers"),
                    medium: disk_medium.clone(),
                }),
                "s3" => {
                    if let Some(m) = &moto {
                        targets.push(bags::writers::Target::S3 {
                            addr: m.addr,
                            prefix: "bag-path-writers".into(),
                        });
                    }
                }
                "nfs" => match &self.args.nfs_url {
                    Some(url) => targets.push(bags::writers::Target::Nfs { url: url.clone() }),
                    None => self.skip_bag_path(
                        "writers on NFS (ganesha)".into(),
                        "no NFS store: BAGEL_NFS_URL_V3 is not set (source tests/support/common.sh and \
                         tests/support/nfs.sh, run nfs_start; or pass --nfs-url)"
                            .into(),
                    ),
                },
                other => self.skip_bag_path(
                    format!("writers on {other}"),
                    "unknown store (tmpfs, disk, s3, nfs)".into(),
                ),
            }
        }

        eprintln!("== bag path: concurrent writers");
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for target in &targets {
            for &n in &counts {
                for mode in ["tasks", "processes"] {
                    if mode == "processes" && procs == 0 {
                        continue;
                    }
                    let log = format!("writers-{run}/{mode}-{n}");
                    let r = if mode == "tasks" {
                        bags::writers::tasks_point(target, &log, n, batch, writers_for).await
                    } else {
                        bags::writers::processes_point(target, &log, n, procs, batch, writers_for).await
                    };
                    match r {
                        Ok(row) => {
                            bags::writers::print(&row);
                            self.report.bags.concurrent_writers.push(row);
                        }
                        Err(e) => self.skip_bag_path(
                            format!("writers on {} ({}), {mode}, {n}", target.store(), target.medium()),
                            format!("{e:#}"),
                        ),
                    }
                    if let bags::writers::Target::Dir { root, .. } = target {
                        let _ = std::fs::remove_dir_all(root.join(format!("writers-{run}")));
                    }
                }
            }
        }

        eprintln!("== bag path: a metronome over many logs");
        for &n in &self.args.bag_logs.clone() {
            if wants("tmpfs")
                && let Some((root, medium)) = &tmpfs_root
            {
                let root = root.join(format!("logs-{n}"));
                let r = async {
                    std::fs::create_dir_all(&root)?;
                    let writes = Arc::new(bagel_bags::directory::DirectoryStore::local(&root, true));
                    let counting =
                        bagel_bags::counting::CountingFs::new(Arc::new(bagel_bags::fsops::StdFs::new(&root)));
                    let counter = bags::many_logs::Counter::Fs(counting.counts.clone());
                    let closes = Arc::new(bagel_bags::directory::DirectoryStore::new(
                        Arc::new(counting),
                        true,
                    ));
                    bags::many_logs::measure(writes, closes, counter, ("posix", medium), n, logs_for).await
                }
                .await;
                let _ = std::fs::remove_dir_all(&root);
                match r {
                    Ok(row) => self.report.bags.metronome_many_logs.push(row),
                    Err(e) => {
                        self.skip_bag_path(format!("metronome over {n} logs on {medium}"), format!("{e:#}"))
                    }
                }
            }
            if let Some(m) = &moto {
                let addr = m.addr;
                let r = async {
                    let inner = s3::store(addr)?;
                    let prefix = format!("bag-path-logs{n}");
                    let (writes, _) = bags::counted_s3(inner.clone(), &prefix).await?;
                    let (closes, counts) = bags::counted_s3(inner, &prefix).await?;
                    let counter = bags::many_logs::Counter::S3(counts);
                    bags::many_logs::measure(writes, closes, counter, ("s3", "moto"), n, logs_for).await
                }
                .await;
                match r {
                    Ok(row) => self.report.bags.metronome_many_logs.push(row),
                    Err(e) => {
                        self.skip_bag_path(format!("metronome over {n} logs on S3 (moto)"), format!("{e:#}"))
                    }
                }
            }
        }
        if let Some(m) = moto {
            m.stop().await;
        }
        if let Some((root, medium)) = &tmpfs_root
            && medium != "tmpfs"
        {
            let _ = std::fs::remove_dir_all(root);
        }
        let _ = std::fs::remove_dir_all(&disk_root);
        drop(tmp);
    }

    /// The cycle through the cluster client against 1, 2 and 4 servers
    /// (see [`cluster`]); single-name and 4-name sets.
    async fn cluster(&mut self) {
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
    async fn restart(&mut self, max_ttl: Duration) -> Result<RestartRow> {
        let opts = bagel::ServerOpts {
            max_ttl,
            skip_restart_wait: false,
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

/// The same allocator as bagel-server, for every system's client side alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Parses the arguments, checks and applies `--client-cpus` to this thread
/// *before* the runtime exists (so every worker inherits the mask and the
/// runtime has as many workers as client CPUs), then runs the benchmark.
fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(spec) = &args.bag_writer_child {
        return bags::writers::child_main(spec);
    }
    let machine = cpus::allowed().context("reading this process's CPUs")?;
    for (flag, list) in [
        ("--server-cpus", &args.server_cpus),
        ("--client-cpus", &args.client_cpus),
    ] {
        if let Some(list) = list {
            list.check_within(&machine, flag)?;
        }
    }
    if let Some(c) = &args.client_cpus {
        cpus::pin_thread(c)?;
    }
    let threads = args.client_cpus.as_ref().map_or(machine.len(), Cpus::len).max(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("building the runtime")?
        .block_on(run(args, machine, threads))
}

async fn run(args: Args, machine: Cpus, client_threads: usize) -> Result<()> {
    if args.bag_scale {
        std::fs::create_dir_all(&args.out)?;
        let s = bag_scale::run(&args.out).await?;
        let md = bag_scale::markdown(&s);
        print!("{md}");
        std::fs::write(args.out.join("bag-scale.md"), &md)?;
        std::fs::write(args.out.join("bag-scale.json"), serde_json::to_string_pretty(&s)?)?;
        return Ok(());
    }
    if args.bag_path {
        return bag_path_only(args, &machine).await;
    }
    let settings = args.settings();
    anyhow::ensure!(
        !args.concurrency.is_empty() && !args.names.is_empty(),
        "nothing to run"
    );
    anyhow::ensure!(
        args.concurrency.iter().all(|&c| (1..=4096).contains(&c)),
        "--concurrency must be within 1..=4096"
    );
    let command = command_line();
    let started = Instant::now();
    let report = Report {
        command,
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        machine: report::Machine::detect(machine.len()),
        settings: serde_json::json!({
            "quick": args.quick,
            "duration_s": settings.duration.as_secs_f64(),
            "warmup_s": settings.warmup.as_secs_f64(),
            "keyspace": args.keyspace,
            "ttl_s": args.ttl.as_secs_f64(),
            "connections_per_system": args.connections,
            "concurrency": args.concurrency,
            "names_per_cycle": args.names,
            "rounds": settings.rounds,
            "scaling": args.scaling,
            "scaling_concurrency": args.scaling_concurrency,
        }),
        pinning: report::Pinning {
            server_cpus: args.server_cpus.as_ref().map(ToString::to_string),
            client_cpus: args.client_cpus.as_ref().map(ToString::to_string),
            client_threads,
        },
        ..Default::default()
    };
    let work = WorkDir::new()?;
    work.set_server_cpus(args.server_cpus.clone());
    let mut bench = Bench {
        work,
        args,
        settings,
        round: 0,
        report,
    };

    let rounds = bench.settings.rounds;
    for round in 0..rounds {
        bench.round = round;
        for system in bench.args.systems.clone() {
            eprintln!("== {} (round {} of {rounds})", system.label(), round + 1);
            if let Err(e) = bench.run_system(system).await {
                bench.missing(format!("{} lease cycles", system.label()), format!("{e:#}"));
            }
            bench.checkpoint(false);
        }
    }
    let rows = std::mem::take(&mut bench.report.rows);
    bench.report.rows = report::median_of_rounds(rows);
    report::fill_ratios(&mut bench.report.rows);
    bench.checkpoint(true);

    if !bench.args.scaling.is_empty() {
        let (work, args) = (&bench.work, &bench.args);
        let s = tokio::task::block_in_place(|| scaling::run(work, args, &machine));
        bench.report.scaling = s.rows;
        bench.report.scaling_notes = s.notes;
        for (what, why) in s.failed {
            bench.missing(what, why);
        }
        bench.checkpoint(true);
    }

    if !bench.args.no_extras {
        for n in bench.settings.held.clone() {
            eprintln!("== memory with {n} held leases");
            bench.memory(n).await?;
        }
        if bench.args.systems.contains(&System::Bagel) {
            for ttl in bench.settings.restart_ttls.clone() {
                eprintln!(
                    "== bagel restart to ready, max TTL {}",
                    humantime::format_duration(ttl)
                );
                match bench.restart(ttl).await {
                    Ok(row) => {
                        eprintln!("  first grant after {:.2} s", row.ready_after_s);
                        bench.report.restart.push(row);
                    }
                    Err(e) => bench.missing(
                        format!("restart to ready (max TTL {})", humantime::format_duration(ttl)),
                        format!("{e:#}"),
                    ),
                }
            }
        }
    }
    bench.checkpoint(true);
    if !bench.args.no_cluster && bench.args.systems.contains(&System::Bagel) {
        bench.cluster().await;
    }
    if !bench.args.no_bags {
        bench.bags().await;
    }

    let written = bench
        .report
        .write(&bench.args.out, bench.args.font().as_deref())
        .context("writing the report")?;
    let path_md = bench.report.bags.path_markdown();
    if !path_md.is_empty() {
        // The bag-path sections go after the report's own tables.
        let md = bench.args.out.join("results.md");
        let mut all = std::fs::read_to_string(&md).unwrap_or_default();
        all.push_str(&path_md);
        std::fs::write(&md, all).with_context(|| format!("writing {}", md.display()))?;
    }
    eprintln!(
        "done in {:.0} s; wrote {}",
        started.elapsed().as_secs_f64(),
        written
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    print!("{}{path_md}", bench.report.markdown());
    Ok(())
}

/// The command as given (or as `bench/run.sh` passes it on).
fn command_line() -> String {
    std::env::var("BAGEL_BENCH_COMMAND").unwrap_or_else(|_| {
        std::env::args()
            .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
            .collect::<Vec<_>>()
            .join(" ")
    })
}

/// `--bag-path`: only the bag-path measurements, into `bag-path.md` and
/// `bag-path.json` in `--out`.
async fn bag_path_only(args: Args, machine: &Cpus) -> Result<()> {
    let started = Instant::now();
    let report = Report {
        command: command_line(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        machine: report::Machine::detect(machine.len()),
        ..Default::default()
    };
    let work = WorkDir::new()?;
    work.set_server_cpus(args.server_cpus.clone());
    let mut bench = Bench {
        work,
        settings: args.settings(),
        args,
        round: 0,
        report,
    };
    bench.bag_path().await;
    let r = &bench.report;
    let m = &r.machine;
    let mut md = format!(
        "# Bag path\n\nRun {} on {} cores ({}), {} RAM, Linux {}; load average at start: {}.\n\nCommand: `{}`\n",
        r.started_at, m.cores, m.cpu, m.mem_total, m.kernel, m.loadavg_at_start, r.command
    );
    md.push_str(&r.bags.path_markdown());
    if !r.missing.is_empty() {
        md.push_str("\n## Not measured\n\n");
        for x in &r.missing {
            md.push_str(&format!("* {}: {}\n", x.what, x.why));
        }
    }
    let out = &bench.args.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("bag-path.md"), &md)?;
    let json = serde_json::json!({
        "command": r.command,
        "started_at": r.started_at,
        "machine": r.machine,
        "bags": {
            "concurrent_writers": r.bags.concurrent_writers,
            "metronome_many_logs": r.bags.metronome_many_logs,
            "bag_path_skipped": r.bags.bag_path_skipped,
            "bag_path_settings": r.bags.bag_path_settings,
        },
        "missing": r.missing,
    });
    std::fs::write(out.join("bag-path.json"), serde_json::to_string_pretty(&json)?)?;
    eprintln!(
        "done in {:.0} s; wrote {}/bag-path.md and bag-path.json",
        started.elapsed().as_secs_f64(),
        out.display()
    );
    print!("{md}");
    Ok(())
}

/// The file system type `path` lives on (the longest mount point above
/// it in /proc/mounts), e.g. `ext4`, `tmpfs`.
fn fs_type(path: &std::path::Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(point).then(|| (point.len(), kind.to_string()))
        })
        .max_by_key(|(n, _)| *n)
        .map_or_else(|| "unknown".into(), |(_, k)| k)
}
