//! The phase's processes (the S3 server, the lease servers, the writers,
//! the metronome), the cuts in turn, and the reads afterwards.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_bags::Bucket;
use bagel_client::Micros;
use rand::Rng as _;
use rand::rngs::StdRng;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, ChildStdin, Command};

use super::checks::{judge_batches, judge_cut, parse_batch, parse_read};
use super::net::StoreNet;
use super::{
    BUCKET, Batch, CLOCK_TOLERANCE, CLOSER_BOUND, CUT_MS, Failure, GRACE, LEASE_PORT, LOG, Outcome, S3_PORT,
    StorePhase, WRITER_OP_TIMEOUTS, batch_bound, now_us,
};
use crate::partitions::BOUND;

/// The running processes of the phase.
pub(super) struct Phase<'a> {
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
    /// Woken whenever a writer reports a batch or the metronome a close:
    /// what [`Phase::until`] waits on.
    reported: Arc<tokio::sync::Notify>,
    store: String,
}

/// A writer process: its standard input (closed to stop it) and the
/// batches it reported.
struct WriterProc {
    child: Child,
    stdin: Option<ChildStdin>,
    batches: Arc<Mutex<Vec<Batch>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl<'a> Phase<'a> {
    pub(super) async fn new(
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
            reported: Arc::default(),
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
        // Every line kept beside the run, for whoever reads a failure.
        let mut kept = std::fs::File::create(self.dir.join(format!("writer-{id}.out")))?;
        let reader = tokio::spawn({
            let batches = Arc::clone(&batches);
            let reported = Arc::clone(&self.reported);
            async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    let _ = writeln!(kept, "{line}");
                    if let Some(b) = parse_batch(id, &line) {
                        batches.lock().expect("batches").push(b);
                        reported.notify_waiters();
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
        let reported = Arc::clone(&self.reported);
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
                    reported.notify_waiters();
                }
            }
        });
        self.services.push(child);
        Ok(())
    }

    /// Waits (bounded) until `done` holds, looking again each time a
    /// process reports a batch or a close.
    async fn until(&self, what: &str, done: impl Fn(&Phase<'_>) -> bool) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + BOUND;
        loop {
            // Registered before the look, so a report between the two
            // still wakes it.
            let reported = self.reported.notified();
            tokio::pin!(reported);
            reported.as_mut().enable();
            if done(self) {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, reported).await.is_err() {
                bail!("{what}: not within {BOUND:?}");
            }
        }
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
    pub(super) async fn cuts(&mut self, rng: &mut StdRng) -> anyhow::Result<(StorePhase, Vec<String>)> {
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
    pub(super) async fn stop(&mut self) {
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
