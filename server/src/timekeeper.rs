//! The server's clock, its health, and the signed time it attaches to
//! witnesses.
//!
//! Two modes:
//!
//! * **Roughtime** (servers configured): a background task asks the
//!   Roughtime servers every `roughtime_refresh`; the latest verified
//!   exchange is the signed time of every witness (`self_timed = false`) and
//!   of `SignedNow`, and it measures this server's clock. The server grants
//!   only while that clock is within tolerance ([`TimeKeeper::check`]):
//!   not before the first answer, not when the clock is off by more than
//!   `clock_tolerance` + the Roughtime radius + RTT/2, and not when the last
//!   answer is older than `roughtime_max_age`.
//! * **Local time agent** (no Roughtime): the server signs its own clock
//!   readings. The signature does not make the reading true; it makes an
//!   innocent mistake (a timestamp far in the future with a valid
//!   signature) implausible, and it tells an auditor which server vouched
//!   for the time. Every witness says `self_timed`. Signing costs tens of
//!   microseconds, so the reading is re-signed every `signed_time_refresh`
//!   rather than per grant.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bagel_proto::authority::monitor::{ClockMonitor, Verdict};
use bagel_proto::authority::querier::Querier;
use bagel_proto::clock::Clock;
use bagel_proto::signed_time::roughtime::RoughtimeKey;
use bagel_proto::{Micros, Signer, TimeProofKind, duration_micros, pb, sign_local_time};
use tokio::sync::watch;

use crate::config::Config;
use crate::error::Error;

/// A signed reading and the time it states.
#[derive(Debug)]
pub struct SignedReading {
    pub time: Micros,
    pub radius_us: u64,
    pub signed: pb::SignedTime,
    pub source: TimeProofKind,
}

#[derive(Debug)]
struct Roughtime {
    querier: Querier,
    monitor: ClockMonitor,
    /// The latest exchange as a reading for witnesses; `None` until the
    /// first answer. Same locking rule as `TimeKeeper::current`.
    current: RwLock<Option<Arc<SignedReading>>>,
}

#[derive(Debug)]
pub struct TimeKeeper {
    clock: Arc<dyn Clock>,
    signer: Signer,
    server_id: String,
    radius_us: u64,
    /// Local mode: replaced wholesale on refresh; readers clone the `Arc`
    /// and drop the lock at once (never held across `.await`).
    current: RwLock<Arc<SignedReading>>,
    roughtime: Option<Roughtime>,
    /// Whether the clock is healthy, for the health service.
    healthy: watch::Sender<bool>,
    /// Roughtime queries answered and failed, for `/metrics`.
    pub roughtime_outcomes: [AtomicU64; 2],
}

impl TimeKeeper {
    pub fn new(clock: Arc<dyn Clock>, signer: Signer, cfg: &Config) -> Self {
        let radius_us = duration_micros(cfg.clock_tolerance);
        let first = Self::sign(&*clock, &signer, &cfg.server_id, radius_us);
        let roughtime = (!cfg.roughtime.is_empty()).then(|| Roughtime {
            querier: Querier::new(cfg.roughtime.clone(), Arc::clone(&clock)).with_config(cfg.roughtime_query),
            monitor: ClockMonitor::new(Arc::clone(&clock), cfg.clock_tolerance, cfg.roughtime_max_age),
            current: RwLock::new(None),
        });
        let (healthy, _) = watch::channel(roughtime.is_none());
        TimeKeeper {
            clock,
            signer,
            server_id: cfg.server_id.clone(),
            radius_us,
            current: RwLock::new(Arc::new(first)),
            roughtime,
            healthy,
            roughtime_outcomes: Default::default(),
        }
    }

    fn sign(clock: &dyn Clock, signer: &Signer, server_id: &str, radius_us: u64) -> SignedReading {
        let time = clock.now();
        SignedReading {
            time,
            radius_us,
            signed: sign_local_time(signer, server_id, time, radius_us),
            source: TimeProofKind::Local,
        }
    }

    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn uses_roughtime(&self) -> bool {
        self.roughtime.is_some()
    }

