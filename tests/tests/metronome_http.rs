//! `bagel metronome --http`: the real CLI closing real directories, watched
//! over real HTTP: bags closed per log and outcome, errors by kind, the
//! status page, `/readyz` naming the log that holds it back.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bagel_tests::{ServerProcess, bin, describe_output, unique};

/// A running `bagel metronome`, killed on drop.
struct Metronome {
    child: Child,
    http: String,
}

impl Metronome {
    fn start(root: &std::path::Path, logs: &[&str]) -> Metronome {
        Self::start_with(root, logs, &[])
    }

    fn start_with(root: &std::path::Path, logs: &[&str], extra: &[&str]) -> Metronome {
        let store = format!("file://{}", root.display());
        let mut cmd = Command::new(bin("bagel"));
        // One host, one clock: these tests are about the HTTP side.
        cmd.args([
            "--unsafe-local-clock",
            "metronome",
            "--store",
            &store,
            "--grace",
            "200ms",
            "--lookback",
            "3s",
        ])
        .args(["--http", "127.0.0.1:0"])
        .args(extra);
        for log in logs {
            cmd.args(["--log", log]);
        }
        let (child, http) = bagel_tests::spawn_with_side_port(cmd.stderr(Stdio::inherit()));
        Metronome { child, http }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("{}{path}", self.http))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = r.status().as_u16();
        (status, r.text().await.expect("body"))
    }

    /// The value of `metric` with exactly these labels, 0 if absent.
    async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200);
        sample(&text, metric, labels)
    }

    /// Polls `/metrics` (bounded) until `metric{labels}` reaches `at_least`.
    async fn wait_metric(&self, metric: &str, labels: &[(&str, &str)], at_least: f64) -> f64 {
        self.wait_metric_until(metric, labels, &format!(">= {at_least}"), |v| v >= at_least)
            .await
    }

    /// Polls `/metrics` (bounded: the metronome shows its state nowhere
    /// else) until `reached` holds of `metric{labels}`. Every sample goes
    /// through `reached`, so a caller may assert on each one it sees.
    async fn wait_metric_until(
        &self,
        metric: &str,
        labels: &[(&str, &str)],
        wanted: &str,
        mut reached: impl FnMut(f64) -> bool,
    ) -> f64 {
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.metric(metric, labels).await;
            if reached(v) {
                return v;
            }
            assert!(
                Instant::now() < give_up,
                "{metric}{labels:?} stayed at {v}, never {wanted}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Metronome {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finds `name{...} value` in /metrics text (either format) with exactly `labels`.
/// One message in `log` under `root`, written under a real lease by the
/// real CLI (the lease server is gone once it is written): a log that
/// exists, for the metronome to find.
async fn write_one_message(root: &std::path::Path, log: &str) {
    let server = ServerProcess::start_ready(&[]).await;
    let lease = server.cli(&["acquire", &format!("{log}-name"), "--json"]);
    assert!(lease.status.success(), "{}", describe_output(&lease));
    let lease_dir = tempfile::tempdir().unwrap();
    let lease_file = lease_dir.path().join("lease.json");
    std::fs::write(&lease_file, &lease.stdout).unwrap();
    let store = format!("file://{}", root.display());
    let wrote = server.cli(&[
        "write",
        "--store",
        &store,
        "--log",
        log,
        "--lease",
        lease_file.to_str().unwrap(),
        "--grace",
        "200ms",
        "hello",
    ]);
    assert!(wrote.status.success(), "{}", describe_output(&wrote));
}

fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, set) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let mut got: Vec<(String, String)> = set
            .split(',')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect("label=value");
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        got.sort();
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        want.sort();
        if got == want {
            return value.parse().expect("a number");
        }
    }
    0.0
}

#[tokio::test]
async fn the_metronome_counts_closes_and_errors_per_log_and_says_why_it_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("bags");
    std::fs::create_dir_all(&root).unwrap();
    let (good, broken) = (unique("good"), unique("broken"));
    // A file where the log's directory should be: every close of it fails.
    std::fs::write(root.join(&broken), b"not a directory").unwrap();

    // One message in `good`, written under a real lease by the real CLI.
    write_one_message(&root, &good).await;

    let m = Metronome::start(&root, &[&good, &broken]);
    let closed = "bagel_metronome_bags_closed_total";
    // The bag with the message closes as a bag with data. (The empty
    // seconds around it are sealed with their minute, up to a minute on:
    // the bag conformance suite counts those.)
    m.wait_metric(closed, &[("log", &good), ("outcome", "with_data")], 1.0)
        .await;
    m.wait_metric(
        "bagel_metronome_errors_total",
        &[("log", &broken), ("kind", "io")],
        1.0,
    )
    .await;
    assert_eq!(
        m.metric(closed, &[("log", &broken), ("outcome", "empty")]).await,
        0.0
    );

    let (status, why) = m.get("/readyz").await;
    assert_eq!(status, 503, "{why}");
    assert!(why.contains(&broken) && why.contains("closing fails"), "{why}");
    let (status, page) = m.get("/").await;
    assert_eq!(status, 200);
    assert!(page.contains(&good) && page.contains(&broken), "{page}");
    assert!(
        page.contains("not a directory") || page.contains("Not a directory"),
        "{page}"
    );
    assert_eq!(m.get("/healthz").await.0, 200);
}

#[tokio::test]
async fn a_metronome_that_keeps_up_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let log = unique("ready");
    let m = Metronome::start(dir.path(), &[&log]);
    // Ready once the backlog (the lookback) is closed; bounded.
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = m.get("/readyz").await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < give_up, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let behind = m.metric("bagel_metronome_behind_seconds", &[("log", &log)]).await;
    assert!(behind < 1.2 + 0.2, "behind {behind} s while ready");
}

/// `--max-idle-listing` caps the pause between listings of an idle log's
/// open minute, as the metronome reports it: the pause doubles from 1 s
/// to the cap and never beyond.
#[tokio::test]
async fn max_idle_listing_caps_an_idle_logs_listing_pause() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("bags");
    std::fs::create_dir_all(&root).unwrap();
    let log = unique("idle");
    // The log exists (one message by the real CLI), then nobody writes.
    write_one_message(&root, &log).await;

    let m = Metronome::start_with(&root, &[&log], &["--max-idle-listing", "2s"]);
    m.wait_metric_until(
        "bagel_metronome_listing_pause_seconds",
        &[("log", &log)],
        "the 2 s cap",
        |pause| {
            assert!(pause <= 2.0, "pause {pause} s over the 2 s cap");
            pause == 2.0
        },
    )
    .await;
}
