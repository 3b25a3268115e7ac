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

//!
//! # Parts
//!
//! * this file: the limits above, what the driver gives and gets back
//!   ([`LeaderSetup`], [`FailoverReport`]), the state the parts share, and
//!   [`run`], which starts the loops and faults, waits for the stop, and
//!   tallies the exits and fences;
//! * `command`: `bagel-chaos leader`, the command each leader runs;
//! * `standby`: the standby loops (`bagel run --wait forever`, again and
//!   again) and the signals sent to their processes;
//! * `faults`: the faults injected into the leaders and waiting standbys;
//! * `record`: the pipe reader that records every leader's lines, and the
//!   timeline written for whoever reads a failed run;
//! * `check`: the checks of one name's lines (one leader at a time,
//!   fencing tokens, gaps).

mod check;
mod command;
mod faults;
mod record;
mod standby;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tokio::sync::watch;

use crate::lists::{Lists, PerStep};
use crate::outages::{Outages, before};
use check::Check;
pub use command::{LeaderArgs, leader};
use faults::{follow_migration, inject};
use record::{read_lines, write_timeline};
use standby::standby;

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
/// What the leader journey needs from the driver.
#[derive(Debug, Clone)]
pub struct LeaderSetup {
    pub bagel: PathBuf,
    /// This binary (the leaders' command).
    pub exe: PathBuf,
    /// The server lists in force (`member-i=URL`): each `bagel run`
    /// starts on them, and the migration moves them.
    pub lists: Lists,
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
    /// Failovers by the step of the migration the new leader's `bagel
    /// run` started under (its lists: current, current and next, next).
    pub across_migration: PerStep,
    /// Failovers from a leader on one step's lists to one on another's:
    /// the handovers a migration must keep to one leader at a time.
    pub between_steps: u64,
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
    /// A waiting standby's `bagel run` on older lists than those in force
    /// SIGTERMed by the migration, as an operator restarts a standby
    /// service onto new lists (its loop starts again on them).
    pub migration_restarts: u64,
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
    /// The lists it started on: their generation and step, and who owns
    /// its name under them (an outage of one explains a gap or a fence).
    generation: u64,
    step: &'static str,
    owners: Vec<String>,
    /// When the migration SIGTERMed it, waiting on older lists.
    migrated: Option<Instant>,
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
    // Who owned each name when the loops began (the first election's).
    let first_lists = setup.lists.now();
    let first_owners: Vec<Vec<String>> = (0..NAMES).map(|i| first_lists.owners(&name_of(i))).collect();
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
            let mover = shared
                .setup
                .lists
                .mover(format!("the standby loop {s} of {}", name_of(name)));
            loops.spawn(standby(
                Arc::clone(&shared),
                (name, s),
                mover,
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
    let migration = tokio::spawn(follow_migration(Arc::clone(&shared), stop.clone()));
    let _ = stop.wait_for(|s| *s).await;
    // When the loops were told to stop (a freeze under way ends later).
    let stopping = Instant::now();
    let mut faults = faults.await.context("the leaders' faults panicked")?;
    migration.await.context("the leaders' migration panicked")?;
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
    faults.migration_restarts = live.units.values().filter(|u| u.migrated.is_some()).count() as u64;
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
        if exit != "exit 3" || !unit.freezes.is_empty() || unit.stops > 0 || unit.migrated.is_some() {
            continue;
        }
        // An outage of one of its servers up to a TTL before it started can
        // still fence it (a renewal that cannot land).
        let spawned = unit.spawned.unwrap_or(begun);
        if unit.owners.iter().any(|owner| {
            setup
                .outages
                .of_member_during(owner, before(spawned, setup.ttl), *exited)
                .is_some()
        }) {
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
            first_owners: &first_owners[name],
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
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
