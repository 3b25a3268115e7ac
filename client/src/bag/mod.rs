//! Closable per-second bags of timestamped messages, on a POSIX directory or
//! on S3, with the metronome that closes them and the reader that orders them.
//!
//! # The model
//! A message goes to the bag of its timestamp's [`Bucket`] (one per UTC
//! second). A bag is *closed* at `bucket_end + grace` (2 s by default): any
//! process (a [`metronome`], a reader, a late writer) may close it, and all
//! of them, concurrently, arrive at the same first-written lock listing.
//! After the close, the bag is exactly what its lock lists; a write that
//! landed after the lock is not in the bag for any reader, and its writer is
//! told so ([`Error::LateRejected`]) instead of being acknowledged.
//!
//! # Who closes what (and why the metronome only looks back a little)
//! * A [`writer::Writer`] only ever writes timestamps `>= now`, so it never
//!   starts a write into a bag whose close time has passed. A write that
//!   *finishes* past the safe point (`close_time - clock_tolerance`) checks
//!   for a close in progress, and a write that finishes past the close time
//!   closes the bag itself; either way it is acknowledged only if the lock
//!   lists it.
//! * A [`reader`] closes every past-due bag it reads before reading it.
//! * So the [`metronome`] only has to be timely, not exhaustive: it closes
//!   from `now - lookback` on, and a bag older than that which nobody closed
//!   is closed by whoever touches it first, with the same result.
//!
//! # Layout
//! * [`frame`]: record framing (length + CRC-32C) in files and objects.
//! * [`fsops`]: the small trait of NFS-safe file operations, and `std::fs`.
//! * [`nfs`]: the same trait over a userspace NFSv3/NFSv4.2 client
//!   (`nfs://host[:port]/export/dir`); see `NFS.md` beside it.
//! * [`counting`]: an `FsOps` wrapper counting calls, to measure the cost
//!   of writes and closes per backend.
//! * [`posix`]: the bag of single-writer logs on a directory (the seed's
//!   appendix).
//! * [`s3`]: the maildir-style bag on an S3 prefix, via `object_store`.
//! * [`faults`]: fault-injecting and counting wrappers, for tests.
//! * [`writer`]: timestamps, batches, commit protocol.
//! * [`metronome`]: closes past bags; [`metronome::close_through`].
//! * [`reader`]: ordered, checked reads of a time range.
//! * [`store_url`]: `file:///dir`, `s3://bucket/prefix` and `nfs://host/dir`.

use std::fmt;
use std::io;
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::{Micros, pb};
use bytes::Bytes;

pub mod counting;
pub mod faults;
pub mod frame;
pub mod fsops;
pub mod metronome;
pub mod nfs;
pub mod posix;
pub mod reader;
pub mod rights;
pub mod s3;
pub mod store_url;
pub mod testing;
pub mod writer;

pub use metronome::{CloseReport, Metronome, close_through};
pub use reader::{ReadOptions, ReadReport, read};
pub use rights::{RightsSnapshot, WriteLedger, WriteRights, WriteSummary, WriteTicket};
pub use store_url::open_store;
pub use writer::{SignedClock, Writer};

