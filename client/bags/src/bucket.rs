//! A bag's time range, one UTC second, and its place in the calendar tree.

use std::fmt;
use std::time::Duration;

use bagel_proto::Micros;
/// One bag's time range: the UTC second `[secs, secs + 1)`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket(u64);

impl Bucket {
    /// How long a bag's time range is: one second.
    pub const WIDTH: Duration = Duration::from_secs(1);

    /// The bag of the UTC second `secs` seconds after the Unix epoch.
    pub const fn from_secs(secs: u64) -> Self {
        Bucket(secs)
    }

    /// The bucket holding `ts`.
    pub fn of(ts: Micros) -> Self {
        Bucket(ts.as_micros() / 1_000_000)
    }

    /// Its second, in seconds since the Unix epoch (UTC).
    pub const fn secs(self) -> u64 {
        self.0
    }

    /// The first instant in the bucket.
    pub fn start(self) -> Micros {
        Micros::from_micros(self.0.saturating_mul(1_000_000))
    }

    /// The first instant after the bucket.
    pub fn end(self) -> Micros {
        Micros::from_micros(self.0.saturating_add(1).saturating_mul(1_000_000))
    }

    /// When the bag may be closed: `end + grace`.
    pub fn close_time(self, grace: Duration) -> Micros {
        self.end().saturating_add(grace)
    }

    /// The bucket of the following second.
    pub fn next(self) -> Self {
        Bucket(self.0.saturating_add(1))
    }

    /// `YYYY/MM/DD/hh/mm/ss`, UTC: the directory (or key prefix) of the bag
    /// under its log, so an operator can `ls` a minute.
    pub fn path(self) -> String {
        let [y, mo, d, h, mi, s] = self.parts();
        format!("{y:04}/{mo:02}/{d:02}/{h:02}/{mi:02}/{s:02}")
    }

    /// Year, month, day, hour, minute, second (UTC).
    pub fn parts(self) -> [u64; 6] {
        let days = self.0 / 86_400;
        let rem = self.0 % 86_400;
        let (y, m, d) = civil_from_days(days);
        [y, m, d, rem / 3600, rem % 3600 / 60, rem % 60]
    }

    /// The inverse of [`Bucket::parts`]; `None` for an impossible date.
    pub fn from_parts(p: [u64; 6]) -> Option<Self> {
        let [y, mo, d, h, mi, s] = p;
        if !(1970..=9999).contains(&y)
            || !(1..=12).contains(&mo)
            || !(1..=31).contains(&d)
            || h > 23
            || mi > 59
            || s > 59
        {
            return None;
        }
        let days = days_from_civil(y, mo, d);
        let b = Bucket(days * 86_400 + h * 3600 + mi * 60 + s);
        (b.parts() == p).then_some(b)
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [y, mo, d, h, mi, s] = self.parts();
        write!(f, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
    }
}

impl fmt::Debug for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bucket({self})")
    }
}

/// Days since 1970-01-01 to (year, month, day); H. Hinnant's algorithm.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (y as u64, m as u64, d as u64)
}

fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let (y, m, d) = (y as i64, m as i64, d as i64);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_paths_are_utc_calendar() {
        let b = Bucket::of(Micros::from_micros(1_700_000_000_123_456));
        assert_eq!(b.path(), "2023/11/14/22/13/20");
        assert_eq!(b.to_string(), "2023-11-14T22:13:20Z");
        assert_eq!(Bucket::from_parts(b.parts()), Some(b));
        assert_eq!(Bucket::from_parts([2023, 2, 29, 0, 0, 0]), None);
        for secs in [0u64, 951_782_400, 4_102_444_799, 1_709_164_800] {
            let b = Bucket::from_secs(secs);
            assert_eq!(Bucket::from_parts(b.parts()), Some(b), "{secs}");
        }
    }
}
