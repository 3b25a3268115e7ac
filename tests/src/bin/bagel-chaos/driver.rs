//! The driver: starts the servers, the metronomes and the workers, injects
//! faults at seeded random times, then checks everything and writes
//! `chaos.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bagel_bags::Bucket;
use bagel_client::Micros;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::RunArgs;
use bagel_tests::sub_url;

use crate::services::{Service, drain, free_port, journal, sibling, wait_http_ok};

const LOG: &str = "chaos";
const BUCKET: &str = "bagel-chaos";
/// The workers' bag timing (the defaults): a bag closes 2 s after its
/// second, and clocks may differ by 1 s.
const GRACE: Duration = Duration::from_secs(2);
const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);
/// The worker whose clock is this far ahead must have every write refused.
const BEYOND_MS: i64 = 20_000;

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
}

/// Acknowledged messages, per store: (timestamp, payload).
type Acks = Vec<BTreeSet<(u64, String)>>;

/// One worker process and what it has said.
struct WorkerProc {
    id: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    done: Arc<Mutex<Option<[u64; 4]>>>,
    reader: tokio::task::JoinHandle<()>,
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

    // The lease server: the same port and key across restarts.
    let port = free_port()?;
    let server_url = format!("http://127.0.0.1:{port}");
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
            run_dir.join("server.key").display().to_string(),
        ],
        Vec::new(),
    );
    let key_line = start_server(&mut server).await?;
    let server_key = key_line
        .split_whitespace()
        .nth(2)
        .context("public key line")?
        .to_owned();

    let bagel = sibling("bagel")?;
    let mut metronomes: Vec<Service> = Vec::new();
    for url in &stores {
        for _ in 0..2 {
            let mut m = Service::new(
                "metronome",
                &bagel,
                vec![
                    // Signed time from the lease server: a metronome
                    // closes only on a clock it vouches for.
                    "--server".into(),
                    server_url.clone(),
                    "metronome".into(),
                    "--store".into(),
                    url.clone(),
                    "--log".into(),
                    LOG.into(),
                    "--lookback".into(),
                    "30s".into(),
                ],
                env.clone(),
            );
            drain(m.start()?);
            metronomes.push(m);
        }
    }

    let acks: Arc<Mutex<Acks>> = Arc::new(Mutex::new(vec![BTreeSet::new(); stores.len()]));
    let mut workers = Vec::new();
    for id in 0..a.workers {
        let role: &[&str] = match id {
            0 => &["--clock-offset-ms", "300"],
            1 => &["--clock-offset-ms", "-300"],
            2 => &["--delay-appends"],
            3 => &["--clock-offset-ms", "20000"],
            _ => &[],
        };
        workers.push(start_worker(
            id,
            &server_url,
            &stores,
            &a,
            rng.r#gen(),
            role,
            &env,
            &acks,
        )?);
    }
    println!(
        "bagel-chaos: {} workers on {} names, stores {stores:?}, lease server {server_url} (max TTL {:?})",
        a.workers, a.names, a.max_ttl
    );

    // Faults.
    let mut report = Report {
        seed,
        stores: stores.clone(),
        workers: a.workers,
        ..Default::default()
    };
    let started = Instant::now();
    let mut next = Duration::from_secs(3);
    while started.elapsed() + next < a.duration {
        tokio::time::sleep(next).await;
        match rng.gen_range(0..4) {
            0 => {
                server.kill().await;
                start_server(&mut server).await?;
                report.server_kills += 1;
                println!(
                    "[{:>5.1}s] kill -9 lease server; restarted (waits out its TTL)",
                    started.elapsed().as_secs_f64()
                );
            }
            1 => {
                s3.kill().await;
                start_s3(&mut s3, s3_port).await?;
                report.store_kills += 1;
                println!(
                    "[{:>5.1}s] kill -9 S3 server; restarted from its journal",
                    started.elapsed().as_secs_f64()
                );
            }
            _ => {
                let i = rng.gen_range(0..metronomes.len());
                metronomes[i].kill().await;
                drain(metronomes[i].start()?);
                report.closer_kills += 1;
                println!(
                    "[{:>5.1}s] kill -9 metronome {i}; restarted",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        next = Duration::from_millis(rng.gen_range(1500..5000));
    }
    tokio::time::sleep(a.duration.saturating_sub(started.elapsed())).await;
    report.duration_s = started.elapsed().as_secs_f64();

    // Stop: workers finish their cycle and release; closers stop.
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
    for d in done.values() {
        report.cycles += d[0];
        report.acked_writes += d[1];
        report.failed_writes += d[2];
        report.refused_acquires += d[3];
    }
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
    let last = Bucket::of(stopped.saturating_add(Duration::from_millis(500)));
    let all_due = last.close_time(GRACE).saturating_add(CLOCK_TOLERANCE);
    tokio::time::sleep(all_due.duration_since(Micros::now())).await;

    let acks = acks.lock().expect("acks").clone();
    let flags = Flags {
        bagel: bagel.clone(),
        env: env.clone(),
        server_key: server_key.clone(),
        server_url: server_url.clone(),
    };
    let mut agree = true;
    for (si, url) in stores.iter().enumerate() {
        let first = flags.read(url).await?;
        let second = flags.read(url).await?;
        report.messages_read.push(first.messages.len() as u64);
        if first.messages != second.messages {
            agree = false;
            report.violations.push(format!(
                "{url}: two readers disagree ({} vs {} messages)",
                first.messages.len(),
                second.messages.len()
            ));
        }
        for bad in first.rejected.iter().chain(&first.problems) {
            report.violations.push(format!("{url}: {bad}"));
        }
        let got: BTreeSet<(u64, String)> = first.messages.iter().map(|m| (m.0, m.3.clone())).collect();
        for ack in &acks[si] {
            if got.contains(ack) {
                report.read_back += 1;
            } else {
                report
                    .violations
                    .push(format!("{url}: acknowledged write not read back: {ack:?}"));
            }
        }
        for v in flags.audit(url).await? {
            report.violations.push(format!("{url}: audit: {v}"));
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
    s3.kill().await;
    server.kill().await;

    let ok = report.violations.is_empty() && report.read_back == report.acked_writes && report.readers_agree;
    std::fs::write(out.join("chaos.json"), serde_json::to_vec_pretty(&report)?)?;
    println!(
        "bagel-chaos: seed {seed}: {:.0} s, {} cycles, {} acked = {} read back ({} failed writes, {} refused acquires); \
         kills: {} lease server, {} S3 server, {} closers; readers agree: {}; {} violations; {}",
        report.duration_s,
        report.cycles,
        report.acked_writes,
        report.read_back,
        report.failed_writes,
        report.refused_acquires,
        report.server_kills,
        report.store_kills,
        report.closer_kills,
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

/// Starts the lease server; returns its `public key` line.
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
    key.context("bagel-server printed no public key")
}

#[allow(clippy::too_many_arguments)]
fn start_worker(
    id: usize,
    server: &str,
    stores: &[String],
    a: &RunArgs,
    seed: u64,
    role: &[&str],
    env: &[(String, String)],
    acks: &Arc<Mutex<Acks>>,
) -> anyhow::Result<WorkerProc> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "worker",
            "--server",
            server,
            "--stores",
            &stores.join(","),
            "--log",
            LOG,
        ])
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
                            acks.lock().expect("acks")[si].insert((ts, payload.to_owned()));
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
        child,
        stdin,
        done,
        reader,
    })
}

/// How the driver runs the real CLI against a store.
struct Flags {
    bagel: PathBuf,
    env: Vec<(String, String)>,
    server_key: String,
    server_url: String,
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
            "--server",
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

    /// `bagel <verb> --store URL --log chaos --key KEY --json`.
    async fn on_log(&self, verb: &str, url: &str) -> anyhow::Result<std::process::Output> {
        Ok(self
            .command(&[
                verb,
                "--store",
                url,
                "--log",
                LOG,
                "--key",
                &self.server_key,
                "--json",
            ])
            .output()
            .await?)
    }

    async fn read(&self, url: &str) -> anyhow::Result<Read> {
        let out = self.on_log("read", url).await?;
        if !out.status.success() {
            bail!(
                "bagel read {url} failed: {}",
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
    async fn audit(&self, url: &str) -> anyhow::Result<Vec<String>> {
        let out = self.on_log("audit", url).await?;
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