/// Everything that can go wrong in the bag module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bag was already closed (or closing) before the write started.
    #[error("bag {bucket} of log {log:?} is closed to new writes")]
    BagClosed { log: String, bucket: Bucket },
    /// The write landed, but after the bag's lock was taken without it: it
    /// is not part of the bag for any reader and is not acknowledged.
    #[error("write to bag {bucket} of log {log:?} landed after the bag was closed; it is not in the bag")]
    LateRejected { log: String, bucket: Bucket },
    /// The lease does not allow this timestamp (at or past deadline - margin).
    #[error(
        "timestamp {ts} is at or past the lease deadline {deadline} minus the safety margin {margin:?}: refusing to write"
    )]
    LeaseExpiring {
        ts: Micros,
        deadline: Micros,
        margin: Duration,
    },
    /// The next timestamp would lie too far ahead of the local clock even
    /// after the bounded pause.
    #[error("next timestamp {ts} is {ahead:?} ahead of the clock ({now}) after pausing; refusing to write")]
    TooFarAhead {
        ts: Micros,
        now: Micros,
        ahead: Duration,
    },
    /// The rights do not allow writing (lost, released, tentative, or the
    /// witnesses do not cover the timestamps).
    #[error("no right to write: {reason}")]
    NoRights { reason: String },
    /// The lease these writes were under is being released.
    #[error("the lease is being released: no more writes under it")]
    WritesClosed,
    /// No recent signed time could be had for the batch (or the local clock
    /// is off): readers would reject it.
    #[error("no signed time for the batch: {detail}")]
    NoSignedTime { detail: String },
    /// The batch's signed time is too far from its timestamps: readers
    /// would reject it.
    #[error(
        "timestamp {ts} is {diff_us} us from the batch's signed time {time} (limit {limit_us} us): refusing to write"
    )]
    SignedTimeOff {
        ts: Micros,
        time: Micros,
        diff_us: u64,
        limit_us: u64,
    },
    /// An item no longer is what the bag's lock lists (its ETag differs).
    #[error("item {item} of bag {bucket} changed since the bag was closed")]
    ItemChanged { bucket: Bucket, item: String },
    #[error("storage operation {op} timed out after {after:?}")]
    Timeout { op: String, after: Duration },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("object store {op} {path}: {source}")]
    Store {
        op: &'static str,
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// The store accepted a second create-only PUT of the same key.
    #[error(
        "the object store {store} ignores conditional writes (a second If-None-Match: * PUT of {key} succeeded); bags cannot be closed safely on it, refusing to run"
    )]
    ConditionalWritesIgnored { store: String, key: String },
    /// A lock file/object that does not parse.
    #[error("lock of bag {bucket} of log {log:?} is corrupt: {reason}")]
    CorruptLock {
        log: String,
        bucket: Bucket,
        reason: String,
    },
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: String,
    },
    /// The bag's close time has not come yet; closing it now could reject
    /// writes that are on time.
    #[error("bag {bucket} may not be closed before {close_at} (now {now})")]
    TooEarly {
        bucket: Bucket,
        close_at: Micros,
        now: Micros,
    },
    /// Injected by the fault wrappers in tests.
    #[error("injected fault: {0}")]
    Injected(String),
}

impl Error {
    /// Whether trying the same operation again may succeed. Permanent errors
    /// (a closed bag, an expiring lease, a lying store, bad input) will not
    /// go away by retrying.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Timeout { .. }
            | Error::TooFarAhead { .. }
            | Error::TooEarly { .. }
            | Error::NoSignedTime { .. }
            | Error::SignedTimeOff { .. } => true,
            Error::Io { source, .. } => !matches!(
                source.kind(),
                io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::Unsupported
            ),
            Error::Store { source, .. } => matches!(source, object_store::Error::Generic { .. }),
            Error::BagClosed { .. }
            | Error::LateRejected { .. }
            | Error::LeaseExpiring { .. }
            | Error::ConditionalWritesIgnored { .. }
            | Error::CorruptLock { .. }
            | Error::Invalid { .. }
            | Error::NoRights { .. }
            | Error::WritesClosed
            | Error::ItemChanged { .. }
            | Error::Injected(_) => false,
        }
    }

    /// The opposite of [`Error::is_retryable`].
    pub fn is_permanent(&self) -> bool {
        !self.is_retryable()
    }

    pub(crate) fn io(op: &'static str, path: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(what: &'static str, value: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs a storage call with a timeout.
pub(crate) async fn timed<T>(
    op: impl FnOnce() -> String,
    after: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout { op: op(), after }),
    }
}

/// One bag's time range: the UTC second `[secs, secs + 1)`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket(u64);

impl Bucket {
    pub const WIDTH: Duration = Duration::from_secs(1);

    pub const fn from_secs(secs: u64) -> Self {
        Bucket(secs)
    }

    /// The bucket holding `ts`.
    pub fn of(ts: Micros) -> Self {
        Bucket(ts.as_micros() / 1_000_000)
    }

