//! Leader election as users run it: the README's standby loop
//! (`while true; do bagel run --name N --wait forever -- CMD; done`),
//! [`STANDBYS`] loops on each of [`NAMES`] leader names, against the run's
//! lease servers, while the driver kills leaders' commands, SIGKILLs
//! `bagel run` itself (with its command, as a systemd unit or a container
//! is killed), freezes leaders (SIGSTOP, then SIGCONT) and runs one
//! standby on a skewed clock (libfaketime).
//!
//! **A leader's work, and the order it is checked on.** The command under
//! `bagel run` is this binary (`bagel-chaos leader`). It writes `START
//! <unit> <token> <pid>` (its fencing token from `BAGEL_FENCING_TOKEN`),
//! then a `STEP` line every [`STEP`] for a random while, then `END`, and
//! exits, so `bagel run` releases; on SIGTERM (`bagel run` fencing it) it
//! writes `END` and exits at once. Its lines *are* its work, as a leader's
//! writes to a store would be: every command of one name writes to the
//! same pipe, which the driver reads. A pipe keeps its writes in the order
//! they happened (each line is one `write(2)` shorter than `PIPE_BUF`, so
//! atomic), so "at most one leader at a time" is checked on that order,
//! not on anyone's clock: no line of a leader may come after the `START` of
//! the next one. A leader frozen past its lease's deadline is the one
//! exception the lease allows (nothing running can be stopped by a frozen
//! supervisor): its lines after the next leader's start are counted as
//! `stale_steps_after_freeze`, and must carry a lower fencing token than the
//! new leader's (what a store checking tokens would refuse) and come within
//! the kill grace of the thaw (the thawed `bagel run` fences at once).
//!
//! **The clock the gaps are timed on** is the driver's monotonic clock, read
//! as it reads each line and as it injects each fault. The commands' own
//! clocks play no part: one standby runs under libfaketime and its command
//! inherits the preload, and wall-clock micros can be stepped.
//!
//! **How long a name may be without a leader.** After a leader's last line
//! (or its kill), a new leader must start within the TTL (the longest a
//! lease that nobody released outlives its holder) plus [`GAP_MARGIN`].
//! A longer gap that an outage of the name's server explains (a kill and
//! its restart wait, a pause) is reported apart; any other fails the run.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bagel_client::{Cluster, ServerSpec};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tokio::process::Command;
use tokio::sync::watch;

use crate::outages::{Outages, before};

/// Leader names (`leader-0`, ...).
pub const NAMES: usize = 2;
/// Standby loops per name.
pub const STANDBYS: usize = 3;
/// How often a leader writes a line while it works.
const STEP: Duration = Duration::from_millis(25);
/// How long a leader works before it exits on its own (ms).
const WORK_MS: std::ops::Range<u64> = 200..3_000;
/// Clock offsets (ms) a standby must work with, as the workers 300 ms
/// ahead and behind must: a `bagel run` on such a clock that is fenced with
/// no fault to explain it (not frozen, not stopped, its server up) fails
/// the run. Beyond it, a fence is the safe answer and only counted.
const MUST_WORK_SKEW_MS: i64 = 300;
/// `bagel run --fence-margin` and `--kill-grace`: their sum must be under
/// two thirds of the TTL (the run's 2 s max TTL).
const FENCE_MARGIN: Duration = Duration::from_millis(300);
const KILL_GRACE: Duration = Duration::from_millis(200);
/// What a failover may take beyond the TTL: the server's wake-up of the
/// first waiter, the grant and the renewal that re-anchors it, the lease
/// file's fsync, and starting the command (a process of this binary), on a
/// 2-core machine that runs the whole fault run at once.
pub const GAP_MARGIN: Duration = Duration::from_secs(1);
/// How long after its thaw a frozen leader may still write: the thawed
/// `bagel run` fences at once, SIGTERM then SIGKILL after the kill grace;
/// this much more for the two processes to be scheduled again.
const THAW_SLACK: Duration = Duration::from_millis(500);
/// Between two `bagel run`s of one loop after one that failed (a restart
/// policy's delay, as systemd's `RestartSec`), so a loop whose every run
/// fails does not spin.
const RESTART_DELAY: Duration = Duration::from_millis(100);

