//! The round-trip floor: one client sending a no-op request, one after
//! another, to a server that does nothing with it.
//!
//! Why: at one client a lease cycle is two round trips, so no server can be
//! faster than two of these. Measuring the floor in the same run as the
//! cycles shows how much of a system's one-client latency is its transport
//! (gRPC over HTTP/2 for bagel, RESP for Redis) and how much is its work.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::driver::{micros, new_histogram};

/// One system's no-op round trip.
#[derive(Debug, Clone, Serialize)]
pub struct FloorRow {
    pub system: String,
    /// What was sent, e.g. "grpc.health.v1 Check" or "PING".
    pub request: String,
    pub calls: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// Sends `call` back to back for `warmup` (not measured) and then
/// `duration`, and returns the latencies of the measured calls.
pub async fn measure<F, Fut>(
    system: &str,
    request: &str,
    warmup: Duration,
    duration: Duration,
    mut call: F,
) -> Result<FloorRow>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut h = new_histogram();
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        tokio::time::timeout(Duration::from_secs(5), call())
            .await
            .map_err(|_| anyhow::anyhow!("{request} timed out"))??;
        if t0 >= measure_from {
            h.saturating_record(micros(t0.elapsed()));
        }
    }
    if h.is_empty() {
        bail!("no {request} completed in {duration:?}");
    }
    Ok(FloorRow {
        system: system.to_string(),
        request: request.to_string(),
        calls: h.len(),
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_only_the_calls_after_the_warmup() {
        let mut sent = 0u64;
        let row = measure(
            "x",
            "noop",
            Duration::from_millis(20),
            Duration::from_millis(30),
            || {
                sent += 1;
                async { Ok(()) }
            },
        )
        .await
        .unwrap();
        assert!(row.calls > 0 && row.calls < sent, "{} of {sent}", row.calls);
        assert!(row.p50_us >= 1 && row.p99_us >= row.p50_us);
        assert_eq!((row.system.as_str(), row.request.as_str()), ("x", "noop"));
    }

    #[tokio::test]
    async fn a_failing_request_fails_the_measurement() {
        let err = measure("x", "noop", Duration::ZERO, Duration::from_secs(5), || async {
            Err(anyhow::anyhow!("refused"))
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
    }
}
