//! How far off is the local clock? Measurements against a time authority
//! and the verdict a process acts on.
//!
//! A [`Measurement`] is one exchange with an authority (a Roughtime server,
//! or a lease server's `SignedNow`): the verified signed time, the local
//! clock when the request left, and the round trip. The authority vouches
//! that true time was within `reading.time ± radius` at some instant during
//! the round trip, so the local clock's error is
//!
//! ```text
//! offset      = local midpoint of the round trip − signed time
//! uncertainty = radius + RTT/2
//! ```
//!
//! and the local clock is **off** when `|offset| > tolerance + uncertainty`,
//! i.e. when it lies outside `[time − radius − tolerance − RTT/2, time +
//! radius + tolerance + RTT/2]`. With the 5 s radius of a `roughenough` 2.2
//! server a correct clock always passes, and a clock off by more than
//! radius + tolerance never does.
//!
//! A [`ClockMonitor`] keeps the latest measurement and turns it into a
//! [`Verdict`] on demand. Between measurements it keeps the offset honest by
//! comparing how far the wall clock moved with how far the monotonic clock
//! moved, so a clock step right after a good measurement is still caught.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::signed_time::TimeReading;
use crate::{Micros, duration_micros, pb};

/// One verified exchange with a time authority.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// Who vouched, for messages: `roughtime 127.0.0.1:2002`, `lease server …`.
    pub source: String,
    /// The verified content of `signed`.
    pub reading: TimeReading,
    /// The granularity of `reading.time` (1 s for RFC Roughtime).
    pub resolution: Duration,
    /// The proof, as attached to witnesses and messages.
    pub signed: pb::SignedTime,
    /// The local clock just before the (first) request left.
    pub sent_at: Micros,
    /// From the first send to the answer, on the monotonic clock.
    pub rtt: Duration,
    /// When the answer arrived, on the monotonic clock.
    pub received: Instant,
    /// When the answer arrived, on the local clock.
    pub received_at: Micros,
}

impl Measurement {
    /// The local clock at the middle of the round trip.
    pub fn local_midpoint(&self) -> Micros {
        self.sent_at.saturating_add(self.rtt / 2)
    }

    /// Local clock minus signed time at the exchange, in microseconds:
    /// positive when the local clock is ahead.
    pub fn offset_us(&self) -> i64 {
        signed_diff(self.local_midpoint(), self.reading.time)
    }

    /// The authority's own uncertainty about its time (its `RADI`).
    pub fn radius(&self) -> Duration {
        Duration::from_micros(self.reading.radius_us)
    }

    /// How far true time may be from the signed time as seen locally:
    /// radius + RTT/2.
    pub fn uncertainty(&self) -> Duration {
        self.radius() + self.rtt / 2
    }
}

