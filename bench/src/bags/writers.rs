//! Concurrent bag writers (issue 27 item 4): 1, 8 and 64 writers, each
//! its own [`Writer`] with its own writer id, all on one log, writing
//! small batches (10 messages of 100 bytes by default) back to back for a
//! bounded time; as tokio tasks in this process, and as separate
//! processes (this binary again, `--bag-writer-child`, each running its
//! share of the writers on a one-thread runtime and printing one JSON
//! line that the parent adds up).
//!
//! The acknowledgement latency of a batch is from the call of
//! `write_batch` to its return (the batch durable per the store: fsync
//! on a directory, the PUT answered on S3, COMMIT on NFS).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::testing::TestLeases;
use bagel_bags::{BagConfig, BagStore, Writer};
use bagel_proto::clock::SystemClock;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::{PAYLOAD_BYTES, write_loop};

/// Where the writers write; also what a child process is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Target {
    /// A directory store (`DirectoryStore::local`) at `root`.
    Dir { root: PathBuf, medium: String },
    /// The bench's moto server, bags under `prefix`.
    S3 { addr: SocketAddr, prefix: String },
    /// An NFS export through bagel's userspace client (`open_store`).
    Nfs { url: String },
}

impl Target {
    /// The `store` column.
    pub fn store(&self) -> &'static str {
        match self {
            Target::Dir { .. } => "posix",
            Target::S3 { .. } => "s3",
            Target::Nfs { .. } => "nfs",
        }
    }

    /// The `medium` column.
    pub fn medium(&self) -> String {
        match self {
            Target::Dir { medium, .. } => medium.clone(),
            Target::S3 { .. } => "moto".into(),
            Target::Nfs { url } => {
                if url.contains("version=4") {
                    "ganesha (NFSv4)".into()
                } else {
                    "ganesha (NFSv3)".into()
                }
            }
        }
    }

    /// Opens the bag store (one per process, shared by its writers, as an
    /// application would).
    pub async fn open(&self, cfg: &BagConfig) -> Result<Arc<dyn BagStore>> {
        Ok(match self {
            Target::Dir { root, .. } => {
                std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
                Arc::new(DirectoryStore::local(root, cfg.sync))
            }
            Target::S3 { addr, prefix } => {
                let (store, _) = super::counted_s3(crate::s3::store(*addr)?, prefix).await?;
                store
            }
            Target::Nfs { url } => bagel_bags::open_store(url, cfg)
                .await
                .with_context(|| format!("opening {url}"))?,
        })
    }
}

/// One point: `writers` writers on one store, as tasks or processes.
#[derive(Debug, Clone, Serialize)]
pub struct WritersRow {
    /// `posix`, `s3` or `nfs`.
    pub store: String,
    /// `tmpfs`, `disk`, `moto`, `ganesha (NFSv3)`.
    pub medium: String,
    /// `tasks` (tokio tasks in the bench process) or `processes`.
    pub mode: String,
    pub writers: usize,
    /// Processes the writers ran in (1 for tasks).
    pub processes: usize,
    /// Messages per batch.
    pub batch: usize,
    pub payload_bytes: usize,
    /// Whether the store syncs before acknowledging (directory and NFS).
    pub fsync: bool,
    pub duration_s: f64,
    pub batches: u64,
    pub messages: u64,
    pub messages_per_s: f64,
    pub batches_per_s: f64,
    /// Per batch, from the call to its acknowledgement.
    pub ack_p50_us: u64,
    pub ack_p99_us: u64,
    pub ack_max_us: u64,
    /// Processes: how much later than the agreed start the last one
    /// began writing (its setup: connecting, probing the store).
    pub start_skew_ms: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// What a set of writers measured (one process's share, or all of them).
#[derive(Debug)]
struct Tally {
    batches: u64,
    errors: u64,
    first_error: Option<String>,
    /// The longest writer's time.
    secs: f64,
    late_ms: u64,
    hist: Histogram<u64>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            batches: 0,
            errors: 0,
            first_error: None,
            secs: 0.0,
            late_ms: 0,
            hist: Histogram::new(3).expect("histogram"),
        }
    }

    fn merge(&mut self, other: Tally) {
        self.batches += other.batches;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.secs = self.secs.max(other.secs);
        self.late_ms = self.late_ms.max(other.late_ms);
        let _ = self.hist.add(&other.hist);
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
}

