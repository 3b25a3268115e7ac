//! `/metrics`: the server's numbers in the classic Prometheus text format,
//! or in OpenMetrics when the scraper's `Accept` asks for it (Prometheus
//! does); see [`bagel_proto::exposition`] for why both.
//!
//! The text is written by `prometheus-client` (the official Rust client):
//! names, escaping, `# HELP`/`# TYPE`/`# UNIT` lines, `_total` and unit
//! suffixes and `# EOF` are its business, and `exposition` turns its
//! OpenMetrics into the classic format. The numbers come from atomics and
//! a table census read at scrape time (see `crate::meter` and
//! `crate::table::stats` for why no metric object sits on the lease path),
//! handed to the encoder as one [`Collector`] per scrape.
//!
//! Label values come from small fixed sets (mode, method, status code,
//! batch operation, Roughtime outcome) and the server's own identity: a
//! lease name, owner or id is never a label.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bagel_proto::exposition::Format;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::{Http, Snapshot};
use crate::meter::{CODES, Histo, Method, Op, code_name};
use crate::table::ByMode;

pub(super) async fn scrape(State(state): State<Arc<Http>>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let Some(snapshot) = state.snapshot(super::Reuse::Fresh).await else {
        return super::shutting_down();
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Exposition { state, snapshot }));
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, format.content_type()),
                (header::CACHE_CONTROL, "no-store"),
                // Caches must not answer one format's request with the other.
                (header::VARY, "accept"),
            ],
            format.render(body),
        )
            .into_response(),
        Err(e) => super::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding failed: {e}\n"),
        ),
    }
}

/// One scrape's numbers.
#[derive(Debug)]
struct Exposition {
    state: Arc<Http>,
    snapshot: Snapshot,
}

type Enc<'a> = DescriptorEncoder<'a>;

fn counter(enc: &mut Enc<'_>, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> fmt::Result {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, unit, MetricType::Counter)?)
}

fn gauge<V: EncodeGaugeValue>(
    enc: &mut Enc<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: V,
) -> fmt::Result {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, unit, MetricType::Gauge)?)
}

fn flag(enc: &mut Enc<'_>, name: &str, help: &str, v: bool) -> fmt::Result {
    gauge(enc, name, help, None, i64::from(v))
}

/// A counter or gauge with a `mode` label.
fn by_mode(enc: &mut Enc<'_>, name: &str, help: &str, ty: MetricType, v: ByMode) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    for (mode, n) in [("full", v.full), ("tentative", v.tentative)] {
        let labels = [("mode", mode)];
        let fm = m.encode_family(&labels)?;
        match ty {
            MetricType::Counter => ConstCounter::new(n).encode(fm)?,
            _ => ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(fm)?,
        }
    }
    Ok(())
}

