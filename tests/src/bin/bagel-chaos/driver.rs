//! The driver: starts the servers, the metronomes and the workers, injects
//! faults at seeded random times, then checks everything and writes
//! `chaos.json`.
//!
//! [`run`] is the sequence of the phases, one function each, on the
//! [`Run`] they share:
//! * `setup`: the S3 server, the lease cluster, the metronomes and the
//!   workers (`Run::start`), then the CLI roles and the user journeys
//!   beside them (`Run::start_roles`).
//! * `faults`: kills, restarts, pauses, retention runs, operators' reads
//!   and the migration until the duration is over (`Run::inject_faults`).
//! * this file: stopping the clients and counting what they did
//!   (`Run::stop`), then the journeys that run after the servers stop
//!   (`Run::after_run`: partitions, retention, policy, hostile readers).
//! * `audit`: the checks of the quiet run: readers agree, every
//!   acknowledged write is read back, `bagel audit` finds nothing, the
//!   watchers match a List (`Run::audit`).
//! * `report`: what `chaos.json` holds, and the summary (`Run::finish`).

mod audit;
mod faults;
mod report;
mod setup;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use bagel_client::Micros;
use rand::SeedableRng as _;
use rand::rngs::StdRng;

use crate::RunArgs;
use crate::cli_roles::RunFences;
use crate::leaders::FailoverReport;
use crate::lists::Lists;
use crate::outages::Outages;
use crate::services::Service;
use crate::spellings::SpellingReport;
use crate::watchers::Watchers;
use report::Report;
use setup::{Cluster, WorkerProc};

const LOG: &str = "chaos";
/// The log written under leases from the S3 lease backend (its names are
/// a namespace of their own, so its writers never share a log with the
/// servers' holders).
const S3_LEASE_LOG: &str = "chaos-s3lease";
/// Clock offsets (ms) of the S3-lease workers: inside the margin they must
/// work; the last one's measured bound (offset + the 5 s Roughtime radius)
/// is over half the 14 s clock margin, so it must be refused every lease.
const S3_LEASE_SKEWS_MS: [i64; 3] = [300, -300, 4_000];
const BUCKET: &str = "bagel-chaos";
/// The workers' bag timing (the defaults): a bag closes 2 s after its
/// second, and clocks may differ by 1 s.
const GRACE: Duration = Duration::from_secs(2);
const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);
/// How much later than its close time a closer on Roughtime's signed time
/// closes a bag: its bound (the 2.2 server's fixed 5 s radius, plus the
/// offset and half the round trip).
const CLOSER_BOUND: Duration = Duration::from_secs(7);
/// The worker whose clock is this far ahead must have every write refused.
const BEYOND_MS: i64 = 20_000;
/// Offsets (ms) a metronome or a mid-run reader may run with: inside the
/// clock tolerance it must work, beyond it it must refuse to close (never
/// close a bag early under a writer).
const SKEWS_MS: [i64; 6] = [0, 300, -300, 2_500, -2_500, 10_000];

/// The metronomes summarize a sealed minute this long after it ends.
const SUMMARIZE_AFTER: &str = "5s";

/// Bags go this long after their minute ended: longer than the
/// metronomes' 30 s lookback plus a worker's longest cycle, so nobody
/// writes or closes a bag the retainer removes.
const KEEP_BAGS: &str = "45s";

/// Acknowledged messages, per (log, store): the servers' log on each
/// store, then the S3-lease log on each store; (timestamp, payload).
type Acks = Vec<BTreeSet<(u64, String)>>;

