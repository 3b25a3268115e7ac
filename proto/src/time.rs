//! The one time type of bagel: Unix microseconds, UTC.
//!
//! Deadlines, watermarks and message timestamps all cross APIs as [`Micros`]
//! so that a bare integer of some other unit never sneaks in.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time as microseconds since the Unix epoch (UTC).
///
/// Microseconds, because two writers on one lease must be able to get
/// distinct, strictly increasing timestamps many times per millisecond,
/// and `u64` microseconds last until the year 586 524.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Micros(u64);

impl Micros {
    /// The epoch itself; also used as "no time" on the wire (proto3 zero).
    pub const ZERO: Micros = Micros(0);
    /// The last representable instant: where saturating arithmetic
    /// stops, and "no end" for a range read to the present.
    pub const MAX: Micros = Micros(u64::MAX);

    /// From microseconds since the Unix epoch, as the wire's `*_us`
    /// fields carry them.
    pub const fn from_micros(us: u64) -> Self {
        Micros(us)
    }

    /// Microseconds since the Unix epoch, for the wire's `*_us` fields.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// The system clock, now. Lease logic never calls this directly: it takes
    /// the time from an injected clock so expiry can be tested exactly.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// A `SystemTime` truncated to the microsecond; a time before the
    /// epoch is the epoch ([`Micros::ZERO`]).
    pub fn from_system_time(t: SystemTime) -> Self {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        Micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    /// The same instant as a `SystemTime`, for formatting and for APIs
    /// that take one.
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.0)
    }

    /// `self + d`, truncated to whole microseconds, at most [`Micros::MAX`]
    /// (a deadline computed from a huge TTL stays an instant).
    pub fn saturating_add(self, d: Duration) -> Self {
        Micros(self.0.saturating_add(duration_micros(d)))
    }

    /// `self - d`, truncated to whole microseconds, at least the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Micros(self.0.saturating_sub(duration_micros(d)))
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub fn duration_since(self, earlier: Micros) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }

    /// The next representable instant.
    pub fn next(self) -> Self {
        Micros(self.0.saturating_add(1))
    }
}

/// A duration in whole microseconds, saturating at `u64::MAX`.
pub fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A duration for people, as the command-line flags take it: `2h`, `1m`,
/// `960ms`, `1s 500ms`. Rounded to milliseconds from a millisecond up, so
/// a TTL that lost a few microseconds on the way still reads as what was
/// asked for.
pub fn human_duration(d: Duration) -> String {
    let d = if d >= Duration::from_millis(1) {
        Duration::from_millis(u64::try_from((d.as_micros() + 500) / 1000).unwrap_or(u64::MAX))
    } else {
        d
    };
    humantime::format_duration(d).to_string()
}

impl fmt::Display for Micros {
    /// RFC 3339 with microseconds, e.g. `2026-11-21T05:51:52.123456Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 > 253_402_300_799_000_000 {
            // Past year 9999: humantime cannot print it; show the number.
            return write!(f, "{}us", self.0);
        }
        write!(f, "{}", humantime::format_rfc3339_micros(self.to_system_time()))
    }
}

impl fmt::Debug for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Micros({})", self.0)
    }
}

impl From<Micros> for u64 {
    fn from(m: Micros) -> u64 {
        m.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Micros::from_micros(10);
        assert_eq!(t.saturating_sub(Duration::from_secs(1)), Micros::ZERO);
        assert_eq!(Micros::MAX.saturating_add(Duration::from_secs(1)), Micros::MAX);
        assert_eq!(
            Micros::from_micros(1_500).duration_since(Micros::from_micros(500)),
            Duration::from_millis(1)
        );
        assert_eq!(t.duration_since(Micros::from_micros(20)), Duration::ZERO);
    }

    #[test]
    fn durations_read_like_flags() {
        let h = |us| human_duration(Duration::from_micros(us));
        assert_eq!(h(7_200_000_000), "2h");
        assert_eq!(h(60_000_000), "1m");
        assert_eq!(h(959_999), "960ms");
        assert_eq!(h(1_500_000), "1s 500ms");
        assert_eq!(h(250), "250us");
    }

    #[test]
    fn displays_rfc3339() {
        let t = Micros::from_micros(1_700_000_000_123_456);
        assert_eq!(t.to_string(), "2023-11-14T22:13:20.123456Z");
    }
}
