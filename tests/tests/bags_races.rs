//! Real concurrency: several `bagel write` processes (some with clocks
//! behind, so they keep writing into bags that are being closed) race two
//! `bagel metronome` processes and each other's closes. Afterwards the set
//! of messages readers get from closed bags must equal exactly the set of
//! writes that were acknowledged.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bagel_bags::{self as bag, BagConfig};
use bagel_proto::Micros;
use bagel_proto::clock::{AssumedExact, SystemClock};
use bagel_tests::{Backend, Roughtime, TestLeases, bagel_bin, lease_json, unique};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};

/// Writer clock offsets: on time, and two behind, which makes them write
/// into bags the metronomes are closing right then.
const OFFSETS_MS: [i64; 3] = [0, -300, -700];

struct Round {
    feed_for: Duration,
    pace: Duration,
}

async fn race_round(backend: &Backend, round: &Round) {
    let url = backend.url();
    let log = unique("race");
    let leases = TestLeases::default();
    let now = Micros::now();
    let lease = leases.lease(
        "race",
        now.saturating_sub(Duration::from_secs(30)),
        now.saturating_add(Duration::from_secs(3600)),
    );
    let lease_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        lease_file.path(),
        serde_json::to_vec(&lease_json(&lease)).unwrap(),
    )
    .unwrap();

    let mut metronomes: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(bagel_bin())
                .args([
                    // Every process of the test shares this host's clock.
                    "--unsafe-local-clock",
                    "metronome",
                    "--store",
                    &url,
                    "--log",
                    &log,
                    "--grace",
                    "0s",
                    "--lookback",
                    "3s",
                ])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn bagel metronome")
        })
        .collect();

    let roughtime = Roughtime::from_env();
    let mut writers = Vec::new();
    for (i, off) in OFFSETS_MS.iter().enumerate() {
        let mut child = Command::new(bagel_bin())
            .args(["write", "--store", &url, "--log", &log, "--lease"])
            .arg(lease_file.path())
            .args([
                "--writer-id",
                &format!("w{i}"),
                "--batch",
                "5",
                "--no-sync",
                "--keep-going",
            ])
            .args(["--grace", "0s", "--clock-tolerance", "2s"])
            .arg(format!("--clock-offset-ms={off}"))
            // Signed time for every batch, from the real Roughtime server.
            .args(roughtime.flags())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn bagel write");
        let mut stdin = child.stdin.take().unwrap();
        let (feed_for, pace) = (round.feed_for, round.pace);
        let feeder = tokio::spawn(async move {
            let start = Instant::now();
            let mut sent = Vec::new();
            let mut j = 0;
            while start.elapsed() < feed_for {
                let mut chunk = String::new();
                for _ in 0..5 {
                    let m = format!("w{i}-m{j}");
                    chunk.push_str(&m);
                    chunk.push('\n');
                    sent.push(m);
                    j += 1;
                }
                stdin.write_all(chunk.as_bytes()).await.unwrap();
                // Pacing only, so the writes spread over several bags.
                tokio::time::sleep(pace).await;
            }
            drop(stdin);
            sent
        });
        writers.push((child, feeder));
    }

    let mut acked = BTreeSet::new();
    let mut failed = 0usize;
    // Batches whose append landed but after the lock: the late-write path.
    let mut landed_late = 0usize;
    for (mut child, feeder) in writers {
        let sent = feeder.await.unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut next = sent.iter();
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("FAILED ") {
                let n: usize = rest.split(' ').next().unwrap().parse().unwrap();
                assert!(
                    rest.contains("closed") || rest.contains("landed after"),
                    "unexpected failure: {line}"
                );
                failed += n;
                if rest.contains("landed after") {
                    landed_late += 1;
                }
                next.by_ref().take(n).for_each(drop);
            } else {
                acked.insert(next.next().expect("more acks than messages").clone());
            }
        }
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("writer did not exit")
            .unwrap();
        assert!(status.success(), "writer failed: {status}");
        assert!(
            next.next().is_none(),
            "a message got neither an ack nor a failure"
        );
    }

    // Stop the metronomes (a kill mid-close is fine: others finish it) and
    // collect their lag reports.
    let mut lags = Vec::new();
    for mut m in metronomes.drain(..) {
        m.kill().await.unwrap();
        let mut lines = BufReader::new(m.stdout.take().unwrap()).lines();
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(ms) = line
                .split("lag ")
                .nth(1)
                .and_then(|s| s.trim_end_matches(" ms").parse::<u64>().ok())
            {
                lags.push(ms);
            }
        }
    }
    lags.sort_unstable();

    // Close everything up to now, then read through the CLI.
    let cfg = BagConfig::default()
        .with_grace(Duration::ZERO)
        .with_lookback(Duration::from_secs(60));
    let store = bag::open_store(&url, &cfg).await.unwrap();
    bag::close_through(
        store.as_ref(),
        &log,
        Micros::now(),
        &cfg,
        &AssumedExact(SystemClock),
    )
    .await
    .unwrap();
    let out = Command::new(bagel_bin())
        .args([
            "read",
            "--store",
            &url,
            "--log",
            &log,
            "--json",
            "--grace",
            "0s",
            "--key",
            &leases.key_hex(),
        ])
        .args(Roughtime::from_env().flags())
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut got = Vec::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        match v["kind"].as_str().unwrap() {
            "message" => {
                assert_eq!(v["verified"], true);
                got.push(v["payload"].as_str().unwrap().to_owned());
            }
            "summary" => {}
            other => panic!("unexpected {other}: {line}"),
        }
    }
    let got_set: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got.len(), got_set.len(), "duplicates in the read");
    let missing: Vec<_> = acked.difference(&got_set).collect();
    let extra: Vec<_> = got_set.difference(&acked).collect();
    println!(
        "{}: {} acknowledged, {} refused ({} batches landed after the lock), {} read; \
         metronome lag ms: min {:?} median {:?} max {:?} (max includes the startup catch-up)",
        backend.url(),
        acked.len(),
        failed,
        landed_late,
        got.len(),
        lags.first(),
        lags.get(lags.len() / 2),
        lags.last()
    );
    assert!(missing.is_empty(), "acknowledged but not read: {missing:?}");
    assert!(extra.is_empty(), "read but never acknowledged: {extra:?}");
    assert!(!acked.is_empty());
}

/// Two rounds on fresh stores of one backend: writers pace their batches
/// `pace` apart (slower stores get fewer, larger gaps).
async fn race_rounds(backend: fn() -> Backend, pace: Duration) {
    let round = Round {
        feed_for: Duration::from_millis(3000),
        pace,
    };
    for _ in 0..2 {
        race_round(&backend(), &round).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_writers_and_closers_race() {
    race_rounds(Backend::posix, Duration::from_millis(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_writers_and_closers_race() {
    race_rounds(Backend::s3, Duration::from_millis(40)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs_v3_writers_and_closers_race() {
    race_rounds(|| Backend::nfs(3), Duration::from_millis(40)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs_v4_writers_and_closers_race() {
    race_rounds(|| Backend::nfs(4), Duration::from_millis(40)).await;
}
