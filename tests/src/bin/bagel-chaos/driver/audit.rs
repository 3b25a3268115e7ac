//! The checks once the run is quiet: after every bag is due to be closed,
//! two independent readers read every log on every store and must agree,
//! every acknowledged write must be read back, `bagel audit` must find no
//! violation, the workers' counts must match their acknowledgements, and
//! each watcher's rebuilt set must match a fresh List. The real CLI does
//! the reading ([`Flags`]), as an operator would run it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_bags::Bucket;
use bagel_client::Micros;
use tokio::process::Command;

use super::{CLOCK_TOLERANCE, CLOSER_BOUND, GRACE, LOG, Run, S3_LEASE_LOG};
use crate::watchers::Watchers;

impl Run<'_> {
    /// Every check of the quiet run, in order; then the services stop.
    /// `stopped`: when the last worker stopped.
    pub(super) async fn audit(&mut self, stopped: Micros, watchers: Watchers) -> anyhow::Result<()> {
        self.wait_for_closes(stopped).await;
        self.read_back().await?;
        self.check_ack_count();
        self.check_watchers(watchers).await;
        self.s3.kill().await;
        for (server, _) in &mut self.cluster.servers {
            server.kill().await;
        }
        Ok(())
    }

    /// Waits until every bag that can hold a write is past its close time
    /// (clocks may be a tolerance apart); readers close or seal whatever
    /// is still open. A closer acts on its clock less its error bound, and
    /// a bound from Roughtime is at least its radius (5 s from roughenough
    /// 2.2): the readers close the last bags only that much later.
    async fn wait_for_closes(&self, stopped: Micros) {
        let last = Bucket::of(stopped.saturating_add(Duration::from_millis(500)));
        let all_due = last
            .close_time(GRACE)
            .saturating_add(CLOCK_TOLERANCE)
            .saturating_add(CLOSER_BOUND);
        tokio::time::sleep(all_due.duration_since(Micros::now())).await;
    }

    /// Each log on each store read twice (the readers must agree), every
    /// acknowledged write looked for, and `bagel audit` run.
    async fn read_back(&mut self) -> anyhow::Result<()> {
        let report = &mut self.report;
        let acks = self.acks.lock().expect("acks").clone();
        let flags = Flags {
            bagel: self.bagel.clone(),
            env: self.env.clone(),
            keys: self.cluster.keys.iter().cloned().collect(),
            server_url: self.cluster.server_url.clone(),
            lease_store: self.lease_store.clone(),
        };
        let mut agree = true;
        let logs = [LOG, S3_LEASE_LOG];
        let per_log = self.stores.len();
        for (si, (log, url)) in logs
            .iter()
            .flat_map(|log| self.stores.iter().map(move |url| (*log, url)))
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
        Ok(())
    }

    /// The workers' own count of acknowledged writes against their ACK
    /// lines.
    fn check_ack_count(&mut self) {
        let acks = self.acks.lock().expect("acks");
        let report = &mut self.report;
        let acked_seen: u64 = acks.iter().map(|s| s.len() as u64).sum();
        if acked_seen != report.acked_writes {
            report.violations.push(format!(
                "workers said they acknowledged {} writes, their ACK lines name {acked_seen}",
                report.acked_writes
            ));
        }
    }

    /// With the run quiet: each watcher's rebuilt set against a fresh List.
    async fn check_watchers(&mut self, watchers: Watchers) {
        let report = &mut self.report;
        report.watch_checks = watchers.check().await;
        for m in &report.watch_checks.mismatches {
            report.violations.push(format!("watch: {m}"));
        }
        for m in &report.watch_checks.not_drained {
            report.violations.push(format!(
                "watch: {m}: a client kept the lists before the migration"
            ));
        }
    }
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
