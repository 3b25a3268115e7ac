//! Network partitions between the S3 bag store and its clients: the
//! writers cut off from the store while a metronome outside goes on
//! closing (`writer_to_store`), and the metronome cut off while the
//! writers go on writing (`closer_to_store`).
//!
//! Three network namespaces, a star: the store's (an S3 server of its
//! own, moto as `tests/support/s3.sh` runs it) in the middle, joined by
//! one veth pair to the writers' namespace and by another to the
//! closer's. Each leaf runs a lease server of its own on its loopback:
//! the writers' grants their leases and signed time, the closer's signs
//! the metronome's time. So a cut separates a client from the store and
//! nothing else. A cut is one or two blackhole routes: `both` (nothing
//! gets through) or `answers_lost` (in the store's namespace only:
//! requests arrive and are served, every answer is lost).
//!
//! The writers are library writers ([`writer`], a process of this binary
//! in the writers' namespace), one with a storage call timeout shorter
//! than a cut, one with the CLI's (see [`WRITER_OP_TIMEOUTS`]). Each batch reports when it started and ended, on this host's clock
//! (the namespaces share it), so a cut's instants compare exactly. The
//! checks:
//!
//! * no batch that started after a writer's cut began and ended before it
//!   healed was acknowledged (nothing from the store could reach it), and
//!   every writer cut made some batch fail: writes during the cut fail
//!   with an error;
//! * every batch ends within its writer's bound ([`batch_bound`]): none
//!   hangs;
//! * after each heal, each writer has a batch acknowledged again (writer
//!   cuts), or the metronome closes again (closer cuts); during a closer
//!   cut the writers go on having batches acknowledged;
//! * once every bag is due, two readers (one per leaf, one reading
//!   summaries where the metronome made them, one with `--no-summaries`)
//!   read the same messages, reject nothing and find no damage; every
//!   acknowledged write is among them; no message of a batch its writer
//!   was told was late (`LateRejected`) is; `bagel audit` finds nothing.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_bags::{self as bag, BagConfig, Bucket, Writer};
use bagel_client::{Client, Micros, TimeOptions, TimeSource};
use bagel_proto::clock::{Clock, SystemClock};
use bytes::Bytes;
use rand::Rng as _;
use rand::rngs::StdRng;
use serde::Serialize;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, ChildStdin, Command};

use crate::partitions::{BOUND, ip};

/// The log the phase writes, and the bucket its store lives in.
const LOG: &str = "store-cuts";
const BUCKET: &str = "bagel-store-cuts";
/// The ports inside the namespaces (each has its own port space).
const S3_PORT: u16 = 9000;
const LEASE_PORT: u16 = 7420;
/// The writer processes' storage call timeouts, one writer each, each on
/// a lease of its own. The first gives up well inside a cut, so a cut
/// fails its writes; the second waits as long as the CLI does (10 s),
/// through the cut, so what it sent lands after the heal, into bags the
/// metronome outside may have closed meanwhile: it must be told
/// `LateRejected`, or be acknowledged only when the bag's lock lists it.
const WRITER_OP_TIMEOUTS: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(10)];

/// The longest a batch may take: its pause for the clock (at most 1 s)
/// and its storage calls, each bounded by `op_timeout`, the first that
/// fails ending the batch. A batch whose calls all succeed makes a handful
/// of them; one that helps seal a minute closes that minute's bags too: a
/// dozen calls covers it.
fn batch_bound(op_timeout: Duration) -> Duration {
    Duration::from_secs(1) + op_timeout * 12
}

/// How long a cut lasts: longer than the first writer's timeout and pause
/// together, so a batch it starts in the cut fails in it, and shorter
/// than the second's, so that one's batches wait through it.
const CUT_MS: std::ops::Range<u64> = 2_500..4_000;

/// The bags' timing (the defaults, for every process of the phase), and
/// how much later than a bag's close time a reader on a lease server's
/// time may close it (its clock bound).
const GRACE: Duration = Duration::from_secs(2);
const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);
const CLOSER_BOUND: Duration = Duration::from_secs(1);

