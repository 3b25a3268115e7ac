//! Starting the run: the S3 server, the lease cluster (one spare member
//! for the migration), two metronomes a store, the workers on the servers
//! and on the S3 lease backend, then the CLI roles and the user journeys
//! beside them; and the processes' clocks (libfaketime). Everything here
//! runs once, before the first fault.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rand::Rng as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use super::report::Report;
use super::{
    Acks, BUCKET, LOG, Roles, Run, S3_LEASE_LOG, S3_LEASE_SKEWS_MS, SKEWS_MS, SUMMARIZE_AFTER, need,
};
use crate::RunArgs;
use crate::cli_roles::{self, CliSetup};
use crate::leaders::LeaderSetup;
use crate::lists::{Lists, Mover};
use crate::outages::Outages;
use crate::services::{Service, drain, free_port, journal, sibling, wait_http_ok};
use crate::spellings::SpellingSetup;
use crate::watchers::Watchers;
use bagel_tests::sub_url;

/// The lease servers: a cluster, each member on the same port across
/// restarts, with its key file or (a member restarted on a fresh disk)
/// without it, and one more member than the cluster: the one a migration
/// moves to.
pub(super) struct Cluster {
    /// Each member and its key file.
    pub(super) servers: Vec<(Service, PathBuf)>,
    /// Every key any member ever had: the readers trust them all.
    pub(super) keys: BTreeSet<String>,
    /// The cluster's server list.
    pub(super) server_url: String,
    /// The list after the migration: the last member replaced by the spare.
    pub(super) migrated_url: String,
}

impl<'a> Run<'a> {
    /// Starts the services and the workers (not yet the CLI roles and the
    /// journeys: see [`Run::start_roles`]).
    pub(super) async fn start(a: &'a RunArgs, seed: u64, rng: StdRng) -> anyhow::Result<Self> {
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
        let cluster = start_cluster(a, &run_dir).await?;

        let bagel = sibling("bagel")?;
        if bagel_tests::libfaketime().is_none() {
            bail!(
                "libfaketime (Debian package faketime) is not installed: bagel-chaos skews real processes' clocks with it"
            );
        }
        let roughtime = (rt_addr.clone(), rt_key.clone());
        let report = Report {
            seed,
            stores: stores.clone(),
            workers: a.workers,
            ..Default::default()
        };
        let acks: Arc<Mutex<Acks>> = Arc::new(Mutex::new(vec![BTreeSet::new(); 2 * stores.len()]));
        let mut run = Run {
            a,
            seed,
            rng,
            out,
            run_dir,
            bagel,
            roughtime,
            env,
            s3,
            s3_port,
            lease_store: format!("s3://{BUCKET}/run-{seed}-leases"),
            stores,
            lists: Lists::new(cluster.server_url.clone()),
            cluster,
            metronomes: Vec::new(),
            acks,
            workers: Vec::new(),
            report,
        };
        run.start_metronomes()?;
        run.start_workers()?;
        Ok(run)
    }

    /// Two metronomes a store: the first on true time, the second on a
    /// clock drawn again at every restart (inside the tolerance it closes;
    /// beyond it, it must refuse to).
    fn start_metronomes(&mut self) -> anyhow::Result<()> {
        for url in &self.stores {
            for j in 0..2 {
                let skew = if j == 0 {
                    0
                } else {
                    *SKEWS_MS.choose(&mut self.rng).expect("skews")
                };
                let mut m = metronome(&self.bagel, url, &self.roughtime, skew, &self.env);
                self.report
                    .clock_skews
                    .entry("metronome".into())
                    .or_default()
                    .push(skew);
                drain(m.start()?);
                self.metronomes.push(m);
            }
        }
        Ok(())
    }

