//! Starting and stopping the servers under test, on 127.0.0.1 only, with
//! their data on tmpfs, and reading their CPU time and memory from /proc.
//!
//! Readiness is always a probe that must answer (a gRPC call, a PING, an HTTP
//! GET), polled every few milliseconds up to a bound; never a fixed sleep.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::cpus::{self, Cpus};

/// How often a readiness probe asks again (the probe answering is the event).
const POLL_EVERY: Duration = Duration::from_millis(10);

/// Linux reports /proc/PID/stat times in USER_HZ ticks, which is 100 on every
/// architecture Linux supports for userspace (`getconf CLK_TCK`).
const CLK_TCK: f64 = 100.0;

/// User + system CPU seconds used so far by process `pid` (all its threads).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu(&stat)
}

fn parse_stat_cpu(stat: &str) -> Option<f64> {
    // The command name (field 2) may hold spaces and parentheses: the fields
    // we want come after its closing parenthesis. utime and stime are fields
    // 14 and 15, i.e. the 12th and 13th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / CLK_TCK)
}

/// Resident set size of process `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it;
/// a tiny race with other processes is possible).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A scratch directory for one run: server logs and data directories.
#[derive(Debug)]
pub struct WorkDir {
    pub path: PathBuf,
    /// CPUs every server spawned from now on is pinned to (`--server-cpus`,
    /// or the scaling sweep's first N); `None`: wherever the OS likes.
    server_cpus: std::sync::Mutex<Option<Cpus>>,
}

impl WorkDir {
    pub fn new() -> Result<Self> {
        let path = std::env::temp_dir().join(format!("bagel-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            path,
            server_cpus: std::sync::Mutex::new(None),
        })
    }

    /// Pins the servers spawned from now on (see [`Server::spawn`]).
    pub fn set_server_cpus(&self, cpus: Option<Cpus>) {
        *self
            .server_cpus
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = cpus;
    }

    pub fn server_cpus(&self) -> Option<Cpus> {
        self.server_cpus
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A data directory for `name`, on a fresh tmpfs when we may mount one
    /// (we run as root on the bench machine), else a plain directory (and the
    /// report says so).
    pub fn data_dir(&self, name: &str) -> Result<DataDir> {
        let path = self.path.join(format!("{name}-data"));
        std::fs::create_dir_all(&path)?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4g,mode=0700", "tmpfs"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !mounted {
            eprintln!(
                "warning: could not mount tmpfs for {name}; its data goes to {}",
                path.display()
            );
        }
        Ok(DataDir { path, tmpfs: mounted })
    }

    pub fn log_file(&self, name: &str) -> Result<(std::fs::File, PathBuf)> {
        let path = self.path.join(format!("{name}.log"));
        Ok((std::fs::File::create(&path)?, path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A server's data directory; unmounted and removed on drop.
#[derive(Debug)]
pub struct DataDir {
    pub path: PathBuf,
    pub tmpfs: bool,
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if self.tmpfs {
            // Lazy, so a server that is still dying cannot make this fail.
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.path)
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running server process. Killed when stopped or dropped.
#[derive(Debug)]
pub struct Server {
    pub system: &'static str,
    pub addr: SocketAddr,
    pub pid: u32,
    pub log: PathBuf,
    pub data: Option<DataDir>,
    /// How long the server took from spawn to answering its probe.
    pub startup: Duration,
    /// The CPUs it was pinned to (read back from the process), if any.
    pub cpus: Option<Cpus>,
    child: Child,
}

impl Server {
    /// Spawns `cmd` with stdout/stderr to a log file in `work`, pinned to
    /// the work dir's server CPUs if any. A pinned bagel-server also gets
    /// `TOKIO_WORKER_THREADS` = that many CPUs: it has no worker-count flag,
    /// and its `#[tokio::main]` runtime would size itself from the affinity
    /// mask anyway (tokio uses `available_parallelism`, which honours
    /// `sched_getaffinity` on Linux); the variable says so explicitly.
    pub fn spawn(
        system: &'static str,
        work: &WorkDir,
        mut cmd: Command,
        addr: SocketAddr,
        data: Option<DataDir>,
    ) -> Result<Self> {
        let (log_file, log) = work.log_file(system)?;
        cmd.stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true);
        let pin = work.server_cpus();
        if let (Some(cpus), "bagel") = (&pin, system) {
            cmd.env("TOKIO_WORKER_THREADS", cpus.len().to_string());
        }
        let child = cpus::spawn_pinned(pin.as_ref(), || {
            cmd.spawn().with_context(|| format!("starting {system}: {cmd:?}"))
        })?;
        let pid = child.id().context("child has no pid")?;
        let cpus = pin.and_then(|_| cpus::of_pid(pid));
        Ok(Self {
            system,
            addr,
            pid,
            log,
            data,
            startup: Duration::ZERO,
            cpus,
            child,
        })
    }

    /// Fails if the process has exited (with the tail of its log).
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); log tail:\n{}",
                self.system,
                log_tail(&self.log)
            );
        }
        Ok(())
    }

    /// Waits for `probe` to succeed, failing early if the process dies.
    pub async fn wait_ready<F, Fut>(&mut self, timeout: Duration, mut probe: F) -> Result<()>
    where
        F: FnMut(SocketAddr) -> Fut,
        Fut: Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            self.check_alive()?;
            let ok = tokio::time::timeout(Duration::from_secs(2), probe(self.addr)).await;
            if matches!(ok, Ok(true)) {
                self.startup = start.elapsed();
                return Ok(());
            }
            if start.elapsed() >= timeout {
                bail!(
                    "{} on {} not ready after {timeout:?}; log tail:\n{}",
                    self.system,
                    self.addr,
                    log_tail(&self.log)
                );
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        // `data` drops here, after the process is gone.
    }
}

pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// One HTTP/1.1 request without a body, for probes and bucket creation;
/// returns the status code.
pub async fn http_status(addr: SocketAddr, method: &str, path: &str) -> Result<u16> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let head = String::from_utf8_lossy(&buf[..buf.len().min(64)]).to_string();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("bad HTTP answer: {head:?}"))?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_with_odd_names() {
        let stat = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0";
        assert_eq!(parse_stat_cpu(stat), Some(3.0));
    }

    #[test]
    fn parses_vm_rss() {
        let status = "Name:\tx\nVmPeak:\t  10 kB\nVmRSS:\t    2048 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(status), Some(2048 * 1024));
    }

    #[test]
    fn reads_own_process() {
        assert!(cpu_seconds(std::process::id()).is_some());
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }
}