/// `bagel-chaos leader`: the command each leader runs (see the module
/// docs).
#[derive(Debug, clap::Args)]
pub struct LeaderArgs {
    /// Which `bagel run` this is (the driver's number for it).
    #[arg(long)]
    unit: u64,
    /// How long to work before exiting.
    #[arg(long)]
    work_ms: u64,
}

/// The leader's command: its lines on standard output (the name's pipe).
pub async fn leader(a: LeaderArgs) -> anyhow::Result<()> {
    let token: u64 = std::env::var("BAGEL_FENCING_TOKEN")
        .context("BAGEL_FENCING_TOKEN is not set: run under `bagel run`")?
        .parse()
        .context("BAGEL_FENCING_TOKEN")?;
    // Before START: a SIGTERM from then on ends the work with an END line.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let line = |kind: &str| -> std::io::Result<()> {
        // One write(2) per line (short lines, flushed at once): atomic in
        // the pipe, never interleaved with another leader's.
        let line = format!("{kind} {} {token} {}\n", a.unit, std::process::id());
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes())?;
        out.flush()
    };
    line("START")?;
    let until = tokio::time::Instant::now() + Duration::from_millis(a.work_ms);
    loop {
        let next = (tokio::time::Instant::now() + STEP).min(until);
        tokio::select! {
            _ = term.recv() => break,
            () = tokio::time::sleep_until(next) => {}
        }
        if tokio::time::Instant::now() >= until {
            break;
        }
        line("STEP")?;
    }
    line("END")?;
    Ok(())
}

/// What the leader journey needs from the driver.
#[derive(Debug, Clone)]
pub struct LeaderSetup {
    pub bagel: PathBuf,
    /// This binary (the leaders' command).
    pub exe: PathBuf,
    /// The run's server list (`member-i=URL`).
    pub servers: String,
    pub roughtime: (String, String),
    pub env: Vec<(String, String)>,
    /// Where the standbys' logs go.
    pub dir: PathBuf,
    /// The lease TTL (the servers' max TTL).
    pub ttl: Duration,
    /// The clock offset (ms) of one standby of each name.
    pub skew_ms: i64,
    pub outages: Outages,
    /// When the run began (for the times printed).
    pub started: Instant,
}

/// `chaos.json`'s `failovers`.
#[derive(Debug, Default, Clone, Serialize)]
pub struct FailoverReport {
    pub names: usize,
    /// Standby loops per name.
    pub standbys: usize,
    pub ttl_ms: u64,
    /// TTL + margin: the longest a name may be without a leader.
    pub gap_bound_ms: u64,
    /// Commands started (leaders), all names.
    pub leaders: u64,
    /// A leader followed by the next one on its name.
    pub count: u64,
    /// The longest time a name was without a leader that no server
    /// outage explains (from a leader's last line or its kill to the next
    /// one's start; also the first election and a name left leaderless at
    /// the end).
    pub longest_gap_ms: u64,
    /// Gaps an outage of the name's server (kill, restart wait, pause)
    /// overlapped, and the longest of them.
    pub explained_gaps: u64,
    pub longest_explained_gap_ms: u64,
    /// Gaps over the bound that nothing explains (each a violation).
    pub gaps_over_bound: u64,
    /// Failovers by how the leader before ended, and the longest gap
    /// after each kind.
    pub by_cause: BTreeMap<String, u64>,
    pub longest_gap_ms_by_cause: BTreeMap<String, u64>,
    /// Leaders that wrote after the next one started, not explained by a
    /// freeze (each a violation).
    pub overlaps: u64,
    /// Lines of a thawed leader after the next one started, all with a
    /// lower fencing token (what a store checking tokens refuses).
    pub stale_steps_after_freeze: u64,
    /// A leader whose fencing token is not above the one before it.
    pub token_regressions: u64,
    /// `bagel run`s fenced (exit 3) with no fault to explain it: not
    /// frozen, not stopped, no outage of the name's server while it ran
    /// (each a violation on a clock within [`MUST_WORK_SKEW_MS`]: a standby
    /// fenced right after it took over leaves the name without a leader
    /// for a TTL), and those on the skewed standby's clock beyond it.
    pub unexplained_fences: u64,
    pub fences_on_a_skewed_clock: u64,
    pub faults: LeaderFaults,
    /// `bagel run`'s exits: its status (`exit N`, `signal N`) and count.
    pub exits: BTreeMap<String, u64>,
    /// The skewed standby's clock offset (ms), and how often it led.
    pub skewed_standby_ms: i64,
    pub skewed_leaders: u64,
}