    pub const fn secs(self) -> u64 {
        self.0
    }

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

/// Settings shared by writers, closers and readers. The writer's `grace`
/// and `clock_tolerance` must match (or be more cautious than) what the
/// metronomes use.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BagConfig {
    /// A bag `[s, s+1)` closes at `s + 1 + grace`.
    pub grace: Duration,
    /// How far apart the clocks of writers and closers may be. A write that
    /// finishes before `close_time - clock_tolerance` needs no extra check.
    pub clock_tolerance: Duration,
    /// Writers refuse timestamps at or past `deadline - deadline_margin`.
    pub deadline_margin: Duration,
    /// A timestamp may run at most this far ahead of the clock...
    pub max_ahead: Duration,
    /// ...after pausing at most this long for the clock to catch up.
    pub max_pause: Duration,
    /// Every storage call gives up after this long.
    pub op_timeout: Duration,
    /// The metronome starts closing at `now - lookback`.
    pub lookback: Duration,
    /// fsync data files and lock files before acknowledging (POSIX).
    pub sync: bool,
    /// Readers reject a message more than this (plus the signer's radius)
    /// away from its batch's signed time.
    pub signed_time_tolerance: Duration,
}

impl Default for BagConfig {
    fn default() -> Self {
        BagConfig {
            grace: Duration::from_secs(2),
            clock_tolerance: Duration::from_secs(1),
            deadline_margin: Duration::from_millis(500),
            max_ahead: Duration::from_millis(100),
            max_pause: Duration::from_secs(1),
            op_timeout: Duration::from_secs(10),
            lookback: Duration::from_secs(60),
            sync: true,
            signed_time_tolerance: Duration::from_secs(1),
        }
    }
}

impl BagConfig {
    #[must_use]
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
    #[must_use]
    pub fn with_clock_tolerance(mut self, d: Duration) -> Self {
        self.clock_tolerance = d;
        self
    }
    #[must_use]
    pub fn with_deadline_margin(mut self, d: Duration) -> Self {
        self.deadline_margin = d;
        self
    }
    #[must_use]
    pub fn with_max_ahead(mut self, d: Duration) -> Self {
        self.max_ahead = d;
        self
    }
    #[must_use]
    pub fn with_max_pause(mut self, d: Duration) -> Self {
        self.max_pause = d;
        self
    }
    #[must_use]
    pub fn with_op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }
    #[must_use]
    pub fn with_lookback(mut self, d: Duration) -> Self {
        self.lookback = d;
        self
    }
    #[must_use]
    pub fn with_sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }
    #[must_use]
    pub fn with_signed_time_tolerance(mut self, d: Duration) -> Self {
        self.signed_time_tolerance = d;
        self
    }

    /// Before this instant a finished write of `bucket` is known to be in.
    pub fn safe_point(&self, bucket: Bucket) -> Micros {
        bucket.close_time(self.grace).saturating_sub(self.clock_tolerance)
    }
}

/// Where one appended record ended up: enough to find it in a lock listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// File name (POSIX) or object name (S3) within the bag.
    pub item: String,
    /// End offset of the record in the file (POSIX) or object size (S3).
    pub end: u64,
    /// The object's ETag, when the store gives one.
    pub etag: Option<String>,
}

/// One item (data file or batch object) of a bag and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedItem {
    pub name: String,
    pub size: u64,
    pub etag: Option<String>,
}

/// The content of a bag's lock: every item and size that is in the bag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub items: Vec<ListedItem>,
}

impl Listing {
    /// Whether the record behind `receipt` is inside the bag.
    pub fn covers(&self, receipt: &Receipt) -> bool {
        self.items.iter().any(|i| {
            i.name == receipt.item
                && i.size >= receipt.end
                && match (&i.etag, &receipt.etag) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        })
    }

    /// The text form stored in lock files/objects: a header, one
    /// `name size etag|-` line per item, and a CRC-32C of the lines before.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::from("bagel-lock v1\n");
        for i in &self.items {
            s.push_str(&format!(
                "{} {} {}\n",
                i.name,
                i.size,
                i.etag.as_deref().unwrap_or("-")
            ));
        }
        let crc = crc32c::crc32c(s.as_bytes());
        s.push_str(&format!("crc32c {crc:08x}\n"));
        s.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Listing, String> {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
        let body_end = text
            .rfind("crc32c ")
            .ok_or_else(|| "no crc32c line (torn or foreign file)".to_owned())?;
        let (body, tail) = text.split_at(body_end);
        let want = u32::from_str_radix(tail.trim_start_matches("crc32c ").trim(), 16)
            .map_err(|e| format!("bad crc32c line: {e}"))?;
        if crc32c::crc32c(body.as_bytes()) != want {
            return Err("crc32c mismatch".into());
        }
        let mut lines = body.lines();
        if lines.next() != Some("bagel-lock v1") {
            return Err("missing header `bagel-lock v1`".into());
        }
        let mut items = Vec::new();
        for line in lines {
            let mut f = line.split(' ');
            let (Some(name), Some(size), Some(etag), None) = (f.next(), f.next(), f.next(), f.next()) else {
                return Err(format!("bad line {line:?}"));
            };
            let size = size.parse().map_err(|e| format!("bad size in {line:?}: {e}"))?;
            items.push(ListedItem {
                name: name.to_owned(),
                size,
                etag: (etag != "-").then(|| etag.to_owned()),
            });
        }
        Ok(Listing { items })
    }
}

