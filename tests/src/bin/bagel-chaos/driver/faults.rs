//! The faults, at seeded random times until the run's duration is over:
//! kill -9 and restart of a lease server (with or without its key), of
//! the S3 server and of a metronome (on a clock drawn again), retention
//! runs killed mid-way, SIGSTOP pauses of workers, servers and
//! metronomes, operators' reads and audits on skewed clocks, and once the
//! migration of every client to another server list. One function a kind
//! of fault; [`Run::inject_faults`] draws which comes next.

use std::process::Stdio;
use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::seq::SliceRandom as _;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

use super::setup::{WorkerProc, metronome, skewed, start_s3, start_server};
use super::{KEEP_BAGS, LOG, Roles, Run, SKEWS_MS};
use crate::lists::Lists;
use crate::services::drain;

impl Run<'_> {
    /// Injects faults every 1.5 to 5 s (the first after 3 s) until the
    /// duration is over, the migration once a third of the way in; then
    /// waits out the duration.
    pub(super) async fn inject_faults(&mut self, roles: &mut Roles) -> anyhow::Result<()> {
        let a = self.a;
        let started = roles.started;
        let mut next = Duration::from_secs(3);
        let migrate_at = a.duration / 3;
        while started.elapsed() + next < a.duration {
            tokio::time::sleep(next).await;
            if self.report.migrations == 0 && started.elapsed() >= migrate_at {
                self.migrate(roles).await?;
            }
            match self.rng.gen_range(0..9) {
                0 => self.kill_server(roles).await?,
                1 => self.kill_s3(roles).await?,
                2 | 3 => self.kill_metronome(roles).await?,
                7 => self.retain(roles).await,
                8 => self.pause(roles),
                k => self.operator(k, roles),
            }
            next = Duration::from_millis(self.rng.gen_range(1500..5000));
        }
        tokio::time::sleep(a.duration.saturating_sub(started.elapsed())).await;
        self.report.duration_s = started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Moves every client to the migrated server list as an operator
    /// rolls it out (docs/operating.md, "Migration"): both lists once
    /// every client runs on them (the standby loops' waiting `bagel run`s
    /// restarted onto them), then the max TTL counted from that moment
    /// (every lease taken under the old list alone has ended: its holder
    /// moved, and its deadline has passed), then the new list alone.
    async fn migrate(&mut self, roles: &Roles) -> anyhow::Result<()> {
        let (server_url, migrated_url) = (&self.cluster.server_url, &self.cluster.migrated_url);
        let mut m = Migration {
            workers: &mut self.workers,
            lists: &self.lists,
            violations: &mut self.report.violations,
        };
        println!(
            "[{:>5.1}s] migration step 2: every client to {server_url} and {migrated_url}",
            roles.at()
        );
        m.step(server_url, Some(migrated_url)).await?;
        println!(
            "[{:>5.1}s] migration step 2: every client moved; waiting out the max TTL",
            roles.at()
        );
        tokio::time::sleep(self.a.max_ttl + Duration::from_millis(500)).await;
        println!(
            "[{:>5.1}s] migration step 3: every client to {migrated_url} only",
            roles.at()
        );
        m.step(migrated_url, None).await?;
        println!("[{:>5.1}s] migration step 3: every client moved", roles.at());
        self.report.migrations += 1;
        Ok(())
    }

    /// kill -9 of a lease server, restarted with its key file or on a
    /// fresh disk.
    async fn kill_server(&mut self, roles: &Roles) -> anyhow::Result<()> {
        let i = self.rng.gen_range(0..self.cluster.servers.len());
        let keep_key = self.rng.gen_bool(0.5);
        let (server, key_file) = &mut self.cluster.servers[i];
        let from = Instant::now();
        server.kill().await;
        if !keep_key {
            // A fresh disk: no key, no granted-until mark.
            let _ = std::fs::remove_file(&*key_file);
            let _ = std::fs::remove_file(key_file.with_extension("key.granted-until"));
        }
        self.cluster.keys.insert(start_server(server).await?);
        // It grants nothing until its restart wait (max TTL) is over.
        roles.outages.record(
            format!("member-{i}"),
            "kill",
            from,
            Instant::now() + self.a.max_ttl,
        );
        self.report.server_kills += 1;
        if keep_key {
            self.report.cluster_kills.with_key += 1;
        } else {
            self.report.cluster_kills.without_key += 1;
        }
        println!(
            "[{:>5.1}s] kill -9 lease server {i}; restarted {} its key (waits out its TTL)",
            roles.at(),
            if keep_key { "with" } else { "without" }
        );
        Ok(())
    }

    /// kill -9 of the S3 server, restarted from its journal.
    async fn kill_s3(&mut self, roles: &Roles) -> anyhow::Result<()> {
        self.s3.kill().await;
        start_s3(&mut self.s3, self.s3_port).await?;
        self.report.store_kills += 1;
        println!(
            "[{:>5.1}s] kill -9 S3 server; restarted from its journal",
            roles.at()
        );
        Ok(())
    }

    /// kill -9 of a metronome, restarted (the second of a store's two on
    /// a clock drawn again).
    async fn kill_metronome(&mut self, roles: &Roles) -> anyhow::Result<()> {
        let i = self.rng.gen_range(0..self.metronomes.len());
        self.metronomes[i].kill().await;
        if i % 2 == 1 {
            let skew = *SKEWS_MS.choose(&mut self.rng).expect("skews");
            self.metronomes[i] =
                metronome(&self.bagel, &self.stores[i / 2], &self.roughtime, skew, &self.env);
            self.report
                .clock_skews
                .entry("metronome".into())
                .or_default()
                .push(skew);
        }
        drain(self.metronomes[i].start()?);
        self.report.closer_kills += 1;
        println!("[{:>5.1}s] kill -9 metronome {i}; restarted", roles.at());
        Ok(())
    }

    /// Retention on one store, killed at a random point half the time:
    /// what it removed must still read back from the summaries, and a
    /// killed run is finished by the next.
    async fn retain(&mut self, roles: &Roles) {
        let (rng, report, roughtime) = (&mut self.rng, &mut self.report, &self.roughtime);
        let url = self.stores[rng.gen_range(0..self.stores.len())].clone();
        let kill_after = rng
            .gen_bool(0.5)
            .then(|| Duration::from_millis(rng.gen_range(0..400)));
        // On a skewed clock like any closer: it judges age on its
        // reading less its measured bound (never early), and
        // refuses when it cannot vouch for its clock.
        let skew = *SKEWS_MS.choose(rng).expect("skews");
        report.clock_skews.entry("retain".into()).or_default().push(skew);
        let mut c = skewed(&self.bagel, skew);
        c.args(["--roughtime", &roughtime.0, "--roughtime-key", &roughtime.1])
            .args(["retain", "--store", &url, "--log", LOG, "--json"])
            .args(["--keep-bags", KEEP_BAGS, "--unsafe-min-keep", KEEP_BAGS])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
                    roles.at()
                );
            }
            Retained::Killed => {
                report.retention.killed += 1;
                println!("[{:>5.1}s] bagel retain of {url}: killed mid-way", roles.at());
            }
            Retained::Failed => report.retention.failed += 1,
        }
    }

    /// A process frozen (SIGSTOP) for up to twice the max TTL and more,
    /// then continued: a worker wakes past its leases' deadlines with
    /// appends in flight (they must be refused or read back, never lost or
    /// overlapping the next holder's); a server or a metronome wakes to a
    /// world that moved on.
    fn pause(&mut self, roles: &mut Roles) {
        let (rng, report) = (&mut self.rng, &mut self.report);
        let pause = Duration::from_millis(
            rng.gen_range(100..=u64::try_from((self.a.max_ttl * 2).as_millis()).unwrap_or(4_000) + 2_000),
        );
        let (what, pid) = match rng.gen_range(0..4) {
            0 | 1 => {
                let w = &self.workers[rng.gen_range(0..self.workers.len())];
                report.pauses.workers += 1;
                (format!("worker {}", w.id), w.child.id())
            }
            2 => {
                let i = rng.gen_range(0..self.cluster.servers.len());
                report.pauses.servers += 1;
                roles.outages.record(
                    format!("member-{i}"),
                    "pause",
                    Instant::now(),
                    Instant::now() + pause,
                );
                (format!("lease server {i}"), self.cluster.servers[i].0.pid())
            }
            _ => {
                let i = rng.gen_range(0..self.metronomes.len());
                report.pauses.metronomes += 1;
                (format!("metronome {i}"), self.metronomes[i].pid())
            }
        };
        let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        report.pauses.longest_ms = report.pauses.longest_ms.max(ms);
        if let Some(pid) = pid {
            roles.side_runs.spawn(pause_process(pid, pause));
        }
        println!("[{:>5.1}s] SIGSTOP {what} for {ms} ms, then SIGCONT", roles.at());
    }

    /// An operator's `bagel read` (or, for `k` 6, `bagel audit`) on a
    /// skewed clock, mid-run: it may refuse, never close bags early.
    fn operator(&mut self, k: i32, roles: &mut Roles) {
        let (rng, roughtime) = (&mut self.rng, &self.roughtime);
        let verb = if k == 6 { "audit" } else { "read" };
        let skew = *SKEWS_MS[1..].choose(rng).expect("skews");
        self.report.clock_skews.entry(verb.into()).or_default().push(skew);
        let url = self.stores[rng.gen_range(0..self.stores.len())].clone();
        let mut c = skewed(&self.bagel, skew);
        c.args(["--roughtime", &roughtime.0, "--roughtime-key", &roughtime.1])
            .args([verb, "--store", &url, "--log", LOG, "--json"])
            .args(
                self.cluster
                    .keys
                    .iter()
                    .flat_map(|k| ["--key".to_owned(), k.clone()]),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        roles.side_runs.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(30), c.status()).await;
        });
        println!(
            "[{:>5.1}s] bagel {verb} of {url} on a clock {skew} ms off",
            roles.at()
        );
    }
}

/// One step of a migration: every client moves to new server lists; the
/// step is done when each has started a lease cycle on them (so no lease
/// from the lists before is still held by it).
struct Migration<'a> {
    workers: &'a mut Vec<WorkerProc>,
    lists: &'a Lists,
    violations: &'a mut Vec<String>,
}

impl Migration<'_> {
    async fn step(&mut self, current: &str, next: Option<&str>) -> anyhow::Result<()> {
        // The journeys and the CLI roles read the lists at each cycle;
        // the workers are told on their standard input.
        let in_force = self.lists.set(current.to_owned(), next.map(str::to_owned));
        let generation = in_force.generation;
        let line = format!("SERVERS {generation} {current} {}\n", next.unwrap_or(""));
        for w in self.workers.iter_mut().filter(|w| !w.s3_lease) {
            if let Some(stdin) = &mut w.stdin {
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await?;
            }
        }
        if let Err(behind) = self.lists.all_moved(generation, Duration::from_secs(60)).await {
            self.violations.push(format!(
                "migration to {}: not every client moved within 60 s: {}",
                in_force.step(),
                behind.join(", ")
            ));
        }
        Ok(())
    }
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