/// Encodes a histogram series (bounds and sum scaled by `scale`).
fn histogram(m: &mut prometheus_client::encoding::MetricEncoder<'_>, h: &Histo, scale: f64) -> fmt::Result {
    let (sum, count, buckets) = h.snapshot(scale);
    m.encode_histogram::<NoLabelSet>(
        sum,
        count,
        &buckets,
        None::<&HashMap<usize, Exemplar<NoLabelSet, f64>>>,
    )
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let e = &mut enc;
        let s = &self.snapshot;
        let inner = &*self.state.inner;
        let cfg = &inner.cfg;

        // Identity.
        {
            let source = if inner.time.uses_roughtime() {
                "roughtime"
            } else {
                "local"
            };
            let labels = [
                ("version", env!("CARGO_PKG_VERSION")),
                ("server_id", cfg.server_id.as_str()),
                ("key_id", inner.witness.signer.key_id()),
                ("time_source", source),
            ];
            let mut m = e.encode_descriptor(
                "bagel_server",
                "This server: version, id, signing key id and where its signed time comes from.",
                None,
                MetricType::Info,
            )?;
            m.encode_info(&labels)?;
        }

        // Lease life cycle.
        let c = &s.counts;
        by_mode(
            e,
            "bagel_grants",
            "Leases granted by an acquire (unary, Batch or Session), by mode.",
            MetricType::Counter,
            c.grants,
        )?;
        by_mode(
            e,
            "bagel_conflicts",
            "Acquires refused because a name was held (their final answer: a waiting acquire that \
             got the name is a grant), by requested mode.",
            MetricType::Counter,
            {
                let (full, tentative) = inner.meters.conflicts();
                ByMode { full, tentative }
            },
        )?;
        counter(
            e,
            "bagel_upgrades",
            "Tentative leases upgraded to full.",
            None,
            c.upgrades,
        )?;
        counter(e, "bagel_renewals", "Successful renewals.", None, c.renewals)?;
        by_mode(
            e,
            "bagel_releases",
            "Leases released by their holder, by mode.",
            MetricType::Counter,
            c.releases,
        )?;
        by_mode(
            e,
            "bagel_breaks",
            "Names taken from a holder: mode=full, a holder that missed its deadline without \
             releasing (its successor inherits the deadline as watermark and closes its bags); \
             mode=tentative, a live tentative holder preempted by a full acquire.",
            MetricType::Counter,
            c.breaks,
        )?;
        by_mode(
            e,
            "bagel_expiries",
            "Leases whose deadline passed without a release, by mode (exact at scrape time, \
             whether or not anyone has touched the name since).",
            MetricType::Counter,
            s.census.expiries,
        )?;
        by_mode(
            e,
            "bagel_leases_held",
            "Live leases, by mode.",
            MetricType::Gauge,
            s.census.held_leases,
        )?;
        by_mode(
            e,
            "bagel_names_held",
            "Names held by a live lease, by the lease's mode.",
            MetricType::Gauge,
            s.census.held_names,
        )?;
        gauge(
            e,
            "bagel_names_known",
            "Name records kept in memory (held or idle); idle ones beyond --max-records are forgotten.",
            None,
            i64::try_from(s.census.names).unwrap_or(i64::MAX),
        )?;
        counter(
            e,
            "bagel_status_census_scans",
            "Scans of the whole table for the status page and scrapes (the status page \
             reuses one for --status-interval, whatever the number of viewers).",
            None,
            self.state.census_scans.load(std::sync::atomic::Ordering::Relaxed),
        )?;
        gauge(
            e,
            "bagel_waiters",
            "Acquires waiting server-side for a busy name.",
            None,
            i64::try_from(s.waiters).unwrap_or(i64::MAX),
        )?;
        counter(
            e,
            "bagel_forgotten_floor_raises",
            "Times forgetting idle name records raised the forgotten floor.",
            None,
            inner.table.floor_raises(),
        )?;
        gauge(
            e,
            "bagel_forgotten_floor_timestamp",
            "The forgotten floor: the watermark a name with no record inherits (Unix time).",
            Some(&Unit::Seconds),
            inner.table.forgotten_floor().as_micros() as f64 / 1e6,
        )?;
        gauge(
            e,
            "bagel_history",
            "Renew/release history kept (its budgeted weight).",
            Some(&Unit::Bytes),
            i64::try_from(s.census.history_bytes).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            "bagel_history_budget",
            "The history budget; the oldest entries go beyond it.",
            Some(&Unit::Bytes),
            i64::try_from(cfg.history_budget_bytes).unwrap_or(i64::MAX),
        )?;

        // Requests.
        {
            let mut m = e.encode_descriptor(
                "bagel_rpc_duration",
                "Unary lease-service calls by method and gRPC status code: time from the request \
                 reaching the service to its answer (an acquire's server-side wait included).",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for method in Method::ALL {
                for code in 0..CODES {
                    let h = inner.meters.rpc_histo(method, code);
                    if h.count() == 0 {
                        continue;
                    }
                    let labels = [("method", method.name()), ("code", code_name(code))];
                    histogram(&mut m.encode_family(&labels)?, h, 1e-9)?;
                }
            }
        }
        {
            let mut m = e.encode_descriptor(
                "bagel_batch_ops",
                "Operations inside Batch calls and Session streams, by operation and gRPC status code.",
                None,
                MetricType::Counter,
            )?;
            for op in Op::ALL {
                for code in 0..CODES {
                    let n = inner.meters.op_count(op, code);
                    if n > 0 {
                        let labels = [("op", op.name()), ("code", code_name(code))];
                        ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
                    }
                }
            }
        }
        histogram(
            &mut e.encode_descriptor(
                "bagel_batch_size",
                "Operations per Batch call, or per group of Session requests run together.",
                None,
                MetricType::Histogram,
            )?,
            &inner.meters.batch_sizes,
            1.0,
        )?;
        histogram(
            &mut e.encode_descriptor(
                "bagel_signature_group_size",
                "Witnesses signed with one ed25519 signature (1: a lone witness; more: a Merkle batch).",
                None,
                MetricType::Histogram,
            )?,
            &inner.witness.group_sizes,
            1.0,
        )?;
        gauge(
            e,
            "bagel_sessions_open",
            "Session streams open.",
            None,
            inner.meters.sessions_open(),
        )?;
        {
            let answers = &inner.frames.answers;
            gauge(
                e,
                "bagel_unread_answers",
                "Unary answers made and not yet taken by their clients, and bytes reserved for \
                 answers not yet made, over all connections.",
                Some(&Unit::Bytes),
                i64::try_from(answers.held()).unwrap_or(i64::MAX),
            )?;
            counter(
                e,
                "bagel_unread_answers_refused",
                "Calls refused because their connection, or the server, held too many unread \
                 answers (--max-unread-answer-bytes-per-connection, --max-unread-answer-bytes).",
                None,
                answers.refused(),
            )?;
            counter(
                e,
                "bagel_unread_answers_closed",
                "Connections closed for leaving their answers unread (--answer-stall-timeout).",
                None,
                answers.closed(),
            )?;
            gauge(
                e,
                "bagel_list_turns_waiting",
                "List calls waiting for a page turn (--list-pages), over all identities.",
                None,
                i64::try_from(inner.list_turns.waiting()).unwrap_or(i64::MAX),
            )?;
            let (light, turned) = inner.light.reads();
            counter(
                e,
                "bagel_list_reads_light",
                "List pages (and side-port searches) read at once on the light lane: their \
                 identity had no other read in flight and has read little lately.",
                None,
                light,
            )?;
            counter(
                e,
                "bagel_list_reads_turned",
                "List pages (and side-port searches) that waited for a page turn and were read \
                 at the readers' lower CPU priority.",
                None,
                turned,
            )?;
            let paused = inner
                .list_paused_micros
                .load(std::sync::atomic::Ordering::Relaxed);
            ConstCounter::new(paused as f64 / 1e6).encode(e.encode_descriptor(
                "bagel_list_paused",
                "Time page turns stayed idle after reads in turn while grants or renewals were \
                 being made (--list-share-while-granting).",
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?)?;
        }
        {
            use std::sync::atomic::Ordering::Relaxed;
            let hub = inner.table.watch_hub();
            let w = hub.stats();
            let (events, bytes) = hub.retained();
            gauge(
                e,
                "bagel_watchers",
                "Watch streams open.",
                None,
                hub.watchers() as i64,
            )?;
            gauge(
                e,
                "bagel_watch_tracked_leases",
                "Live leases the watch hub tracks for their expiry while anyone watches or \
                 listed within the linger (read from the table a few shards per tick after it wakes).",
                None,
                hub.tracked() as i64,
            )?;
            counter(
                e,
                "bagel_watch_dispatched",
                "Watchers an event was queued for (found through the name and prefix index: \
                 a watcher of other names costs an event nothing).",
                None,
                w.dispatched.load(Relaxed),
            )?;
            counter(
                e,
                "bagel_watch_overflowed",
                "Watchers dropped for falling behind (--watch-buffer, or a resume the retained \
                 events moved past).",
                None,
                w.overflowed.load(Relaxed),
            )?;
            counter(
                e,
                "bagel_watch_stalled",
                "Watchers ended for reading nothing they were owed for --watch-stall-timeout.",
                None,
                w.stalled.load(Relaxed),
            )?;
            gauge(
                e,
                "bagel_watch_retained_events",
                "Events kept for resuming (--watch-retain), one copy for all watchers.",
                None,
                events as i64,
            )?;
            gauge(
                e,
                "bagel_watch_retained",
                "Bytes of the events kept for resuming (--watch-retain-bytes).",
                Some(&Unit::Bytes),
                bytes as i64,
            )?;
        }

        // Readiness and time.
        flag(
            e,
            "bagel_ready",
            "1 when the lease service grants (its gRPC health is SERVING), as /readyz.",
            s.not_ready.is_none(),
        )?;
        gauge(
            e,
            "bagel_restart_wait_remaining",
            "Time left before a freshly started server grants (0 once over).",
            Some(&Unit::Seconds),
            s.restart_wait_left().as_secs_f64(),
        )?;
        let clock = inner.time.status();
        flag(
            e,
            "bagel_clock_healthy",
            "1 when this server's clock is known to be right (always, as local time agent).",
            clock.healthy,
        )?;
        if clock.error_bound_us != u64::MAX {
            gauge(
                e,
                "bagel_clock_error_bound",
                "How far this server's clock may be off: the Roughtime radius plus half the round \
                 trip, or the configured tolerance as local time agent.",
                Some(&Unit::Seconds),
                clock.error_bound_us as f64 / 1e6,
            )?;
        }
        if let Some(monitor) = inner.time.roughtime_monitor() {
            let verdict = monitor.verdict();
            if let Some(offset) = verdict.offset_us() {
                gauge(
                    e,
                    "bagel_clock_offset",
                    "This server's clock minus Roughtime's, at the last answer (kept honest since \
                     with the monotonic clock).",
                    Some(&Unit::Seconds),
                    offset as f64 / 1e6,
                )?;
            }
            if let Some(age) = monitor.age() {
                gauge(
                    e,
                    "bagel_roughtime_last_answer_age",
                    "Time since the last verified Roughtime answer.",
                    Some(&Unit::Seconds),
                    age.as_secs_f64(),
                )?;
            }
            let mut m = e.encode_descriptor(
                "bagel_roughtime_queries",
                "Roughtime queries (each with its retries), by outcome.",
                None,
                MetricType::Counter,
            )?;
            for (outcome, i) in [("ok", 0), ("error", 1)] {
                let n = inner.time.roughtime_outcomes[i].load(std::sync::atomic::Ordering::Relaxed);
                ConstCounter::new(n).encode(m.encode_family(&[("outcome", outcome)])?)?;
            }
        }

        // The process.
        let p = &s.process;
        if let Some(v) = p.resident_bytes {
            gauge(
                e,
                "process_resident_memory",
                "Resident memory size.",
                Some(&Unit::Bytes),
                v as f64,
            )?;
        }
        if let Some(v) = p.virtual_bytes {
            gauge(
                e,
                "process_virtual_memory",
                "Virtual memory size.",
                Some(&Unit::Bytes),
                v as f64,
            )?;
        }
        if let Some(v) = p.cpu {
            ConstCounter::new(v.as_secs_f64()).encode(e.encode_descriptor(
                "process_cpu",
                "User and system CPU time spent.",
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?)?;
        }
        if let Some(v) = p.threads {
            gauge(e, "process_threads", "OS threads.", None, v as f64)?;
        }
        if let Some(v) = p.open_fds {
            gauge(e, "process_open_fds", "Open file descriptors.", None, v as f64)?;
        }
        if let Some(v) = p.max_fds {
            gauge(
                e,
                "process_max_fds",
                "The limit on open file descriptors.",
                None,
                v as f64,
            )?;
        }
        gauge(
            e,
            "process_start_time",
            "When this server started (Unix time).",
            Some(&Unit::Seconds),
            inner.table.config().started.as_micros() as f64 / 1e6,
        )?;
        let others = vec![
            ("queued_lists", inner.list_turns.usage()),
            ("unread_answer_bytes", inner.frames.answers.identity_usage()),
        ];
        crate::shares::encode_metrics(&inner.shares, others, e)?;
        if let Some(acl) = &inner.acl {
            crate::acl::encode_metrics(acl, e)?;
        }
        Ok(())
    }
}
