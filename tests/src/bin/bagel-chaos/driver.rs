//! The driver: starts the servers, the metronomes and the workers, injects
//! faults at seeded random times, then checks everything and writes
//! `chaos.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bagel_bags::Bucket;
use bagel_client::Micros;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::RunArgs;
use crate::cli_roles::{self, CliSetup, RunFences};
use crate::leaders::{FailoverReport, LeaderSetup};
use crate::outages::Outages;
use crate::partitions::PartitionReport;
use crate::spellings::{SpellingReport, SpellingSetup};
use crate::watchers::{WatchReport, Watchers};
use bagel_tests::sub_url;

use crate::services::{Service, drain, free_port, journal, sibling, wait_http_ok};

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

/// What `chaos.json` says.
#[derive(Debug, Default, Serialize)]
struct Report {
    seed: u64,
    duration_s: f64,
    stores: Vec<String>,
    workers: usize,
    cycles: u64,
    acked_writes: u64,
    read_back: u64,
    failed_writes: u64,
    refused_acquires: u64,
    server_kills: u64,
    store_kills: u64,
    closer_kills: u64,
    /// Messages each store's first reader read.
    messages_read: Vec<u64>,
    readers_agree: bool,
    violations: Vec<String>,
    /// Clock offsets (ms, libfaketime) each kind of process ran with, one
    /// entry a start: `metronome`, `reader`, `audit`, `writer`, `retain`.
    clock_skews: BTreeMap<String, Vec<i64>>,
    /// Kills of one member of the lease cluster (`server_kills` counts them
    /// all), restarted with its key file or without it (a new key).
    cluster_kills: ClusterKills,
    /// Moves of the workers from one server list to another.
    migrations: u64,
    /// The workers leasing from the S3 lease backend (no server), on their
    /// own log.
    s3_lease: S3LeaseReport,
    /// `bagel run` / `--hold` supervisors interrupted (see cli_roles.rs).
    run_fences: RunFences,
    /// `bagel retain` runs on the stores (the metronomes summarize every
    /// sealed minute after [`SUMMARIZE_AFTER`]), some killed mid-way.
    retention: RetentionReport,
    /// Processes stopped (SIGSTOP) for a while and continued: a process
    /// that sleeps past its lease's deadline, a server or a closer that
    /// freezes, as a long GC pause or a swapped-out host would.
    pauses: PauseReport,
    /// Leader election: standby loops of `bagel run --wait forever` on
    /// shared names (see leaders.rs).
    failovers: FailoverReport,
    /// Clients naming the cluster with differently written server lists
    /// (see spellings.rs).
    config_spellings: SpellingReport,
    /// List-then-watch clients whose rebuilt held sets must equal a final
    /// List (see watchers.rs).
    watch_checks: WatchReport,
    /// Network partitions between a leader and its lease server, by kind
    /// (see partitions.rs).
    partitions: PartitionReport,
    /// Retention as operators run it, under faults (see retention.rs).
    retention_journeys: crate::retention::RetentionReport,
    /// Workers under an access policy (see policy.rs).
    policy: crate::policy::PolicyReport,
    /// Unread watch streams and greedy listers beside workers (see
    /// hostile.rs).
    hostile_readers: crate::hostile::HostileReport,
}

/// The SIGSTOP pauses of the run: how many of each kind of process, and
/// the longest (ms).
#[derive(Debug, Default, Serialize)]
struct PauseReport {
    workers: u64,
    servers: u64,
    metronomes: u64,
    longest_ms: u64,
}

/// Stops `pid` (SIGSTOP) for `pause`, then continues it (SIGCONT). A
/// process killed meanwhile (a restarted server) is simply gone.
async fn pause_process(pid: u32, pause: Duration) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else { return };
    if kill(Pid::from_raw(raw), Signal::SIGSTOP).is_err() {
        return;
    }
    tokio::time::sleep(pause).await;
    let _ = kill(Pid::from_raw(raw), Signal::SIGCONT);
}

/// What the retention runs did: every completed run's figures summed.
#[derive(Debug, Default, Serialize)]
struct RetentionReport {
    runs: u64,
    /// Runs killed with SIGKILL at a random point.
    killed: u64,
    /// Summaries old enough whose bags were checked.
    summaries_checked: u64,
    bags_removed: u64,
    /// Runs that ended in an error: a store being killed, or a clock it
    /// could not vouch for.
    failed: u64,
}

/// The metronomes summarize a sealed minute this long after it ends.
const SUMMARIZE_AFTER: &str = "5s";

/// Bags go this long after their minute ended: longer than the
/// metronomes' 30 s lookback plus a worker's longest cycle, so nobody
/// writes or closes a bag the retainer removes.
const KEEP_BAGS: &str = "45s";

/// What the workers on the S3 lease backend did (their cycles and writes
/// are also in the run's totals).
#[derive(Debug, Default, Serialize)]
struct S3LeaseReport {
    workers: usize,
    cycles: u64,
    acked_writes: u64,
    read_back: u64,
    refused_acquires: u64,
}

#[derive(Debug, Default, Serialize)]
struct ClusterKills {
    with_key: u64,
    without_key: u64,
}

