//! Waits longer than a server allows per call (issue 28 item 1): the
//! client re-issues bounded waits until its own overall wait is over, and
//! rides through a server's restart wait. The servers here allow 1 s per
//! wait, so a wait over several of them is short.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bagel_tests::{ServerProcess, describe_output};
use serde_json::Value;

/// Starts `bagel` against `server` without waiting for it.
fn spawn_bagel(server: &ServerProcess, state: &std::path::Path, args: &[&str]) -> Child {
    Command::new(bagel_tests::bin("bagel"))
        .args(["--server", &server.url])
        .args(args)
        .env("BAGEL_STATE_DIR", state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bagel")
}

/// Asserts `child` is still running (waiting) until `period` has passed
/// since `since`, checking every few milliseconds: today's client gave up
/// at once on a wait over the server's max.
fn still_waiting_through(child: &mut Child, since: Instant, period: Duration) {
    while since.elapsed() < period {
        if let Some(status) = child.try_wait().unwrap() {
            let out = Output {
                status,
                stdout: Vec::new(),
                stderr: std::io::read_to_string(child.stderr.take().unwrap())
                    .unwrap()
                    .into(),
            };
            panic!(
                "gave up waiting after {:?}: {}",
                since.elapsed(),
                describe_output(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) for `child` to end and returns its output.
fn finish(child: Child) -> Output {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    rx.recv_timeout(Duration::from_secs(30))
        .expect("bagel did not end within 30 s")
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "{}", describe_output(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe_output(out)))
}

/// The README's standby recipe, `bagel run --name leader --wait 5m -- cmd`,
/// against a server that waits at most 1 s per call: the standby starts
/// its command once the leader releases, more than two max waits later.
#[tokio::test]
async fn a_standby_waits_past_the_servers_max_wait() {
    let server = ServerProcess::start_ready(&["--max-wait", "1s"]).await;
    let state = tempfile::tempdir().unwrap();
    let leader = json_of(&server.cli(&["acquire", "leader", "--ttl", "10s", "--json"]));
    let started = Instant::now();
    let mut standby = spawn_bagel(
        &server,
        state.path(),
        &[
            "run", "--name", "leader", "--ttl", "5s", "--wait", "5m", "--", "true",
        ],
    );
    still_waiting_through(&mut standby, started, Duration::from_millis(2500));
    let out = server.cli(&[
        "release",
        "--lease",
        leader["lease_id"].as_str().unwrap(),
        "--token",
        leader["token"].as_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let out = finish(standby);
    assert!(out.status.success(), "{}", describe_output(&out));
}

/// `--wait forever` waits until the name is had.
#[tokio::test]
async fn acquire_wait_forever() {
    let server = ServerProcess::start_ready(&["--max-wait", "1s"]).await;
    let state = tempfile::tempdir().unwrap();
    let holder = json_of(&server.cli(&["acquire", "n", "--ttl", "10s", "--json"]));
    let started = Instant::now();
    let mut waiter = spawn_bagel(
        &server,
        state.path(),
        &["acquire", "n", "--ttl", "5s", "--wait", "forever", "--json"],
    );
    still_waiting_through(&mut waiter, started, Duration::from_millis(2500));
    let out = server.cli(&[
        "release",
        "--lease",
        holder["lease_id"].as_str().unwrap(),
        "--token",
        holder["token"].as_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let got = json_of(&finish(waiter));
    assert_eq!(
        got["names"][0]["previous"]["lease_id"], holder["lease_id"],
        "{got}"
    );
}

/// When the user's wait is over, the usual "held" exit (2) naming the
/// holder, after the whole wait (not after the server's 1 s).
#[tokio::test]
async fn the_overall_wait_ends_held_naming_the_holder() {
    let server = ServerProcess::start_ready(&["--max-wait", "1s"]).await;
    let holder = json_of(&server.cli(&["acquire", "n", "--ttl", "10s", "--json"]));
    let started = Instant::now();
    let out = server.cli(&["acquire", "n", "--ttl", "5s", "--wait", "2500ms"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe_output(&out));
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(holder["lease_id"].as_str().unwrap()), "{err}");
}

/// An acquire sent during a fresh server's restart wait (the server
/// answers "unavailable until ...") waits it out and succeeds, within its
/// own `--wait`.
#[tokio::test]
async fn an_acquire_waits_through_a_restart_wait() {
    let server = ServerProcess::start(&["--max-ttl", "1500ms", "--clock-tolerance", "200ms"]).await;
    let info = server.client().await.server_info().await.unwrap();
    assert!(!info.ready, "the server should still be in its restart wait");
    let state = tempfile::tempdir().unwrap();
    let waiter = spawn_bagel(
        &server,
        state.path(),
        &["acquire", "n", "--ttl", "1s", "--wait", "20s", "--json"],
    );
    let got = json_of(&finish(waiter));
    assert_eq!(got["names"][0]["name"], "n", "{got}");
}

/// The library: `wait_forever` through a server with a 1 s max wait.
#[tokio::test]
async fn the_library_waits_in_rounds() {
    let server = ServerProcess::start_ready(&["--max-wait", "1s"]).await;
    let client = server.client().await;
    let holder = client
        .acquire(["lib"])
        .ttl(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .acquire(["lib"])
                .ttl(Duration::from_secs(5))
                .wait_forever()
                .send()
                .await
        }
    });
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2500) {
        assert!(!waiter.is_finished(), "gave up after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release(None).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter got the name within 30 s of its release")
        .unwrap()
        .unwrap();
    assert_eq!(lease.names()[0].name, "lib");
}
