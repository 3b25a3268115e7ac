//! Workers that use the real CLI as an operator's script would, and are
//! interrupted the ways processes are in production:
//!
//! * `fork`: `bagel run` whose command starts a background `bagel write`
//!   (half of the time in a new session, out of its process group) and
//!   exits at once; the supervisor must kill the whole tree before it
//!   releases, or the writer goes on under a released lease;
//! * `sigterm`: `bagel run` itself gets SIGTERM while its command writes;
//! * `sigkill_writer`: the `bagel write` under `bagel run` is SIGKILLed
//!   mid-batch;
//! * `hold_interrupt`: `bagel acquire --hold`, a `bagel write` with its
//!   lease file, then SIGINT to the holder.
//!
//! Whatever a `bagel write` printed as written (one `<µs> <time>` line per
//! message, in input order) is acknowledged and must be read back; a
//! process of the run still alive after `bagel run` (or the holder) has
//! returned is a violation: its lease is gone. The watermark each release
//! published is checked by the audit (at least every message of the lease).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tokio::process::Command;

use crate::lists::{Lists, PerStep};

/// How often each interruption happened, and what went wrong.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RunFences {
    pub fork: u64,
    pub sigterm: u64,
    pub sigkill_writer: u64,
    pub hold_interrupt: u64,
    /// Runs whose names were busy (nothing to fence).
    pub busy: u64,
    /// Processes found alive after their supervisor returned.
    pub leaked_processes: u64,
    /// Messages the CLI writers acknowledged (all must be read back).
    pub acked: u64,
    /// Runs interrupted under each step of the migration.
    pub across_migration: PerStep,
}

/// What the CLI roles need to run.
#[derive(Debug, Clone)]
pub struct CliSetup {
    pub bagel: PathBuf,
    /// The server lists in force (`--servers`, and `--next-servers` while
    /// migrating). Each run reads them when it starts; runs go one at a
    /// time, so once one started on a generation every earlier run has
    /// ended.
    pub lists: Lists,
    pub roughtime: (String, String),
    pub env: Vec<(String, String)>,
    pub dir: PathBuf,
    pub log: String,
    /// Stores the CLI writes to, with their index in the driver's list.
    pub stores: Vec<(usize, String)>,
    pub names: usize,
}

/// Acknowledged messages per store index: (timestamp, payload).
pub type Acks = Arc<Mutex<Vec<BTreeSet<(u64, String)>>>>;

/// Runs CLI roles one after another until `stop` says so.
pub async fn run(
    setup: CliSetup,
    seed: u64,
    acks: Acks,
    stop: tokio::sync::watch::Receiver<bool>,
    violations: Arc<Mutex<Vec<String>>>,
) -> RunFences {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fences = RunFences::default();
    let mut k = 0u64;
    let mover = setup.lists.mover("the CLI roles".into());
    let mut step = setup.lists.now().step();
    while !*stop.borrow() {
        k += 1;
        let role = rng.gen_range(0..4);
        let (si, store) = setup.stores.choose(&mut rng).expect("a store").clone();
        let name = format!("n{}", rng.gen_range(0..setup.names));
        let in_force = setup.lists.now();
        mover.on(in_force.generation);
        if in_force.step() != step {
            step = in_force.step();
            println!("bagel-chaos: CLI roles: run {k} on the lists of {step}");
        }
        let run = OneRun {
            setup: &setup,
            servers: in_force.current,
            next: in_force.next,
            k,
            store,
            name,
            out: setup.dir.join(format!("cli-{k}.out")),
        };
        let outcome = match role {
            0 => run.fork(&mut rng).await,
            1 => run.interrupted(&mut rng, Interrupt::TermSupervisor).await,
            2 => run.interrupted(&mut rng, Interrupt::KillWriter).await,
            _ => run.hold_interrupt(&mut rng).await,
        };
        if matches!(outcome, Ok(Outcome::Ran)) {
            *fences.across_migration.entry(step).or_default() += 1;
        }
        match outcome {
            Ok(Outcome::Busy) => fences.busy += 1,
            Ok(Outcome::Ran) => match role {
                0 => fences.fork += 1,
                1 => fences.sigterm += 1,
                2 => fences.sigkill_writer += 1,
                _ => fences.hold_interrupt += 1,
            },
            Err(e) => violations
                .lock()
                .expect("violations")
                .push(format!("cli role {k}: {e:#}")),
        }
        let leaked = processes_naming(&marker(k));
        if !leaked.is_empty() {
            fences.leaked_processes += leaked.len() as u64;
            violations.lock().expect("violations").push(format!(
                "cli role {k}: processes {leaked:?} of the run outlived their supervisor"
            ));
            for pid in leaked {
                kill(pid, "KILL");
            }
        }
        match read_acks(&run.out, &format!("c{k}-")) {
            Ok(got) => {
                fences.acked += got.len() as u64;
                acks.lock().expect("acks")[si].extend(got);
            }
            Err(e) => violations
                .lock()
                .expect("violations")
                .push(format!("cli role {k}: {e:#}")),
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await;
    }
    fences
}

enum Outcome {
    Ran,
    Busy,
}

enum Interrupt {
    TermSupervisor,
    KillWriter,
}

struct OneRun<'a> {
    setup: &'a CliSetup,
    servers: String,
    next: Option<String>,
    k: u64,
    store: String,
    name: String,
    /// What the `bagel write` of this run printed.
    out: PathBuf,
}