/// Acknowledged messages, per (log, store): the servers' log on each
/// store, then the S3-lease log on each store; (timestamp, payload).
type Acks = Vec<BTreeSet<(u64, String)>>;

/// One worker process and what it has said.
struct WorkerProc {
    id: usize,
    /// Leases from the S3 lease backend (not moved by a migration).
    s3_lease: bool,
    child: Child,
    stdin: Option<ChildStdin>,
    done: Arc<Mutex<Option<[u64; 4]>>>,
    /// The latest server-list generation it has moved to.
    moved: Arc<AtomicU64>,
    reader: tokio::task::JoinHandle<()>,
}

/// One step of a migration: every client moves to new server lists; the
/// step is done when each has started a lease cycle on them (so no lease
/// from the lists before is still held by it).
struct Migration<'a> {
    workers: &'a mut Vec<WorkerProc>,
    cli_lists: &'a cli_roles::Lists,
    cli_in_use: &'a AtomicU64,
    violations: &'a mut Vec<String>,
}

impl Migration<'_> {
    async fn step(&mut self, generation: u64, current: &str, next: Option<&str>) -> anyhow::Result<()> {
        let line = format!("SERVERS {generation} {current} {}\n", next.unwrap_or(""));
        for w in self.workers.iter_mut().filter(|w| !w.s3_lease) {
            if let Some(stdin) = &mut w.stdin {
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await?;
            }
        }
        *self.cli_lists.lock().expect("lists") = (generation, current.to_owned(), next.map(str::to_owned));
        let moved = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let workers_moved = self
                    .workers
                    .iter()
                    .filter(|w| !w.s3_lease)
                    .all(|w| w.moved.load(Ordering::SeqCst) >= generation);
                if workers_moved && self.cli_in_use.load(Ordering::SeqCst) >= generation {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        if moved.is_err() {
            self.violations.push(format!(
                "migration step {generation}: not every client moved within 60 s"
            ));
        }
        Ok(())
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
    let mut rng = StdRng::seed_from_u64(seed);
    let s3_cmd = need("BAGEL_S3_SERVER")?;
    let nfs = need("BAGEL_NFS_URL_V3")?;
    let rt_addr = need("BAGEL_ROUGHTIME_ADDR")?;
    let rt_key = need("BAGEL_ROUGHTIME_KEY")?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let out = a.out.canonicalize()?;
    let run_dir = out.join(format!("run-{seed}"));
    let _ = std::fs::remove_dir_all(&run_dir);
    std::fs::create_dir_all(&run_dir)?;

    // The S3 server: our own, so we can kill it; journaled, so a restart
    // keeps what it acknowledged.
    let s3_port = free_port()?;
    let mut parts = s3_cmd.split_whitespace().map(str::to_owned);
    let s3_prog = parts.next().context("BAGEL_S3_SERVER is empty")?;
    let mut s3_args: Vec<String> = parts.collect();
    s3_args.extend([
        "127.0.0.1".to_owned(),
        s3_port.to_string(),
        "--journal".to_owned(),
        journal(&run_dir).display().to_string(),
        "--bucket".to_owned(),
        BUCKET.to_owned(),
    ]);
    let mut s3 = Service::new("s3", s3_prog, s3_args, Vec::new());
    start_s3(&mut s3, s3_port).await?;
    let endpoint = format!("http://127.0.0.1:{s3_port}");
    let env: Vec<(String, String)> = [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "bagel"),
        ("AWS_SECRET_ACCESS_KEY", "bagel-secret"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false"),
        ("BAGEL_ROUGHTIME_ADDR", rt_addr.as_str()),
        ("BAGEL_ROUGHTIME_KEY", rt_key.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();

    let dir = run_dir.join("dir-store");
    std::fs::create_dir_all(&dir)?;
    let stores = vec![
        format!("file://{}", dir.display()),
        format!("s3://{BUCKET}/run-{seed}"),
        sub_url(&nfs, &format!("chaos-{seed}-{:08x}", rand::random::<u32>())),
    ];

    // The lease servers: a cluster, each member on the same port across
    // restarts, with its key file or (a member restarted on a fresh disk)
    // without it. Every key any member ever had is trusted by the readers.
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    let mut ports = Vec::new();
    let mut keys: BTreeSet<String> = BTreeSet::new();
    // One more than the cluster: the member a migration moves to.
    for i in 0..=a.servers {
        let port = free_port()?;
        let key_file = run_dir.join(format!("server-{i}.key"));
        let mut server = Service::new(
            "bagel-server",
            sibling("bagel-server")?,
            vec![
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--max-ttl".into(),
                humantime::format_duration(a.max_ttl).to_string(),
                "--clock-tolerance".into(),
                "200ms".into(),
                "--key".into(),
                key_file.display().to_string(),
                // As deployed (deploy/README.md): a member keeps its
                // identity, which routes names, even when it restarts on
                // a fresh disk with a new key.
                "--server-id".into(),
                format!("member-{i}"),
            ],
            Vec::new(),
        );
        keys.insert(start_server(&mut server).await?);
        servers.push((server, key_file));
        urls.push(format!("member-{i}=http://127.0.0.1:{port}"));
        ports.push(port);
    }
    let server_url = urls[..a.servers].join(",");
    // After the migration: the last member replaced by the spare.
    let migrated_url = urls[..a.servers - 1]
        .iter()
        .chain(urls.last())
        .cloned()
        .collect::<Vec<_>>()
        .join(",");

    let bagel = sibling("bagel")?;
    if bagel_tests::libfaketime().is_none() {
        bail!(
            "libfaketime (Debian package faketime) is not installed: bagel-chaos skews real processes' clocks with it"
        );
    }
    let roughtime = (rt_addr.clone(), rt_key.clone());
    let mut report = Report {
        seed,
        stores: stores.clone(),
        workers: a.workers,
        ..Default::default()
    };
    // Two metronomes a store: the first on true time, the second on a
    // clock drawn again at every restart (inside the tolerance it closes;
    // beyond it, it must refuse to).
    let mut metronomes: Vec<Service> = Vec::new();
    for url in &stores {
        for j in 0..2 {
            let skew = if j == 0 {
                0
            } else {
                *SKEWS_MS.choose(&mut rng).expect("skews")
            };
            let mut m = metronome(&bagel, url, &roughtime, skew, &env);
            report
                .clock_skews
                .entry("metronome".into())
                .or_default()
                .push(skew);
            drain(m.start()?);
            metronomes.push(m);
        }
    }

    let acks: Arc<Mutex<Acks>> = Arc::new(Mutex::new(vec![BTreeSet::new(); 2 * stores.len()]));
    let mut workers = Vec::new();
    for id in 0..a.workers {
        // Workers 0 and 1 run whole (lease client, writer, closer) on a
        // clock a little ahead and behind; worker 3's writer is far ahead
        // (its lease client is not, so it gets leases to refuse writing
        // under); worker 4 runs whole 2.5 s behind, beyond the tolerance:
        // its lease validity is measured on monotonic time and its writer
        // allows for its measured bound, so whatever it gets acknowledged
        // must be read back like anyone's.
        let (skew, role): (i64, &[&str]) = match id {
            0 => (300, &[]),
            1 => (-300, &[]),
            2 => (0, &["--delay-appends"]),
            3 => (0, &["--clock-offset-ms", "20000"]),
            4 => (-2_500, &[]),
            _ => (0, &[]),
        };
        report.clock_skews.entry("worker".into()).or_default().push(skew);
        workers.push(start_worker(
            id,
            Leases::Servers(&server_url),
            &stores,
            &a,
            rng.r#gen(),
            skew,
            role,
            &env,
            &acks,
        )?);
    }
    // The S3 lease backend as a second lease target: its own workers, names
    // and log, on the same S3 server (killed with it) and the same stores.
    let lease_store = format!("s3://{BUCKET}/run-{seed}-leases");
    for (i, &skew) in S3_LEASE_SKEWS_MS.iter().take(a.s3_lease_workers).enumerate() {
        report
            .clock_skews
            .entry("s3_lease_worker".into())
            .or_default()
            .push(skew);
        workers.push(start_worker(
            a.workers + i,
            Leases::Store(&lease_store),
            &stores,
            &a,
            rng.r#gen(),
            skew,
            // Over the S3 backend's 1 s minimum TTL, counted from its own
            // checked clock after the request is built.
            &["--ttl", "3s"],
            &env,
            &acks,
        )?);
    }
    report.s3_lease.workers = a.s3_lease_workers.min(S3_LEASE_SKEWS_MS.len());
    // The CLI roles (`bagel run` fenced, writers killed, holders
    // interrupted) write to the directory and S3 stores.
    let violations = Arc::new(Mutex::new(Vec::new()));
    std::fs::create_dir_all(run_dir.join("cli/state"))?;
    let (stop_cli, stop_rx) = tokio::sync::watch::channel(false);
    let cli_lists: cli_roles::Lists = Arc::new(Mutex::new((0, server_url.clone(), None)));
    let cli_in_use = Arc::new(AtomicU64::new(0));
    let cli = tokio::spawn(cli_roles::run(
        CliSetup {
            bagel: bagel.clone(),
            lists: Arc::clone(&cli_lists),
            in_use: Arc::clone(&cli_in_use),
            roughtime: roughtime.clone(),
            env: env.clone(),
            dir: run_dir.join("cli"),
            log: LOG.into(),
            stores: stores.iter().cloned().enumerate().take(2).collect(),
            names: a.names,
        },
        rng.r#gen(),
        Arc::clone(&acks),
        stop_rx,
        Arc::clone(&violations),
    ));
    let mut side_runs = tokio::task::JoinSet::new();
    // The user journeys, on the first list (the spare is not theirs): they
    // stop with the CLI roles, and read the servers' outages at the end.
    let started = Instant::now();
    let outages = Outages::default();
    let (stop_journeys, journeys_rx) = tokio::sync::watch::channel(false);
    let leader_skew = *[300, -300, 2_500, -2_500].choose(&mut rng).expect("skews");
    report
        .clock_skews
        .entry("standby".into())
        .or_default()
        .push(leader_skew);
    // List-then-watch clients, one on each member (the spare included: a
    // migration moves names onto it).
    let watchers = Watchers::start(
        &ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>(),
    );
    let leaders = tokio::spawn(crate::leaders::run(
        LeaderSetup {
            bagel: bagel.clone(),
            exe: std::env::current_exe()?,
            servers: server_url.clone(),
            roughtime: roughtime.clone(),
            env: env.clone(),
            dir: run_dir.join("leaders"),
            ttl: a.max_ttl,
            skew_ms: leader_skew,
            outages: outages.clone(),
            started,
        },
        rng.r#gen(),
        journeys_rx.clone(),
        Arc::clone(&violations),
    ));
    let spellings = tokio::spawn(crate::spellings::run(
        SpellingSetup {
            bagel: bagel.clone(),
            env: env.clone(),
            dir: run_dir.join("spellings"),
            members: (0..a.servers)
                .map(|i| (format!("member-{i}"), ports[i]))
                .collect(),
            ttl: a.max_ttl,
            outages: outages.clone(),
            started,
        },
        rng.r#gen(),
        journeys_rx,
        Arc::clone(&violations),
    ));
    println!(
        "bagel-chaos: {} workers on {} names, stores {stores:?}, lease server {server_url} (max TTL {:?})",
        a.workers, a.names, a.max_ttl
    );

    // Faults.
    let at = || started.elapsed().as_secs_f64();
    let mut next = Duration::from_secs(3);
    let migrate_at = a.duration / 3;
    while started.elapsed() + next < a.duration {
        tokio::time::sleep(next).await;
        if report.migrations == 0 && started.elapsed() >= migrate_at {
            let mut m = Migration {
                workers: &mut workers,
                cli_lists: &cli_lists,
                cli_in_use: &cli_in_use,
                violations: &mut report.violations,
            };
            m.step(1, &server_url, Some(&migrated_url)).await?;
            println!(
                "[{:>5.1}s] migration step 1: every grant from {server_url} and {migrated_url}",
                at()
            );
            // Every lease granted under the old list alone is gone by now:
            // its holder moved (released) and its deadline has passed.
            tokio::time::sleep(a.max_ttl + Duration::from_millis(500)).await;
            m.step(2, &migrated_url, None).await?;
            println!("[{:>5.1}s] migration step 2: {migrated_url} only", at());
            report.migrations += 1;
        }
        match rng.gen_range(0..9) {
            0 => {
                let i = rng.gen_range(0..servers.len());
                let keep_key = rng.gen_bool(0.5);
                let (server, key_file) = &mut servers[i];
                let from = Instant::now();
                server.kill().await;
                if !keep_key {
                    // A fresh disk: no key, no granted-until mark.
                    let _ = std::fs::remove_file(&*key_file);
                    let _ = std::fs::remove_file(key_file.with_extension("key.granted-until"));
                }
                keys.insert(start_server(server).await?);
                // It grants nothing until its restart wait (max TTL) is over.
                outages.record(format!("member-{i}"), "kill", from, Instant::now() + a.max_ttl);
                report.server_kills += 1;
                if keep_key {
                    report.cluster_kills.with_key += 1;
                } else {
                    report.cluster_kills.without_key += 1;
                }
                println!(
                    "[{:>5.1}s] kill -9 lease server {i}; restarted {} its key (waits out its TTL)",
                    at(),
                    if keep_key { "with" } else { "without" }
                );
            }
            1 => {
                s3.kill().await;
                start_s3(&mut s3, s3_port).await?;
                report.store_kills += 1;
                println!("[{:>5.1}s] kill -9 S3 server; restarted from its journal", at());
            }
            2 | 3 => {
                let i = rng.gen_range(0..metronomes.len());
                metronomes[i].kill().await;
                if i % 2 == 1 {
                    let skew = *SKEWS_MS.choose(&mut rng).expect("skews");
                    metronomes[i] = metronome(&bagel, &stores[i / 2], &roughtime, skew, &env);
                    report
                        .clock_skews
                        .entry("metronome".into())
                        .or_default()
                        .push(skew);
                }
                drain(metronomes[i].start()?);
                report.closer_kills += 1;
                println!("[{:>5.1}s] kill -9 metronome {i}; restarted", at());
            }
            7 => {
                // Retention on one store, killed at a random point half
                // the time: what it removed must still read back from the
                // summaries, and a killed run is finished by the next.
                let url = stores[rng.gen_range(0..stores.len())].clone();
                let kill_after = rng
                    .gen_bool(0.5)
                    .then(|| Duration::from_millis(rng.gen_range(0..400)));
                // On a skewed clock like any closer: it judges age on its
                // reading less its measured bound (never early), and
                // refuses when it cannot vouch for its clock.
                let skew = *SKEWS_MS.choose(&mut rng).expect("skews");
                report.clock_skews.entry("retain".into()).or_default().push(skew);
                let mut c = skewed(&bagel, skew);
                c.args(["--roughtime", &roughtime.0, "--roughtime-key", &roughtime.1])
                    .args(["retain", "--store", &url, "--log", LOG, "--json"])
                    .args(["--keep-bags", KEEP_BAGS, "--unsafe-min-keep", KEEP_BAGS])
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .env("RUST_LOG", "error")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .kill_on_drop(true);
                report.retention.runs += 1;
                match retain_once(c, kill_after).await {
                    Retained::Done(checked, removed) => {
                        report.retention.summaries_checked += checked;
                        report.retention.bags_removed += removed;
                        println!(
                            "[{:>5.1}s] bagel retain of {url}: {checked} summaries checked, {removed} bags removed",
                            at()
                        );
                    }
                    Retained::Killed => {
                        report.retention.killed += 1;
                        println!("[{:>5.1}s] bagel retain of {url}: killed mid-way", at());
                    }
                    Retained::Failed => report.retention.failed += 1,
                }
            }
            8 => {
                // A process frozen (SIGSTOP) for up to twice the max TTL
                // and more, then continued: a worker wakes past its
                // leases' deadlines with appends in flight (they must be
                // refused or read back, never lost or overlapping the
                // next holder's); a server or a metronome wakes to a world
                // that moved on.
                let pause = Duration::from_millis(
                    rng.gen_range(100..=u64::try_from((a.max_ttl * 2).as_millis()).unwrap_or(4_000) + 2_000),
                );
                let (what, pid) = match rng.gen_range(0..4) {
                    0 | 1 => {
                        let w = &workers[rng.gen_range(0..workers.len())];
                        report.pauses.workers += 1;
                        (format!("worker {}", w.id), w.child.id())
                    }
                    2 => {
                        let i = rng.gen_range(0..servers.len());
                        report.pauses.servers += 1;
                        outages.record(
                            format!("member-{i}"),
                            "pause",
                            Instant::now(),
                            Instant::now() + pause,
                        );
                        (format!("lease server {i}"), servers[i].0.pid())
                    }
                    _ => {
                        let i = rng.gen_range(0..metronomes.len());
                        report.pauses.metronomes += 1;
                        (format!("metronome {i}"), metronomes[i].pid())
                    }
                };
                let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
                report.pauses.longest_ms = report.pauses.longest_ms.max(ms);
                if let Some(pid) = pid {
                    side_runs.spawn(pause_process(pid, pause));
                }
                println!("[{:>5.1}s] SIGSTOP {what} for {ms} ms, then SIGCONT", at());
            }
            k => {
                // An operator's `bagel read` or `bagel audit` on a skewed
                // clock, mid-run: it may refuse, never close bags early.
                let verb = if k == 6 { "audit" } else { "read" };
                let skew = *SKEWS_MS[1..].choose(&mut rng).expect("skews");
                report.clock_skews.entry(verb.into()).or_default().push(skew);
                let url = stores[rng.gen_range(0..stores.len())].clone();
                let mut c = skewed(&bagel, skew);
                c.args(["--roughtime", &roughtime.0, "--roughtime-key", &roughtime.1])
                    .args([verb, "--store", &url, "--log", LOG, "--json"])
                    .args(keys.iter().flat_map(|k| ["--key".to_owned(), k.clone()]))
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .env("RUST_LOG", "error")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .kill_on_drop(true);
                side_runs.spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(30), c.status()).await;
                });
                println!("[{:>5.1}s] bagel {verb} of {url} on a clock {skew} ms off", at());
            }
        }
        next = Duration::from_millis(rng.gen_range(1500..5000));
    }
    tokio::time::sleep(a.duration.saturating_sub(started.elapsed())).await;
    report.duration_s = started.elapsed().as_secs_f64();

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
    for w in &mut workers {
        w.stdin.take();
    }
    let mut done = BTreeMap::new();
    for mut w in workers {
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
    let stopped = Micros::now();
    for m in &mut metronomes {
        m.kill().await;
    }
    for (id, d) in &done {
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

    // Every bag that can hold a write is past its close time (clocks may be
    // a tolerance apart); readers close or seal whatever is still open.
    // A closer acts on its clock less its error bound, and a bound from
    // Roughtime is at least its radius (5 s from roughenough 2.2): the
    // readers close the last bags only that much later.
    let last = Bucket::of(stopped.saturating_add(Duration::from_millis(500)));
    let all_due = last
        .close_time(GRACE)
        .saturating_add(CLOCK_TOLERANCE)
        .saturating_add(CLOSER_BOUND);
    tokio::time::sleep(all_due.duration_since(Micros::now())).await;

    let acks = acks.lock().expect("acks").clone();
    let flags = Flags {
        bagel: bagel.clone(),
        env: env.clone(),
        keys: keys.iter().cloned().collect(),
        server_url: server_url.clone(),
        lease_store: lease_store.clone(),
    };
    let mut agree = true;
    let logs = [LOG, S3_LEASE_LOG];
    let per_log = stores.len();
    for (si, (log, url)) in logs
        .iter()
        .flat_map(|log| stores.iter().map(move |url| (*log, url)))
        .enumerate()
    {
        let first = flags.read(log, url).await?;
        let second = flags.read(log, url).await?;
        if log == LOG {
            report.messages_read.push(first.messages.len() as u64);
        }
        if first.messages != second.messages {
            agree = false;
            report.violations.push(format!(
                "{url} {log}: two readers disagree ({} vs {} messages)",
                first.messages.len(),
                second.messages.len()
            ));
        }
        for bad in first.rejected.iter().chain(&first.problems) {
            report.violations.push(format!("{url} {log}: {bad}"));
        }
        let got: BTreeSet<(u64, String)> = first.messages.iter().map(|m| (m.0, m.3.clone())).collect();
        for ack in &acks[si] {
            if got.contains(ack) {
                report.read_back += 1;
                if si >= per_log {
                    report.s3_lease.read_back += 1;
                }
            } else {
                report
                    .violations
                    .push(format!("{url} {log}: acknowledged write not read back: {ack:?}"));
            }
        }
        for v in flags.audit(log, url).await? {
            report.violations.push(format!("{url} {log}: audit: {v}"));
        }
    }
    report.readers_agree = agree;
    let acked_seen: u64 = acks.iter().map(|s| s.len() as u64).sum();
    if acked_seen != report.acked_writes {
        report.violations.push(format!(
            "workers said they acknowledged {} writes, their ACK lines name {acked_seen}",
            report.acked_writes
        ));
    }
    // With the run quiet: each watcher's rebuilt set against a fresh List.
    report.watch_checks = watchers.check().await;
    for m in &report.watch_checks.mismatches {
        report.violations.push(format!("watch: {m}"));
    }
    s3.kill().await;
    for (server, _) in &mut servers {
        server.kill().await;
    }
    // Partitions, on servers and clients of their own in network
    // namespaces (after the run: their cuts must not fault the run's
    // servers).
    match crate::partitions::run(&bagel, &sibling("bagel-server")?, &run_dir).await {
        Ok(p) => report.partitions = p,
        Err(e) => report.violations.push(format!("partitions: {e:#}")),
    }
    match crate::retention::run(&bagel, &run_dir, seed).await {
        Ok((r, violations)) => {
            report.retention_journeys = r;
            report.violations.extend(violations);
        }
        Err(e) => report.violations.push(format!("retention: {e:#}")),
    }
    match crate::policy::run(&run_dir, seed).await {
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

    println!(
        "bagel-chaos: watchers: {} (events {}, relists {}, {} matched a final List); partitions: {} (longest {} ms)",
        report.watch_checks.watchers,
        report.watch_checks.events,
        report.watch_checks.relists,
        report.watch_checks.matched,
        if report.partitions.ran {
            report
                .partitions
                .kinds
                .iter()
                .map(|k| format!("{} takeover {} ms", k.kind, k.takeover_ms))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            format!(
                "NOT RUN: {}",
                report.partitions.not_run_because.as_deref().unwrap_or("?")
            )
        },
        report.partitions.longest_ms
    );
    let ok = report.violations.is_empty() && report.read_back == report.acked_writes && report.readers_agree;
    std::fs::write(out.join("chaos.json"), serde_json::to_vec_pretty(&report)?)?;
    println!(
        "bagel-chaos: seed {seed}: {:.0} s, {} cycles, {} acked = {} read back ({} failed writes, {} refused acquires); \
         kills: {} lease server ({} without its key), {} S3 server, {} closers; CLI runs interrupted: {} fork, \
         {} SIGTERM, {} writer SIGKILL, {} --hold SIGINT; S3-lease workers: {} cycles, {} acked = {} read back; \
         skewed starts: {}; SIGSTOP pauses: {} (longest {} ms); leaders: {} failovers of {} leaders, longest gap \
         {} ms (bound {} ms; {} explained by an outage, longest {} ms), {} overlaps, {} stale steps after a freeze; \
         config spellings: {} grants over {} spellings, {} double grants, swapped IDs refused {} of {}; readers \
         agree: {}; {} violations; {}",
        report.duration_s,
        report.cycles,
        report.acked_writes,
        report.read_back,
        report.failed_writes,
        report.refused_acquires,
        report.server_kills,
        report.cluster_kills.without_key,
        report.store_kills,
        report.closer_kills,
        report.run_fences.fork,
        report.run_fences.sigterm,
        report.run_fences.sigkill_writer,
        report.run_fences.hold_interrupt,
        report.s3_lease.cycles,
        report.s3_lease.acked_writes,
        report.s3_lease.read_back,
        report.clock_skews.values().flatten().filter(|&&s| s != 0).count(),
        report.pauses.workers + report.pauses.servers + report.pauses.metronomes,
        report.pauses.longest_ms,
        report.failovers.count,
        report.failovers.leaders,
        report.failovers.longest_gap_ms,
        report.failovers.gap_bound_ms,
        report.failovers.explained_gaps,
        report.failovers.longest_explained_gap_ms,
        report.failovers.overlaps,
        report.failovers.stale_steps_after_freeze,
        report.config_spellings.grants,
        report.config_spellings.spellings.len(),
        report.config_spellings.double_grants,
        report.config_spellings.wrong_id_refused,
        report.config_spellings.wrong_id_tries,
        report.readers_agree,
        report.violations.len(),
        out.join("chaos.json").display()
    );
    for v in report.violations.iter().take(20) {
        println!("VIOLATION {v}");
    }
    Ok(ok)
}

async fn start_s3(s3: &mut Service, port: u16) -> anyhow::Result<()> {
    drain(s3.start()?);
    // Replaying a long journal takes a while.
    wait_http_ok(port, "/moto-api/", Duration::from_secs(120)).await
}

/// Starts a lease server; returns its public key (hex).
async fn start_server(server: &mut Service) -> anyhow::Result<String> {
    let out = server.start()?;
    let mut lines = BufReader::new(out).lines();
    let mut key = None;
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("public key ") {
                key = Some(line.clone());
            }
            if line.contains(" listening on ") {
                return Ok::<_, std::io::Error>(true);
            }
        }
        Ok(false)
    })
    .await;
    if !matches!(found, Ok(Ok(true))) {
        bail!("bagel-server did not start: {found:?}");
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let line = key.context("bagel-server printed no public key")?;
    Ok(line
        .split_whitespace()
        .nth(2)
        .with_context(|| format!("no key in {line:?}"))?
        .to_owned())
}

/// Where a worker takes its leases.
#[derive(Clone, Copy)]
enum Leases<'a> {
    /// The lease servers (a comma-separated list).
    Servers(&'a str),
    /// The S3 lease backend at this URL; the worker writes [`S3_LEASE_LOG`].
    Store(&'a str),
}

#[allow(clippy::too_many_arguments)]
fn start_worker(
    id: usize,
    leases: Leases<'_>,
    stores: &[String],
    a: &RunArgs,
    seed: u64,
    skew_ms: i64,
    role: &[&str],
    env: &[(String, String)],
    acks: &Arc<Mutex<Acks>>,
) -> anyhow::Result<WorkerProc> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(&exe);
    command.envs(skew_env(skew_ms));
    let (source, log, ack_base) = match leases {
        Leases::Servers(list) => (["--server", list], LOG, 0),
        Leases::Store(url) => (["--lease-store", url], S3_LEASE_LOG, stores.len()),
    };
    let mut child = command
        .arg("worker")
        .args(source)
        .args(["--stores", &stores.join(","), "--log", log])
        .args([
            "--names",
            &a.names.to_string(),
            "--seed",
            &seed.to_string(),
            "--id",
            &id.to_string(),
        ])
        .args(role)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting a worker")?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped");
    let done = Arc::new(Mutex::new(None));
    let moved = Arc::new(AtomicU64::new(0));
    let reader = tokio::spawn({
        let (acks, done, moved) = (Arc::clone(acks), Arc::clone(&done), Arc::clone(&moved));
        async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut f = line.splitn(4, ' ');
                match (f.next(), f.next(), f.next(), f.next()) {
                    (Some("ACK"), Some(si), Some(ts), Some(payload)) => {
                        if let (Ok(si), Ok(ts)) = (si.parse::<usize>(), ts.parse::<u64>()) {
                            acks.lock().expect("acks")[ack_base + si].insert((ts, payload.to_owned()));
                        }
                    }
                    (Some("MOVED"), Some(generation), ..) => {
                        if let Ok(g) = generation.parse() {
                            moved.fetch_max(g, Ordering::SeqCst);
                        }
                    }
                    (Some("DONE"), ..) => {
                        let n: Vec<u64> = line.split(' ').skip(1).filter_map(|x| x.parse().ok()).collect();
                        if let [c, a, f, r] = n[..] {
                            *done.lock().expect("done") = Some([c, a, f, r]);
                        }
                    }
                    _ => {}
                }
            }
        }
    });
    Ok(WorkerProc {
        id,
        s3_lease: matches!(leases, Leases::Store(_)),
        child,
        stdin,
        done,
        moved,
        reader,
    })
}