    /// The Roughtime keys signed times are checked against (empty in local
    /// mode).
    pub fn roughtime_keys(&self) -> Vec<RoughtimeKey> {
        self.roughtime
            .as_ref()
            .map(|r| r.querier.trusted_keys())
            .unwrap_or_default()
    }

    /// The latest signed reading: a Roughtime exchange, or our own signed
    /// clock. Unavailable only in Roughtime mode before the first answer.
    pub fn signed(&self) -> Result<Arc<SignedReading>, Error> {
        match &self.roughtime {
            Some(r) => r
                .current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .ok_or_else(|| Error::ClockUnhealthy {
                    detail: r.monitor.verdict().to_string(),
                }),
            None => Ok(Arc::clone(
                &self.current.read().unwrap_or_else(|e| e.into_inner()),
            )),
        }
    }

    /// Refuses (UNAVAILABLE, saying why) when this server must not grant
    /// because its clock is not known to be right.
    pub fn check(&self) -> Result<(), Error> {
        let Some(r) = &self.roughtime else {
            return Ok(());
        };
        match r.monitor.verdict() {
            Verdict::Healthy { .. } => Ok(()),
            v => Err(Error::ClockUnhealthy {
                detail: v.to_string(),
            }),
        }
    }

    /// Local mode: signs a fresh reading.
    pub fn refresh(&self) {
        let next = Arc::new(Self::sign(
            &*self.clock,
            &self.signer,
            &self.server_id,
            self.radius_us,
        ));
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = next;
    }

    /// Roughtime mode: asks the Roughtime servers once (with the querier's
    /// retries) and records the outcome. Returns the verdict after it.
    pub async fn refresh_roughtime(&self) -> Option<Verdict> {
        let r = self.roughtime.as_ref()?;
        let outcome = r.querier.query().await;
        self.roughtime_outcomes[usize::from(outcome.is_err())].fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(m) => {
                let reading = Arc::new(SignedReading {
                    time: m.reading.time,
                    radius_us: m.reading.radius_us,
                    signed: m.signed.clone(),
                    source: TimeProofKind::Roughtime,
                });
                r.monitor.record(Ok(m));
                *r.current.write().unwrap_or_else(|e| e.into_inner()) = Some(reading);
            }
            Err(e) => {
                tracing::warn!(error = %e, "roughtime refresh failed");
                r.monitor.record(Err(e.to_string()));
            }
        }
        let verdict = r.monitor.verdict();
        let healthy = verdict.is_healthy();
        let changed = self
            .healthy
            .send_if_modified(|h| std::mem::replace(h, healthy) != healthy);
        if changed {
            if healthy {
                tracing::info!("{verdict}");
            } else {
                tracing::error!("refusing grants: {verdict}");
            }
        }
        Some(verdict)
    }

    /// The Roughtime clock monitor (`None` in local mode), for operators:
    /// its verdict has the measured offset and the age of the last answer.
    pub fn roughtime_monitor(&self) -> Option<&ClockMonitor> {
        self.roughtime.as_ref().map(|r| &r.monitor)
    }

    /// Follows clock health (always healthy in local mode).
    pub fn watch_health(&self) -> watch::Receiver<bool> {
        self.healthy.subscribe()
    }

    pub fn status(&self) -> pb::ClockStatus {
        match &self.roughtime {
            None => pb::ClockStatus {
                source: pb::TimeSource::Local.into(),
                error_bound_us: self.radius_us,
                healthy: true,
                detail: "local time agent: this server signs its own clock readings; no external \
                         time authority is configured"
                    .into(),
            },
            Some(r) => {
                let v = r.monitor.verdict();
                pb::ClockStatus {
                    source: pb::TimeSource::Roughtime.into(),
                    error_bound_us: v.error_bound().map(duration_micros).unwrap_or(u64::MAX),
                    healthy: v.is_healthy(),
                    detail: v.to_string(),
                }
            }
        }
    }
}