/// Whether a bag is closed, and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BagState {
    /// Its lock exists: the bag is exactly this.
    Closed(Listing),
    /// Not (yet) closed; these items exist now.
    Open(Vec<ListedItem>),
}

/// A storage backend holding bags. One implementation per kind of storage;
/// the writer, metronome and reader are written once over this trait.
///
/// Every method is idempotent and safe to run concurrently from any number
/// of processes, except that one `writer_file` is appended to by one writer
/// at a time (the [`Writer`] serialises its batches).
#[async_trait]
pub trait BagStore: Send + Sync + fmt::Debug {
    /// A short description for messages, e.g. the store URL.
    fn describe(&self) -> String;

    /// Appends one framed record (see [`frame`]) for writer `writer_file` to
    /// the bag. Fails with [`Error::BagClosed`] when the bag is visibly
    /// closed already. `sequence` is the record's first sequence number
    /// (backends that store one object per record name it with it).
    async fn append(
        &self,
        log: &str,
        bucket: Bucket,
        writer_file: &str,
        sequence: u64,
        record: Bytes,
    ) -> Result<Receipt>;

    /// Whether some process has started closing the bag.
    async fn closing_started(&self, log: &str, bucket: Bucket) -> Result<bool>;

    /// Closes the bag (or finishes someone else's close) and returns the
    /// lock listing, which is the same for every caller.
    async fn close(&self, log: &str, bucket: Bucket) -> Result<Listing>;

    /// The bag's current state, without changing anything.
    async fn state(&self, log: &str, bucket: Bucket) -> Result<BagState>;

    /// Reads one item: at most `limit` bytes (the listed size) when given,
    /// else all of it.
    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> Result<Bytes>;

    /// Lists the child "directories" of `<log>/<parts...>/` (one tree level).
    async fn list_level(&self, log: &str, parts: &[String]) -> Result<Vec<String>>;

    /// The earliest bag any writer of `log` declared it may write
    /// ([`BagStore::mark_log_start`]); `None` when none did. Readers seal
    /// the missing past bags from there on.
    async fn log_start(&self, log: &str) -> Result<Option<Bucket>>;

    /// Declares that writers may write `log` from `bucket` on. Create-only
    /// and idempotent; the earliest mark wins.
    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> Result<()>;
}

/// Where a log keeps its start marks (`<log>/_start/<unix seconds>`): a
/// name no log segment or bag path can take.
pub(crate) const START_DIR: &str = "_start";

/// The earliest of a log's start marks, from their names.
pub(crate) fn earliest_start<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Bucket> {
    names
        .into_iter()
        .filter_map(|n| n.parse::<u64>().ok())
        .min()
        .map(Bucket::from_secs)
}

/// Every bucket of `log` that exists in `store` within `[from, to]`,
/// ascending, found by walking the `YYYY/MM/DD/hh/mm/ss` tree and pruning
/// subtrees outside the range.
pub async fn list_buckets(store: &dyn BagStore, log: &str, from: Bucket, to: Bucket) -> Result<Vec<Bucket>> {
    let lo = from.parts();
    let hi = to.parts();
    let mut out = Vec::new();
    // Depth-first over (prefix parts, tight_lo, tight_hi).
    let mut stack: Vec<(Vec<u64>, bool, bool)> = vec![(Vec::new(), true, true)];
    while let Some((prefix, tight_lo, tight_hi)) = stack.pop() {
        let depth = prefix.len();
        if depth == 6 {
            let p: [u64; 6] = prefix.clone().try_into().expect("six parts");
            if let Some(b) = Bucket::from_parts(p)
                && b >= from
                && b <= to
            {
                out.push(b);
            }
            continue;
        }
        let names: Vec<String> = prefix
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if i == 0 {
                    format!("{v:04}")
                } else {
                    format!("{v:02}")
                }
            })
            .collect();
        let mut children: Vec<u64> = store
            .list_level(log, &names)
            .await?
            .iter()
            .filter(|n| n.len() == if depth == 0 { 4 } else { 2 })
            .filter_map(|n| n.parse().ok())
            .filter(|v| (!tight_lo || *v >= lo[depth]) && (!tight_hi || *v <= hi[depth]))
            .collect();
        children.sort_unstable();
        for v in children.into_iter().rev() {
            let mut p = prefix.clone();
            p.push(v);
            stack.push((p, tight_lo && v == lo[depth], tight_hi && v == hi[depth]));
        }
    }
    Ok(out)
}