/// What the run started and what it found: the services it kills and
/// restarts, the workers, what every client is given, and the report.
struct Run<'a> {
    a: &'a RunArgs,
    seed: u64,
    /// Every random choice of the driver, in the order the phases make
    /// them (so a seed replays the same faults).
    rng: StdRng,
    /// Where `chaos.json` goes.
    out: PathBuf,
    /// This seed's files.
    run_dir: PathBuf,
    /// The `bagel` CLI beside this binary.
    bagel: PathBuf,
    /// The Roughtime server's address and key.
    roughtime: (String, String),
    /// The S3 and Roughtime settings every client runs with.
    env: Vec<(String, String)>,
    s3: Service,
    s3_port: u16,
    /// The bag stores: a directory, S3, NFS.
    stores: Vec<String>,
    cluster: Cluster,
    /// The server lists in force (moved by the migration) and every
    /// client that follows them.
    lists: Lists,
    /// The S3 lease backend's store (the S3-lease workers' leases).
    lease_store: String,
    /// Two a store: one on true time, one on a skewed clock.
    metronomes: Vec<Service>,
    acks: Arc<Mutex<Acks>>,
    workers: Vec<WorkerProc>,
    report: Report,
}

/// What runs beside the workers until [`Run::stop`]: the CLI roles, the
/// user journeys, the watchers, and the faults' own side runs (pauses,
/// operators' reads).
struct Roles {
    /// Violations the CLI roles and the journeys found.
    violations: Arc<Mutex<Vec<String>>>,
    stop_cli: tokio::sync::watch::Sender<bool>,
    cli: tokio::task::JoinHandle<RunFences>,
    stop_journeys: tokio::sync::watch::Sender<bool>,
    leaders: tokio::task::JoinHandle<anyhow::Result<FailoverReport>>,
    spellings: tokio::task::JoinHandle<anyhow::Result<SpellingReport>>,
    watchers: Watchers,
    /// The servers' kills and pauses, for the journeys to explain gaps.
    outages: Outages,
    /// When the faults began: the times printed are from it.
    started: Instant,
    side_runs: tokio::task::JoinSet<()>,
}

impl Roles {
    /// Seconds since the faults began, for the lines printed.
    fn at(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

fn need(var: &str) -> anyhow::Result<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(v),
        _ => bail!(
            "{var} is not set: bagel-chaos needs the services tests/run.sh starts (S3 server command, \
             NFS server, Roughtime server); run it from tests/run.sh or after sourcing tests/support/*.sh"
        ),
    }
}

pub async fn run(a: RunArgs) -> anyhow::Result<bool> {
    if a.workers < 5 {
        bail!("--workers must be at least 5 (the first five have roles)");
    }
    let seed = a.seed.unwrap_or_else(rand::random);
    println!("bagel-chaos: seed {seed} (rerun with --seed {seed})");
    let rng = StdRng::seed_from_u64(seed);
    let mut run = Run::start(&a, seed, rng).await?;
    let mut roles = run.start_roles()?;
    run.inject_faults(&mut roles).await?;
    let (stopped, watchers) = run.stop(roles).await?;
    run.audit(stopped, watchers).await?;
    run.after_run().await?;
    run.finish()
}