/// A child process's report: one JSON line on stdout.
#[derive(Debug, Serialize, Deserialize)]
struct ChildReport {
    batches: u64,
    errors: u64,
    first_error: Option<String>,
    secs: f64,
    late_ms: u64,
    /// The latency histogram as (µs, count) pairs.
    hist: Vec<(u64, u64)>,
}

impl From<&Tally> for ChildReport {
    fn from(t: &Tally) -> Self {
        ChildReport {
            batches: t.batches,
            errors: t.errors,
            first_error: t.first_error.clone(),
            secs: t.secs,
            late_ms: t.late_ms,
            hist: t
                .hist
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
        }
    }
}

impl From<ChildReport> for Tally {
    fn from(r: ChildReport) -> Self {
        let mut t = Tally::new();
        t.batches = r.batches;
        t.errors = r.errors;
        t.first_error = r.first_error;
        t.secs = r.secs;
        t.late_ms = r.late_ms;
        for (v, n) in r.hist {
            let _ = t.hist.record_n(v, n);
        }
        t
    }
}

/// What `--bag-writer-child` is given (as JSON).
#[derive(Debug, Serialize, Deserialize)]
pub struct ChildSpec {
    target: Target,
    log: String,
    writer_ids: Vec<String>,
    batch: usize,
    duration_ms: u64,
    /// Unix milliseconds at which every process starts writing.
    start_at_ms: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs one writer per id on `store`, all at once, from `start_at_ms`
/// (unix ms; now if `None`) for `duration`.
async fn run_writers(
    store: Arc<dyn BagStore>,
    log: &str,
    ids: &[String],
    batch: usize,
    duration: Duration,
    start_at_ms: Option<u64>,
    cfg: &BagConfig,
) -> Result<Tally> {
    // A full lease and signed times from a throwaway key, shared by the
    // writers of this process (nothing here talks to a lease server).
    let leases = TestLeases::default();
    let lease = leases.lease_for_an_hour("bench-writers");
    let time = leases.time(Arc::new(SystemClock));
    let writers = ids
        .iter()
        .map(|id| {
            Writer::new(
                store.clone(),
                log,
                id,
                Arc::new(lease.clone()),
                Arc::new(SystemClock),
                time.clone(),
                cfg.clone(),
            )
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut late_ms = 0;
    if let Some(at) = start_at_ms {
        let now = unix_ms();
        if at > now {
            tokio::time::sleep(Duration::from_millis(at - now)).await;
        } else {
            late_ms = now - at;
        }
    }
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|w| tokio::spawn(async move { write_loop(&w, batch, duration, u64::MAX / 2).await }))
        .collect();
    let mut t = Tally::new();
    t.late_ms = late_ms;
    for task in tasks {
        match task.await {
            Ok(r) => {
                t.batches += r.batches;
                t.errors += r.errors;
                if t.first_error.is_none() {
                    t.first_error = r.first_error;
                }
                t.secs = t.secs.max(r.secs);
                let _ = t.hist.add(&r.hist);
            }
            Err(e) => t.error(format!("writer task: {e}")),
        }
    }
    Ok(t)
}

/// The hidden `--bag-writer-child SPEC` mode: runs its writers on a
/// one-thread runtime and prints a [`ChildReport`] line.
pub fn child_main(spec: &str) -> Result<()> {
    let spec: ChildSpec = serde_json::from_str(spec).context("--bag-writer-child: bad spec")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the runtime")?;
    let t = rt.block_on(async {
        let cfg = BagConfig::default();
        let store = spec.target.open(&cfg).await?;
        run_writers(
            store,
            &spec.log,
            &spec.writer_ids,
            spec.batch,
            Duration::from_millis(spec.duration_ms),
            Some(spec.start_at_ms),
            &cfg,
        )
        .await
    })?;
    println!("{}", serde_json::to_string(&ChildReport::from(&t))?);
    Ok(())
}

fn row(target: &Target, mode: &str, writers: usize, processes: usize, batch: usize, t: Tally) -> WritersRow {
    let per_s = |n: u64| if t.secs > 0.0 { n as f64 / t.secs } else { 0.0 };
    let messages = t.batches * batch as u64;
    WritersRow {
        store: target.store().into(),
        medium: target.medium(),
        mode: mode.into(),
        writers,
        processes,
        batch,
        payload_bytes: PAYLOAD_BYTES,
        fsync: BagConfig::default().sync,
        duration_s: t.secs,
        batches: t.batches,
        messages,
        messages_per_s: per_s(messages),
        batches_per_s: per_s(t.batches),
        ack_p50_us: t.hist.value_at_quantile(0.5),
        ack_p99_us: t.hist.value_at_quantile(0.99),
        ack_max_us: t.hist.max(),
        start_skew_ms: t.late_ms,
        errors: t.errors,
        first_error: t.first_error,
    }
}

/// `writers` tokio tasks in this process, one store shared by them.
pub async fn tasks_point(
    target: &Target,
    log: &str,
    writers: usize,
    batch: usize,
    duration: Duration,
) -> Result<WritersRow> {
    let cfg = BagConfig::default();
    let store = target.open(&cfg).await?;
    let ids: Vec<String> = (0..writers).map(|i| format!("t{i}")).collect();
    let t = run_writers(store, log, &ids, batch, duration, None, &cfg).await?;
    Ok(row(target, "tasks", writers, 1, batch, t))
}

/// `writers` writers spread over `min(writers, max_procs)` child
/// processes (this binary, `--bag-writer-child`), each opening the store
/// itself; they start together at an agreed instant.
pub async fn processes_point(
    target: &Target,
    log: &str,
    writers: usize,
    max_procs: usize,
    batch: usize,
    duration: Duration,
) -> Result<WritersRow> {
    let procs = writers.min(max_procs).max(1);
    // The running image itself: the file may have been rebuilt (a shared
    // target directory) since this process started.
    let exe = match PathBuf::from("/proc/self/exe") {
        p if p.exists() => p,
        _ => std::env::current_exe().context("finding this binary")?,
    };
    // Time for every child to start and open its store.
    let start_at_ms = unix_ms() + 1500 + 100 * procs as u64;
    let mut children = Vec::new();
    for p in 0..procs {
        let spec = ChildSpec {
            target: target.clone(),
            log: log.into(),
            writer_ids: (p..writers)
                .step_by(procs)
                .map(|i| format!("p{p}-w{i}"))
                .collect(),
            batch,
            duration_ms: duration.as_millis() as u64,
            start_at_ms,
        };
        let child = tokio::process::Command::new(&exe)
            .arg("--bag-writer-child")
            .arg(serde_json::to_string(&spec)?)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", exe.display()))?;
        children.push(child);
    }
    let bound = duration + Duration::from_secs(60);
    let outputs = futures::future::join_all(
        children
            .into_iter()
            .map(|c| tokio::time::timeout(bound, c.wait_with_output())),
    )
    .await;
    let mut t = Tally::new();
    for (p, out) in outputs.into_iter().enumerate() {
        match out {
            Err(_) => t.error(format!("process {p}: no answer within {bound:?} (killed)")),
            Ok(Err(e)) => t.error(format!("process {p}: {e}")),
            Ok(Ok(o)) => {
                let stdout = String::from_utf8_lossy(&o.stdout);
                let line = stdout.lines().rev().find(|l| l.starts_with('{'));
                match line.map(serde_json::from_str::<ChildReport>) {
                    Some(Ok(r)) if o.status.success() => t.merge(r.into()),
                    other => {
                        let stderr = String::from_utf8_lossy(&o.stderr);
                        let tail: String = stderr.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
                        t.error(format!(
                            "process {p}: {} ({}): {tail}",
                            o.status,
                            match other {
                                Some(Err(e)) => format!("bad report: {e}"),
                                _ => "no report".into(),
                            }
                        ));
                    }
                }
            }
        }
    }
    Ok(row(target, "processes", writers, procs, batch, t))
}

/// A writers point's console line.
pub fn print(r: &WritersRow) {
    eprintln!(
        "  {} ({}) {:9} {:2} writer(s) in {:2} process(es): {:>9.0} msgs/s {:>8.0} batches/s  ack p50 {} µs p99 {} µs max {} µs  errors {}{}",
        r.store,
        r.medium,
        r.mode,
        r.writers,
        r.processes,
        r.messages_per_s,
        r.batches_per_s,
        r.ack_p50_us,
        r.ack_p99_us,
        r.ack_max_us,
        r.errors,
        r.first_error
            .as_deref()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
}
