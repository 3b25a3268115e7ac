//! The HTTP side port of the real `bagel-server` (`--http`), over real HTTP:
//! `/readyz` mirrors the gRPC health through the restart wait, `/metrics`
//! answers (the classic Prometheus text format unless OpenMetrics is asked
//! for: `metrics_format.rs`), and `--log-format json` logs every refusal once,
//! with the name, the holder and the reason, and never a token.
//!
//! The counter deltas of a known sequence of calls, parsed by the official
//! Python Prometheus client, are checked by `tests/python/metrics_test.py`
//! (run by `tests/run.sh`).

use std::io::Read as _;
use std::time::Duration;

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{ServerOptions, ServerProcess};
use tonic::Code;

async fn get(url: &str) -> (u16, String, String) {
    let response = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, content_type, response.text().await.expect("body"))
}

fn now_us() -> u64 {
    bagel_proto::Micros::now().as_micros()
}

fn acquire(names: &[&str], ttl: Duration, owner: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        deadline_us: now_us() + ttl.as_micros() as u64,
        owner: owner.to_owned(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    }
}

#[tokio::test]
async fn readyz_is_503_during_the_restart_wait_and_200_after() {
    let server = ServerProcess::start(&[
        "--http",
        "127.0.0.1:0",
        "--max-ttl",
        "5s",
        "--clock-tolerance",
        "100ms",
    ])
    .await;
    let http = server.http_url();

    let (status, _, body) = get(&format!("{http}/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: restart wait"), "{body}");
    let (status, _, body) = get(&format!("{http}/healthz")).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"), "the process serves");
    let (_, content_type, metrics) = get(&format!("{http}/metrics")).await;
    // No Accept header: the classic text format (changed from OpenMetrics
    // on purpose; OpenMetrics is for scrapers that ask).
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    assert!(metrics.contains("\nbagel_ready 0\n"), "{metrics}");
    assert!(
        !metrics.contains("\nbagel_restart_wait_remaining_seconds 0.0\n"),
        "{metrics}"
    );

    // The gRPC health service flips to SERVING (an event the server
    // pushes); /readyz asks that same health service, so it agrees.
    server.wait_ready().await;
    let (status, _, body) = get(&format!("{http}/readyz")).await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    let (_, _, metrics) = get(&format!("{http}/metrics")).await;
    assert!(metrics.contains("\nbagel_ready 1\n"), "{metrics}");
    assert!(
        metrics.contains("\nbagel_restart_wait_remaining_seconds 0.0\n"),
        "{metrics}"
    );
    assert!(!metrics.contains("# EOF"), "the classic format has no # EOF");

    let (status, _, _) = get(&format!("{http}/no-such-page")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn without_http_flag_no_side_port_is_opened() {
    let server = ServerProcess::start_ready(&[]).await;
    assert_eq!(server.http, None);
}

#[tokio::test]
async fn json_logs_show_every_refusal_once_and_never_a_token() {
    let mut server = ServerProcess::start_with(
        &["--unsafe-skip-restart-wait", "--log-format", "json"],
        ServerOptions {
            rust_log: "warn,bagel_server::refusal=debug".to_owned(),
            capture_stderr: true,
            ..ServerOptions::default()
        },
    )
    .await;
    server.wait_ready().await;
    // Drain stderr as it comes, so the server never blocks on a full pipe.
    let mut stderr = server.take_stderr().expect("stderr captured");
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        stderr.read_to_string(&mut all).expect("read stderr");
        all
    });
    let mut client = LeaseServiceClient::connect(server.url.clone()).await.unwrap();

    let held = client
        .acquire(acquire(&["tenant-a"], Duration::from_secs(10), "writer-1"))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    // 1. A conflict: unary, and a waiting acquire that gives up (one line
    //    each, although the waiter retried).
    let err = client
        .acquire(acquire(&["tenant-a"], Duration::from_secs(5), "writer-2"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    let mut waiting = acquire(&["tenant-a", "tenant-b"], Duration::from_secs(5), "writer-3");
    waiting.wait_us = 50_000;
    let err = client.acquire(waiting).await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    // 2. A wrong token on renew.
    let wrong = "0".repeat(held.token.len());
    let err = client
        .renew(pb::RenewRequest {
            lease_id: held.lease_id.clone(),
            token: wrong.clone(),
            deadline_us: now_us() + 5_000_000,
            ttl_us: 0,
            metadata: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    // 3. A conflict inside a batch, next to a grant.
    let batch = client
        .batch(pb::BatchRequest {
            lean: false,
            ops: vec![
                pb::BatchOp {
                    op: Some(pb::batch_op::Op::Acquire(acquire(
                        &["tenant-a"],
                        Duration::from_secs(5),
                        "writer-4",
                    ))),
                },
                pb::BatchOp {
                    op: Some(pb::batch_op::Op::Acquire(acquire(
                        &["tenant-c"],
                        Duration::from_secs(5),
                        "writer-4",
                    ))),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let batch_token = match &batch.results[1].result {
        Some(pb::batch_result::Result::Grant(g)) => g.token.clone(),
        other => panic!("expected a grant, got {other:?}"),
    };
    // 4. The holder releases (no refusal).
    client
        .release(pb::ReleaseRequest {
            lease_id: held.lease_id.clone(),
            token: held.token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();

    server.kill();
    let logs = reader.join().expect("stderr reader");
    for token in [&held.token, &batch_token] {
        assert!(
            !logs.contains(token.as_str()),
            "a token appeared in the logs:\n{logs}"
        );
    }
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let refusals: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["target"] == "bagel_server::refusal")
        .collect();
    let summary: Vec<(String, String, String, String)> = refusals
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (s("op"), s("code"), s("names"), s("holder"))
        })
        .collect();
    let holder = held.lease_id.clone();
    assert_eq!(
        summary,
        vec![
            (
                "Acquire".into(),
                "ABORTED".into(),
                "tenant-a".into(),
                holder.clone()
            ),
            (
                "Acquire".into(),
                "ABORTED".into(),
                "tenant-a,tenant-b".into(),
                holder.clone()
            ),
            (
                "Renew".into(),
                "PERMISSION_DENIED".into(),
                String::new(),
                String::new()
            ),
            (
                "acquire".into(),
                "ABORTED".into(),
                "tenant-a".into(),
                holder.clone()
            ),
        ],
        "one line per refusal:\n{logs}"
    );
    for r in &refusals {
        assert_eq!(r["level"], "DEBUG");
        assert!(!r["reason"].as_str().unwrap().is_empty(), "{r}");
    }
    assert_eq!(refusals[0]["holder_owner"], "writer-1");
    assert_eq!(refusals[0]["name"], "tenant-a");
    assert_eq!(refusals[2]["lease"], holder.as_str());
    assert!(
        refusals[2]["reason"]
            .as_str()
            .unwrap()
            .contains("token: does not match"),
        "{}",
        refusals[2]
    );
}

/// A sample's value in an OpenMetrics exposition, by its exact series text
/// (name and labels as the server writes them).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn with_roughtime_the_side_port_shows_the_clock_and_why_it_does_not_grant() {
    let rt = bagel_tests::Roughtime::from_env();
    // A healthy clock: offset and answer age from Roughtime.
    let mut args = rt.flags().to_vec();
    args.extend(["--unsafe-skip-restart-wait", "--http", "127.0.0.1:0"]);
    let server = ServerProcess::start(&args).await;
    server.wait_ready().await;
    let (_, _, metrics) = get(&format!("{}/metrics", server.http_url())).await;
    assert!(metrics.contains(r#"time_source="roughtime""#), "{metrics}");
    assert!(sample(&metrics, r#"bagel_roughtime_queries_total{outcome="ok"}"#).unwrap() >= 1.0);
    let offset = sample(&metrics, "bagel_clock_offset_seconds").expect("an offset");
    assert!(offset.abs() < 10.0, "offset {offset} s");
    assert!(
        sample(&metrics, "bagel_roughtime_last_answer_age_seconds").is_some(),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "bagel_clock_healthy"), Some(1.0));
    drop(server);

    // A clock 20 s off: never ready, and /readyz says it is the clock.
    let mut args = rt.flags().to_vec();
    args.extend([
        "--unsafe-skip-restart-wait",
        "--unsafe-clock-offset",
        "20s",
        "--http",
        "127.0.0.1:0",
    ]);
    let server = ServerProcess::start(&args).await;
    let (status, _, body) = get(&format!("{}/readyz", server.http_url())).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: clock: "), "{body}");
    assert!(body.contains("ahead of"), "{body}");
    let (_, _, metrics) = get(&format!("{}/metrics", server.http_url())).await;
    assert_eq!(sample(&metrics, "bagel_clock_healthy"), Some(0.0), "{metrics}");
    assert_eq!(sample(&metrics, "bagel_ready"), Some(0.0), "{metrics}");
    let offset = sample(&metrics, "bagel_clock_offset_seconds").expect("an offset");
    assert!((15.0..25.0).contains(&offset), "offset {offset} s");
}
