//! `bagel run` fences the command's whole process tree, and the CLI never
//! forgets what `bagel write` wrote (issue 23, items 2 and 3), over the
//! real binaries and a real `bagel-server` on 127.0.0.1.
//!
//! Every wait here is for an event (a file appears, a process is gone, a
//! process exits), polled with a bound so a broken build fails instead of
//! hanging.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use bagel_tests::{ServerProcess, describe_output};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// How long any awaited event may take before the test gives up.
const BOUND: Duration = Duration::from_secs(30);

/// Polls `cond` until it holds; panics naming `what` after [`BOUND`].
fn await_until(what: &str, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < BOUND, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process with this pid exists (a zombie counts: it is not
/// reaped yet).
fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

/// Waits for a file to exist and hold a whole line, and parses it as a pid.
fn pid_in(file: &Path) -> i32 {
    let mut pid = None;
    await_until(&format!("{} to hold a pid", file.display()), || {
        pid = std::fs::read_to_string(file)
            .ok()
            .filter(|t| t.ends_with('\n'))
            .and_then(|t| t.trim().parse().ok());
        pid.is_some()
    });
    pid.expect("parsed")
}

/// Waits (bounded) for a child to exit.
fn await_exit(child: &mut Child) -> ExitStatus {
    let mut status = None;
    await_until("the process to exit", || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status.expect("exited")
}

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "{}", describe_output(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe_output(out)))
}

/// A scratch directory with its own CLI state directory, and a way to run
/// `bagel` against the server with it.
struct Scene {
    server: ServerProcess,
    dir: tempfile::TempDir,
}

impl Scene {
    async fn new() -> Scene {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("store")).expect("the store's root");
        Scene {
            server: ServerProcess::start_ready(&[]).await,
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn store(&self) -> String {
        format!("file://{}", self.path("store").display())
    }

    fn bagel(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bagel_tests::bin("bagel"));
        cmd.args(["--server", &self.server.url])
            .args(args)
            .env("BAGEL_STATE_DIR", self.path("state"))
            .env("BAGEL_BIN", bagel_tests::bin("bagel"))
            .env("SCENE", self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn output(&self, args: &[&str]) -> Output {
        self.bagel(args).output().expect("bagel")
    }

    /// `bagel run` with these run flags around `sh -c SCRIPT` (the script
    /// finds the scene directory in `$SCENE`).
    fn run(&self, flags: &[&str], script: &str) -> Child {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.bagel(&args).spawn().expect("bagel run")
    }

    /// The `min_timestamp_us` a new holder of `name` gets.
    fn next_min_timestamp(&self, name: &str) -> u64 {
        let v = json_of(&self.output(&["acquire", name, "--ttl", "5s", "--json"]));
        v["min_timestamp_us"].as_u64().expect("min_timestamp_us")
    }
}

/// The largest timestamp among `bagel write`'s acknowledgement lines
/// (`<µs> <time>`).
fn top_acked(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .max()
}

#[tokio::test]
async fn a_background_child_is_dead_before_another_client_gets_the_name() {
    let s = Scene::new().await;
    let mut run = s.run(
        &["--name", "bg"],
        r#"sleep 30 & echo $! > "$SCENE/pid"; while [ ! -e "$SCENE/go" ]; do sleep 0.02; done; exit 0"#,
    );
    let worker = pid_in(&s.path("pid"));
    // A second client waits for the name; it gets it once `bagel run`
    // releases.
    let waiter = s
        .bagel(&["acquire", "bg", "--ttl", "5s", "--wait", "10s", "--json"])
        .spawn()
        .unwrap();
    std::fs::write(s.path("go"), "").unwrap();
    let got = waiter.wait_with_output().unwrap();
    let worker_alive_at_grant = alive(worker);
    json_of(&got);
    let status = await_exit(&mut run);
    assert!(
        !worker_alive_at_grant,
        "the background worker {worker} still ran when another client got the name"
    );
    assert_eq!(status.code(), Some(0), "the command's own status");
}

#[tokio::test]
async fn a_setsid_grandchild_is_killed_when_run_is_told_to_stop() {
    let s = Scene::new().await;
    let mut run = s.run(
        &["--name", "sid", "--kill-grace", "1s"],
        r#"setsid sleep 30 & echo $! > "$SCENE/pid"; wait"#,
    );
    let escaped = pid_in(&s.path("pid"));
    kill(Pid::from_raw(i32::try_from(run.id()).unwrap()), Signal::SIGTERM).unwrap();
    await_exit(&mut run);
    assert!(
        !alive(escaped),
        "the setsid grandchild {escaped} outlived bagel run"
    );
    // Released only once the tree was gone: the name is free.
    json_of(&s.output(&["acquire", "sid", "--ttl", "5s", "--json"]));
}

#[tokio::test]
async fn a_child_ignoring_sigterm_is_killed_after_the_grace() {
    let s = Scene::new().await;
    let mut run = s.run(
        &["--name", "stubborn", "--kill-grace", "1s"],
        r#"trap '' TERM; echo $$ > "$SCENE/pid"; while :; do sleep 0.1; done"#,
    );
    let child = pid_in(&s.path("pid"));
    kill(Pid::from_raw(i32::try_from(run.id()).unwrap()), Signal::SIGTERM).unwrap();
    let status = await_exit(&mut run);
    assert_eq!(status.code(), Some(128 + 9), "killed by SIGKILL after the grace");
    assert!(!alive(child), "the child {child} outlived bagel run");
}

#[tokio::test]
async fn a_supervisor_error_kills_the_whole_tree() {
    let s = Scene::new().await;
    let lease_file = s.path("lease.json");
    // The command makes the lease file impossible to rewrite (its
    // temporary name is a directory): the next renewal's rewrite fails.
    let mut run = s.run(
        &[
            "--name",
            "err",
            "--ttl",
            "3s",
            "--fence-margin",
            "500ms",
            "--kill-grace",
            "500ms",
            "--lease-file",
            lease_file.to_str().unwrap(),
        ],
        r#"mkdir "$BAGEL_LEASE_FILE.tmp"; sleep 30 & echo $! > "$SCENE/pid"; wait"#,
    );
    let worker = pid_in(&s.path("pid"));
    let status = await_exit(&mut run);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("json.tmp"),
        "names the file it could not write: {err}"
    );
    assert!(!alive(worker), "the worker {worker} outlived bagel run's error");
}

#[tokio::test]
async fn a_fenced_run_kills_a_setsid_grandchild() {
    let s = Scene::new().await;
    let mut run = s.run(
        &[
            "--name",
            "fence",
            "--ttl",
            "3s",
            "--fence-margin",
            "500ms",
            "--kill-grace",
            "500ms",
        ],
        r#"setsid sleep 30 & echo $! > "$SCENE/pid"; wait"#,
    );
    let escaped = pid_in(&s.path("pid"));
    s.server.pause();
    let status = await_exit(&mut run);
    s.server.resume();
    assert_eq!(status.code(), Some(3), "fenced");
    assert!(
        !alive(escaped),
        "the setsid grandchild {escaped} outlived the fence"
    );
}

#[tokio::test]
async fn hold_released_by_ctrl_c_publishes_what_was_written() {
    let s = Scene::new().await;
    let mut hold = s
        .bagel(&["acquire", "held", "--ttl", "5s", "--json", "--hold"])
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hold.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let lease_file = s.path("lease.json");
    std::fs::write(&lease_file, &line).unwrap();
    let out = s.output(&[
        "write",
        "--store",
        &s.store(),
        "--log",
        "held",
        "--lease",
        lease_file.to_str().unwrap(),
        "one",
        "two",
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let top = top_acked(&String::from_utf8_lossy(&out.stdout)).expect("acknowledged");
    kill(Pid::from_raw(i32::try_from(hold.id()).unwrap()), Signal::SIGINT).unwrap();
    let status = await_exit(&mut hold);
    assert!(status.success(), "--hold released");
    let min = s.next_min_timestamp("held");
    assert!(
        min >= top,
        "next holder may write after {min}, below the acknowledged {top}"
    );
}

/// `bagel write` under `bagel run`, acknowledging batch by batch, stopped
/// mid-way by `signal`: the release publishes every acknowledged timestamp.
async fn a_write_stopped_mid_way_is_published(signal: Signal, via_run: bool) {
    let s = Scene::new().await;
    let script = format!(
        r#"echo $$ > "$SCENE/pid"; exec "$BAGEL_BIN" write --store {} --log w --lease "$BAGEL_LEASE_FILE" --batch 1 > "$SCENE/acked""#,
        s.store()
    );
    let mut run = s
        .bagel(&[
            "run",
            "--name",
            "w",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let writer = pid_in(&s.path("pid"));
    let mut input = run.stdin.take().unwrap();
    let acked = s.path("acked");
    for i in 0..3 {
        std::io::Write::write_all(&mut input, format!("m{i}\n").as_bytes()).unwrap();
        await_until("the batch's acknowledgement", || {
            std::fs::read_to_string(&acked).is_ok_and(|t| t.lines().count() > i)
        });
    }
    let target = if via_run {
        i32::try_from(run.id()).unwrap()
    } else {
        writer
    };
    kill(Pid::from_raw(target), signal).unwrap();
    await_exit(&mut run);
    drop(input);
    let top = top_acked(&std::fs::read_to_string(&acked).unwrap()).expect("acknowledged");
    let min = s.next_min_timestamp("w");
    assert!(
        min >= top,
        "next holder may write after {min}, below the acknowledged {top}"
    );
}

#[tokio::test]
async fn a_write_killed_by_sigkill_under_run_is_published() {
    a_write_stopped_mid_way_is_published(Signal::SIGKILL, false).await;
}

#[tokio::test]
async fn a_write_stopped_by_sigterm_to_run_is_published() {
    a_write_stopped_mid_way_is_published(Signal::SIGTERM, true).await;
}
