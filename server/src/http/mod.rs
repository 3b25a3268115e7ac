//! The HTTP side port (`--http ADDR`): what operators and their tools read.
//!
//! * `/metrics`: Prometheus text, or OpenMetrics when asked (`metrics`).
//! * `/`: a status page for people (`status`), server-rendered, with a
//!   small same-origin script for the restart countdown; nothing is loaded
//!   from outside the machine, and the Content-Security-Policy says so to
//!   the browser.
//! * `/healthz` and `/readyz`: liveness and readiness over plain HTTP, for
//!   load balancers that cannot speak gRPC. `/readyz` asks the very health
//!   service that gRPC clients watch, so the two never disagree;
//!   `/healthz` is 200 for as long as the process serves (during the
//!   restart wait too, when the gRPC overall entry `""` says NOT_SERVING).
//!
//! Why a separate port rather than the gRPC one: scrapers, load balancers
//! and browsers speak HTTP/1.1, and an operator may want to expose them to
//! a different network than lease clients (or not at all: it is off unless
//! `--http` is given).
//!
//! Everything here reads the server's state; nothing on the lease path
//! waits for it. The only periodic work is [`sample`]: one read of the
//! grant counters per second for the grants/s chart, and a decay of the
//! busiest-names sketch per minute.

mod metrics;
mod process;
mod status;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bagel_proto::Micros;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health as _;
use tonic_health::server::{HealthReporter, HealthService};

use crate::service::Inner;
use crate::table::{Census, Counts};

/// Seconds of grants/s history on the status page.
const RATE_WINDOW: usize = 60;

/// Shared state of the HTTP side.
#[derive(Debug)]
pub(crate) struct Http {
    inner: Arc<Inner>,
    health: HealthService,
    /// `(when, grants so far, conflicts so far)`, one per second, the
    /// last `RATE_WINDOW + 1`.
    rates: Mutex<VecDeque<(Micros, u64, u64)>>,
    /// The last census of the table. Its lock makes requests that arrive
    /// while a census is being taken wait for that one rather than start
    /// their own.
    census: tokio::sync::Mutex<Option<Taken>>,
    /// Censuses taken so far (`bagel_status_census_scans`).
    pub(crate) census_scans: AtomicU64,
}

/// A census and when it was taken.
#[derive(Debug)]
struct Taken {
    census: Census,
    started: tokio::time::Instant,
    finished: tokio::time::Instant,
}

/// How old a census a request may be answered from.
#[derive(Clone, Copy, Debug)]
enum Reuse {
    /// The status page: one taken at most this long ago (whatever the
    /// number of viewers, the table is scanned at most once per interval).
    Within(Duration),
    /// `/metrics`: one still being taken when the scrape arrived, or a new
    /// one (a scrape sees every expiry before it; concurrent scrapes share).
    Fresh,
}

impl Http {
    pub(crate) fn new(inner: Arc<Inner>, health: &HealthReporter) -> Arc<Http> {
        Arc::new(Http {
            inner,
            health: HealthService::from_health_reporter(health.clone()),
            rates: Mutex::new(VecDeque::with_capacity(RATE_WINDOW + 1)),
            census: tokio::sync::Mutex::new(None),
            census_scans: AtomicU64::new(0),
        })
    }

    /// The gRPC health status of `service` ("" is the whole server).
    async fn health(&self, service: &str) -> ServingStatus {
        let request = tonic::Request::new(HealthCheckRequest {
            service: service.to_owned(),
        });
        match self.health.check(request).await {
            Ok(answer) => answer.into_inner().status(),
            Err(_) => ServingStatus::ServiceUnknown,
        }
    }

    /// Grants per second over the last minute, oldest first.
    fn grant_rates(&self) -> Vec<f64> {
        self.rates_of(|&(t, g, _)| (t, g))
    }

    /// Refused acquires (a name held) per second over the last minute,
    /// oldest first.
    fn conflict_rates(&self) -> Vec<f64> {
        self.rates_of(|&(t, _, c)| (t, c))
    }