/// The faults injected into the standbys.
#[derive(Debug, Default, Clone, Serialize)]
pub struct LeaderFaults {
    /// The leader's command SIGKILLed (`bagel run` releases).
    pub command_kills: u64,
    /// `bagel run` and its command SIGKILLed together (the lease is left
    /// to expire).
    pub unit_kills: u64,
    /// `bagel run` and its command stopped, for up to twice the TTL.
    pub unit_freezes: u64,
    pub longest_freeze_ms: u64,
    /// `bagel run` alone stopped, for at most a quarter of the TTL (it
    /// renews or fences in time when continued).
    pub supervisor_stops: u64,
    /// A waiting standby's `bagel run` SIGKILLed.
    pub standby_kills: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Start,
    Step,
    End,
}

/// One line of a leader, as the driver read it.
#[derive(Debug, Clone, Copy)]
struct Event {
    at: Instant,
    kind: Kind,
    unit: u64,
    token: u64,
}

/// What the driver knows of one `bagel run`.
#[derive(Debug, Default)]
struct Unit {
    name: usize,
    skewed: bool,
    spawned: Option<Instant>,
    bagel_pid: Option<u32>,
    /// From its command's START line.
    cmd_pid: Option<u32>,
    started: bool,
    /// When the driver killed it, and what (`command` or `unit`).
    killed: Option<(Instant, &'static str)>,
    /// Freezes of the whole unit, and stops of `bagel run` alone.
    freezes: Vec<(Instant, Instant)>,
    stops: u64,
    exit: Option<(Instant, String)>,
}

#[derive(Debug, Default)]
struct Live {
    units: HashMap<u64, Unit>,
    /// Per name: the unit whose command started last and has not ended.
    leading: Vec<Option<u64>>,
    /// Per name: every line, in the pipe's order.
    events: Vec<Vec<Event>>,
}

#[derive(Debug)]
struct Shared {
    setup: LeaderSetup,
    live: Mutex<Live>,
    next_unit: AtomicU64,
    violations: Arc<Mutex<Vec<String>>>,
}

impl Shared {
    fn violation(&self, v: String) {
        self.violations.lock().expect("violations").push(v);
    }

