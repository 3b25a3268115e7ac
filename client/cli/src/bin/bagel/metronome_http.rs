//! `bagel metronome --http ADDR`: what a closer is doing, for Prometheus
//! and for people. `/metrics` (prometheus-client's metrics, in classic
//! Prometheus text or OpenMetrics as the scraper asks),
//! `/` (a small status page, refreshing itself), `/healthz` (the process
//! runs) and `/readyz` (every log is closed up to its last due bag, or
//! for a log idle in a listing pause, up to its last listing, and that is
//! not older than the pause).
//!
//! The metronome tells [`MetronomeStatus`] of every close as it happens
//! ([`CloseObserver`]); the log label's values are the operator's own
//! `--log` list, so the label stays small.
//!
//! "Closed through" is what the metronome told [`CloseObserver::caught_up`]:
//! seconds it listed past their close time, or sealed. While a log is idle
//! its open minute is listed only every few seconds
//! ([`bagel_bags::Metronome::with_max_idle_listing`]), so `behind` then
//! grows up to that pause between listings (a bag written meanwhile may
//! wait that long for its close); the pause is exported
//! (`bagel_metronome_listing_pause_seconds`) and `/readyz` allows for it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bagel_bags::{Bucket, CloseObserver};
use bagel_proto::Micros;
use bagel_proto::clock::Clock;
use bagel_proto::exposition::Format;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LogLabel {
    log: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    log: String,
    /// `with_data` or `empty`.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    log: String,
    /// The bag engine's error kind (`io`, `store`, `timeout`, ...).
    kind: &'static str,
}

/// One log's state, for the status page and `/readyz`.
#[derive(Clone, Debug, Default)]
struct LogState {
    last_closed: Option<Bucket>,
    last_lag: Duration,
    closed: u64,
    empty: u64,
    errors: u64,
    last_error: Option<(Micros, String)>,
    /// The last tick's close of this log failed (cleared by a close).
    failing: bool,
    /// The log has no start mark: nobody wrote it yet, nothing to close.
    missing: bool,
    /// The log is idle: its open minute is listed this long after the
    /// last listing (zero: at every tick).
    listing_pause: Duration,
}

/// The metronome's metrics and status, shared with the HTTP side.
pub struct MetronomeStatus {
    registry: Registry,
    closed: Family<ClosedLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    lag: Family<LogLabel, Gauge<f64, AtomicU64>>,
    behind: Family<LogLabel, Gauge<f64, AtomicU64>>,
    pause: Family<LogLabel, Gauge<f64, AtomicU64>>,
    lag_seconds: Histogram,
    logs: Mutex<BTreeMap<String, LogState>>,
    /// Why the last tick closed nothing: its clock was not vouched for.
    clock_refused: Mutex<Option<String>>,
    grace: Duration,
    clock: Arc<dyn Clock>,
    started: Micros,
    /// The first bag of every log the metronome closes (now - lookback).
    first: Bucket,
    store: String,
}