/// How the driver runs the real CLI against a store.
struct Flags {
    bagel: PathBuf,
    env: Vec<(String, String)>,
    /// Every key any lease server had during the run.
    keys: Vec<String>,
    server_url: String,
    /// The S3 lease store, whose published keys vouch for [`S3_LEASE_LOG`].
    lease_store: String,
}

/// One `bagel read --json`: messages (timestamp, writer, sequence,
/// payload), and what it rejected or found damaged.
struct Read {
    messages: Vec<(u64, String, u64, String)>,
    rejected: Vec<String>,
    problems: Vec<String>,
}

impl Flags {
    fn command(&self, args: &[&str]) -> Command {
        let rt_addr = self.env("BAGEL_ROUGHTIME_ADDR");
        let rt_key = self.env("BAGEL_ROUGHTIME_KEY");
        let mut c = Command::new(&self.bagel);
        c.args([
            "--servers",
            &self.server_url,
            "--roughtime",
            &rt_addr,
            "--roughtime-key",
            &rt_key,
        ])
        .args(args)
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .kill_on_drop(true);
        c
    }

    fn env(&self, k: &str) -> String {
        self.env
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// `bagel <verb> --store URL --log LOG --json`, trusting every server
    /// key (`--key KEY...`) for the servers' log and the keys published in
    /// the S3 lease store (`--lease-store`) for its log.
    async fn on_log(&self, verb: &str, log: &str, url: &str) -> anyhow::Result<std::process::Output> {
        let mut c = self.command(&[verb, "--store", url, "--log", log, "--json"]);
        if log == S3_LEASE_LOG {
            c.args(["--lease-store", &self.lease_store]);
        } else {
            c.args(self.keys.iter().flat_map(|k| ["--key", k.as_str()]));
        }
        Ok(c.output().await?)
    }

    async fn read(&self, log: &str, url: &str) -> anyhow::Result<Read> {
        let out = self.on_log("read", log, url).await?;
        // A read that rejected messages exits non-zero with its report;
        // one that failed has no summary line.
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !stdout.contains(r#""kind":"summary""#) {
            bail!(
                "bagel read {url} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut r = Read {
            messages: Vec::new(),
            rejected: Vec::new(),
            problems: Vec::new(),
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(line)?;
            match v["kind"].as_str() {
                Some("message") => r.messages.push((
                    v["timestamp_us"].as_u64().unwrap_or(0),
                    v["writer_id"].as_str().unwrap_or_default().to_owned(),
                    v["sequence"].as_u64().unwrap_or(0),
                    v["payload"].as_str().unwrap_or_default().to_owned(),
                )),
                Some("rejected") => r.rejected.push(format!("rejected by the reader: {line}")),
                Some("problem") => r.problems.push(format!("damage: {line}")),
                _ => {}
            }
        }
        Ok(r)
    }

    /// `bagel audit`'s violations (none when it exits 0).
    async fn audit(&self, log: &str, url: &str) -> anyhow::Result<Vec<String>> {
        let out = self.on_log("audit", log, url).await?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("bagel audit {url}: {}", String::from_utf8_lossy(&out.stderr)))?;
        let violations: Vec<String> = v["violations"]
            .as_array()
            .map(|a| a.iter().map(|x| x.to_string()).collect())
            .unwrap_or_default();
        if !out.status.success() && violations.is_empty() {
            bail!(
                "bagel audit {url} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(violations)
    }
}

enum Retained {
    /// Summaries checked, bags removed.
    Done(u64, u64),
    Killed,
    Failed,
}

/// Runs one `bagel retain`, killed with SIGKILL after `kill_after` if it
/// has not ended by then.
async fn retain_once(mut c: Command, kill_after: Option<Duration>) -> Retained {
    let Ok(mut child) = c.spawn() else {
        return Retained::Failed;
    };
    let mut stdout = child.stdout.take().expect("piped");
    let read = async {
        let mut out = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut stdout, &mut out).await;
        (child.wait().await, out)
    };
    let (status, out) = match kill_after {
        Some(after) => match tokio::time::timeout(after, read).await {
            Ok(done) => done,
            Err(_) => return Retained::Killed, // dropped: kill_on_drop
        },
        None => match tokio::time::timeout(Duration::from_secs(60), read).await {
            Ok(done) => done,
            Err(_) => return Retained::Failed,
        },
    };
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
    match status {
        Ok(s) if s.success() => Retained::Done(
            v["summaries_checked"].as_u64().unwrap_or(0),
            v["bags_removed"].as_u64().unwrap_or(0),
        ),
        _ => Retained::Failed,
    }
}

/// A metronome on `url`, on a clock `skew_ms` off (libfaketime), closing
/// on the signed time Roughtime gives it.
fn metronome(
    bagel: &std::path::Path,
    url: &str,
    roughtime: &(String, String),
    skew_ms: i64,
    env: &[(String, String)],
) -> Service {
    let args = [
        "--roughtime",
        &roughtime.0,
        "--roughtime-key",
        &roughtime.1,
        "metronome",
        "--store",
        url,
        "--log",
        LOG,
        S3_LEASE_LOG,
        "--lookback",
        "30s",
        "--summarize-after",
        SUMMARIZE_AFTER,
    ]
    .map(str::to_owned)
    .to_vec();
    let mut env = env.to_vec();
    env.extend(skew_env(skew_ms));
    Service::new("metronome", bagel, args, env)
}

/// `bagel` run on a clock `skew_ms` off.
fn skewed(bagel: &std::path::Path, skew_ms: i64) -> Command {
    let mut c = Command::new(bagel);
    c.envs(skew_env(skew_ms));
    c
}

/// The environment that runs a process on a clock `skew_ms` off: libfaketime
/// preloaded into the process itself (no wrapper process, so a kill reaches
/// the process that acts), with a relative offset such as `+2.5s`.
fn skew_env(skew_ms: i64) -> Vec<(String, String)> {
    if skew_ms == 0 {
        return Vec::new();
    }
    let lib = bagel_tests::libfaketime().expect("checked at start");
    let offset = format!(
        "{}{}s",
        if skew_ms < 0 { "-" } else { "+" },
        skew_ms.unsigned_abs() as f64 / 1000.0
    );
    vec![
        ("LD_PRELOAD".to_owned(), lib.display().to_string()),
        ("FAKETIME".to_owned(), offset),
    ]
}