impl OneRun<'_> {
    fn bagel(&self) -> Command {
        let s = self.setup;
        let mut c = Command::new(&s.bagel);
        c.args(["--servers", &self.servers]);
        if let Some(next) = &self.next {
            c.args(["--next-servers", next]);
        }
        c.args(["--roughtime", &s.roughtime.0, "--roughtime-key", &s.roughtime.1])
            .envs(s.env.iter().map(|(k, v)| (k, v)))
            .env("BAGEL_STATE_DIR", s.dir.join("state"))
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// A shell pipeline: numbered payloads, a few a tenth of a second,
    /// into `bagel write` under `$BAGEL_LEASE_FILE` (or `lease`).
    fn writer_script(&self, lease: &str, count: u32) -> String {
        let s = self.setup;
        format!(
            "i=0; while [ $i -lt {count} ]; do i=$((i+1)); echo c{k}-$i; sleep 0.03; done | \
             '{bagel}' --roughtime {rt} --roughtime-key {rk} write --store '{store}' --log {log} \
             --lease \"{lease}\" --batch 2 --keep-going --writer-id {marker} > '{out}'",
            k = self.k,
            marker = marker(self.k),
            bagel = s.bagel.display(),
            rt = s.roughtime.0,
            rk = s.roughtime.1,
            store = self.store,
            log = s.log,
            out = self.out.display(),
        )
    }

    fn run_cmd(&self, script: &str) -> Command {
        let mut c = self.bagel();
        c.args([
            "run",
            "--name",
            &self.name,
            "--ttl",
            "2s",
            "--kill-grace",
            "500ms",
            "--",
        ])
        .args(["sh", "-c", script]);
        c
    }

    /// `bagel run` whose command leaves a writer behind and exits.
    async fn fork(&self, rng: &mut StdRng) -> anyhow::Result<Outcome> {
        // Half of the time the writer leaves the process group too (a
        // daemon's `setsid`): only a subreaper finds it.
        let writer = self.writer_script("$BAGEL_LEASE_FILE", 200);
        let background = if rng.gen_bool(0.5) {
            format!("setsid sh -c '{}' &", writer.replace('\'', r"'\''"))
        } else {
            format!("( {writer} ) &")
        };
        let script = format!("{background} sleep 0.{}; exit 0", rng.gen_range(2..8));
        let status = tokio::time::timeout(Duration::from_secs(30), self.run_cmd(&script).status())
            .await
            .context("bagel run did not return within 30 s")??;
        Ok(match status.code() {
            Some(2) => Outcome::Busy,
            _ => Outcome::Ran,
        })
    }

    /// `bagel run` with a writer in front, interrupted mid-way.
    async fn interrupted(&self, rng: &mut StdRng, how: Interrupt) -> anyhow::Result<Outcome> {
        let script = self.writer_script("$BAGEL_LEASE_FILE", 100);
        let mut child = self.run_cmd(&script).spawn()?;
        let pid = child.id().context("bagel run's pid")?;
        let after = Duration::from_millis(rng.gen_range(200..1500));
        if let Ok(status) = tokio::time::timeout(after, child.wait()).await {
            // It ended on its own first (busy, or done).
            return Ok(match status?.code() {
                Some(2) => Outcome::Busy,
                _ => Outcome::Ran,
            });
        }
        match how {
            Interrupt::TermSupervisor => kill(pid, "TERM"),
            Interrupt::KillWriter => {
                for p in processes_naming(&marker(self.k)) {
                    if cmdline(p).is_some_and(|c| c.iter().any(|a| a == "write") && c[0].ends_with("bagel")) {
                        kill(p, "KILL");
                    }
                }
            }
        }
        tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .context("bagel run did not return within 30 s of the interruption")??;
        Ok(Outcome::Ran)
    }

    /// `bagel acquire --hold`, a write under its lease file, then SIGINT.
    async fn hold_interrupt(&self, rng: &mut StdRng) -> anyhow::Result<Outcome> {
        let lease = self.setup.dir.join(format!("cli-{}.lease.json", self.k));
        let log = self.setup.dir.join(format!("cli-{}.hold.log", self.k));
        let mut hold = self.bagel();
        hold.args(["acquire", &self.name, "--ttl", "2s", "--hold", "--json"])
            .env("RUST_LOG", "info")
            .stdout(std::fs::File::create(&lease)?)
            .stderr(std::fs::File::create(&log)?);
        let mut holder = hold.spawn()?;
        let pid = holder.id().context("holder's pid")?;
        // The lease file is complete once it parses.
        let ready = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                if let Ok(Some(status)) = holder.try_wait() {
                    return Err(status);
                }
                let text = std::fs::read_to_string(&lease).unwrap_or_default();
                if serde_json::from_str::<serde_json::Value>(&text).is_ok() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .with_context(|| {
            format!(
                "the holder printed no lease within 15 s; its log ends: {}",
                tail(&log, 1500)
            )
        })?;
        if ready.is_err() {
            return Ok(Outcome::Busy);
        }
        let script = self.writer_script(&lease.display().to_string(), rng.gen_range(5..40));
        let mut sh = Command::new("sh");
        sh.args(["-c", &script])
            .envs(self.setup.env.iter().map(|(k, v)| (k, v)))
            .env("BAGEL_STATE_DIR", self.setup.dir.join("state"))
            .env("RUST_LOG", "error")
            .kill_on_drop(true);
        tokio::time::timeout(Duration::from_secs(30), sh.status())
            .await
            .context("the write under --hold did not finish within 30 s")??;
        kill(pid, "INT");
        tokio::time::timeout(Duration::from_secs(30), holder.wait())
            .await
            .context("the holder did not exit within 30 s of SIGINT")??;
        Ok(Outcome::Ran)
    }
}

