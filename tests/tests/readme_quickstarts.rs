//! The README's quickstarts, run as written: every fenced `sh` block under
//! a `## Quickstart` heading of README.md is run with `bash -euo pipefail`,
//! the workspace's binaries first on `PATH`, in a directory of its own,
//! and must succeed with the outcome the README promises (a lease held,
//! refused, released and taken again; a bag written, closed, read and
//! audited clean; a standby that takes over with a higher fencing token).
//!
//! The blocks name no address: the server listens where `BAGEL_LISTEN`
//! says and the CLI asks where `BAGEL_SERVER` says (both default to
//! 127.0.0.1:7420), so the test gives each block a free port of its own.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bagel_tests::{bin, bin_dir};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// A quickstart must finish well within the README's minute.
const LIMIT: Duration = Duration::from_secs(60);

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fenced `sh` blocks under each `## Quickstart...` heading, by heading.
fn quickstarts(readme: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut in_quickstart = false;
    // Inside a fence: whether it is a shell block, and its text.
    let mut block: Option<(bool, String)> = None;
    for line in readme.lines() {
        if let Some((is_sh, text)) = block.as_mut() {
            if line.starts_with("```") {
                if *is_sh && in_quickstart {
                    out.last_mut().expect("a heading").1.push(std::mem::take(text));
                }
                block = None;
            } else {
                text.push_str(line);
                text.push('\n');
            }
        } else if line.starts_with("```") {
            block = Some((line.trim() == "```sh", String::new()));
        } else if let Some(heading) = line.strip_prefix("## ") {
            in_quickstart = heading.starts_with("Quickstart");
            if in_quickstart {
                out.push((heading.to_owned(), Vec::new()));
            }
        }
    }
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// What a block printed, and whether it succeeded.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `script` as a user would paste it, in its own process group, which
/// is killed whole at the end (and at the limit), so nothing it started in
/// the background outlives the test.
fn run(script: &str, scratch: &Path) -> Run {
    let port = free_port();
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(scratch)
        .env("PATH", path)
        .env("TMPDIR", scratch)
        .env("BAGEL_LISTEN", format!("127.0.0.1:{port}"))
        .env("BAGEL_SERVER", format!("http://127.0.0.1:{port}"))
        .env("BAGEL_STATE_DIR", scratch.join("state"))
        .env_remove("BAGEL_SERVERS")
        .env_remove("BAGEL_LEASE_STORE")
        .env_remove("BAGEL_ROUGHTIME")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash");
    let group = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send(status);
    });
    let status = rx.recv_timeout(LIMIT);
    let took = started.elapsed();
    // Whatever is left of the block (a server, a `sleep` of a leader)
    // goes with the group; its pipes then close.
    let _ = killpg(group, Signal::SIGKILL);
    let mut out = String::new();
    let mut err = String::new();
    let _ = stdout.read_to_string(&mut out);
    let _ = stderr.read_to_string(&mut err);
    let ok = match status {
        Ok(status) => status.expect("waited").success(),
        Err(_) => {
            err.push_str(&format!("\n(test: killed after {LIMIT:?})"));
            false
        }
    };
    Run {
        ok,
        stdout: out,
        stderr: err,
        took,
    }
}

fn scratch_dir(root: &Path, n: usize) -> PathBuf {
    let dir = root.join(format!("quickstart-{n}"));
    std::fs::create_dir_all(dir.join("state")).expect("scratch dir");
    dir
}

/// The fencing token in `"<host> leads (fencing token N)"`.
fn token_of(line_owner: &str, stdout: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{line_owner} leads")))
        .unwrap_or_else(|| panic!("no line of {line_owner} leading in:\n{stdout}"));
    line.rsplit("token ")
        .next()
        .and_then(|t| t.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no fencing token in {line:?}"))
}

#[test]
fn every_quickstart_of_the_readme_runs_as_written() {
    // The binaries the blocks call, there before anything runs.
    for name in ["bagel", "bagel-server"] {
        bin(name);
    }
    let readme = readme();
    let quickstarts = quickstarts(&readme);
    let headings: Vec<&str> = quickstarts.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(
        headings,
        [
            "Quickstart: a lease",
            "Quickstart: write, read and audit a bag",
            "Quickstart: leader election",
        ],
        "the README's quickstarts changed: update this test with them"
    );
    let root = tempfile::tempdir().expect("temp dir");
    for (n, (heading, blocks)) in quickstarts.iter().enumerate() {
        assert_eq!(blocks.len(), 1, "{heading}: one shell block expected");
        let run = run(&blocks[0], &scratch_dir(root.path(), n));
        let shown = format!(
            "{heading} ({:?}):\n--- stdout\n{}\n--- stderr\n{}",
            run.took, run.stdout, run.stderr
        );
        assert!(run.ok, "{shown}");
        assert!(run.took < LIMIT, "{shown}");
        match n {
            0 => {
                assert!(run.stderr.contains("is held by lease"), "{shown}");
                assert!(run.stdout.contains("exit 2: tenant-7 is held"), "{shown}");
                assert!(run.stdout.contains("witness OK"), "{shown}");
                assert!(run.stdout.contains("released"), "{shown}");
                // bob's grant names alice's lease as the one before it.
                let alice = run
                    .stdout
                    .split_whitespace()
                    .skip_while(|w| *w != "lease")
                    .nth(1)
                    .unwrap_or_else(|| panic!("no lease id in the witness line\n{shown}"));
                assert!(
                    run.stdout
                        .lines()
                        .any(|l| l.contains("previous") && l.contains(alice) && l.contains("released")),
                    "bob's grant does not name alice's released lease {alice}\n{shown}"
                );
            }
            1 => {
                for payload in ["\"payload\":\"deposit 10\"", "\"payload\":\"withdraw 3\""] {
                    assert!(run.stdout.contains(payload), "{shown}");
                }
                assert!(run.stdout.contains("\"verified\":true"), "{shown}");
                assert!(run.stdout.contains("audited 2 messages"), "{shown}");
                assert!(run.stdout.contains(" 0 violations"), "{shown}");
            }
            _ => {
                let a = token_of("host-a", &run.stdout);
                let b = token_of("host-b", &run.stdout);
                assert!(
                    b > a,
                    "the standby's token {b} is not above the leader's {a}\n{shown}"
                );
            }
        }
    }
}
