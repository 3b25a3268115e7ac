//! The standby loops: each runs `bagel run --wait forever` again as soon as
//! the one before ended, as the README's shell loop does, and notes each
//! `bagel run`'s fate; with the helpers that look up and signal their
//! processes.
//!
//! Separate from the faults and the checks: this is the workload as users
//! run it (one standby of each name on a skewed clock); what is done to it
//! is `faults`'s, and what is made of it is `check`'s.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::Signal;
use rand::Rng as _;
use rand::rngs::StdRng;
use tokio::process::Command;
use tokio::sync::watch;

use super::{FENCE_MARGIN, KILL_GRACE, RESTART_DELAY, Shared, WORK_MS, name_of};
use crate::lists::Mover;

/// One standby loop: `bagel run --wait forever` again as soon as the one
/// before ended, until the run stops (then SIGTERM, as an operator's stop).
pub(super) async fn standby(
    shared: Arc<Shared>,
    (name, s): (usize, usize),
    mover: Mover,
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
    let mut step = setup.lists.now().step();
    loop {
        if *stop.borrow_and_update() {
            return Ok(());
        }
        // Each `bagel run` starts on the lists in force, as a restarted
        // service reads its configuration again.
        let in_force = setup.lists.now();
        mover.on(in_force.generation);
        let unit = shared.next_unit.fetch_add(1, Ordering::SeqCst);
        if in_force.step() != step {
            step = in_force.step();
            println!(
                "[{:>5.1}s] {}: standby {s} runs bagel run (unit {unit}) on the lists of {step}",
                shared.at(),
                name_of(name)
            );
        }
        let mut c = Command::new(&setup.bagel);
        if skew_ms != 0 {
            let offset = format!(
                "{}{}s",
                if skew_ms < 0 { "-" } else { "+" },
                skew_ms.unsigned_abs() as f64 / 1000.0
            );
            c.envs(bagel_tests::skewed_env(&offset));
        }
        c.args(["--servers", &in_force.current]);
        if let Some(next) = &in_force.next {
            c.args(["--next-servers", next]);
        }
        c.args([
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
        let outdated = {
            // Its command's START may have been read already.
            let mut live = shared.live.lock().expect("live");
            let u = live.units.entry(unit).or_default();
            u.name = name;
            u.skewed = skew_ms != 0;
            u.bagel_pid = child.id();
            u.spawned = Some(Instant::now());
            u.generation = in_force.generation;
            u.step = in_force.step();
            u.owners = in_force.owners(&name_of(name));
            // Lists moved between reading them and noting the unit: the
            // migration's scan (under this lock) may have missed it, so it
            // restarts onto them itself.
            let outdated = setup.lists.now().generation > in_force.generation && !u.started;
            if outdated {
                u.migrated = Some(Instant::now());
            }
            outdated
        };
        if outdated {
            signal(child.id(), Signal::SIGTERM);
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

pub(super) fn signal(pid: Option<u32>, sig: Signal) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}