/// The last `max` bytes of a process's log, for a violation's message.
fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].replace('\n', " | ")
}

/// What `bagel write` acknowledged: its output lines, one per message in
/// input order (`FAILED n ...` stands for n messages not written).
fn read_acks(out: &Path, prefix: &str) -> anyhow::Result<Vec<(u64, String)>> {
    let text = match std::fs::read_to_string(out) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
    };
    let mut acks = Vec::new();
    let mut next = 1u64;
    // A writer killed mid-line leaves a last line without its newline: not
    // a whole acknowledgement.
    let whole = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    for line in whole.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("FAILED") => {
                let n: u64 = f.next().and_then(|n| n.parse().ok()).context("FAILED count")?;
                next += n;
            }
            Some(ts) => {
                let ts: u64 = ts
                    .parse()
                    .with_context(|| format!("{}: line {line:?}", out.display()))?;
                acks.push((ts, format!("{prefix}{next}")));
                next += 1;
            }
            None => {}
        }
    }
    Ok(acks)
}

/// The writer id of run `k`: on the command line of every process of the
/// run (the shell's script holds it too), so they can be found.
fn marker(k: u64) -> String {
    format!("chaosrun{k}x")
}

/// Live processes whose command line names `marker`.
fn processes_naming(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| cmdline(pid).is_some_and(|c| c.iter().any(|a| a.contains(marker))))
        .filter(|&pid| !is_zombie(pid))
        .collect()
}

fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn kill(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status();
}