/// What the phase did and found.
#[derive(Debug, Default, Serialize)]
pub struct StorePhase {
    /// One entry a cut, in the order they ran.
    pub cuts: Vec<StoreCut>,
    /// Messages the writers were told were written, and how many of them
    /// every reader read.
    pub acked: u64,
    pub read_back: u64,
    /// Messages each reader read (summaries, then `--no-summaries`).
    pub messages_read: Vec<u64>,
    pub readers_agree: bool,
    /// Messages read that no writer was told were written: batches whose
    /// outcome the writer could not know (a call timed out after its
    /// request arrived) that landed all the same.
    pub read_unacknowledged: u64,
    /// Failed batches by why: a storage call timed out, the bag was closed
    /// under it (`LateRejected`, `BagClosed`), anything else.
    pub failed_timeout: u64,
    pub failed_late: u64,
    pub failed_other: u64,
    /// Each writer's storage call timeout, its longest batch, and the
    /// bound every batch of it must keep, ms.
    pub op_timeout_ms: Vec<u64>,
    pub longest_batch_ms: Vec<u64>,
    pub batch_bound_ms: Vec<u64>,
    /// Bags the metronome closed over the phase.
    pub closes: u64,
}

/// One cut.
#[derive(Debug, Serialize)]
pub struct StoreCut {
    /// `writer_to_store` or `closer_to_store`.
    pub kind: &'static str,
    /// `both` or `answers_lost`.
    pub direction: &'static str,
    /// From the cut to the heal, ms.
    pub length_ms: u64,
    /// Batches that started during the cut, and how many of them failed
    /// or were acknowledged.
    pub batches: u64,
    pub failed: u64,
    pub acked: u64,
    /// Bags the metronome closed during the cut.
    pub closes: u64,
    /// From the heal to the first acknowledged batch of every writer
    /// (writer cuts) or the metronome's first close (closer cuts), ms.
    pub recovered_ms: u64,
}

/// A writer's batch as it reported it.
#[derive(Debug, Clone)]
struct Batch {
    writer: usize,
    start_us: u64,
    end_us: u64,
    outcome: Outcome,
}

#[derive(Debug, Clone)]
enum Outcome {
    /// (timestamp, payload) of each message.
    Acked(Vec<(u64, String)>),
    Failed {
        why: Failure,
        payloads: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Failure {
    Timeout,
    Late,
    Other,
}

/// Runs the store cuts once each (two of the writers, both ways and
/// answers lost; one of the closer, its direction drawn from `rng`).
/// Returns what they did and the violations found; `Err` only for a setup
/// that failed.
pub async fn run(
    bagel: &Path,
    server: &Path,
    dir: &Path,
    rng: &mut StdRng,
) -> anyhow::Result<(StorePhase, Vec<String>)> {
    let s3_cmd = std::env::var("BAGEL_S3_SERVER")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .context("BAGEL_S3_SERVER is not set: the store partitions start an S3 server of their own")?;
    let dir = dir.join("store-partitions");
    std::fs::create_dir_all(&dir)?;
    let net = StoreNet::create(std::process::id()).await?;
    let result = Phase::new(&net, bagel, server, &s3_cmd, &dir)
        .await
        .context("starting the store partitions' processes");
    let outcome = match result {
        Ok(mut phase) => {
            let r = phase.cuts(rng).await;
            phase.stop().await;
            r
        }
        Err(e) => Err(e),
    };
    net.remove().await;
    outcome
}

/// The running processes of the phase.
struct Phase<'a> {
    net: &'a StoreNet,
    bagel: PathBuf,
    dir: PathBuf,
    /// Processes that live as long as the phase: the S3 server, the two
    /// lease servers, the metronome.
    services: Vec<Child>,
    writers: Vec<WriterProc>,
    /// The writers' lease server's key: the readers trust it.
    key: String,
    /// Instants (Unix µs) of the metronome's closes, and how many bags.
    closes: Arc<Mutex<Vec<(u64, u64)>>>,
    store: String,
}

struct WriterProc {
    child: Child,
    stdin: Option<ChildStdin>,
    batches: Arc<Mutex<Vec<Batch>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl<'a> Phase<'a> {
    async fn new(
        net: &'a StoreNet,
        bagel: &Path,
        server: &Path,
        s3_cmd: &str,
        dir: &Path,
    ) -> anyhow::Result<Phase<'a>> {
        let store = format!("s3://{BUCKET}/cuts");
        let mut services = Vec::new();
        let mut parts = s3_cmd.split_whitespace();
        let program = parts.next().context("BAGEL_S3_SERVER is empty")?;
        let mut s3 = net
            .exec(&net.store_ns, Path::new(program))
            .args(parts)
            .args(["0.0.0.0", &S3_PORT.to_string(), "--bucket", BUCKET])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting the S3 server in the store's namespace")?;
        lines_until(&mut s3, " listening on ").await?;
        services.push(s3);
        let mut key = String::new();
        for ns in [&net.writer_ns, &net.closer_ns] {
            let mut lease_server = net
                .exec(ns, server)
                .args(["--listen", &format!("127.0.0.1:{LEASE_PORT}")])
                .args(["--max-ttl", "3s", "--clock-tolerance", "100ms"])
                // Fresh servers with no predecessor.
                .arg("--unsafe-skip-restart-wait")
                .env("RUST_LOG", "error")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting bagel-server in a client namespace")?;
            let printed = lines_until(&mut lease_server, " listening on ").await?;
            if ns == &net.writer_ns {
                key = printed
                    .iter()
                    .find_map(|l| l.strip_prefix("public key "))
                    .and_then(|k| k.split_whitespace().next())
                    .context("bagel-server printed no public key")?
                    .to_owned();
            }
            services.push(lease_server);
        }
        let mut phase = Phase {
            net,
            bagel: bagel.to_owned(),
            dir: dir.to_owned(),
            services,
            writers: Vec::new(),
            key,
            closes: Arc::default(),
            store,
        };
        for id in 0..WRITER_OP_TIMEOUTS.len() {
            let w = phase.start_writer(id).await?;
            phase.writers.push(w);
        }
        phase.start_metronome()?;
        Ok(phase)
    }