/// Checks a log name: path-safe segments of `[A-Za-z0-9._-]` separated by
/// `/`, none starting with `.` or `_` (those are ours).
pub fn validate_log(log: &str) -> Result<()> {
    if log.is_empty() || log.len() > 200 {
        return Err(Error::invalid("log name", log, "must be 1 to 200 bytes"));
    }
    for seg in log.split('/') {
        validate_segment("log name", log, seg)?;
        if seg.len() == 4 && seg.bytes().all(|b| b.is_ascii_digit()) {
            // Harmless, but keep logs and the time tree visibly apart.
            return Err(Error::invalid(
                "log name",
                log,
                "a segment may not be a 4-digit year",
            ));
        }
    }
    Ok(())
}

/// Checks a writer id: `[A-Za-z0-9._-]`, 1 to 64 bytes, not starting with
/// `.` or `_`.
pub fn validate_writer_id(id: &str) -> Result<()> {
    if id.len() > 64 {
        return Err(Error::invalid("writer id", id, "at most 64 bytes"));
    }
    validate_segment("writer id", id, id)
}

fn validate_segment(what: &'static str, whole: &str, seg: &str) -> Result<()> {
    if seg.is_empty() {
        return Err(Error::invalid(what, whole, "empty path segment"));
    }
    if seg.starts_with('.') || seg.starts_with('_') {
        return Err(Error::invalid(what, whole, "may not start with '.' or '_'"));
    }
    if let Some(c) = seg
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(Error::invalid(
            what,
            whole,
            format!("character {c:?} not allowed"),
        ));
    }
    Ok(())
}

/// Reads a witness body without checking its signature (for reporting, and
/// for readers that were given no keys and say so).
pub fn decode_witness_unverified(w: &pb::Witness) -> Result<pb::WitnessBody, String> {
    use prost::Message as _;
    pb::WitnessBody::decode(w.body.as_slice()).map_err(|e| format!("witness body does not decode: {e}"))
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

    #[test]
    fn listing_round_trips_and_detects_damage() {
        let l = Listing {
            items: vec![
                ListedItem {
                    name: "w1.0.log".into(),
                    size: 42,
                    etag: None,
                },
                ListedItem {
                    name: "w2.00000000000000000007".into(),
                    size: 7,
                    etag: Some("\"abc\"".into()),
                },
            ],
        };
        let bytes = l.encode();
        assert_eq!(Listing::decode(&bytes).unwrap(), l);
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(Listing::decode(&bad).is_err());
        assert!(Listing::decode(&bytes[..bytes.len() - 3]).is_err());
        assert_eq!(
            Listing::decode(&Listing::default().encode()).unwrap(),
            Listing::default()
        );
    }

    #[test]
    fn covers_needs_name_size_and_etag() {
        let l = Listing {
            items: vec![ListedItem {
                name: "a".into(),
                size: 10,
                etag: Some("e".into()),
            }],
        };
        let r = |item: &str, end, etag: Option<&str>| Receipt {
            item: item.into(),
            end,
            etag: etag.map(str::to_owned),
        };
        assert!(l.covers(&r("a", 10, None)));
        assert!(l.covers(&r("a", 10, Some("e"))));
        assert!(!l.covers(&r("a", 11, None)));
        assert!(!l.covers(&r("b", 1, None)));
        assert!(!l.covers(&r("a", 5, Some("f"))));
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_log("tenants/acme").is_ok());
        assert!(validate_log("../x").is_err());
        assert!(validate_log("a//b").is_err());
        assert!(validate_log("_x").is_err());
        assert!(validate_writer_id("host-1.pid-7").is_ok());
        assert!(validate_writer_id("a/b").is_err());
    }
}
