//! CPU pinning: `--server-cpus` / `--client-cpus` lists (`0-7`, `0,2,4`,
//! `0-3,8-11`), checked against the CPUs this process may run on, applied
//! with `sched_setaffinity(2)` (no `taskset` needed).
//!
//! * The load generator: [`pin_thread`] on the main thread *before* the
//!   tokio runtime is built, so every worker thread inherits the mask, and
//!   the runtime sizes itself from it (tokio's default worker count is
//!   `std::thread::available_parallelism()`, which on Linux counts the CPUs
//!   of the calling thread's `sched_getaffinity` mask; the scaling sweep
//!   passes the count explicitly anyway).
//! * The servers: [`spawn_pinned`] narrows the spawning thread's mask for
//!   the duration of the `fork`/`exec` and restores it; the child inherits
//!   the mask from its first instruction on, so even threads it starts at
//!   once (tokio workers, Go's Ps, Redis's bio threads) are pinned. No
//!   window where a thread escapes, and no `unsafe` `pre_exec` hook.

use std::fmt;

use anyhow::{Context, Result, bail, ensure};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// A set of CPU ids, sorted, without duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cpus(pub Vec<usize>);

impl Cpus {
    /// Parses `0-7`, `0,2,4`, `0-3,8-11` (no validation against the machine).
    pub fn parse(s: &str) -> Result<Self> {
        let mut ids = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let num = |t: &str| {
                t.trim()
                    .parse::<usize>()
                    .with_context(|| format!("{t:?} in CPU list {s:?} is not a CPU number"))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    ensure!(a <= b, "range {part:?} in CPU list {s:?} runs backwards");
                    ids.extend(a..=b);
                }
                None => ids.push(num(part)?),
            }
        }
        ensure!(!ids.is_empty(), "empty CPU list {s:?}");
        ids.sort_unstable();
        ids.dedup();
        Ok(Cpus(ids))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first `n` CPUs.
    pub fn first(&self, n: usize) -> Cpus {
        Cpus(self.0.iter().copied().take(n).collect())
    }

    /// These CPUs less `other`'s.
    pub fn without(&self, other: &Cpus) -> Cpus {
        Cpus(self.0.iter().copied().filter(|c| !other.0.contains(c)).collect())
    }

    fn to_set(&self) -> Result<CpuSet> {
        let mut set = CpuSet::new();
        for &c in &self.0 {
            set.set(c)
                .with_context(|| format!("CPU {c} is beyond what sched_setaffinity takes"))?;
        }
        Ok(set)
    }

    fn from_set(set: &CpuSet) -> Cpus {
        Cpus(
            (0..CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect(),
        )
    }

    /// Fails with a clear message unless every CPU is one this process may
    /// run on (`what` is the flag, for the message).
    pub fn check_within(&self, allowed: &Cpus, what: &str) -> Result<()> {
        let missing: Vec<usize> = self
            .0
            .iter()
            .copied()
            .filter(|c| !allowed.0.contains(c))
            .collect();
        if !missing.is_empty() {
            bail!(
                "{what} {self}: CPU{} {} not available: this machine lets the benchmark run on \
                 {} CPU{} ({allowed})",
                if missing.len() == 1 { "" } else { "s" },
                Cpus(missing),
                allowed.len(),
                if allowed.len() == 1 { "" } else { "s" },
            );
        }
        Ok(())
    }
}

/// `0-3,6,8-9`: the compact form, as `taskset -c` writes it.
impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end > start {
                write!(f, "{start}-{end}")?;
            } else {
                write!(f, "{start}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

/// The CPUs the calling thread may run on now.
pub fn allowed() -> Result<Cpus> {
    let set = sched_getaffinity(Pid::from_raw(0)).context("sched_getaffinity")?;
    Ok(Cpus::from_set(&set))
}

/// The CPUs process (or thread) `pid` may run on; `None` if it is gone.
pub fn of_pid(pid: u32) -> Option<Cpus> {
    let pid = i32::try_from(pid).ok()?;
    sched_getaffinity(Pid::from_raw(pid))
        .ok()
        .map(|s| Cpus::from_set(&s))
}

/// Pins the calling thread (threads it starts later inherit the mask).
pub fn pin_thread(cpus: &Cpus) -> Result<()> {
    sched_setaffinity(Pid::from_raw(0), &cpus.to_set()?)
        .with_context(|| format!("sched_setaffinity to CPUs {cpus}"))
}

/// Runs `spawn` (a `fork`/`exec`) with the calling thread pinned to `cpus`,
/// then restores the thread's mask: the child starts pinned.
pub fn spawn_pinned<T>(cpus: Option<&Cpus>, spawn: impl FnOnce() -> Result<T>) -> Result<T> {
    let Some(cpus) = cpus else {
        return spawn();
    };
    let saved = sched_getaffinity(Pid::from_raw(0)).context("sched_getaffinity")?;
    pin_thread(cpus)?;
    let r = spawn();
    sched_setaffinity(Pid::from_raw(0), &saved).context("restoring the thread's CPU mask")?;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_and_lists() {
        assert_eq!(Cpus::parse("0-3").unwrap().0, [0, 1, 2, 3]);
        assert_eq!(Cpus::parse("0,2,4").unwrap().0, [0, 2, 4]);
        assert_eq!(Cpus::parse("8-9, 0-1,1").unwrap().0, [0, 1, 8, 9]);
        assert!(Cpus::parse("").is_err());
        assert!(Cpus::parse("3-1").is_err());
        assert!(Cpus::parse("a").is_err());
    }

    #[test]
    fn prints_compactly() {
        assert_eq!(Cpus(vec![0, 1, 2, 3, 6, 8, 9]).to_string(), "0-3,6,8-9");
        assert_eq!(Cpus(vec![5]).to_string(), "5");
    }

    #[test]
    fn splits_and_checks() {
        let all = Cpus::parse("0-7").unwrap();
        assert_eq!(all.first(2).0, [0, 1]);
        assert_eq!(all.without(&all.first(6)).to_string(), "6-7");
        let err = Cpus::parse("6-9")
            .unwrap()
            .check_within(&all, "--server-cpus")
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("--server-cpus 6-9: CPUs 8-9 not available"), "{msg}");
        assert!(msg.contains("8 CPUs (0-7)"), "{msg}");
    }

    #[test]
    fn reads_and_restores_own_mask() {
        let before = allowed().unwrap();
        assert!(!before.is_empty());
        let one = before.first(1);
        let inside = spawn_pinned(Some(&one), allowed).unwrap();
        assert_eq!(inside, one);
        assert_eq!(allowed().unwrap(), before);
    }
}