    fn at(&self) -> f64 {
        self.setup.started.elapsed().as_secs_f64()
    }
}

fn name_of(i: usize) -> String {
    format!("leader-{i}")
}

/// Runs the standby loops and their faults until `stop` says so, then
/// checks the leaders' lines.
pub async fn run(
    setup: LeaderSetup,
    seed: u64,
    mut stop: watch::Receiver<bool>,
    violations: Arc<Mutex<Vec<String>>>,
) -> anyhow::Result<FailoverReport> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Which member owns each name: an outage of that member explains a gap.
    let specs = ServerSpec::parse_list(&setup.servers).map_err(anyhow::Error::msg)?;
    let cluster = Cluster::connect(&specs).await?;
    let owners: Vec<String> = (0..NAMES)
        .map(|i| cluster.route(&name_of(i)).current_identity)
        .collect();
    drop(cluster);
    std::fs::create_dir_all(setup.dir.join("state"))?;
    let shared = Arc::new(Shared {
        live: Mutex::new(Live {
            leading: vec![None; NAMES],
            events: vec![Vec::new(); NAMES],
            ..Default::default()
        }),
        setup,
        next_unit: AtomicU64::new(1),
        violations,
    });
    let mut readers = Vec::new();
    let mut loops = tokio::task::JoinSet::new();
    let begun = Instant::now();
    for name in 0..NAMES {
        let (reader, writer) = std::io::pipe()?;
        readers.push(std::thread::spawn({
            let shared = Arc::clone(&shared);
            move || read_lines(name, reader, &shared)
        }));
        for s in 0..STANDBYS {
            // The last standby of each name runs on the skewed clock.
            let skew = if s == STANDBYS - 1 {
                shared.setup.skew_ms
            } else {
                0
            };
            loops.spawn(standby(
                Arc::clone(&shared),
                name,
                s,
                skew,
                StdRng::seed_from_u64(rng.r#gen()),
                writer.try_clone()?,
                stop.clone(),
            ));
        }
        // Only the commands hold the pipe now: its end is theirs.
        drop(writer);
    }
    let faults = tokio::spawn(inject(
        Arc::clone(&shared),
        StdRng::seed_from_u64(rng.r#gen()),
        stop.clone(),
    ));
    let _ = stop.wait_for(|s| *s).await;
    // When the loops were told to stop (a freeze under way ends later).
    let stopping = Instant::now();
    let faults = faults.await.context("the leaders' faults panicked")?;
    while let Some(done) = loops.join_next().await {
        if let Err(e) = done.context("a standby loop panicked")? {
            shared.violation(format!("leaders: a standby loop failed: {e:#}"));
        }
    }
    // Every `bagel run` has exited, so the pipes end once no command holds
    // them: a command still writing now outlived its supervisor.
    for reader in readers {
        let joined = tokio::task::spawn_blocking(move || reader.join());
        if tokio::time::timeout(Duration::from_secs(30), joined)
            .await
            .is_err()
        {
            shared.violation(
                "leaders: a leader's command still held its pipe 30 s after every bagel run ended".into(),
            );
        }
    }

    let live = shared.live.lock().expect("live");
    let setup = &shared.setup;
    write_timeline(&live, setup)?;
    let mut report = FailoverReport {
        names: NAMES,
        standbys: STANDBYS,
        ttl_ms: ms(setup.ttl),
        gap_bound_ms: ms(setup.ttl + GAP_MARGIN),
        faults,
        skewed_standby_ms: setup.skew_ms,
        ..Default::default()
    };
    let mut found = Vec::new();
    let mut units: Vec<(&u64, &Unit)> = live.units.iter().collect();
    units.sort_by_key(|(k, _)| **k);
    for (k, unit) in units {
        let Some((exited, exit)) = &unit.exit else {
            continue;
        };
        *report.exits.entry(exit.clone()).or_default() += 1;
        if unit.skewed && unit.started {
            report.skewed_leaders += 1;
        }
        if exit != "exit 3" || !unit.freezes.is_empty() || unit.stops > 0 {
            continue;
        }
        // An outage of its server up to a TTL before it started can still
        // fence it (a renewal that cannot land).
        let spawned = unit.spawned.unwrap_or(begun);
        if setup
            .outages
            .of_member_during(&owners[unit.name], before(spawned, setup.ttl), *exited)
            .is_some()
        {
            continue;
        }
        let skew = if unit.skewed { setup.skew_ms } else { 0 };
        if skew.abs() > MUST_WORK_SKEW_MS {
            report.fences_on_a_skewed_clock += 1;
            continue;
        }
        report.unexplained_fences += 1;
        let t = |at: Instant| at.saturating_duration_since(setup.started).as_secs_f64();
        found.push(format!(
            "leaders: {}: bagel run (unit {k}, clock {skew} ms off) was fenced with no fault to explain it: \
             started {:.3}s, {} at {:.3}s, its command {}; its reason is in {}/standby-{}-*.log",
            name_of(unit.name),
            t(spawned),
            exit,
            t(*exited),
            if unit.started {
                "had started"
            } else {
                "never started"
            },
            setup.dir.display(),
            unit.name
        ));
    }
    for (name, events) in live.events.iter().enumerate() {
        let check = Check {
            name: name_of(name),
            owner: &owners[name],
            events,
            units: &live.units,
            setup,
            begun,
            stopping,
        };
        check.run(&mut report, &mut found);
    }
    drop(live);
    for v in found {
        shared.violation(v);
    }
    Ok(report)
}

/// `timeline.txt` beside the standbys' logs: every line the leaders wrote
/// and every `bagel run`'s fate, in seconds since the run began, for whoever
/// reads a failed run.
fn write_timeline(live: &Live, setup: &LeaderSetup) -> anyhow::Result<()> {
    let t = |at: Instant| at.saturating_duration_since(setup.started).as_secs_f64();
    let mut rows: Vec<(f64, String)> = Vec::new();
    for (name, events) in live.events.iter().enumerate() {
        for e in events {
            rows.push((
                t(e.at),
                format!("{} {:?} unit {} token {}", name_of(name), e.kind, e.unit, e.token),
            ));
        }
    }
    for (unit, u) in &live.units {
        if let Some((at, exit)) = &u.exit {
            rows.push((
                t(*at),
                format!("{} unit {unit} bagel run {exit}", name_of(u.name)),
            ));
        }
        if let Some((at, what)) = u.killed {
            rows.push((t(at), format!("{} unit {unit} {what} SIGKILLed", name_of(u.name))));
        }
        for (from, until) in &u.freezes {
            rows.push((
                t(*from),
                format!("{} unit {unit} frozen until {:.3}", name_of(u.name), t(*until)),
            ));
        }
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let text: String = rows.iter().map(|(at, row)| format!("{at:.3} {row}\n")).collect();
    std::fs::write(setup.dir.join("timeline.txt"), text)?;
    Ok(())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Reads one name's pipe until every command that held it has exited.
fn read_lines(name: usize, reader: std::io::PipeReader, shared: &Shared) {
    for line in std::io::BufReader::new(reader).lines() {
        let Ok(line) = line else { break };
        let at = Instant::now();
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, unit, token, pid] = f[..] else { continue };
        let kind = match kind {
            "START" => Kind::Start,
            "STEP" => Kind::Step,
            "END" => Kind::End,
            _ => continue,
        };
        let (Ok(unit), Ok(token), Ok(pid)) = (unit.parse(), token.parse(), pid.parse()) else {
            continue;
        };
        let mut live = shared.live.lock().expect("live");
        live.events[name].push(Event {
            at,
            kind,
            unit,
            token,
        });
        match kind {
            Kind::Start => {
                let u = live.units.entry(unit).or_default();
                u.cmd_pid = Some(pid);
                u.started = true;
                live.leading[name] = Some(unit);
            }
            Kind::End if live.leading[name] == Some(unit) => live.leading[name] = None,
            _ => {}
        }
    }
}

/// One standby loop: `bagel run --wait forever` again as soon as the one
/// before ended, until the run stops (then SIGTERM, as an operator's stop).
async fn standby(
    shared: Arc<Shared>,
    name: usize,
    s: usize,
    skew_ms: i64,
    mut rng: StdRng,
    pipe: std::io::PipeWriter,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let setup = &shared.setup;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(setup.dir.join(format!("standby-{name}-{s}.log")))?;
    let ttl = humantime::format_duration(setup.ttl).to_string();
    let fence_margin = humantime::format_duration(FENCE_MARGIN).to_string();
    let kill_grace = humantime::format_duration(KILL_GRACE).to_string();
    loop {
        if *stop.borrow_and_update() {
            return Ok(());
        }
        let unit = shared.next_unit.fetch_add(1, Ordering::SeqCst);
        let mut c = Command::new(&setup.bagel);
        if skew_ms != 0 {
            let offset = format!(
                "{}{}s",
                if skew_ms < 0 { "-" } else { "+" },
                skew_ms.unsigned_abs() as f64 / 1000.0
            );
            c.envs(bagel_tests::skewed_env(&offset));
        }
        c.args(["--servers", &setup.servers])
            .args([
                "--roughtime",
                &setup.roughtime.0,
                "--roughtime-key",
                &setup.roughtime.1,
            ])
            .args([
                "run",
                "--name",
                &name_of(name),
                "--wait",
                "forever",
                "--ttl",
                &ttl,
            ])
            .args(["--fence-margin", &fence_margin, "--kill-grace", &kill_grace])
            .args(["--owner", &format!("chaos-standby-{name}-{s}"), "--"])
            .arg(&setup.exe)
            .args(["leader", "--unit", &unit.to_string()])
            .args(["--work-ms", &rng.gen_range(WORK_MS).to_string()])
            .envs(setup.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "error")
            .env("BAGEL_STATE_DIR", setup.dir.join("state"))
            .stdin(Stdio::null())
            .stdout(pipe.try_clone()?)
            .stderr(log.try_clone()?)
            .kill_on_drop(true);
        let mut child = c.spawn().context("starting bagel run")?;
        {
            // Its command's START may have been read already.
            let mut live = shared.live.lock().expect("live");
            let u = live.units.entry(unit).or_default();
            u.name = name;
            u.skewed = skew_ms != 0;
            u.bagel_pid = child.id();
            u.spawned = Some(Instant::now());
        }
        let status = tokio::select! {
            status = child.wait() => status?,
            _ = stop.changed() => {
                signal(child.id(), Signal::SIGTERM);
                match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
                    Ok(status) => status?,
                    Err(_) => {
                        shared.violation(format!("leaders: bagel run of unit {unit} did not exit within 30 s of SIGTERM"));
                        let _ = child.start_kill();
                        child.wait().await?
                    }
                }
            }
        };
        let exit = match (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(&status),
        ) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            (None, None) => "unknown".to_owned(),
        };
        let outlived = {
            let mut live = shared.live.lock().expect("live");
            if live.leading[name] == Some(unit) {
                live.leading[name] = None;
            }
            let u = live.units.get_mut(&unit).expect("inserted");
            u.exit = Some((Instant::now(), exit.clone()));
            // A unit the driver SIGKILLed whole is its own to reap.
            match (u.cmd_pid, u.killed) {
                (Some(pid), None | Some((_, "command"))) => Some(pid),
                _ => None,
            }
        };
        if let Some(pid) = outlived
            && runs(pid, unit)
        {
            shared.violation(format!(
                "leaders: the command of unit {unit} (pid {pid}) outlived its bagel run ({exit})"
            ));
            signal(Some(pid), Signal::SIGKILL);
        }
        if status.code() != Some(0) {
            tokio::time::sleep(RESTART_DELAY).await;
        }
    }
}

/// Whether `pid` is still the leader command of `unit` (and not a zombie).
fn runs(pid: u32, unit: u64) -> bool {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
    let ours = args
        .windows(2)
        .any(|w| w[0] == b"--unit" && w[1] == unit.to_string().as_bytes());
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    ours && !zombie
}

fn signal(pid: Option<u32>, sig: Signal) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// The faults, one every 0.8 to 2.5 s on a random name, until `stop`.
async fn inject(shared: Arc<Shared>, mut rng: StdRng, mut stop: watch::Receiver<bool>) -> LeaderFaults {
    let mut f = LeaderFaults::default();
    let ttl = shared.setup.ttl;
    loop {
        let pause = Duration::from_millis(rng.gen_range(800..2_500));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return f,
        }
        let name = rng.gen_range(0..NAMES);
        let what = rng.gen_range(0..5);
        let (leader, waiting) = {
            let live = shared.live.lock().expect("live");
            let leader = live.leading[name].map(|u| (u, live.units[&u].bagel_pid, live.units[&u].cmd_pid));
            let waiting: Vec<(u64, Option<u32>)> = live
                .units
                .iter()
                .filter(|(_, u)| u.name == name && !u.started && u.exit.is_none())
                .map(|(k, u)| (*k, u.bagel_pid))
                .collect();
            (leader, waiting)
        };
        let mark = |unit: u64, edit: &dyn Fn(&mut Unit)| {
            if let Some(u) = shared.live.lock().expect("live").units.get_mut(&unit) {
                edit(u);
            }
        };
        let n = name_of(name);
        match (what, leader) {
            (0, Some((unit, _, cmd))) => {
                mark(unit, &|u| u.killed = Some((Instant::now(), "command")));
                signal(cmd, Signal::SIGKILL);
                f.command_kills += 1;
                println!(
                    "[{:>5.1}s] {n}: SIGKILL the leader's command (unit {unit})",
                    shared.at()
                );
            }
            (1, Some((unit, bagel, cmd))) => {
                // As systemd kills a unit: every process of it at once.
                mark(unit, &|u| u.killed = Some((Instant::now(), "unit")));
                signal(bagel, Signal::SIGKILL);
                signal(cmd, Signal::SIGKILL);
                f.unit_kills += 1;
                println!(
                    "[{:>5.1}s] {n}: SIGKILL bagel run and its command (unit {unit})",
                    shared.at()
                );
            }
            (2, Some((unit, bagel, cmd))) => {
                // A frozen host or cgroup: both stopped; continued in a
                // random order (who runs first decides whether the command
                // writes before bagel run fences it).
                let hold = Duration::from_millis(rng.gen_range(200..=ms(ttl * 2)));
                let from = Instant::now();
                signal(bagel, Signal::SIGSTOP);
                signal(cmd, Signal::SIGSTOP);
                tokio::time::sleep(hold).await;
                let order = if rng.gen_bool(0.5) {
                    [bagel, cmd]
                } else {
                    [cmd, bagel]
                };
                for pid in order {
                    signal(pid, Signal::SIGCONT);
                }
                let until = Instant::now();
                mark(unit, &|u| u.freezes.push((from, until)));
                f.unit_freezes += 1;
                f.longest_freeze_ms = f.longest_freeze_ms.max(ms(until - from));
                println!(
                    "[{:>5.1}s] {n}: froze the leader (unit {unit}: bagel run and its command) for {} ms",
                    shared.at(),
                    ms(until - from)
                );
            }
            (3, Some((unit, bagel, _))) => {
                let hold = Duration::from_millis(rng.gen_range(50..=ms(ttl / 4)));
                signal(bagel, Signal::SIGSTOP);
                tokio::time::sleep(hold).await;
                signal(bagel, Signal::SIGCONT);
                mark(unit, &|u| u.stops += 1);
                f.supervisor_stops += 1;
                println!(
                    "[{:>5.1}s] {n}: stopped the leader's bagel run (unit {unit}) for {} ms",
                    shared.at(),
                    ms(hold)
                );
            }
            (4, _) if !waiting.is_empty() => {
                let (unit, pid) = waiting[rng.gen_range(0..waiting.len())];
                signal(pid, Signal::SIGKILL);
                f.standby_kills += 1;
                println!(
                    "[{:>5.1}s] {n}: SIGKILL a waiting standby (unit {unit})",
                    shared.at()
                );
            }
            _ => {}
        }
    }
}