impl Run<'_> {
    /// Stops the CLI roles and the journeys (taking their reports and
    /// violations), waits for the side runs, lets every worker finish its
    /// cycle and release, and stops the metronomes. Returns when the last
    /// worker stopped, and the watchers for the checks.
    async fn stop(&mut self, roles: Roles) -> anyhow::Result<(Micros, Watchers)> {
        let Roles {
            violations,
            stop_cli,
            cli,
            stop_journeys,
            leaders,
            spellings,
            watchers,
            mut side_runs,
            ..
        } = roles;
        let report = &mut self.report;
        // Stop: workers finish their cycle and release; closers stop.
        let _ = stop_cli.send(true);
        let _ = stop_journeys.send(true);
        report.run_fences = cli.await?;
        report.failovers = leaders.await??;
        report.config_spellings = spellings.await??;
        report
            .violations
            .extend(violations.lock().expect("violations").drain(..));
        while side_runs.join_next().await.is_some() {}
        let done = self.stop_workers().await;
        let stopped = Micros::now();
        for m in &mut self.metronomes {
            m.kill().await;
        }
        self.count(&done);
        Ok((stopped, watchers))
    }

    /// Closes every worker's stdin (its signal to stop) and waits for
    /// each; returns each one's summary (cycles, acknowledged writes,
    /// failed writes, refused acquires) by worker id.
    async fn stop_workers(&mut self) -> BTreeMap<usize, [u64; 4]> {
        let report = &mut self.report;
        for w in &mut self.workers {
            w.stdin.take();
        }
        let mut done = BTreeMap::new();
        for mut w in std::mem::take(&mut self.workers) {
            match tokio::time::timeout(Duration::from_secs(60), w.child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    let _ = w.child.start_kill();
                    report
                        .violations
                        .push(format!("worker {} did not stop within 60 s", w.id));
                }
            }
            let _ = w.reader.await;
            let d = w.done.lock().expect("done").take();
            match d {
                Some(d) => {
                    done.insert(w.id, d);
                }
                None => report
                    .violations
                    .push(format!("worker {} exited without its summary", w.id)),
            }
        }
        done
    }

    /// Adds up the workers' summaries, and checks the two that must have
    /// been refused: the S3-lease worker beyond the clock margin (no
    /// lease) and the worker far ahead (no acknowledged write).
    fn count(&mut self, done: &BTreeMap<usize, [u64; 4]>) {
        let (a, report) = (self.a, &mut self.report);
        for (id, d) in done {
            report.cycles += d[0];
            report.acked_writes += d[1];
            report.failed_writes += d[2];
            report.refused_acquires += d[3];
            if *id >= a.workers {
                report.s3_lease.cycles += d[0];
                report.s3_lease.acked_writes += d[1];
                report.s3_lease.refused_acquires += d[3];
            }
        }
        let beyond = a.workers + S3_LEASE_SKEWS_MS.len() - 1;
        if let Some(d) = done.get(&beyond)
            && d[0] > 0
        {
            report.violations.push(format!(
                "the S3-lease worker {} ms ahead was granted {} leases (its clock bound is over half the margin)",
                S3_LEASE_SKEWS_MS[S3_LEASE_SKEWS_MS.len() - 1],
                d[0]
            ));
        }
        report.acked_writes += report.run_fences.acked;
        if let Some(d) = done.get(&3)
            && d[1] > 0
        {
            report.violations.push(format!(
                "the worker {BEYOND_MS} ms ahead had {} writes acknowledged",
                d[1]
            ));
        }
    }

    /// The journeys that run after the servers stopped, on servers and
    /// clients of their own: partitions (in network namespaces: their cuts
    /// must not fault the run's servers), retention, policy, hostile
    /// readers.
    async fn after_run(&mut self) -> anyhow::Result<()> {
        let (report, bagel, run_dir) = (&mut self.report, &self.bagel, &self.run_dir);
        match crate::partitions::run(
            bagel,
            &crate::services::sibling("bagel-server")?,
            run_dir,
            self.seed,
        )
        .await
        {
            Ok(p) => report.partitions = p,
            Err(e) => report.violations.push(format!("partitions: {e:#}")),
        }
        match crate::retention::run(bagel, run_dir, self.seed).await {
            Ok((r, violations)) => {
                report.retention_journeys = r;
                report.violations.extend(violations);
            }
            Err(e) => report.violations.push(format!("retention: {e:#}")),
        }
        match crate::policy::run(run_dir, self.seed).await {
            Ok((p, violations)) => {
                report.policy = p;
                report.violations.extend(violations);
            }
            Err(e) => report.violations.push(format!("policy: {e:#}")),
        }
        match crate::hostile::run().await {
            Ok((h, violations)) => {
                report.hostile_readers = h;
                report.violations.extend(violations);
            }
            Err(e) => report.violations.push(format!("hostile readers: {e:#}")),
        }
        Ok(())
    }
}
