//! The whole process tree of the command `bagel run` supervises: found,
//! signalled and reaped as one, so that no part of it outlives the lease.
//!
//! A process group is not enough: a grandchild that calls `setsid` leaves
//! it, and a background child (`worker & exit 0`) outlives the direct
//! child. So `bagel run` makes itself a **child subreaper**
//! (`PR_SET_CHILD_SUBREAPER`): every orphan of the tree is re-parented to
//! it rather than to init, and so every live process the command started
//! is a descendant of `bagel run`, found by walking `/proc` by parent pid.
//! `bagel run` reaps every child itself (`waitpid(-1)`), so a process it
//! saw cannot be replaced by an unrelated one with the same pid between
//! the scan and the signal, except one that a still-running member of the
//! tree reaped itself in that instant.
//!
//! The tree is known to be gone when `waitpid` says this process has no
//! children left, never when a scan finds none: a member that forks and
//! exits while `/proc` is being read can be missing from that scan, but as
//! an orphan it is this subreaper's child until it is reaped.

use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};

/// One line of `/proc/<pid>/stat`, as far as the tree needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: i32,
    pub ppid: i32,
    /// Dead, waiting for its parent to reap it (state `Z`).
    pub zombie: bool,
}

/// Parses `/proc/<pid>/stat`: `pid (comm) state ppid ...`. The command
/// name may hold spaces and parentheses, so the fields after it are found
/// from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcEntry> {
    let open = text.find(" (")?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(ProcEntry {
        pid,
        ppid,
        zombie: state == "Z",
    })
}

/// Every process below `root` (children, their children, ...), in no
/// particular order.
pub fn descendants(all: &[ProcEntry], root: i32) -> Vec<ProcEntry> {
    let mut found: Vec<ProcEntry> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in all.iter().filter(|p| p.ppid == parent && p.pid != root) {
            if !found.iter().any(|f| f.pid == p.pid) {
                found.push(*p);
                frontier.push(p.pid);
            }
        }
    }
    found
}

/// Every process `/proc` lists now. A process that ends during the scan is
/// simply missing.
fn scan() -> Vec<ProcEntry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|t| parse_stat(&t))
        .collect()
}

/// The command `bagel run` started and everything it started in turn.
#[derive(Debug)]
pub struct ProcessTree {
    me: i32,
    main: i32,
    main_status: Option<ExitStatus>,
    sigchld: SignalStream,
    /// How `/proc` is read ([`scan`]; a test makes it miss members).
    scan: fn() -> Vec<ProcEntry>,
}

impl ProcessTree {
    /// Makes this process a child subreaper, then starts `cmd`. Must be
    /// called before any other child of this process is started, and no
    /// one else in this process may wait for children: the tree reaps
    /// every child of this process.
    pub fn spawn(mut cmd: std::process::Command) -> anyhow::Result<ProcessTree> {
        nix::sys::prctl::set_child_subreaper(true)
            .context("becoming a child subreaper (PR_SET_CHILD_SUBREAPER), to keep the command's orphans")?;
        let sigchld = signal(SignalKind::child()).context("listening for SIGCHLD")?;
        let child = cmd.spawn()?;
        let main = i32::try_from(child.id()).context("a process id out of range")?;
        // Reaped by `reap`, never by the handle: dropping it neither waits
        // nor kills.
        drop(child);
        Ok(ProcessTree {
            me: i32::try_from(std::process::id()).context("own process id out of range")?,
            main,
            main_status: None,
            sigchld,
            scan,
        })
    }

    /// The command's exit status, once it has exited.
    pub fn main_status(&self) -> Option<ExitStatus> {
        self.main_status
    }

    /// Waits until something in the tree may have changed: a child of this
    /// process ended, or a short while passed (a grandchild's end sends no
    /// signal here).
    pub async fn changed(&mut self) {
        let _ = tokio::time::timeout(Duration::from_millis(50), self.sigchld.recv()).await;
        self.reap();
    }

