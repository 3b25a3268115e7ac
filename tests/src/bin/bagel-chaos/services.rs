//! The processes the driver starts, kills with SIGKILL and starts again:
//! the lease server (same port and key file each time), the S3 server
//! (moto with a journal, so a restart keeps what it acknowledged), and the
//! metronomes (`bagel metronome`, two per store).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

/// A process started from a fixed command line, restartable after a kill.
#[derive(Debug)]
pub struct Service {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    child: Option<Child>,
}

impl Service {
    pub fn new(
        name: &str,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        envs: Vec<(String, String)>,
    ) -> Self {
        Service {
            name: name.to_owned(),
            program: program.into(),
            args,
            envs,
            child: None,
        }
    }

    /// Starts it; returns the child's standard output.
    pub fn start(&mut self) -> anyhow::Result<tokio::process::ChildStdout> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} ({})", self.name, self.program.display()))?;
        let out = child.stdout.take().expect("piped");
        self.child = Some(child);
        Ok(out)
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// SIGKILL, and wait for it to be gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// Drains a process's output in the background.
pub fn drain(out: tokio::process::ChildStdout) {
    tokio::spawn(async move {
        let mut out = out;
        let mut buf = [0u8; 4096];
        while matches!(out.read(&mut buf).await, Ok(n) if n > 0) {}
    });
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Polls `GET path` on 127.0.0.1:`port` until it answers 200.
pub async fn wait_http_ok(port: u16, path: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if http_status(port, path).await.is_ok_and(|s| s == 200) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("127.0.0.1:{port}{path} did not answer 200 within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn http_status(port: u16, path: &str) -> anyhow::Result<u16> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut head = vec![0u8; 64];
    let n = s.read(&mut head).await?;
    let text = String::from_utf8_lossy(&head[..n]);
    let code = text.split_whitespace().nth(1).context("no status")?;
    Ok(code.parse()?)
}

/// The directory holding the workspace binaries (this one's).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.parent().expect("a directory").to_path_buf()
}

/// A workspace binary next to this one; fails loudly when missing.
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let p = bin_dir().join(name);
    if !p.exists() {
        bail!(
            "{} not found: build the binaries first (`cargo build --workspace --bins`)",
            p.display()
        );
    }
    Ok(p)
}

/// The journal file's path for an S3 server rooted in `dir`.
pub fn journal(dir: &Path) -> PathBuf {
    dir.join("s3-journal.jsonl")
}