    /// The workers on the lease servers, then those on the S3 lease
    /// backend.
    fn start_workers(&mut self) -> anyhow::Result<()> {
        let a = self.a;
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
            self.report
                .clock_skews
                .entry("worker".into())
                .or_default()
                .push(skew);
            self.workers.push(start_worker(
                id,
                Leases::Servers(&self.cluster.server_url),
                &self.stores,
                a,
                self.rng.r#gen(),
                skew,
                role,
                &self.env,
                &self.acks,
                Some(self.lists.mover(format!("worker {id}"))),
            )?);
        }
        // The S3 lease backend as a second lease target: its own workers, names
        // and log, on the same S3 server (killed with it) and the same stores.
        for (i, &skew) in S3_LEASE_SKEWS_MS.iter().take(a.s3_lease_workers).enumerate() {
            self.report
                .clock_skews
                .entry("s3_lease_worker".into())
                .or_default()
                .push(skew);
            self.workers.push(start_worker(
                a.workers + i,
                Leases::Store(&self.lease_store),
                &self.stores,
                a,
                self.rng.r#gen(),
                skew,
                // Over the S3 backend's 1 s minimum TTL, counted from its own
                // checked clock after the request is built.
                &["--ttl", "3s"],
                &self.env,
                &self.acks,
                None,
            )?);
        }
        self.report.s3_lease.workers = a.s3_lease_workers.min(S3_LEASE_SKEWS_MS.len());
        Ok(())
    }

    /// The CLI roles (`bagel run` fenced, writers killed, holders
    /// interrupted) on the directory and S3 stores, the list-then-watch
    /// clients, and the user journeys (leaders, config spellings); they run
    /// until [`Run::stop`].
    pub(super) fn start_roles(&mut self) -> anyhow::Result<Roles> {
        let a = self.a;
        let violations = Arc::new(Mutex::new(Vec::new()));
        std::fs::create_dir_all(self.run_dir.join("cli/state"))?;
        let (stop_cli, stop_rx) = tokio::sync::watch::channel(false);
        let cli = tokio::spawn(cli_roles::run(
            CliSetup {
                bagel: self.bagel.clone(),
                lists: self.lists.clone(),
                roughtime: self.roughtime.clone(),
                env: self.env.clone(),
                dir: self.run_dir.join("cli"),
                log: LOG.into(),
                stores: self.stores.iter().cloned().enumerate().take(2).collect(),
                names: a.names,
            },
            self.rng.r#gen(),
            Arc::clone(&self.acks),
            stop_rx,
            Arc::clone(&violations),
        ));
        let side_runs = tokio::task::JoinSet::new();
        // The user journeys, on the first list (the spare is not theirs): they
        // stop with the CLI roles, and read the servers' outages at the end.
        let started = Instant::now();
        let outages = Outages::default();
        let (stop_journeys, journeys_rx) = tokio::sync::watch::channel(false);
        let leader_skew = *[300, -300, 2_500, -2_500].choose(&mut self.rng).expect("skews");
        self.report
            .clock_skews
            .entry("standby".into())
            .or_default()
            .push(leader_skew);
        // List-then-watch clients, one on each member of the lists in
        // force, following the migration.
        let watchers = Watchers::start(self.lists.clone(), outages.clone(), started);
        let leaders = tokio::spawn(crate::leaders::run(
            LeaderSetup {
                bagel: self.bagel.clone(),
                exe: std::env::current_exe()?,
                lists: self.lists.clone(),
                roughtime: self.roughtime.clone(),
                env: self.env.clone(),
                dir: self.run_dir.join("leaders"),
                ttl: a.max_ttl,
                skew_ms: leader_skew,
                outages: outages.clone(),
                started,
            },
            self.rng.r#gen(),
            journeys_rx.clone(),
            Arc::clone(&violations),
        ));
        let spellings = tokio::spawn(crate::spellings::run(
            SpellingSetup {
                bagel: self.bagel.clone(),
                env: self.env.clone(),
                dir: self.run_dir.join("spellings"),
                lists: self.lists.clone(),
                ttl: a.max_ttl,
                outages: outages.clone(),
                started,
            },
            self.rng.r#gen(),
            journeys_rx,
            Arc::clone(&violations),
        ));
        println!(
            "bagel-chaos: {} workers on {} names, stores {:?}, lease server {} (max TTL {:?})",
            a.workers, a.names, self.stores, self.cluster.server_url, a.max_ttl
        );
        Ok(Roles {
            violations,
            stop_cli,
            cli,
            stop_journeys,
            leaders,
            spellings,
            watchers,
            outages,
            started,
            side_runs,
        })
    }
}

/// Starts the cluster's members and the spare (see [`Cluster`]).
async fn start_cluster(a: &RunArgs, run_dir: &Path) -> anyhow::Result<Cluster> {
    let mut servers = Vec::new();
    let mut urls = Vec::new();
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
    }
    let server_url = urls[..a.servers].join(",");
    // After the migration: the last member replaced by the spare.
    let migrated_url = urls[..a.servers - 1]
        .iter()
        .chain(urls.last())
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    Ok(Cluster {
        servers,
        keys,
        server_url,
        migrated_url,
    })
}

/// One worker process and what it has said.
pub(super) struct WorkerProc {
    pub(super) id: usize,
    /// Leases from the S3 lease backend (not moved by a migration).
    pub(super) s3_lease: bool,
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) done: Arc<Mutex<Option<[u64; 4]>>>,
    pub(super) reader: tokio::task::JoinHandle<()>,
}

pub(super) async fn start_s3(s3: &mut Service, port: u16) -> anyhow::Result<()> {
    drain(s3.start()?);
    // Replaying a long journal takes a while.
    wait_http_ok(port, "/moto-api/", Duration::from_secs(120)).await
}

/// Starts a lease server; returns its public key (hex).
pub(super) async fn start_server(server: &mut Service) -> anyhow::Result<String> {
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
    mover: Option<Mover>,
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
    let reader = tokio::spawn({
        let (acks, done) = (Arc::clone(acks), Arc::clone(&done));
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
                        if let (Ok(g), Some(mover)) = (generation.parse(), &mover) {
                            mover.on(g);
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
        reader,
    })
}

/// A metronome on `url`, on a clock `skew_ms` off (libfaketime), closing
/// on the signed time Roughtime gives it.
pub(super) fn metronome(
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
pub(super) fn skewed(bagel: &std::path::Path, skew_ms: i64) -> Command {
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