/// The checks of one name's lines.
struct Check<'a> {
    name: String,
    /// The member that owns the name.
    owner: &'a str,
    events: &'a [Event],
    units: &'a HashMap<u64, Unit>,
    setup: &'a LeaderSetup,
    /// When the loops started, and when they were told to stop.
    begun: Instant,
    stopping: Instant,
}

/// One leader of a name: its first and last line (index in the pipe's
/// order, and when the driver read it).
struct Led {
    unit: u64,
    token: u64,
    start: (usize, Instant),
    last: (usize, Instant),
    ended: bool,
}

impl Check<'_> {
    fn run(&self, report: &mut FailoverReport, found: &mut Vec<String>) {
        let mut leaders: Vec<Led> = Vec::new();
        let mut index: HashMap<u64, usize> = HashMap::new();
        for (i, e) in self.events.iter().enumerate() {
            if e.kind == Kind::Start {
                index.insert(e.unit, leaders.len());
                leaders.push(Led {
                    unit: e.unit,
                    token: e.token,
                    start: (i, e.at),
                    last: (i, e.at),
                    ended: false,
                });
            } else if let Some(&k) = index.get(&e.unit) {
                leaders[k].last = (i, e.at);
                leaders[k].ended |= e.kind == Kind::End;
            }
        }
        report.leaders += leaders.len() as u64;
        let t = |at: Instant| at.saturating_duration_since(self.setup.started).as_secs_f64();
        match leaders.first() {
            Some(first) => {
                self.gap(report, found, "first election", self.begun, first.start.1);
            }
            None => found.push(format!("leaders: {} never had a leader", self.name)),
        }
        for pair in leaders.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let ua = &self.units[&a.unit];
            report.count += 1;
            if b.token <= a.token {
                report.token_regressions += 1;
                found.push(format!(
                    "leaders: {}: unit {} led with fencing token {} after unit {} with {}",
                    self.name, b.unit, b.token, a.unit, a.token
                ));
            }
            if a.last.0 > b.start.0 {
                // A wrote after B had started.
                let stale: Vec<&Event> = self.events[b.start.0..]
                    .iter()
                    .filter(|e| e.unit == a.unit)
                    .collect();
                let thawed = ua.freezes.last().map(|f| f.1 + KILL_GRACE + THAW_SLACK);
                if let Some(by) = thawed
                    && a.token < b.token
                    && stale.iter().all(|e| e.at <= by)
                {
                    report.stale_steps_after_freeze += stale.len() as u64;
                } else {
                    report.overlaps += 1;
                    found.push(format!(
                        "leaders: {}: two leaders at once: unit {} (token {}, started {:.3}s, freezes {:?}, \
                         supervisor stops {}, killed {:?}, {}) wrote {} lines after unit {} (token {}) started at \
                         {:.3}s, the last at {:.3}s",
                        self.name,
                        a.unit,
                        a.token,
                        t(a.start.1),
                        ua.freezes.iter().map(|f| (t(f.0), t(f.1))).collect::<Vec<_>>(),
                        ua.stops,
                        ua.killed.map(|k| (t(k.0), k.1)),
                        ua.exit.as_ref().map_or("running", |e| e.1.as_str()),
                        stale.len(),
                        b.unit,
                        b.token,
                        t(b.start.1),
                        t(a.last.1)
                    ));
                }
                continue;
            }
            let cause = self.cause(a);
            *report.by_cause.entry(cause.clone()).or_default() += 1;
            let gap = self.gap(report, found, &cause, self.ended_at(a), b.start.1);
            let longest = report.longest_gap_ms_by_cause.entry(cause).or_default();
            *longest = (*longest).max(ms(gap));
        }
        // A name left without a leader before the stop.
        if let Some(last) = leaders.last() {
            let u = &self.units[&last.unit];
            let over =
                last.ended || u.killed.is_some() || u.exit.as_ref().is_some_and(|e| e.0 < self.stopping);
            let ended = self.ended_at(last);
            if over && ended < self.stopping {
                self.gap(report, found, "no leader at the stop", ended, self.stopping);
            }
        }
    }

    /// When a leader was last seen working: its last line, or its kill.
    fn ended_at(&self, a: &Led) -> Instant {
        let killed = self.units[&a.unit].killed.map(|k| k.0);
        killed.map_or(a.last.1, |k| k.max(a.last.1))
    }

    /// How a leader's time ended.
    fn cause(&self, a: &Led) -> String {
        let u = &self.units[&a.unit];
        let exit = u.exit.as_ref().map_or("running", |e| e.1.as_str());
        match u.killed {
            Some((_, "unit")) => "unit killed".into(),
            Some((_, "command")) => "command killed".into(),
            _ if !u.freezes.is_empty() => format!("frozen, then {exit}"),
            _ if u.stops > 0 => format!("supervisor stopped, then {exit}"),
            _ if exit == "exit 0" && a.ended => "released".into(),
            _ if exit == "exit 3" => "fenced".into(),
            _ => exit.to_owned(),
        }
    }

    /// Judges one leaderless stretch `[from, to]`; returns its length.
    fn gap(
        &self,
        report: &mut FailoverReport,
        found: &mut Vec<String>,
        what: &str,
        from: Instant,
        to: Instant,
    ) -> Duration {
        let gap = to.saturating_duration_since(from);
        let ttl = self.setup.ttl;
        // An outage of the owner up to a TTL before the gap began can
        // still hold it up: a lease it could not renew runs out, a restart
        // waits out its max TTL.
        if let Some(o) = self
            .setup
            .outages
            .of_member_during(self.owner, before(from, ttl), to)
        {
            report.explained_gaps += 1;
            report.longest_explained_gap_ms = report.longest_explained_gap_ms.max(ms(gap));
            if gap > ttl + GAP_MARGIN {
                println!(
                    "bagel-chaos: {}: {} ms without a leader ({what}), explained by a {} of {}",
                    self.name,
                    ms(gap),
                    o.kind,
                    o.member
                );
            }
            return gap;
        }
        report.longest_gap_ms = report.longest_gap_ms.max(ms(gap));
        if gap > ttl + GAP_MARGIN {
            report.gaps_over_bound += 1;
            let t = |at: Instant| at.saturating_duration_since(self.setup.started).as_secs_f64();
            found.push(format!(
                "leaders: {}: no leader for {} ms ({what}), from {:.3}s to {:.3}s, over the TTL + {} ms with no \
                 outage of its server {}",
                self.name,
                ms(gap),
                t(from),
                t(to),
                ms(GAP_MARGIN),
                self.owner
            ));
        }
        gap
    }
}