impl std::fmt::Debug for MetronomeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetronomeStatus")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl MetronomeStatus {
    pub fn new(
        logs: &[String],
        store: &str,
        grace: Duration,
        lookback: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut registry = Registry::default();
        let closed = Family::<ClosedLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let lag = Family::<LogLabel, Gauge<f64, AtomicU64>>::default();
        let behind = Family::<LogLabel, Gauge<f64, AtomicU64>>::default();
        let pause = Family::<LogLabel, Gauge<f64, AtomicU64>>::default();
        let lag_seconds = Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]);
        registry.register(
            "bagel_metronome_bags_closed",
            "Bags closed, by log and whether they held anything",
            closed.clone(),
        );
        registry.register(
            "bagel_metronome_errors",
            "Failed closes, by log and error kind (retried at the next tick)",
            errors.clone(),
        );
        registry.register(
            "bagel_metronome_lag_seconds",
            "Of the last bag closed: end of its close minus its close time",
            lag.clone(),
        );
        registry.register(
            "bagel_metronome_behind_seconds",
            "Now minus the close time of the oldest second not known closed: not yet closed, or \
             not listed since its close time while the log is idle (up to the listing pause more)",
            behind.clone(),
        );
        registry.register(
            "bagel_metronome_listing_pause_seconds",
            "How long an idle log's open minute goes unlisted after a listing that found nothing \
             to close (0: listed every tick)",
            pause.clone(),
        );
        registry.register(
            "bagel_metronome_close_lag_seconds",
            "Lag of every close",
            lag_seconds.clone(),
        );
        let now = clock.now();
        let status = MetronomeStatus {
            registry,
            closed,
            errors,
            lag,
            behind,
            pause,
            lag_seconds,
            logs: Mutex::new(logs.iter().map(|l| (l.clone(), LogState::default())).collect()),
            clock_refused: Mutex::new(None),
            grace,
            clock,
            started: now,
            first: Bucket::of(now.saturating_sub(lookback)),
            store: store.to_owned(),
        };
        // Every log appears from the first scrape on, at zero.
        for log in logs {
            for outcome in ["with_data", "empty"] {
                let _ = status.closed.get_or_create(&ClosedLabels {
                    log: log.clone(),
                    outcome,
                });
            }
            let _ = status.lag.get_or_create(&LogLabel { log: log.clone() });
            let _ = status.pause.get_or_create(&LogLabel { log: log.clone() });
        }
        status
    }

    fn logs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LogState>> {
        self.logs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the oldest second of a log not known closed has been due:
    /// the first after what the metronome last closed or claimed
    /// ([`CloseObserver::caught_up`]). For a log idle in a listing pause
    /// that includes the seconds not listed since their close time.
    fn behind(&self, s: &LogState, now: Micros) -> Duration {
        if s.missing {
            return Duration::ZERO;
        }
        match s.last_closed {
            Some(b) => now.duration_since(b.next().close_time(self.grace)),
            // Nothing closed yet: the first bag is the oldest due.
            None => now.duration_since(self.first.close_time(self.grace)),
        }
    }

    /// Why the metronome is not ready, if it is not: its clock is not
    /// vouched for (it closes nothing), or every log whose last close
    /// failed or that is more than a second (one tick) plus the grace
    /// behind, plus its listing pause while it is idle (it is not listed
    /// before then), `; `-separated (an operator sees all stuck logs at
    /// once).
    fn not_ready(&self) -> Option<String> {
        if let Some(why) = &*self.clock_refused.lock().unwrap_or_else(PoisonError::into_inner) {
            return Some(format!("closing nothing until the clock is vouched for: {why}"));
        }
        let now = self.clock.now();
        let why: Vec<String> = self
            .logs()
            .iter()
            .filter_map(|(log, s)| {
                if s.failing {
                    let why = s.last_error.as_ref().map_or("", |(_, e)| e.as_str());
                    return Some(format!("log {log:?}: closing fails: {why}"));
                }
                let behind = self.behind(s, now);
                let limit = self.grace + Duration::from_secs(1) + s.listing_pause;
                (behind > limit).then(|| format!("log {log:?} is {behind:?} behind (limit {limit:?})"))
            })
            .collect();
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// `n` seconds of `log` closed (`outcome` `empty` or `with_data`),
    /// through `through`, `lag` after their close time: a bag's close, or
    /// a minute's seal of its empty seconds.
    fn record_closes(&self, log: &str, outcome: &'static str, n: u64, through: Bucket, lag: Duration) {
        self.closed
            .get_or_create(&ClosedLabels {
                log: log.to_owned(),
                outcome,
            })
            .inc_by(n);
        self.lag
            .get_or_create(&LogLabel { log: log.to_owned() })
            .set(lag.as_secs_f64());
        self.lag_seconds.observe(lag.as_secs_f64());
        let mut logs = self.logs();
        let s = logs.entry(log.to_owned()).or_default();
        s.last_closed = Some(s.last_closed.map_or(through, |b| b.max(through)));
        s.last_lag = lag;
        s.closed += n;
        if outcome == "empty" {
            s.empty += n;
        }
        s.failing = false;
    }

    fn scrape(&self) -> String {
        let now = self.clock.now();
        for (log, s) in self.logs().iter() {
            self.behind
                .get_or_create(&LogLabel { log: log.clone() })
                .set(self.behind(s, now).as_secs_f64());
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

impl CloseObserver for MetronomeStatus {
    fn closed(&self, log: &str, bucket: Bucket, lag: Duration, items: usize) {
        let outcome = if items == 0 { "empty" } else { "with_data" };
        self.record_closes(log, outcome, 1, bucket, lag);
    }

    fn failed(&self, log: &str, bucket: Bucket, error: &bagel_bags::Error) {
        self.errors
            .get_or_create(&ErrorLabels {
                log: log.to_owned(),
                kind: error.kind(),
            })
            .inc();
        let mut logs = self.logs();
        let s = logs.entry(log.to_owned()).or_default();
        s.errors += 1;
        s.failing = true;
        s.last_error = Some((self.clock.now(), format!("bag {bucket}: {error}")));
    }

    fn sealed(&self, log: &str, last: Bucket, lag: Duration, empty: u64) {
        self.record_closes(log, "empty", empty, last, lag);
    }

    fn caught_up(&self, log: &str, through: Bucket) {
        let mut logs = self.logs();
        let s = logs.entry(log.to_owned()).or_default();
        s.last_closed = Some(s.last_closed.map_or(through, |b| b.max(through)));
        s.failing = false;
        s.missing = false;
    }

    fn listing_paused(&self, log: &str, pause: Duration) {
        self.pause
            .get_or_create(&LogLabel { log: log.to_owned() })
            .set(pause.as_secs_f64());
        self.logs().entry(log.to_owned()).or_default().listing_pause = pause;
    }

    fn log_missing(&self, log: &str) {
        let mut logs = self.logs();
        let s = logs.entry(log.to_owned()).or_default();
        s.missing = true;
        s.failing = false;
    }

    fn clock_checked(&self, refused: Option<&bagel_bags::Error>) {
        *self.clock_refused.lock().unwrap_or_else(PoisonError::into_inner) = refused.map(ToString::to_string);
    }
}

/// Binds `addr` and serves until `cancel`; returns the bound address.
pub async fn serve(
    addr: &str,
    status: Arc<MetronomeStatus>,
    cancel: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--http {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(page))
        .route("/metronome.css", get(css))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(status);
    // The same bounds as bagel-server's side port: a connection cap,
    // header and idle timeouts, a bounded request head, descriptors kept
    // for the closer's own storage calls.
    let limits = bagel_proto::side_port::SidePortLimits::default();
    tokio::spawn(bagel_proto::side_port::serve(listener, app, limits, cancel));
    Ok(bound)
}

/// What the browser may load for the status page: its own stylesheet,
/// nothing else (no script at all), as the server's side port says.
const CSP: &str =
    "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const CSS: &str = "body{font:15px system-ui,sans-serif;margin:1em;max-width:60em}\
table{border-collapse:collapse;width:100%}td,th{padding:.3em .5em;border-bottom:1px solid #ddd;text-align:left}\
.ok{color:#176c2c}.bad{color:#a4161a}\n";

/// On every answer: the CSP, and no content-type sniffing (a log name or
/// an error text must never be taken for HTML or script).
async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    r
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        CSS,
    )
        .into_response()
}

/// Classic Prometheus text, or OpenMetrics when `Accept` asks for it (see
/// [`bagel_proto::exposition`]).
async fn metrics(State(s): State<Arc<MetronomeStatus>>, headers: header::HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "accept"),
        ],
        format.render(s.scrape()),
    )
        .into_response()
}

async fn readyz(State(s): State<Arc<MetronomeStatus>>) -> Response {
    match s.not_ready() {
        None => (StatusCode::OK, "ready\n".to_owned()).into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The status page: one table row per log. Plain HTML, no script, nothing
/// loaded from elsewhere (its stylesheet is `/metronome.css`, as the CSP
/// allows); the browser reloads it every 5 s.
async fn page(State(s): State<Arc<MetronomeStatus>>) -> Response {
    let now = s.clock.now();
    let ready = s.not_ready();
    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width,initial-scale=1\">\
         <meta http-equiv=refresh content=5><title>bagel metronome</title>\
         <link rel=stylesheet href=metronome.css></head><body>\
         <h1>bagel metronome</h1><p>store <code>{}</code>; grace {:?}; up {}s; <span id=ready class={}>{}</span></p>",
        escape(&s.store),
        s.grace,
        now.duration_since(s.started).as_secs(),
        if ready.is_none() { "ok" } else { "bad" },
        escape(ready.as_deref().map_or("ready", |w| w)),
    );
    html.push_str(
        "<table><thead><tr><th>log</th><th>closed through</th><th>lag ms</th><th>behind ms</th>\
         <th>listing pause ms</th><th>bags closed</th><th>empty</th><th>errors</th><th>last error</th></tr></thead><tbody>",
    );
    for (log, st) in s.logs().iter() {
        let _ = write!(
            html,
            "<tr class=log><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(log),
            match (st.missing, st.last_closed) {
                (true, _) => "no such log yet: no writer has started it".to_owned(),
                (false, Some(b)) => b.to_string(),
                (false, None) => "–".to_owned(),
            },
            st.last_lag.as_millis(),
            s.behind(st, now).as_millis(),
            st.listing_pause.as_millis(),
            st.closed,
            st.empty,
            st.errors,
            st.last_error
                .as_ref()
                .map_or(String::new(), |(at, e)| escape(&format!("{at}: {e}"))),
        );
    }
    html.push_str("</tbody></table></body></html>");
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bagel_proto::clock::ManualClock;

    /// A log idle in a listing pause is not "behind" until it is later
    /// than that pause too; the pause is exported; once the log is busy
    /// again the limit is the grace and a tick.
    #[test]
    fn readiness_allows_an_idle_logs_listing_pause_and_no_more() {
        let t = Micros::from_micros(1_900_000_000_000_000);
        let clock = ManualClock::new(t);
        let grace = Duration::from_secs(2);
        let log = "idle".to_owned();
        let s = MetronomeStatus::new(
            std::slice::from_ref(&log),
            "mem://",
            grace,
            Duration::from_secs(60),
            Arc::new(clock.clone()),
        );
        // Listed at t: every second whose close time had passed.
        let through = Bucket::from_secs(Bucket::of(t.saturating_sub(grace)).secs() - 1);
        s.caught_up(&log, through);
        assert_eq!(s.not_ready(), None);
        // 6 s on, not listed since: behind beyond grace + 1 s.
        clock.set(t.saturating_add(Duration::from_secs(6)));
        assert!(s.not_ready().is_some_and(|w| w.contains("\"idle\" is")));
        // ... unless it is idle with an 8 s pause: listed again by t + 8 s.
        s.listing_paused(&log, Duration::from_secs(8));
        assert_eq!(s.not_ready(), None);
        assert!(
            s.scrape()
                .contains("bagel_metronome_listing_pause_seconds{log=\"idle\"} 8.0"),
            "{}",
            s.scrape()
        );
        // Later than the pause too (its limit: 2 s grace + 1 s + 8 s).
        clock.set(t.saturating_add(Duration::from_secs(11)));
        assert_eq!(s.not_ready(), None);
        clock.set(t.saturating_add(Duration::from_secs(13)));
        assert!(s.not_ready().is_some_and(|w| w.contains("\"idle\" is")));
        // Busy again (the listing found a bag): the plain limit.
        clock.set(t.saturating_add(Duration::from_secs(6)));
        s.listing_paused(&log, Duration::ZERO);
        assert!(s.not_ready().is_some());
    }
}