    /// Reaps every child that has ended, remembering the command's status.
    /// Returns whether any child is left (live, or not yet reapable): an
    /// orphaned member of the tree is a child of this subreaper, so none
    /// left means the whole tree is gone.
    fn reap(&mut self) -> bool {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    self.ended(pid, ExitStatus::from_raw((code & 0xff) << 8))
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => self.ended(pid, ExitStatus::from_raw(sig as i32)),
                Ok(WaitStatus::StillAlive) => return true,
                Err(Errno::ECHILD) => return false,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid");
                    return true;
                }
            }
        }
    }

    fn ended(&mut self, pid: Pid, status: ExitStatus) {
        if pid.as_raw() == self.main {
            self.main_status = Some(status);
        }
    }

    /// Every process of the tree that exists now (zombies included: they
    /// are gone only once reaped).
    fn members(&self) -> Vec<ProcEntry> {
        descendants(&(self.scan)(), self.me)
    }

    /// Sends `sig` to every live process of the tree but those in `skip`;
    /// returns the pids signalled.
    pub fn signal_all(&self, sig: Signal, skip: &[i32]) -> Vec<i32> {
        let live: Vec<i32> = self
            .members()
            .into_iter()
            .filter(|p| !p.zombie && !skip.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        for &pid in &live {
            let _ = kill(Pid::from_raw(pid), sig);
        }
        live
    }

    /// Stops the whole tree: SIGTERM to every process, SIGKILL to whatever
    /// is left after `grace`, and returns only once every process of it is
    /// gone and reaped (no child left, see the module docs). Processes
    /// started meanwhile, or missed by a scan, are caught by the next pass.
    pub async fn stop(&mut self, grace: Duration) {
        let started = Instant::now();
        let mut termed = Vec::new();
        loop {
            if !self.reap() {
                return;
            }
            if started.elapsed() >= grace {
                self.signal_all(Signal::SIGKILL, &[]);
            } else {
                // Once each: a process forked after the first pass gets
                // its SIGTERM too, and none gets it twice.
                let sent = self.signal_all(Signal::SIGTERM, &termed);
                termed.extend(sent);
            }
            self.changed().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let e = parse_stat("4242 (my (odd) cmd) S 17 4242 4242 0 -1 4194560 ...").unwrap();
        assert_eq!(
            e,
            ProcEntry {
                pid: 4242,
                ppid: 17,
                zombie: false
            }
        );
        assert!(parse_stat("9 (sh) Z 8 9 9").unwrap().zombie);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("12 (x)"), None);
    }

    /// A scan that misses every member, as one can miss a member that
    /// forked and exited while `/proc` was read.
    fn blind_scan() -> Vec<ProcEntry> {
        Vec::new()
    }

    /// Before: `stop` returned as soon as a scan found no member, while the
    /// missed process still ran. It returns once no child is left.
    #[tokio::test]
    async fn stop_waits_for_children_a_scan_missed() {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("0.3");
        let mut tree = ProcessTree::spawn(cmd).unwrap();
        tree.scan = blind_scan;
        tree.stop(Duration::from_secs(5)).await;
        let status = tree
            .main_status()
            .expect("the missed command was waited for and reaped");
        assert!(status.success(), "{status:?}");
        assert_eq!(kill(Pid::from_raw(tree.main), None), Err(Errno::ESRCH));
    }

    #[test]
    fn descendants_are_the_whole_subtree_and_nothing_else() {
        let p = |pid, ppid| ProcEntry {
            pid,
            ppid,
            zombie: false,
        };
        let all = [
            p(1, 0),
            p(10, 1),
            p(11, 10),
            p(12, 11),
            p(13, 10),
            p(20, 1),
            p(21, 20),
        ];
        let mut below: Vec<i32> = descendants(&all, 10).iter().map(|e| e.pid).collect();
        below.sort_unstable();
        assert_eq!(below, vec![11, 12, 13]);
        assert!(descendants(&all, 12).is_empty());
    }
}