fn signed_diff(a: Micros, b: Micros) -> i64 {
    let d = i128::from(a.as_micros()) - i128::from(b.as_micros());
    d.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn secs(us: i64) -> String {
    format!("{:.3} s", us as f64 / 1e6)
}

fn dur(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.3} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

/// What a process should do about its clock right now.
#[derive(Clone, Debug)]
pub enum Verdict {
    /// Within tolerance: grant, write and close on this clock.
    Healthy {
        /// The exchange the verdict rests on.
        measurement: Arc<Measurement>,
        /// Local minus authority time now, in µs (positive: local ahead),
        /// corrected for any wall-clock step since the exchange.
        offset_us: i64,
        /// The largest `|offset_us|` that passes: `tolerance` plus the
        /// exchange's uncertainty (radius + RTT/2).
        allowed: Duration,
        /// The configured tolerance, beyond the authority's uncertainty.
        tolerance: Duration,
    },
    /// Off by more than tolerance + uncertainty: refuse to grant or write.
    Off {
        /// The exchange the verdict rests on.
        measurement: Arc<Measurement>,
        /// Local minus authority time now, in µs (positive: local ahead).
        offset_us: i64,
        /// The largest `|offset_us|` that would have passed.
        allowed: Duration,
        /// The configured tolerance, beyond the authority's uncertainty.
        tolerance: Duration,
    },
    /// The latest good answer is too old to vouch for the clock now.
    Stale {
        /// The last good exchange (still shown, no longer trusted).
        measurement: Arc<Measurement>,
        /// How long ago it arrived, on the monotonic clock.
        age: Duration,
        /// The configured limit `age` passed.
        max_age: Duration,
        /// Why the refreshes since failed, if one did.
        last_error: Option<String>,
    },
    /// No good answer yet.
    NoAnswer {
        /// Why the refreshes so far failed, if one finished.
        last_error: Option<String>,
    },
}

impl Verdict {
    /// Whether the process may act on its clock now: only
    /// [`Verdict::Healthy`] lets it.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Verdict::Healthy { .. })
    }

    /// `|offset| + uncertainty`: how far the local clock may be from true
    /// time, given the authority. `None` without a measurement.
    pub fn error_bound(&self) -> Option<Duration> {
        match self {
            Verdict::Healthy {
                measurement,
                offset_us,
                ..
            }
            | Verdict::Off {
                measurement,
                offset_us,
                ..
            } => Some(Duration::from_micros(offset_us.unsigned_abs()) + measurement.uncertainty()),
            Verdict::Stale { measurement, .. } => Some(
                Duration::from_micros(measurement.offset_us().unsigned_abs()) + measurement.uncertainty(),
            ),
            Verdict::NoAnswer { .. } => None,
        }
    }

    /// The exchange the verdict rests on; `None` before the first answer.
    pub fn measurement(&self) -> Option<&Arc<Measurement>> {
        match self {
            Verdict::Healthy { measurement, .. }
            | Verdict::Off { measurement, .. }
            | Verdict::Stale { measurement, .. } => Some(measurement),
            Verdict::NoAnswer { .. } => None,
        }
    }

    /// The current offset (local − authority), when measured and fresh.
    pub fn offset_us(&self) -> Option<i64> {
        match self {
            Verdict::Healthy { offset_us, .. } | Verdict::Off { offset_us, .. } => Some(*offset_us),
            _ => None,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Healthy {
                measurement: m,
                offset_us,
                allowed,
                tolerance,
            }
            | Verdict::Off {
                measurement: m,
                offset_us,
                allowed,
                tolerance,
            } => {
                let (state, verb) = if self.is_healthy() {
                    ("clock ok", "within")
                } else {
                    ("clock is off", "more than")
                };
                let side = if *offset_us >= 0 { "ahead of" } else { "behind" };
                write!(
                    f,
                    "{state}: local clock {} {side} {} (signed time {}, radius {}, RTT {}), {verb} the {} allowed \
                     (tolerance {} + radius + RTT/2)",
                    secs(offset_us.abs()),
                    m.source,
                    m.reading.time,
                    dur(m.radius()),
                    dur(m.rtt),
                    dur(*allowed),
                    dur(*tolerance),
                )
            }
            Verdict::Stale {
                measurement,
                age,
                max_age,
                last_error,
            } => {
                write!(
                    f,
                    "no recent signed time: the last answer from {} is {} old (max {})",
                    measurement.source,
                    dur(*age),
                    dur(*max_age)
                )?;
                if let Some(e) = last_error {
                    write!(f, "; last error: {e}")?;
                }
                Ok(())
            }
            Verdict::NoAnswer { last_error } => {
                write!(f, "no signed time yet")?;
                if let Some(e) = last_error {
                    write!(f, ": {e}")?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    latest: Option<Arc<Measurement>>,
    /// The error of the latest failed refresh, cleared by a success.
    last_error: Option<String>,
}

/// The latest measurement of one process's clock and the verdict on it.
#[derive(Debug)]
pub struct ClockMonitor {
    clock: Arc<dyn Clock>,
    tolerance: Duration,
    max_age: Duration,
    /// Replaced on every refresh; readers copy what they need and drop the
    /// lock at once (never held across `.await`).
    state: RwLock<State>,
}

impl ClockMonitor {
    /// `tolerance`: how far off the local clock may be beyond the
    /// authority's own uncertainty. `max_age`: how old the latest good
    /// answer may be before the verdict turns [`Verdict::Stale`].
    pub fn new(clock: Arc<dyn Clock>, tolerance: Duration, max_age: Duration) -> Self {
        ClockMonitor {
            clock,
            tolerance,
            max_age,
            state: RwLock::new(State::default()),
        }
    }

    /// The local clock being judged.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// How far off the clock may be beyond the authority's uncertainty.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Records the outcome of one refresh. A failure keeps the previous
    /// good measurement (it ages into [`Verdict::Stale`]).
    pub fn record(&self, outcome: Result<Measurement, String>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(m) => {
                state.latest = Some(Arc::new(m));
                state.last_error = None;
            }
            Err(e) => state.last_error = Some(e),
        }
    }

    /// The latest good measurement, however old; `None` before the first.
    pub fn latest(&self) -> Option<Arc<Measurement>> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .latest
            .clone()
    }

    /// How old the latest good answer is (monotonic), if any.
    pub fn age(&self) -> Option<Duration> {
        self.latest().map(|m| m.received.elapsed())
    }

    /// The verdict now.
    pub fn verdict(&self) -> Verdict {
        self.verdict_at(self.clock.now(), Instant::now())
    }

    /// The verdict at local time `wall`, monotonic time `mono` (both "now";
    /// separate so that tests are exact).
    pub fn verdict_at(&self, wall: Micros, mono: Instant) -> Verdict {
        let (latest, last_error) = {
            let state = self.state.read().unwrap_or_else(|e| e.into_inner());
            (state.latest.clone(), state.last_error.clone())
        };
        let Some(m) = latest else {
            return Verdict::NoAnswer { last_error };
        };
        let age = mono.saturating_duration_since(m.received);
        if age > self.max_age {
            return Verdict::Stale {
                measurement: m,
                age,
                max_age: self.max_age,
                last_error,
            };
        }
        // A wall-clock step since the measurement shows as the wall clock
        // moving more (or less) than the monotonic clock did.
        let wall_moved = signed_diff(wall, m.received_at);
        let mono_moved = i64::try_from(duration_micros(age)).unwrap_or(i64::MAX);
        let offset_us = m
            .offset_us()
            .saturating_add(wall_moved.saturating_sub(mono_moved));
        let allowed = self.tolerance + m.uncertainty();
        if offset_us.unsigned_abs() > duration_micros(allowed) {
            Verdict::Off {
                measurement: m,
                offset_us,
                allowed,
                tolerance: self.tolerance,
            }
        } else {
            Verdict::Healthy {
                measurement: m,
                offset_us,
                allowed,
                tolerance: self.tolerance,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::signed_time::TimeProofKind;

    fn measurement(local: Micros, signed: Micros, radius: Duration, rtt: Duration) -> Measurement {
        Measurement {
            source: "test authority".into(),
            reading: TimeReading {
                time: signed,
                radius_us: duration_micros(radius),
                source: TimeProofKind::Roughtime,
            },
            resolution: Duration::from_secs(1),
            signed: pb::SignedTime::default(),
            sent_at: local.saturating_sub(rtt / 2),
            rtt,
            received: Instant::now(),
            received_at: local.saturating_add(rtt / 2),
        }
    }

    const T: Micros = Micros::from_micros(1_800_000_000_000_000);

    fn monitor(clock: &ManualClock) -> ClockMonitor {
        ClockMonitor::new(
            Arc::new(clock.clone()),
            Duration::from_millis(500),
            Duration::from_secs(3600),
        )
    }

    #[test]
    fn the_boundary_is_tolerance_plus_radius_plus_half_rtt() {
        let radius = Duration::from_secs(5);
        let rtt = Duration::from_millis(2);
        // allowed = 0.5 s + 5 s + 1 ms
        for (offset_us, healthy) in [
            (0i64, true),
            (5_501_000, true),
            (-5_501_000, true),
            (5_501_001, false),
            (-5_501_001, false),
            (20_000_000, false),
        ] {
            let local = Micros::from_micros(T.as_micros().saturating_add_signed(offset_us));
            let clock = ManualClock::new(local.saturating_add(rtt / 2));
            let mon = monitor(&clock);
            let m = measurement(local, T, radius, rtt);
            let at = m.received;
            mon.record(Ok(m));
            let v = mon.verdict_at(clock.now(), at);
            assert_eq!(v.is_healthy(), healthy, "offset {offset_us} us: {v}");
            assert_eq!(v.offset_us(), Some(offset_us));
        }
    }

    #[test]
    fn says_why_and_by_how_much() {
        let clock = ManualClock::new(T.saturating_add(Duration::from_secs(20)));
        let mon = monitor(&clock);
        assert!(matches!(mon.verdict(), Verdict::NoAnswer { .. }));
        mon.record(Err("roughtime 127.0.0.1:9: no answer".into()));
        assert!(mon.verdict().to_string().contains("no answer"));
        let m = measurement(clock.now(), T, Duration::from_secs(5), Duration::ZERO);
        let at = m.received;
        mon.record(Ok(m));
        let v = mon.verdict_at(clock.now(), at);
        let text = v.to_string();
        assert!(text.contains("clock is off"), "{text}");
        assert!(text.contains("20.000 s ahead of test authority"), "{text}");
        assert_eq!(
            v.error_bound(),
            Some(Duration::from_secs(25)),
            "|offset| + radius"
        );
    }

    #[test]
    fn a_clock_step_after_the_measurement_is_caught() {
        let clock = ManualClock::new(T);
        let mon = monitor(&clock);
        let m = measurement(T, T, Duration::from_secs(5), Duration::ZERO);
        let at = m.received;
        mon.record(Ok(m));
        assert!(mon.verdict_at(clock.now(), at).is_healthy());
        // Time passing normally keeps it healthy...
        clock.advance(Duration::from_secs(2));
        let v = mon.verdict_at(clock.now(), at + Duration::from_secs(2));
        assert_eq!(v.offset_us(), Some(0), "{v}");
        // ...but a wall-clock jump of 30 s with no monotonic time passing
        // is caught before the next measurement.
        clock.advance(Duration::from_secs(30));
        let v = mon.verdict_at(clock.now(), at + Duration::from_secs(2));
        assert!(!v.is_healthy(), "{v}");
        assert_eq!(v.offset_us(), Some(30_000_000));
    }

    #[test]
    fn an_old_answer_is_stale() {
        let clock = ManualClock::new(T);
        let mon = ClockMonitor::new(
            Arc::new(clock.clone()),
            Duration::from_millis(500),
            Duration::ZERO,
        );
        let m = measurement(T, T, Duration::from_secs(5), Duration::ZERO);
        let at = m.received;
        mon.record(Ok(m));
        let v = mon.verdict_at(clock.now(), at + Duration::from_millis(1));
        assert!(matches!(v, Verdict::Stale { .. }), "{v}");
        assert!(v.to_string().contains("no recent signed time"));
    }
}