    /// The environment of a client in `ns`: the S3 server through that
    /// namespace's link, and nothing of this host's services (its
    /// Roughtime server, stores and lease servers are out of reach).
    fn env(&self, cmd: &mut Command, ns: &str) {
        let endpoint = format!("http://{}:{S3_PORT}", self.net.store_ip_for(ns));
        cmd.env_clear()
            .envs(std::env::vars().filter(|(k, _)| k == "PATH" || k == "HOME"))
            .envs([
                ("AWS_ENDPOINT", endpoint.as_str()),
                ("AWS_ENDPOINT_URL", endpoint.as_str()),
                ("AWS_ALLOW_HTTP", "true"),
                ("AWS_ACCESS_KEY_ID", "bagel"),
                ("AWS_SECRET_ACCESS_KEY", "bagel-secret"),
                ("AWS_REGION", "us-east-1"),
                ("AWS_DEFAULT_REGION", "us-east-1"),
                ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false"),
                ("RUST_LOG", "error"),
            ]);
    }

    fn lease_url() -> String {
        format!("http://127.0.0.1:{LEASE_PORT}")
    }

    /// A writer process in the writers' namespace; returns once it has
    /// its lease and its store is open.
    async fn start_writer(&self, id: usize) -> anyhow::Result<WriterProc> {
        // This very binary, even if a build replaced its file meanwhile.
        let me = PathBuf::from(format!("/proc/{}/exe", std::process::id()));
        let mut cmd = self.net.exec(&self.net.writer_ns, &me);
        self.env(&mut cmd, &self.net.writer_ns);
        let mut child = cmd
            .args([
                "store-writer",
                "--server",
                &Self::lease_url(),
                "--store",
                &self.store,
            ])
            .args(["--log", LOG, "--id", &id.to_string()])
            .arg("--op-timeout")
            .arg(humantime::format_duration(WRITER_OP_TIMEOUTS[id]).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.dir.join(format!("writer-{id}.err")))?)
            .kill_on_drop(true)
            .spawn()
            .context("starting a store writer")?;
        let stdin = child.stdin.take();
        let out = child.stdout.take().context("stdout piped")?;
        let mut lines = tokio::io::BufReader::new(out).lines();
        let ready = tokio::time::timeout(BOUND, async {
            while let Some(line) = lines.next_line().await? {
                if line == "READY" {
                    return anyhow::Ok(());
                }
            }
            bail!("the writer ended before it was ready")
        })
        .await
        .with_context(|| format!("writer {id} not ready within {BOUND:?}"))?;
        ready.with_context(|| format!("writer {id} (see writer-{id}.err)"))?;
        let batches: Arc<Mutex<Vec<Batch>>> = Arc::default();
        let reader = tokio::spawn({
            let batches = Arc::clone(&batches);
            async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(b) = parse_batch(id, &line) {
                        batches.lock().expect("batches").push(b);
                    }
                }
            }
        });
        Ok(WriterProc {
            child,
            stdin,
            batches,
            reader,
        })
    }

    /// `bagel metronome` in the closer's namespace, on its lease server's
    /// time, summarizing each sealed minute a second after it closes.
    fn start_metronome(&mut self) -> anyhow::Result<()> {
        let mut cmd = self.net.exec(&self.net.closer_ns, &self.bagel);
        self.env(&mut cmd, &self.net.closer_ns);
        let mut child = cmd
            .args([
                "--server",
                &Self::lease_url(),
                "metronome",
                "--store",
                &self.store,
            ])
            .args(["--log", LOG, "--lookback", "30s", "--summarize-after", "1s"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.dir.join("metronome.err"))?)
            .kill_on_drop(true)
            .spawn()
            .context("starting the metronome")?;
        let out = child.stdout.take().context("stdout piped")?;
        let closes = Arc::clone(&self.closes);
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                // `closed N bags through ...`
                if let Some(n) = line
                    .strip_prefix("closed ")
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|n| n.parse().ok())
                {
                    closes.lock().expect("closes").push((now_us(), n));
                }
            }
        });
        self.services.push(child);
        Ok(())
    }

    /// Waits (bounded) until `done` holds, polling what the processes
    /// reported.
    async fn until(&self, what: &str, done: impl Fn(&Phase<'_>) -> bool) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        while !done(self) {
            if started.elapsed() > BOUND {
                bail!("{what}: not within {BOUND:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn batches(&self) -> Vec<Batch> {
        self.writers
            .iter()
            .flat_map(|w| w.batches.lock().expect("batches").clone())
            .collect()
    }

    /// Every writer has a batch acknowledged that started at or after
    /// `since` (Unix µs).
    fn all_acked_since(&self, since: u64) -> bool {
        self.writers.iter().all(|w| {
            w.batches
                .lock()
                .expect("batches")
                .iter()
                .any(|b| b.start_us >= since && matches!(b.outcome, Outcome::Acked(_)))
        })
    }

    fn closed_since(&self, since: u64) -> bool {
        self.closes
            .lock()
            .expect("closes")
            .iter()
            .any(|(t, _)| *t >= since)
    }

    /// The cuts, then the stop, the wait for every bag to be due, the
    /// reads and the checks.
    async fn cuts(&mut self, rng: &mut StdRng) -> anyhow::Result<(StorePhase, Vec<String>)> {
        let begin = now_us();
        // Writing and closing before the first cut: the metronome outside
        // is closing while the writers are cut off.
        self.until("every writer acknowledged and the metronome closed", |p| {
            p.all_acked_since(begin) && p.closed_since(begin)
        })
        .await?;
        let closer_direction = if rng.gen_bool(0.5) { "both" } else { "answers_lost" };
        let plan = [
            ("writer_to_store", "both"),
            ("writer_to_store", "answers_lost"),
            ("closer_to_store", closer_direction),
        ];
        let mut violations = Vec::new();
        let mut spans = Vec::new();
        for (kind, direction) in plan {
            let length = Duration::from_millis(rng.gen_range(CUT_MS));
            self.net.cut(kind, direction).await?;
            let cut_at = now_us();
            tokio::time::sleep(length).await;
            let heal_at = now_us();
            self.net.heal(kind, direction).await?;
            let recovered = match kind {
                "writer_to_store" => {
                    self.until("every writer acknowledged again after the heal", |p| {
                        p.all_acked_since(heal_at)
                    })
                    .await
                }
                _ => {
                    self.until("the metronome closed again after the heal", |p| {
                        p.closed_since(heal_at)
                    })
                    .await
                }
            };
            if let Err(e) = recovered {
                violations.push(format!("{kind} ({direction}): {e:#}"));
            }
            spans.push((kind, direction, cut_at, heal_at, now_us()));
            tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1_000))).await;
        }
        let last_write = self.stop_writers(&mut violations).await;
        // Every bag that can hold a write is past its close time, on any
        // clock within the tolerance, for a reader on its time's bound.
        let due = Bucket::of(Micros::from_micros(last_write).saturating_add(Duration::from_millis(500)))
            .close_time(GRACE)
            .saturating_add(CLOCK_TOLERANCE)
            .saturating_add(CLOSER_BOUND);
        tokio::time::sleep(due.duration_since(Micros::now())).await;
        let batches = self.batches();
        let closes = self.closes.lock().expect("closes").clone();
        let mut report = StorePhase {
            op_timeout_ms: WRITER_OP_TIMEOUTS.iter().map(|t| t.as_millis() as u64).collect(),
            longest_batch_ms: vec![0; WRITER_OP_TIMEOUTS.len()],
            batch_bound_ms: WRITER_OP_TIMEOUTS
                .iter()
                .map(|t| batch_bound(*t).as_millis() as u64)
                .collect(),
            closes: closes.iter().map(|(_, n)| n).sum(),
            ..Default::default()
        };
        for (kind, direction, cut_at, heal_at, recovered_at) in spans {
            let cut = judge_cut(
                kind,
                direction,
                (cut_at, heal_at, recovered_at),
                &batches,
                &closes,
                &mut violations,
            );
            println!(
                "partitions: {kind} ({direction}): cut {} ms; {} batches began in it ({} failed, {} acked), {} bags \
                 closed in it; working again {} ms after the heal",
                cut.length_ms, cut.batches, cut.failed, cut.acked, cut.closes, cut.recovered_ms
            );
            report.cuts.push(cut);
        }
        judge_batches(&batches, &mut report, &mut violations);
        self.read_back(&batches, &mut report, &mut violations).await?;
        std::fs::write(
            self.dir.join("store-partitions.json"),
            serde_json::to_vec_pretty(&report)?,
        )?;
        Ok((report, violations))
    }

    /// Closes the writers' standard input (their signal to stop) and waits
    /// for them; returns the last instant any of them wrote (Unix µs).
    async fn stop_writers(&mut self, violations: &mut Vec<String>) -> u64 {
        for w in &mut self.writers {
            w.stdin.take();
        }
        for (id, w) in self.writers.iter_mut().enumerate() {
            match tokio::time::timeout(BOUND, w.child.wait()).await {
                Ok(Ok(s)) if s.success() => {}
                Ok(s) => violations.push(format!("store writer {id} ended badly: {s:?}")),
                Err(_) => violations.push(format!("store writer {id} did not stop within {BOUND:?}")),
            }
            let _ = (&mut w.reader).await;
        }
        self.batches().iter().map(|b| b.end_us).max().unwrap_or(0)
    }

    /// Two readers, one in each leaf namespace (summaries, then
    /// `--no-summaries`), and `bagel audit`.
    async fn read_back(
        &self,
        batches: &[Batch],
        report: &mut StorePhase,
        violations: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        let mut reads = Vec::new();
        for (ns, extra) in [
            (&self.net.writer_ns, None),
            (&self.net.closer_ns, Some("--no-summaries")),
        ] {
            let out = self.bagel_in(ns, "read", extra).await?;
            let read = parse_read(&out).with_context(|| format!("bagel read in {ns}"))?;
            violations.extend(read.bad.iter().map(|b| format!("reader in {ns}: {b}")));
            report.messages_read.push(read.messages.len() as u64);
            reads.push(read.messages);
        }
        report.readers_agree = reads.windows(2).all(|w| w[0] == w[1]);
        if !report.readers_agree {
            let (a, b) = (&reads[0], &reads[1]);
            violations.push(format!(
                "the readers disagree: {} messages only one reads, e.g. {:?}",
                a.symmetric_difference(b).count(),
                a.symmetric_difference(b).take(3).collect::<Vec<_>>()
            ));
        }
        let read_payloads: BTreeSet<&str> = reads
            .iter()
            .flat_map(|r| r.iter().map(|(_, p)| p.as_str()))
            .collect();
        for b in batches {
            match &b.outcome {
                Outcome::Acked(msgs) => {
                    for m in msgs {
                        report.acked += 1;
                        if reads.iter().all(|r| r.contains(m)) {
                            report.read_back += 1;
                        } else {
                            violations.push(format!("acknowledged write not read back: {m:?}"));
                        }
                    }
                }
                Outcome::Failed {
                    why: Failure::Late,
                    payloads,
                } => {
                    for p in payloads.iter().filter(|p| read_payloads.contains(p.as_str())) {
                        violations.push(format!("a write its writer was told was late is read: {p}"));
                    }
                }
                Outcome::Failed { .. } => {}
            }
        }
        let acked: BTreeSet<&(u64, String)> = batches
            .iter()
            .filter_map(|b| match &b.outcome {
                Outcome::Acked(msgs) => Some(msgs),
                Outcome::Failed { .. } => None,
            })
            .flatten()
            .collect();
        report.read_unacknowledged = reads[0].iter().filter(|m| !acked.contains(m)).count() as u64;
        let out = self.bagel_in(&self.net.writer_ns, "audit", None).await?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("bagel audit: {}", String::from_utf8_lossy(&out.stderr).trim()))?;
        for x in v["violations"].as_array().into_iter().flatten() {
            violations.push(format!("audit: {x}"));
        }
        if !out.status.success() && v["violations"].as_array().is_none_or(Vec::is_empty) {
            bail!(
                "bagel audit failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// `bagel <verb> --store .. --log .. --json --key ..` in namespace `ns`
    /// (on its lease server's time).
    async fn bagel_in(
        &self,
        ns: &str,
        verb: &str,
        extra: Option<&str>,
    ) -> anyhow::Result<std::process::Output> {
        let mut cmd = self.net.exec(ns, &self.bagel);
        self.env(&mut cmd, ns);
        cmd.args(["--server", &Self::lease_url(), verb, "--store", &self.store])
            .args(["--log", LOG, "--json", "--key", &self.key])
            .args(extra)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        tokio::time::timeout(BOUND, cmd.output())
            .await
            .with_context(|| format!("bagel {verb} in {ns} did not finish within {BOUND:?}"))?
            .with_context(|| format!("running bagel {verb}"))
    }

    /// Stops whatever still runs.
    async fn stop(&mut self) {
        for c in self
            .services
            .iter_mut()
            .chain(self.writers.iter_mut().map(|w| &mut w.child))
        {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
}

/// One cut's outcome from the batches and closes around it, and its
/// violations: for a writer cut, no batch wholly inside it acknowledged
/// and at least one failed; for a closer cut, the writers acknowledged
/// batches during it.
fn judge_cut(
    kind: &'static str,
    direction: &'static str,
    (cut_at, heal_at, recovered_at): (u64, u64, u64),
    batches: &[Batch],
    closes: &[(u64, u64)],
    violations: &mut Vec<String>,
) -> StoreCut {
    let during: Vec<&Batch> = batches
        .iter()
        .filter(|b| b.start_us >= cut_at && b.start_us < heal_at)
        .collect();
    let acked = during
        .iter()
        .filter(|b| matches!(b.outcome, Outcome::Acked(_)))
        .count() as u64;
    let cut = StoreCut {
        kind,
        direction,
        length_ms: (heal_at - cut_at) / 1000,
        batches: during.len() as u64,
        failed: during.len() as u64 - acked,
        acked,
        closes: closes
            .iter()
            .filter(|(t, _)| (cut_at..heal_at).contains(t))
            .map(|(_, n)| n)
            .sum(),
        recovered_ms: recovered_at.saturating_sub(heal_at) / 1000,
    };
    let name = format!("{kind} ({direction})");
    if kind == "writer_to_store" {
        for b in during.iter().filter(|b| b.end_us <= heal_at) {
            if let Outcome::Acked(msgs) = &b.outcome {
                violations.push(format!(
                    "{name}: writer {} had a batch acknowledged with its store cut off the whole time \
                     ({} µs to {} µs, cut {cut_at} to {heal_at}): {msgs:?}",
                    b.writer, b.start_us, b.end_us
                ));
            }
        }
        if cut.failed == 0 {
            violations.push(format!(
                "{name}: no write failed during a {} ms cut",
                cut.length_ms
            ));
        }
    } else if acked == 0 {
        violations.push(format!(
            "{name}: the writers had nothing acknowledged while only the closer was cut off"
        ));
    }
    cut
}

/// The failures by why, the longest batch, and every batch within its
/// bound.
fn judge_batches(batches: &[Batch], report: &mut StorePhase, violations: &mut Vec<String>) {
    for b in batches {
        let took = b.end_us.saturating_sub(b.start_us);
        let longest = &mut report.longest_batch_ms[b.writer];
        *longest = (*longest).max(took / 1000);
        let bound = batch_bound(WRITER_OP_TIMEOUTS[b.writer]);
        if took > bound.as_micros() as u64 {
            violations.push(format!(
                "writer {}: a batch took {} ms (bound {} ms)",
                b.writer,
                took / 1000,
                bound.as_millis()
            ));
        }
        match &b.outcome {
            Outcome::Failed {
                why: Failure::Timeout,
                ..
            } => report.failed_timeout += 1,
            Outcome::Failed {
                why: Failure::Late, ..
            } => report.failed_late += 1,
            Outcome::Failed {
                why: Failure::Other, ..
            } => report.failed_other += 1,
            Outcome::Acked(_) => {}
        }
    }
}

/// A writer's line: `OK <start> <end> <ts>:<payload>...` or `FAILED
/// <start> <end> <why> <payload>,... <error>`.
fn parse_batch(writer: usize, line: &str) -> Option<Batch> {
    let mut f = line.split_whitespace();
    let what = f.next()?;
    let start_us = f.next()?.parse().ok()?;
    let end_us = f.next()?.parse().ok()?;
    let outcome = match what {
        "OK" => Outcome::Acked(
            f.map(|m| {
                let (ts, p) = m.split_once(':')?;
                Some((ts.parse().ok()?, p.to_owned()))
            })
            .collect::<Option<_>>()?,
        ),
        "FAILED" => Outcome::Failed {
            why: match f.next()? {
                "timeout" => Failure::Timeout,
                "late" => Failure::Late,
                _ => Failure::Other,
            },
            payloads: f.next()?.split(',').map(str::to_owned).collect(),
        },
        _ => return None,
    };
    Some(Batch {
        writer,
        start_us,
        end_us,
        outcome,
    })
}

/// What one `bagel read --json` read: (timestamp, payload) of each
/// message, and the lines that say something is wrong.
struct Read {
    messages: BTreeSet<(u64, String)>,
    bad: Vec<String>,
}

fn parse_read(out: &std::process::Output) -> anyhow::Result<Read> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains(r#""kind":"summary""#) {
        bail!(
            "failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut r = Read {
        messages: BTreeSet::new(),
        bad: Vec::new(),
    };
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        match v["kind"].as_str() {
            Some("message") => {
                r.messages.insert((
                    v["timestamp_us"].as_u64().unwrap_or(0),
                    v["payload"].as_str().unwrap_or_default().to_owned(),
                ));
            }
            Some("rejected") => r.bad.push(format!("rejected: {line}")),
            Some("problem") => r.bad.push(format!("damage: {line}")),
            Some("summary") if v["open_bags_skipped"].as_u64() != Some(0) => r
                .bad
                .push(format!("open bags skipped after every bag was due: {line}")),
            _ => {}
        }
    }
    Ok(r)
}

fn now_us() -> u64 {
    Micros::now().as_micros()
}

/// Reads `child`'s standard output (bounded) until a line holding
/// `marker`; returns the lines up to it. The rest is drained.
async fn lines_until(child: &mut Child, marker: &str) -> anyhow::Result<Vec<String>> {
    let out = child.stdout.take().context("stdout piped")?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let mut seen = Vec::new();
    tokio::time::timeout(BOUND, async {
        while let Some(line) = lines.next_line().await? {
            let done = line.contains(marker);
            seen.push(line);
            if done {
                return anyhow::Ok(());
            }
        }
        bail!("the process ended before printing {marker:?}")
    })
    .await
    .with_context(|| format!("no {marker:?} within {BOUND:?}"))??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(seen)
}

/// The three namespaces: the store's in the middle, a veth pair to each
/// of the writers' and the closer's.
struct StoreNet {
    store_ns: String,
    writer_ns: String,
    closer_ns: String,
    /// (store side, client side) addresses of the writers' link and of
    /// the closer's.
    writer_link: (String, String),
    closer_link: (String, String),
}

impl StoreNet {
    /// Makes the namespaces (named after `tag`, this run's pid) and the
    /// links, each a /30 of its own inside a /29 for the run.
    async fn create(tag: u32) -> anyhow::Result<StoreNet> {
        let tag = tag % 100_000;
        let base = |host: u32| format!("10.232.{}.{}", (tag / 32) % 256, (tag % 32) * 8 + host);
        let net = StoreNet {
            store_ns: format!("bagel-ss-{tag}"),
            writer_ns: format!("bagel-sw-{tag}"),
            closer_ns: format!("bagel-sc-{tag}"),
            writer_link: (base(1), base(2)),
            closer_link: (base(5), base(6)),
        };
        let mut steps: Vec<Vec<String>> = [&net.store_ns, &net.writer_ns, &net.closer_ns]
            .iter()
            .map(|ns| args(&["netns", "add", ns]))
            .collect();
        for (ns, (store_ip, client_ip), (s_if, c_if)) in [
            (
                &net.writer_ns,
                &net.writer_link,
                (format!("bssw{tag}"), format!("bsw{tag}")),
            ),
            (
                &net.closer_ns,
                &net.closer_link,
                (format!("bssc{tag}"), format!("bsc{tag}")),
            ),
        ] {
            steps.extend([
                args(&[
                    "link",
                    "add",
                    &s_if,
                    "netns",
                    &net.store_ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &c_if,
                    "netns",
                    ns,
                ]),
                args(&[
                    "-n",
                    &net.store_ns,
                    "addr",
                    "add",
                    &format!("{store_ip}/30"),
                    "dev",
                    &s_if,
                ]),
                args(&["-n", ns, "addr", "add", &format!("{client_ip}/30"), "dev", &c_if]),
                args(&["-n", &net.store_ns, "link", "set", &s_if, "up"]),
                args(&["-n", ns, "link", "set", &c_if, "up"]),
            ]);
        }
        for ns in [&net.store_ns, &net.writer_ns, &net.closer_ns] {
            steps.push(args(&["-n", ns, "link", "set", "lo", "up"]));
        }
        for step in steps {
            if let Err(e) = ip(&step).await {
                net.remove().await;
                return Err(e.context("setting up the store partition namespaces (needs iproute2 and root)"));
            }
        }
        Ok(net)
    }

    /// The store's address as seen from namespace `ns`.
    fn store_ip_for(&self, ns: &str) -> &str {
        if ns == self.closer_ns {
            &self.closer_link.0
        } else {
            &self.writer_link.0
        }
    }

    /// A command run inside namespace `ns`.
    fn exec(&self, ns: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// The blackhole routes of a cut: in the client's namespace to the
    /// store (requests lost), in the store's to the client (answers lost).
    fn routes(&self, kind: &str, direction: &str) -> Vec<Vec<String>> {
        let (ns, (store_ip, client_ip)) = match kind {
            "writer_to_store" => (&self.writer_ns, &self.writer_link),
            _ => (&self.closer_ns, &self.closer_link),
        };
        let answers = vec![self.store_ns.clone(), format!("{client_ip}/32")];
        let requests = vec![ns.clone(), format!("{store_ip}/32")];
        match direction {
            "both" => vec![requests, answers],
            _ => vec![answers],
        }
    }

    async fn cut(&self, kind: &str, direction: &str) -> anyhow::Result<()> {
        for r in self.routes(kind, direction) {
            ip(&args(&["-n", &r[0], "route", "add", "blackhole", &r[1]])).await?;
        }
        Ok(())
    }

    async fn heal(&self, kind: &str, direction: &str) -> anyhow::Result<()> {
        for r in self.routes(kind, direction) {
            ip(&args(&["-n", &r[0], "route", "del", "blackhole", &r[1]])).await?;
        }
        Ok(())
    }

    /// Removes the namespaces (the veth pairs go with them).
    async fn remove(&self) {
        for ns in [&self.store_ns, &self.writer_ns, &self.closer_ns] {
            let _ = ip(&args(&["netns", "del", ns])).await;
        }
    }
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// A library writer of the phase (`bagel-chaos store-writer`), run in the
/// writers' namespace.
#[derive(Debug, clap::Args)]
pub struct StoreWriterArgs {
    /// The lease server: its lease on the name `w<id>`, and its signed
    /// time.
    #[arg(long)]
    server: String,
    #[arg(long)]
    store: String,
    #[arg(long)]
    log: String,
    #[arg(long)]
    id: usize,
    /// Every storage call gives up after this.
    #[arg(long, value_parser = humantime::parse_duration)]
    op_timeout: Duration,
}

/// Writes batches of one to five messages, one every 100 ms, under a lease
/// renewed in the background, until standard input closes. Prints `READY`
/// once it holds its lease and its store is open, then one line a batch:
/// `OK <start µs> <end µs> <ts>:<payload>...` or `FAILED <start µs> <end
/// µs> <timeout|late|other> <payload>,... <error>`.
pub async fn writer(a: StoreWriterArgs) -> anyhow::Result<()> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            for _ in std::io::stdin().lines() {}
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let cfg = BagConfig::default().with_op_timeout(a.op_timeout);
    // The S3 server says it listens just before it binds.
    let store = retry(|| bag::open_store(&a.store, &cfg)).await?;
    let client = retry(|| Client::connect(a.server.clone())).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let time = Arc::new(TimeSource::lease_server(
        client.clone(),
        TimeOptions::default().with_clock(Arc::clone(&clock)),
    ));
    let name = format!("w{}", a.id);
    let lease = client
        .acquire(vec![name.clone()])
        .ttl(Duration::from_secs(3))
        .wait(BOUND)
        .owner(format!("store-cuts-{name}"))
        .send()
        .await?;
    let writer = Writer::new(store, &a.log, &name, lease.rights(), clock, time, cfg)?;
    let mut out = std::io::stdout();
    writeln!(out, "READY")?;
    out.flush()?;
    let mut next = 0u64;
    let mut rng = rand::thread_rng();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let n = rng.gen_range(1..=5u64);
        let payloads: Vec<String> = (next..next + n).map(|k| format!("{name}-{k}")).collect();
        next += n;
        let start = now_us();
        let result = writer
            .write_batch(payloads.iter().map(|p| Bytes::from(p.clone())).collect())
            .await;
        let end = now_us();
        match result {
            Ok(stamps) => {
                let msgs: Vec<String> = stamps
                    .iter()
                    .zip(&payloads)
                    .map(|(t, p)| format!("{}:{p}", t.as_micros()))
                    .collect();
                writeln!(out, "OK {start} {end} {}", msgs.join(" "))?;
            }
            Err(e) => {
                let why = match e {
                    bag::Error::Timeout { .. } => "timeout",
                    bag::Error::LateRejected { .. } | bag::Error::BagClosed { .. } => "late",
                    _ => "other",
                };
                let error = e.to_string().replace('\n', " ");
                writeln!(out, "FAILED {start} {end} {why} {} {error}", payloads.join(","))?;
            }
        }
        out.flush()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lease.release(None).await?;
    Ok(())
}

/// Tries `f` until it works, for at most [`BOUND`].
async fn retry<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    mut f: impl FnMut() -> F,
) -> anyhow::Result<T> {
    let started = tokio::time::Instant::now();
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() > BOUND => bail!("for {BOUND:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
