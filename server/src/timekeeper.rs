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
//!
//! In both modes a **wall-clock step** is a clock fault: the wall clock is
//! compared with the monotonic clock since start (`StepGuard`), and when
//! they diverge by more than `clock_tolerance` (someone set the clock, or
//! NTP stepped it) the server stops granting and signing time and says so
//! in readiness, in `ServerInfo`'s clock status and in its log, rather
//! than act on it: a forward step would break every live lease early, a
//! backward one stretch them. The fault clears if the clock comes back;
//! to accept the new time, restart the server (it then waits out the max
//! TTL, so no lease of the old time can overlap).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

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

/// Watches the wall clock against the monotonic clock: between the two,
/// only a step (a `settimeofday`, an NTP step) makes them diverge, since
/// NTP's slewing moves both alike.
#[derive(Debug)]
struct StepGuard {
    wall0: Micros,
    mono0: Instant,
    tolerance: Duration,
    /// Why the clock is faulty, while it is.
    fault: RwLock<Option<String>>,
}

impl StepGuard {
    fn new(wall0: Micros, mono0: Instant, tolerance: Duration) -> Self {
        StepGuard {
            wall0,
            mono0,
            tolerance,
            fault: RwLock::new(None),
        }
    }

    /// How far the wall clock has moved beyond (positive) or short of
    /// (negative) the monotonic clock since start, in microseconds.
    fn divergence_us(&self, wall: Micros, mono: Instant) -> i64 {
        let wall_moved = i128::from(wall.as_micros()) - i128::from(self.wall0.as_micros());
        let mono_moved = i128::from(duration_micros(mono.saturating_duration_since(self.mono0)));
        (wall_moved - mono_moved).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    /// Judges the clock at (`wall`, `mono`); returns whether the fault
    /// state changed.
    fn judge(&self, wall: Micros, mono: Instant) -> bool {
        let d = self.divergence_us(wall, mono);
        let faulty = d.unsigned_abs() > duration_micros(self.tolerance);
        let mut fault = self.fault.write().unwrap_or_else(|e| e.into_inner());
        if faulty == fault.is_some() {
            return false;
        }
        *fault = faulty.then(|| {
            format!(
                "clock fault: the wall clock stepped {} {:.3} s against the monotonic clock since start                  (tolerance {:?}); not granting nor signing time until it is back (restart the server to                  accept the new time: it then waits out the max TTL)",
                if d > 0 { "forward" } else { "back" },
                d.unsigned_abs() as f64 / 1e6,
                self.tolerance
            )
        });
        true
    }

    fn fault(&self) -> Option<String> {
        self.fault.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
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
    /// A wall-clock step is a clock fault.
    step: StepGuard,
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
        let step = StepGuard::new(clock.now(), Instant::now(), cfg.clock_tolerance);
        TimeKeeper {
            step,
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
        self.check_step()?;
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
        self.check_step()?;
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

    /// Judges the wall clock against the monotonic clock now, and refuses
    /// while it is stepped (see the module docs). Cheap: two clock reads,
    /// a lock taken for writing only when the verdict changes.
    fn check_step(&self) -> Result<(), Error> {
        self.watch_step_at(self.clock.now(), Instant::now());
        match self.step.fault() {
            None => Ok(()),
            Some(detail) => Err(Error::ClockUnhealthy { detail }),
        }
    }

    /// `TimeKeeper::check_step`'s judgement at (`wall`, `mono`), separate
    /// so that tests are exact: on a change, logs it and tells the health
    /// service.
    pub fn watch_step_at(&self, wall: Micros, mono: Instant) {
        if !self.step.judge(wall, mono) {
            return;
        }
        match self.step.fault() {
            Some(fault) => tracing::error!("refusing grants: {fault}"),
            None => {
                tracing::warn!("clock fault cleared: the wall clock is back in step with the monotonic clock")
            }
        }
        self.publish_health();
    }

    /// Healthy = no step fault and, with Roughtime, a healthy verdict.
    /// Returns whether it changed.
    fn publish_health(&self) -> bool {
        let healthy = self.step.fault().is_none()
            && self
                .roughtime
                .as_ref()
                .is_none_or(|r| r.monitor.verdict().is_healthy());
        self.healthy
            .send_if_modified(|h| std::mem::replace(h, healthy) != healthy)
    }

    /// Local mode: signs a fresh reading (not while the clock is stepped).
    pub fn refresh(&self) {
        if self.check_step().is_err() {
            return;
        }
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
        let _ = self.check_step();
        let changed = self.publish_health();
        if changed && self.step.fault().is_none() {
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
        if let Err(Error::ClockUnhealthy { detail }) = self.check_step() {
            return pb::ClockStatus {
                source: if self.roughtime.is_some() {
                    pb::TimeSource::Roughtime
                } else {
                    pb::TimeSource::Local
                }
                .into(),
                error_bound_us: u64::MAX,
                healthy: false,
                detail,
            };
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use bagel_proto::clock::ManualClock;

    const T: Micros = Micros::from_micros(1_900_000_000_000_000);

    fn keeper(clock: &ManualClock) -> TimeKeeper {
        let cfg = Config {
            clock_tolerance: Duration::from_millis(500),
            ..Config::default()
        };
        TimeKeeper::new(Arc::new(clock.clone()), Signer::generate(), &cfg)
    }

    #[test]
    fn a_wall_clock_step_beyond_the_tolerance_is_a_clock_fault_until_it_is_undone() {
        let clock = ManualClock::new(T);
        let tk = keeper(&clock);
        let health = tk.watch_health();
        let mono0 = tk.step.mono0;
        // Time passing alike on both clocks: healthy, granting, signing.
        clock.advance(Duration::from_secs(3));
        tk.watch_step_at(clock.now(), mono0 + Duration::from_secs(3));
        assert!(tk.step.fault().is_none());
        assert!(*health.borrow());
        // Within the tolerance (NTP-sized differences): still healthy.
        clock.advance(Duration::from_millis(400));
        tk.watch_step_at(clock.now(), mono0 + Duration::from_secs(3));
        assert!(tk.step.fault().is_none());
        // A forward step of 30 s with no monotonic time passing: a fault.
        clock.advance(Duration::from_secs(30));
        tk.watch_step_at(clock.now(), mono0 + Duration::from_secs(3));
        let fault = tk.step.fault().expect("a 30 s step is a fault");
        assert!(fault.contains("stepped forward 30.400 s"), "{fault}");
        assert!(!*health.borrow(), "readiness follows the fault");
        // Stepped back to where it belongs: the fault clears.
        clock.set(T.saturating_add(Duration::from_secs(3)));
        tk.watch_step_at(clock.now(), mono0 + Duration::from_secs(3));
        assert!(tk.step.fault().is_none());
        assert!(*health.borrow());
        // A backward step is a fault too.
        clock.set(T);
        tk.watch_step_at(clock.now(), mono0 + Duration::from_secs(3));
        let fault = tk.step.fault().expect("a 3 s step back is a fault");
        assert!(fault.contains("stepped back 3.000 s"), "{fault}");
    }

    #[test]
    fn a_stepped_clock_refuses_grants_and_signed_time_and_says_so_in_its_status() {
        let clock = ManualClock::new(T);
        let tk = keeper(&clock);
        assert!(tk.check().is_ok());
        assert!(tk.signed().is_ok());
        // The step happens on the wall clock only; the real monotonic
        // clock has moved by microseconds.
        clock.advance(Duration::from_secs(60));
        let e = tk.check().unwrap_err();
        assert!(e.to_string().contains("clock fault"), "{e}");
        assert!(tk.signed().is_err(), "no signed time from a stepped clock");
        let status = tk.status();
        assert!(!status.healthy);
        assert!(status.detail.contains("stepped forward 60."), "{}", status.detail);
        let before = tk.current.read().unwrap().time;
        tk.refresh();
        assert_eq!(
            tk.current.read().unwrap().time,
            before,
            "nothing re-signed while stepped"
        );
    }
}
