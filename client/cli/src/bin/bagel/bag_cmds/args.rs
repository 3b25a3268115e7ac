//! The flags several bag commands share (the bag store, the timing every
//! process must agree on, the range a read covers) and their parsers.

use std::sync::Arc;
use std::time::Duration;

use bagel_bags::reader::ReadOptions;
use bagel_bags::{self as bag, BagConfig};
use bagel_proto::Micros;

/// `--store`: the bag store a command works on, in the same forms for
/// every command.
#[derive(clap::Args, Debug)]
pub struct BagStoreArgs {
    /// `file:///abs/dir`, `s3://bucket/prefix` or `nfs://host/dir`.
    #[arg(long, env = "BAGEL_STORE")]
    store: String,
}

impl BagStoreArgs {
    /// The store's URL, as given.
    pub(super) fn url(&self) -> &str {
        &self.store
    }

    /// Opens the store for processes that agree on `cfg`.
    pub(super) async fn open(&self, cfg: &BagConfig) -> bag::Result<Arc<dyn bag::BagStore>> {
        bag::open_store(&self.store, cfg).await
    }
}

/// A duration of whole minutes, as a count of minutes.
pub(super) fn parse_minutes(s: &str) -> Result<u32, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 || secs % 60 != 0 || secs / 60 > 7 * 24 * 60 {
        return Err(format!("{s:?} is not a whole number of minutes from 1m to 7d"));
    }
    Ok((secs / 60) as u32)
}

/// Bytes: a number, optionally followed by KiB, MiB or GiB (or K, M, G).
pub(super) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 1048576, 512MiB, 1GiB)"))?;
    let mul: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use KiB, MiB or GiB)")),
    };
    n.checked_mul(mul).ok_or_else(|| format!("{s:?} is too large"))
}

/// A time as `--from`/`--to` take it: relative to now (`now`, `-5m`,
/// `-1h30m`, as `journalctl --since` and `docker logs --since` take one),
/// Unix microseconds, or RFC 3339.
pub(super) fn parse_time(s: &str) -> Result<Micros, String> {
    parse_time_at(s, Micros::now())
}

/// [`parse_time`] with `now` given.
fn parse_time_at(s: &str, now: Micros) -> Result<Micros, String> {
    if s == "now" {
        return Ok(now);
    }
    if let Some(ago) = s.strip_prefix('-') {
        return humantime::parse_duration(ago)
            .map(|d| now.saturating_sub(d))
            .map_err(|e| format!("{s:?}: not a duration before now ({e}; e.g. -5m, -1h30m)"));
    }
    if let Ok(us) = s.parse::<u64>() {
        return Ok(Micros::from_micros(us));
    }
    humantime::parse_rfc3339_weak(s)
        .map(Micros::from_system_time)
        .map_err(|e| format!("{s:?} is neither a time before now (-5m), Unix microseconds nor RFC 3339: {e}"))
}

/// Which log to read, and which part of it (`read` and `audit`).
#[derive(clap::Args, Debug)]
pub struct LogRange {
    #[command(flatten)]
    pub(super) store: BagStoreArgs,
    /// The log (a stream of bags) in the store.
    #[arg(long)]
    pub(super) log: String,
    /// First timestamp included: relative (`-5m`, `now`), Unix
    /// microseconds or RFC 3339.
    #[arg(long, value_parser = parse_time, allow_hyphen_values = true)]
    pub(super) from: Option<Micros>,
    /// First timestamp excluded: relative (`-5m`, `now`), Unix
    /// microseconds or RFC 3339.
    #[arg(long, value_parser = parse_time, allow_hyphen_values = true)]
    pub(super) to: Option<Micros>,
    /// Items (data files, batch objects) listed bigger than this are not
    /// read but reported as a problem (bytes, or with KiB, MiB, GiB).
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub(super) max_item_bytes: u64,
    /// A read closes missing past bags empty (so later readers agree) at
    /// most this far back from now; one that would reach further back is
    /// refused (a stray start mark, or --from long before the log began).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub(super) max_seal_lookback: Duration,
}

impl LogRange {
    /// Read options covering this range.
    pub(super) fn read_options(&self) -> ReadOptions {
        ReadOptions::default()
            .with_range(self.from.unwrap_or(Micros::ZERO), self.to.unwrap_or(Micros::MAX))
            .with_max_item_bytes(self.max_item_bytes)
            .with_max_seal_lookback(self.max_seal_lookback)
    }
}

/// Timing shared by writers and closers; must agree across processes.
#[derive(clap::Args, Debug, Clone)]
pub struct TimingArgs {
    /// A bag [s, s+1) closes at s + 1 + grace. Every writer, metronome and
    /// reader of a store must use the same grace: closing earlier than the
    /// writers expect would drop writes they acknowledged.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Bound on clock differences between writers and closers.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    clock_tolerance: Duration,
}

impl TimingArgs {
    pub(super) fn config(&self) -> BagConfig {
        BagConfig::default()
            .with_grace(self.grace)
            .with_clock_tolerance(self.clock_tolerance)
    }
}

#[cfg(test)]
mod tests {
    use super::{Micros, parse_minutes, parse_time_at};

    #[test]
    fn times_are_relative_to_now_absolute_or_rfc3339() {
        let now = Micros::from_micros(1_800_000_000_000_000);
        assert_eq!(parse_time_at("now", now), Ok(now));
        assert_eq!(
            parse_time_at("-5m", now),
            Ok(Micros::from_micros(1_800_000_000_000_000 - 300_000_000))
        );
        assert_eq!(
            parse_time_at("-1h30m", now),
            Ok(Micros::from_micros(1_800_000_000_000_000 - 5_400_000_000))
        );
        assert_eq!(parse_time_at("17", now), Ok(Micros::from_micros(17)));
        assert_eq!(
            parse_time_at("1970-01-01T00:00:01Z", now),
            Ok(Micros::from_micros(1_000_000))
        );
        let e = parse_time_at("-soon", now).unwrap_err();
        assert!(e.contains("-5m"), "{e}");
    }

    #[test]
    fn summary_spans_are_whole_minutes_from_one_minute_to_a_week() {
        assert_eq!(parse_minutes("1m"), Ok(1));
        assert_eq!(parse_minutes("1h"), Ok(60));
        assert_eq!(parse_minutes("7d"), Ok(7 * 24 * 60));
        for bad in ["0s", "30s", "90s", "1m 500ms", "8d", "soon"] {
            let err = parse_minutes(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
        assert_eq!(
            parse_minutes("8d").unwrap_err(),
            "\"8d\" is not a whole number of minutes from 1m to 7d"
        );
    }
}
