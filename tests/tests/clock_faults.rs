//! Every process that acts on time acts on a checked clock (issue 23,
//! items 1 and 8), over the real binaries on 127.0.0.1, with real
//! per-process clock skew from libfaketime (`faketime`):
//!
//! * a metronome 2.5 s fast, beside a writer on true time, loses no
//!   acknowledged write (S3 and directory);
//! * `bagel read` on a host 10 s fast does not seal the next seconds;
//! * a metronome that cannot reach its time authority closes nothing and
//!   says why (stderr, `/readyz`);
//! * a lease server whose wall clock is stepped stops granting and says so.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::{self as bag, BagConfig, Bucket, Writer};
use bagel_client::{Client, Lease, Micros, TimeOptions, TimeSource};
use bagel_proto::clock::SystemClock;
use bagel_tests::{ServerOptions, ServerProcess, bin, describe_output, s3_bucket, unique};
use bytes::Bytes;
use tokio::process::Command;

/// `bagel` with libfaketime preloaded: its wall (and monotonic) clock runs
/// `offset` off, as on a host whose clock is wrong.
fn bagel_skewed(offset: &str, server: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin("bagel"));
    c.args(["--server", server])
        .args(args)
        .envs(bagel_tests::skewed_env(offset))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        // In a group of its own, so `stop` reaches whatever it started.
        .process_group(0)
        .kill_on_drop(true);
    c
}

/// Stops a process started by [`bagel_skewed`] and its group.
fn stop(child: &tokio::process::Child) {
    let pgid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
}

fn bagel(server: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin("bagel"));
    c.args(["--server", server])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

/// A writer on true time, with its signed time from the lease server (the
/// default time authority), as `bagel write` has.
async fn writer(client: &Client, lease: &Lease, store: &str, log: &str) -> Writer {
    let cfg = BagConfig::default().with_sync(false);
    let store = bag::open_store(store, &cfg).await.unwrap();
    let time = TimeSource::lease_server(client.clone(), TimeOptions::default());
    Writer::new(
        store,
        log,
        &unique("w"),
        lease.rights(),
        Arc::new(SystemClock),
        Arc::new(time),
        cfg,
    )
    .unwrap()
}

/// Reads `[from, to)` of `log` with the real `bagel read` on true time,
/// again until no bag of the range is left open (each read closes what is
/// past due by then); returns the payloads read.
async fn read_all(
    server: &ServerProcess,
    store: &str,
    log: &str,
    from: Micros,
    to: Micros,
) -> BTreeSet<String> {
    let (from, to) = (from.as_micros().to_string(), to.as_micros().to_string());
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = bagel(
            &server.url,
            &[
                "read",
                "--store",
                store,
                "--log",
                log,
                "--from",
                &from,
                "--to",
                &to,
                "--json",
                "--key",
                &server.public_key_hex,
            ],
        )
        .output()
        .await
        .unwrap();
        assert!(out.status.success(), "{}", describe_output(&out));
        let mut payloads = BTreeSet::new();
        let mut skipped = None;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            match v["kind"].as_str() {
                Some("message") => {
                    payloads.insert(v["payload"].as_str().unwrap().to_owned());
                }
                Some("summary") => skipped = v["open_bags_skipped"].as_u64(),
                Some("rejected" | "problem") => panic!("{v}"),
                _ => {}
            }
        }
        if skipped == Some(0) {
            return payloads;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "bags still open after 30 s: {}",
            describe_output(&out)
        );
        // The next bag's close time (plus the reader's bound) is the event
        // waited for; there is nothing to be told of it.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A writer on true time writes small batches for 10 s while a metronome