    fn rates_of(&self, pick: impl Fn(&(Micros, u64, u64)) -> (Micros, u64)) -> Vec<f64> {
        let rates = self.rates.lock().unwrap_or_else(PoisonError::into_inner);
        rates
            .iter()
            .zip(rates.iter().skip(1))
            .map(|(a, b)| {
                let ((t0, n0), (t1, n1)) = (pick(a), pick(b));
                let secs = t1.duration_since(t0).as_secs_f64();
                if secs > 0.0 {
                    n1.saturating_sub(n0) as f64 / secs
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Everything a page or a scrape shows. The census (a scan of every
    /// record: 8-10 ms of CPU at 10^6 leases) is reused as `reuse` allows,
    /// and runs off the async workers; the rest is read now. `None` when
    /// the runtime is shutting down.
    async fn snapshot(self: &Arc<Self>, reuse: Reuse) -> Option<Snapshot> {
        let ready = self.health(LEASE_SERVICE).await == ServingStatus::Serving;
        let census = self.census(reuse).await?;
        let inner = &*self.inner;
        let now = inner.time.now();
        Some(Snapshot {
            now,
            not_ready: self.why_not_ready(ready, now),
            counts: inner.table.counts(),
            census,
            waiters: inner.table.waiters(),
            process: process::Process::read(),
        })
    }

    async fn census(self: &Arc<Self>, reuse: Reuse) -> Option<Census> {
        let asked = tokio::time::Instant::now();
        let mut last = self.census.lock().await;
        if let Some(taken) = &*last {
            let usable = match reuse {
                Reuse::Within(interval) => taken.started + interval > asked,
                Reuse::Fresh => taken.finished >= asked,
            };
            if usable {
                return Some(taken.census);
            }
        }
        let started = tokio::time::Instant::now();
        let inner = Arc::clone(&self.inner);
        let census = tokio::task::spawn_blocking(move || inner.table.census(inner.time.now()))
            .await
            .ok()?;
        self.census_scans.fetch_add(1, Ordering::Relaxed);
        *last = Some(Taken {
            census,
            started,
            finished: tokio::time::Instant::now(),
        });
        Some(census)
    }

    /// Why the lease service is not SERVING (`None` when it is).
    fn why_not_ready(&self, ready: bool, now: Micros) -> Option<NotReady> {
        let ready_at = self.inner.table.config().ready_at;
        if ready {
            None
        } else if now < ready_at {
            Some(NotReady::RestartWait(ready_at.duration_since(now)))
        } else if let Err(e) = self.inner.time.check() {
            Some(NotReady::Clock(e.to_string()))
        } else {
            Some(NotReady::Starting)
        }
    }
}

/// The gRPC name of the lease service, whose health is readiness.
const LEASE_SERVICE: &str = "bagel.v1.LeaseService";

/// Why the server does not grant.
#[derive(Clone, Debug)]
enum NotReady {
    /// Waiting out a previous incarnation's leases; this much is left.
    RestartWait(Duration),
    /// The clock is not known to be right.
    Clock(String),
    /// The wait is over and health is about to flip.
    Starting,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::RestartWait(left) => write!(
                f,
                "restart wait: refusing grants for another {:.1} s, to wait out any lease a \
                 previous incarnation may have granted",
                left.as_secs_f64()
            ),
            NotReady::Clock(detail) => write!(f, "clock: {detail}"),
            NotReady::Starting => f.write_str("starting: the restart wait is over"),
        }
    }
}

/// The server's state at one moment.
#[derive(Debug)]
struct Snapshot {
    now: Micros,
    /// `None` when ready (the lease service's health is SERVING).
    not_ready: Option<NotReady>,
    counts: Counts,
    census: Census,
    waiters: u64,
    process: process::Process,
}

impl Snapshot {
    fn restart_wait_left(&self) -> Duration {
        match &self.not_ready {
            Some(NotReady::RestartWait(left)) => *left,
            _ => Duration::ZERO,
        }
    }
}

/// The routes of the side port.
fn router(state: Arc<Http>) -> Router {
    Router::new()
        .route("/", get(status::page))
        .route("/status.css", get(status::css))
        .route("/status.js", get(status::script))
        .route("/favicon.svg", get(status::favicon))
        .route("/metrics", get(metrics::scrape))
        .route("/holders", get(status::holders))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the side port until `cancel`, then lets open requests finish
/// within the bounds of [`bagel_proto::side_port`].
pub(crate) async fn serve(listener: TcpListener, state: Arc<Http>, cancel: CancellationToken) {
    let limits = state.inner.cfg.http;
    bagel_proto::side_port::serve(listener, router(state), limits, cancel).await;
}

/// Samples the grant counter every second (for the grants/s chart) and
/// halves the busiest-names counts every minute (so they follow current
/// load, with a one-minute half-life).
pub(crate) async fn sample(state: Arc<Http>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = cancel.cancelled() => return,
        }
        let grants = state.inner.table.counts().grants.total();
        let (full, tentative) = state.inner.meters.conflicts();
        let now = state.inner.time.now();
        {
            let mut rates = state.rates.lock().unwrap_or_else(PoisonError::into_inner);
            if rates.len() > RATE_WINDOW {
                rates.pop_front();
            }
            rates.push_back((now, grants, full + tentative));
        }
        ticks += 1;
        if ticks.is_multiple_of(60) {
            let inner = Arc::clone(&state.inner);
            let _ = tokio::task::spawn_blocking(move || inner.table.decay_busiest()).await;
        }
    }
}

/// Liveness: 200 while the process serves, restart wait included (a
/// load balancer that restarted a server for waiting out its TTL would
/// keep it waiting forever); 503 once it is shutting down. Whether it
/// grants is `/readyz`.
async fn healthz(State(state): State<Arc<Http>>) -> Response {
    if state.inner.stopping.is_cancelled() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not serving: shutting down\n".to_owned(),
        );
    }
    text(StatusCode::OK, "ok\n".to_owned())
}

/// 200 when the lease service grants (its gRPC health is SERVING), 503
/// with the reason otherwise: during the restart wait, or while the clock
/// is off.
async fn readyz(State(state): State<Arc<Http>>) -> Response {
    let ready = state.health(LEASE_SERVICE).await == ServingStatus::Serving;
    match state.why_not_ready(ready, state.inner.time.now()) {
        None => text(StatusCode::OK, "ready\n".to_owned()),
        Some(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

/// The answer when the server is going away mid-request.
fn shutting_down() -> Response {
    text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".to_owned())
}

async fn not_found() -> Response {
    text(
        StatusCode::NOT_FOUND,
        "not found; try /, /metrics, /healthz or /readyz\n".to_owned(),
    )
}

fn text(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}
