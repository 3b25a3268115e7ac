//! The faults injected into the leaders: a leader's command killed, its
//! whole unit killed, the unit frozen, `bagel run` alone stopped, and a
//! waiting standby killed; and what the migration does to them, as an
//! operator rolls new server lists out (waiting standbys restarted onto
//! them).
//!
//! Separate from the standby loops so that what is done to them reads as
//! one list, each fault noted on its unit for the checks to explain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rand::Rng as _;
use rand::rngs::StdRng;
use tokio::sync::watch;

use super::standby::signal;
use super::{LeaderFaults, NAMES, Shared, Unit, ms, name_of};

/// The faults, one every 0.8 to 2.5 s on a random name, until `stop`.
pub(super) async fn inject(
    shared: Arc<Shared>,
    mut rng: StdRng,
    mut stop: watch::Receiver<bool>,
) -> LeaderFaults {
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
                // It may have taken over since the snapshot: frozen, it
                // starts nothing more, and a child means it leads. Then the
                // kill takes the whole unit, as systemd's would; a
                // supervisor killed alone cannot stop its command (see
                // `bagel run`'s docs), which is not the fault meant here.
                signal(pid, Signal::SIGSTOP);
                let children = pid.map(children_of).unwrap_or_default();
                if !children.is_empty() {
                    mark(unit, &|u| u.killed = Some((Instant::now(), "unit")));
                }
                signal(pid, Signal::SIGKILL);
                for child in &children {
                    signal(Some(*child), Signal::SIGKILL);
                }
                f.standby_kills += 1;
                let what = if children.is_empty() {
                    "a waiting standby"
                } else {
                    "a standby that had just taken over, with its command"
                };
                println!("[{:>5.1}s] {n}: SIGKILL {what} (unit {unit})", shared.at());
            }
            _ => {}
        }
    }
}

/// Follows the migration as an operator rolls it out to standby services:
/// each time the lists move, every `bagel run` still waiting on older
/// lists is stopped (SIGTERM, a service's stop) and its loop starts the
/// next one on the lists in force. The leader is left to end its term
/// (at most [`WORK_MS`](super::WORK_MS), or a freeze): its loop's next
/// `bagel run` starts on the new lists. So the driver's step, which waits
/// for every loop to run on the new lists, counts its wait from the last
/// restart of a standby, as the recipe requires.
pub(super) async fn follow_migration(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut lists = shared.setup.lists.subscribe();
    loop {
        tokio::select! {
            moved = lists.changed() => if moved.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        let in_force = lists.borrow_and_update().clone();
        let waiting: Vec<(u64, usize, Option<u32>)> = {
            let mut live = shared.live.lock().expect("live");
            live.units
                .iter_mut()
                .filter(|(_, u)| {
                    u.generation < in_force.generation
                        && !u.started
                        && u.exit.is_none()
                        && u.migrated.is_none()
                })
                .map(|(k, u)| {
                    u.migrated = Some(Instant::now());
                    (*k, u.name, u.bagel_pid)
                })
                .collect()
        };
        for (unit, name, pid) in waiting {
            // It may have taken over since the snapshot: frozen, it starts
            // nothing more, and a child means it leads. A leader is left
            // to end its term (its loop moves then), as an operator
            // restarts the standbys, not the leader.
            signal(pid, Signal::SIGSTOP);
            let leads = !pid.map(children_of).unwrap_or_default().is_empty();
            if leads {
                if let Some(u) = shared.live.lock().expect("live").units.get_mut(&unit) {
                    u.migrated = None;
                }
            } else {
                // Delivered on SIGCONT: a waiting `bagel run` ends on it.
                signal(pid, Signal::SIGTERM);
            }
            signal(pid, Signal::SIGCONT);
            println!(
                "[{:>5.1}s] {}: unit {unit} {} on older lists than those of {}: {}",
                shared.at(),
                name_of(name),
                if leads { "had just taken over" } else { "waits" },
                in_force.step(),
                if leads {
                    "left to end its term"
                } else {
                    "SIGTERM, its loop restarts on the lists in force"
                }
            );
        }
    }
}

/// The processes whose parent is `pid` (from `/proc/<pid>/stat`, whose
/// fourth field is the parent's pid; the command name before it may hold
/// spaces, so fields are counted from the last `)`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|s| {
                    let (_, rest) = s.rsplit_once(')')?;
                    rest.split_ascii_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}