/// 2.5 s fast runs: every batch it acknowledged is read back later. Before,
/// the metronome closed each bag 0.5 s after its second began, under
/// writes that finish long before their safe point and so do not look for
/// a close: about half the acknowledged batches were lost.
async fn a_fast_metronome_loses_no_acknowledged_write(store: String) {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let log = unique("fast-metronome");
    let metronome = bagel_skewed(
        "+2.5s",
        &server.url,
        &["metronome", "--store", &store, "--log", &log, "--lookback", "20s"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let lease = client
        .acquire([unique("name")])
        .ttl(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    let w = writer(&client, &lease, &store, &log).await;
    let (mut acked, mut refused) = (Vec::new(), 0u32);
    let start = tokio::time::Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(10) {
        let payload = format!("m{i}");
        i += 1;
        match w.write(Bytes::from(payload.clone())).await {
            Ok(ts) => acked.push((ts, payload)),
            // Refused (e.g. late and left out of a close): not acknowledged,
            // so not owed to anyone.
            Err(_) => refused += 1,
        }
        // Pacing only: spreads the batches over every part of each second.
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    stop(&metronome);
    let out = metronome.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        acked.len() >= 100,
        "only {} batches acknowledged ({refused} refused)",
        acked.len()
    );
    let (first, last) = (acked[0].0, acked[acked.len() - 1].0);
    let read = read_all(
        &server,
        &store,
        &log,
        first,
        last.saturating_add(Duration::from_micros(1)),
    )
    .await;
    let lost: Vec<&String> = acked
        .iter()
        .map(|(_, p)| p)
        .filter(|p| !read.contains(*p))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged batches were never read back: {lost:?}\nmetronome stderr: {stderr}",
        lost.len(),
        acked.len()
    );
    // It closed nothing, and said why: its clock is off.
    assert!(stderr.contains("not closing bags"), "metronome stderr: {stderr}");
    assert!(
        stderr.contains("ahead of lease server"),
        "metronome stderr: {stderr}"
    );
    lease.release(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metronome_2_5_s_fast_loses_no_acknowledged_s3_write() {
    a_fast_metronome_loses_no_acknowledged_write(format!("s3://{}/{}", s3_bucket(), unique("clock"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metronome_2_5_s_fast_loses_no_acknowledged_directory_write() {
    let dir = tempfile::tempdir().unwrap();
    a_fast_metronome_loses_no_acknowledged_write(format!("file://{}", dir.path().display())).await;
}

/// An operator's laptop 10 s fast runs `bagel read`: it seals no bag of
/// the next seconds (a writer on true time goes on writing into them), and
/// says it closed nothing and why. Before, it sealed the seven seconds
/// ahead and the writer's next batches were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_10_s_fast_seals_no_bag_of_the_next_seconds() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let log = unique("fast-reader");
    let lease = client
        .acquire([unique("name")])
        .ttl(Duration::from_secs(8))
        .send()
        .await
        .unwrap();
    let w = writer(&client, &lease, &store, &log).await;
    let first = w.write(Bytes::from("before")).await.unwrap();
    let out = bagel_skewed(
        "+10s",
        &server.url,
        &["read", "--store", &store, "--log", &log, "--json"],
    )
    .output()
    .await
    .unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("closed nothing"), "{}", describe_output(&out));
    let summary: serde_json::Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["kind"] == "summary")
        .expect("a summary line");
    assert!(
        summary["close_refused"]
            .as_str()
            .is_some_and(|r| r.contains("clock is off")),
        "{summary}"
    );
    // The writer, on true time, writes on into this second and the next
    // ones: none of them was sealed.
    let mut stamps = vec![first];
    while Bucket::of(*stamps.last().unwrap()) < Bucket::of(first).next().next().next() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = stamps.len();
        stamps.push(
            w.write(Bytes::from(format!("after-{n}")))
                .await
                .unwrap_or_else(|e| panic!("write {n} after the fast read: {e}")),
        );
    }
    lease.release(None).await.unwrap();
}

/// A closed 127.0.0.1 port: a lease server that is not there.
fn nowhere() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

/// A metronome whose time authority (the lease server) cannot be reached
/// closes nothing, exits 1 with `--once` saying why, and its `/readyz`
/// says what it waits for. Before, it closed on the host's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metronome_without_its_time_authority_closes_nothing_and_says_why() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let log = unique("no-authority");
    let lease = client
        .acquire([unique("name")])
        .ttl(Duration::from_secs(8))
        .send()
        .await
        .unwrap();
    let w = writer(&client, &lease, &store, &log).await;
    let ts = w.write(Bytes::from("x")).await.unwrap();
    lease.release(None).await.unwrap();
    let bag_dir = dir.path().join(&log).join(Bucket::of(ts).path());
    // Its close time (grace 2 s) passed, with room for any clock bound.
    let due = Bucket::of(ts)
        .close_time(Duration::from_secs(2))
        .saturating_add(Duration::from_secs(1));
    tokio::time::sleep(due.duration_since(Micros::now())).await;

    let gone = nowhere();
    let out = bagel(
        &gone,
        &[
            "metronome",
            "--store",
            &store,
            "--log",
            &log,
            "--once",
            "--lookback",
            "30s",
        ],
    )
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not closing bags"), "{}", describe_output(&out));
    assert!(
        stderr.contains("cannot reach the time authority"),
        "{}",
        describe_output(&out)
    );
    assert!(
        !bag_dir.join("lock").exists(),
        "the bag was closed on an unchecked clock"
    );
    assert!(
        !bag_dir.join("prelock").exists(),
        "a close of the bag was started"
    );

    // Running, it says on /readyz what it waits for.
    let mut m = bagel(
        &gone,
        &[
            "metronome",
            "--store",
            &store,
            "--log",
            &log,
            "--lookback",
            "30s",
            "--http",
            "127.0.0.1:0",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(m.stdout.take().unwrap()));
    let first = lines.next_line().await.unwrap().expect("a first line");
    let addr = first
        .strip_prefix("http on ")
        .unwrap_or_else(|| panic!("{first:?}"))
        .to_owned();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let r = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        // Before its first tick it may not know yet: wait for the verdict.
        if body.contains("vouched") {
            assert_eq!(status, 503, "{body}");
            break body;
        }
        assert!(tokio::time::Instant::now() < give_up, "/readyz: {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains("cannot reach the time authority"), "{body}");
    assert!(!bag_dir.join("lock").exists());
    m.start_kill().unwrap();
}

/// libfaketime's flags for a process whose wall clock can be stepped while
/// it runs (the offset is re-read from `file`) and whose monotonic clock
/// is left alone, as with `date -s` or an NTP step.
fn steppable_clock(file: &std::path::Path) -> ServerOptions {
    std::fs::write(file, "+0s\n").unwrap();
    // libfaketime preloaded with no FAKETIME variable (the `faketime`
    // wrapper sets one, which wins over the file): the offset is read
    // from the file at every call, so a test can step the clock.
    ServerOptions {
        env: vec![
            (
                "LD_PRELOAD".into(),
                bagel_tests::libfaketime()
                    .expect("libfaketime is not installed (Debian package faketime)")
                    .display()
                    .to_string(),
            ),
            ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ],
        ..ServerOptions::default()
    }
}

/// A lease server acting as the local time agent whose wall clock is
/// stepped 30 s forward: it stops granting (saying it is a clock fault)
/// instead of breaking every live lease early, and says so in `/readyz`
/// and in its clock status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_server_whose_clock_is_stepped_stops_granting_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    let server = ServerProcess::start_with(
        &["--unsafe-skip-restart-wait", "--http", "127.0.0.1:0"],
        steppable_clock(&offset),
    )
    .await;
    server.wait_ready().await;
    let held = bagel(&server.url, &["acquire", "held", "--ttl", "10s", "--json"])
        .output()
        .await
        .unwrap();
    assert!(held.status.success(), "{}", describe_output(&held));

    std::fs::write(&offset, "+30s\n").unwrap();
    let out = bagel(&server.url, &["acquire", "held", "--ttl", "5s"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "{}", describe_output(&out));
    let text = describe_output(&out);
    assert!(text.contains("clock fault"), "{text}");
    assert!(text.contains("stepped forward"), "{text}");
    let ready = reqwest::get(format!("{}/readyz", server.http_url()))
        .await
        .unwrap();
    let status = ready.status().as_u16();
    let body = ready.text().await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("clock fault"), "{body}");
    let info = bagel(&server.url, &["server-info", "--json"])
        .output()
        .await
        .unwrap();
    let info_text = String::from_utf8_lossy(&info.stdout);
    assert!(info_text.contains("clock fault"), "{}", describe_output(&info));
}
