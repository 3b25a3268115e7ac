//! `/metrics` of both side ports (the real `bagel-server --http` and
//! `bagel metronome --http`) in the format the scraper asks for: the
//! classic Prometheus text format by default (what `promtool check
//! metrics`, `curl` and older agents read), OpenMetrics when `Accept` asks
//! for `application/openmetrics-text` (as Prometheus does).
//!
//! The classic text is parsed with a Prometheus text parser; every series
//! must carry `# HELP` and `# TYPE` under its own name (the classic format
//! names a counter's family after its `_total` series, and has no `info`
//! type). `tests/run.sh` also lints both with Debian's `promtool`, and the
//! OpenMetrics text is parsed strictly by `tests/python/metrics_test.py`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bagel_tests::{ServerProcess, bin};

const OPENMETRICS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `GET url` with this `Accept` (none when `None`): (content type, body).
async fn scrape(url: &str, accept: Option<&str>) -> (String, String) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(response.status().as_u16(), 200, "GET {url}");
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (content_type, response.text().await.expect("body"))
}

/// Parses classic Prometheus text, checks that every series has its
/// family's HELP and TYPE under its own name, and returns each family's
/// type by name.
fn check_classic(what: &str, text: &str) -> HashMap<String, String> {
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{what}: {text}"
    );
    let mut types = HashMap::new();
    let mut helps = HashMap::new();
    for line in text.lines() {
        let mut words = line.splitn(4, ' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name), Some(kind)) => {
                types.insert(name.to_owned(), kind.to_owned());
            }
            (Some("#"), Some("HELP"), Some(name), Some(help)) => {
                assert!(!help.is_empty(), "{what}: empty help for {name}");
                helps.insert(name.to_owned(), help.to_owned());
            }
            _ => {}
        }
    }
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");
    assert!(!scrape.samples.is_empty(), "{what}: no samples in {text}");
    let sample_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    for sample in &scrape.samples {
        // A histogram's buckets come back under its family name, its
        // `_sum` and `_count` as series of their own; every other series
        // is named exactly as its family.
        let family = ["_sum", "_count"]
            .iter()
            .filter_map(|suffix| sample.metric.strip_suffix(suffix))
            .find(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            .unwrap_or(&sample.metric);
        assert!(
            types.contains_key(family),
            "{what}: {family} has no # TYPE of its own"
        );
        assert!(
            helps.contains_key(family),
            "{what}: {family} has no # HELP of its own"
        );
    }
    // Every line the parser skipped would be a line promtool refuses.
    let parsed_lines: usize = scrape
        .samples
        .iter()
        .map(|s| match &s.value {
            prometheus_parse::Value::Histogram(buckets) => buckets.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(
        parsed_lines, sample_lines,
        "{what}: every sample line parses\n{text}"
    );
    types
}

/// OpenMetrics text: its own terminator and type names.
fn check_openmetrics(what: &str, text: &str, info: Option<&str>) {
    assert!(text.ends_with("# EOF\n"), "{what}: OpenMetrics ends with # EOF");
    if let Some(info) = info {
        assert!(text.contains(&format!("# TYPE {info} info\n")), "{what}: {text}");
    }
}

#[tokio::test]
async fn the_server_speaks_classic_text_by_default_and_openmetrics_when_asked() {
    let server = ServerProcess::start_ready(&["--http", "127.0.0.1:0"]).await;
    // A conflict, so that the labelled counters and histograms have series.
    let client = server.client().await;
    let _held = client
        .acquire(["m"])
        .ttl(Duration::from_secs(5))
        .send()
        .await
        .expect("acquire");
    let _ = client
        .acquire(["m"])
        .owner("rival")
        .ttl(Duration::from_secs(5))
        .send()
        .await;
    let url = format!("{}/metrics", server.http_url());

    for accept in [None, Some("*/*"), Some("text/plain")] {
        let (content_type, text) = scrape(&url, accept).await;
        assert_eq!(
            content_type, "text/plain; version=0.0.4; charset=utf-8",
            "Accept: {accept:?}"
        );
        let types = check_classic("bagel-server", &text);
        assert_eq!(types["bagel_server_info"], "gauge");
        assert_eq!(types["bagel_grants_total"], "counter");
        assert_eq!(types["bagel_conflicts_total"], "counter");
        assert_eq!(types["bagel_rpc_duration_seconds"], "histogram");
        assert_eq!(types["bagel_history_bytes"], "gauge");
        assert!(
            text.contains("\nbagel_conflicts_total{mode=\"full\"} 1\n"),
            "{text}"
        );
    }

    for accept in [OPENMETRICS_ACCEPT, "application/openmetrics-text"] {
        let (content_type, text) = scrape(&url, Some(accept)).await;
        assert_eq!(
            content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8",
            "Accept: {accept}"
        );
        check_openmetrics("bagel-server", &text, Some("bagel_server"));
        assert!(text.contains("# TYPE bagel_grants counter\n"), "{text}");
        assert!(
            text.contains("\nbagel_conflicts_total{mode=\"full\"} 1\n"),
            "{text}"
        );
    }
}

/// A running `bagel metronome --http` over a fresh directory, killed on drop.
struct Metronome(Child, String);

impl Drop for Metronome {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn metronome(root: &std::path::Path) -> Metronome {
    let mut cmd = Command::new(bin("bagel"));
    cmd.args(["--unsafe-local-clock", "metronome", "--store"])
        .arg(format!("file://{}", root.display()))
        .args([
            "--log",
            "events",
            "--grace",
            "200ms",
            "--lookback",
            "2s",
            "--http",
            "127.0.0.1:0",
        ])
        .stderr(Stdio::inherit());
    let (child, http) = bagel_tests::spawn_with_side_port(&mut cmd);
    Metronome(child, format!("{http}/metrics"))
}

#[tokio::test]
async fn the_metronome_speaks_classic_text_by_default_and_openmetrics_when_asked() {
    let root = tempfile::tempdir().expect("tempdir");
    let m = metronome(root.path());

    let (content_type, text) = scrape(&m.1, None).await;
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let types = check_classic("metronome", &text);
    assert_eq!(types["bagel_metronome_bags_closed_total"], "counter");
    assert_eq!(types["bagel_metronome_close_lag_seconds"], "histogram");

    let (content_type, text) = scrape(&m.1, Some(OPENMETRICS_ACCEPT)).await;
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    check_openmetrics("metronome", &text, None);
    assert!(
        text.contains("# TYPE bagel_metronome_bags_closed counter\n"),
        "{text}"
    );
}
