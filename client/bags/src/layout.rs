//! The log's layout on the store: every protocol object's name (the
//! minute a seal closes, the stretch a summary covers, a seal's intent, a
//! tombstone) and the codecs of the small protocol objects (seals and
//! tombstones). A leaf: it does no I/O and depends on nothing else of the
//! crate's protocol, so the modules that act on the store (`seal`,
//! `tombstone`, `summary`, the writer, the reader, retention) depend on it
//! and not on each other for names and formats.
//!
//! ```text
//! <log>/_start/<second>                 the log's start mark
//! <log>/YYYY/MM/DD/hh/mm/ss/            a bag (one second)
//! <log>/_seal/<minute start>            a minute's seal (Seal)
//! <log>/_seal/<minute start>.intent     a sealer's intent
//! <log>/_seal/<minute start>.removed    a removed minute's tombstone
//! <log>/_summary/<first second>.<secs>  a summary of whole minutes (Stretch)
//! ```

use std::collections::BTreeSet;

use bagel_proto::Micros;
use bytes::Bytes;

use crate::Bucket;

/// Where a log keeps its seals: a name no log segment can take.
pub const SEAL_DIR: &str = "_seal";
/// A span is this many seconds, aligned to the minute.
pub const SPAN_SECS: u64 = 60;
/// A seal lists at most 60 seconds: anything bigger was not written by a
/// sealer.
pub(crate) const MAX_SEAL_BYTES: u64 = 4096;
pub(crate) const SEAL_MAGIC: &str = "bagel-seal v1";

/// A minute of a log: the seconds `[start, start + 60)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span(pub(crate) u64);

impl Span {
    /// The span holding `bucket`.
    pub fn of(bucket: Bucket) -> Self {
        Span(bucket.secs() - bucket.secs() % SPAN_SECS)
    }

    /// Its first second.
    pub fn first(self) -> Bucket {
        Bucket::from_secs(self.0)
    }

    /// Its last second.
    pub fn last(self) -> Bucket {
        Bucket::from_secs(self.0 + SPAN_SECS - 1)
    }

    /// The minute after it.
    pub fn next(self) -> Self {
        Span(self.0 + SPAN_SECS)
    }

    /// When a closer may seal it: its last second's close time.
    pub fn close_time(self, grace: std::time::Duration) -> Micros {
        self.last().close_time(grace)
    }

    /// Every second of the span.
    pub fn buckets(self) -> impl Iterator<Item = Bucket> {
        (self.0..self.0 + SPAN_SECS).map(Bucket::from_secs)
    }

    /// The spans from the one holding `from` to the one holding `to`.
    pub fn covering(from: Bucket, to: Bucket) -> impl Iterator<Item = Span> {
        let (a, b) = (Span::of(from).0, Span::of(to).0);
        (a..=b).step_by(SPAN_SECS as usize).map(Span)
    }

    /// Its seal's object name in the log (`_seal/<first second>`).
    pub(crate) fn seal_name(self) -> String {
        format!("{SEAL_DIR}/{}", self.0)
    }

    pub(crate) fn intent_name(self) -> String {
        format!("{SEAL_DIR}/{}.intent", self.0)
    }

    /// The minute's path parts (`YYYY MM DD hh mm`), whose children are
    /// the span's bags.
    pub(crate) fn minute_parts(self) -> Vec<String> {
        let p = self.first().parts();
        std::iter::once(format!("{:04}", p[0]))
            .chain(p[1..5].iter().map(|v| format!("{v:02}")))
            .collect()
    }
}

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.first(), self.last())
    }
}

/// A sealed span: which of its seconds held a bag when it was sealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seal {
    /// The minute it seals.
    pub span: Span,
    pub(crate) bags: BTreeSet<Bucket>,
}

impl Seal {
    /// Whether `bucket`'s own lock decides it (`true`), or the seal closed
    /// it empty (`false`).
    pub fn has_bag(&self, bucket: Bucket) -> bool {
        self.bags.contains(&bucket)
    }

    /// The seconds that held a bag, ascending.
    pub fn bags(&self) -> impl Iterator<Item = Bucket> + '_ {
        self.bags.iter().copied()
    }

    /// How many seconds of the span the seal closed empty.
    pub fn empty_seconds(&self) -> u64 {
        SPAN_SECS - self.bags.len() as u64
    }

    pub(crate) fn encode(&self) -> Bytes {
        let mut s = format!("{SEAL_MAGIC}\n{}\n", self.span.0);
        for b in &self.bags {
            s.push_str(&format!("{}\n", b.secs()));
        }
        Bytes::from(s)
    }

    pub(crate) fn decode(span: Span, bytes: &[u8]) -> std::result::Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
        let mut lines = text.lines();
        if lines.next() != Some(SEAL_MAGIC) {
            return Err(format!("does not start with {SEAL_MAGIC:?}"));
        }
        let start: u64 = lines.next().and_then(|l| l.parse().ok()).ok_or("no span start")?;
        if start != span.0 {
            return Err(format!("names span {start}, not {}", span.0));
        }
        let mut bags = BTreeSet::new();
        for l in lines {
            let secs: u64 = l.parse().map_err(|_| format!("bad second {l:?}"))?;
            let b = Bucket::from_secs(secs);
            if Span::of(b) != span {
                return Err(format!("lists second {secs}, outside the span"));
            }
            if !bags.insert(b) {
                return Err(format!("lists second {secs} twice"));
            }
        }
        Ok(Seal { span, bags })
    }
}

/// Where a log keeps its summaries: a name no log segment can take.
pub const SUMMARY_DIR: &str = "_summary";

/// The stretch a summary covers: `minutes` whole minutes from `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stretch {
    /// Its first minute.
    pub first: Span,
    /// How many whole minutes it covers, at least 1.
    pub minutes: u32,
}

impl Stretch {
    /// The stretch of `minutes` minutes holding `bucket`, aligned to
    /// `minutes` whole minutes since the epoch: every summarizer given the
    /// same length cuts the log the same way.
    pub fn aligned(bucket: Bucket, minutes: u32) -> Self {
        let len = u64::from(minutes.max(1)) * SPAN_SECS;
        let from = bucket.secs() - bucket.secs() % len;
        Stretch::new(Span::of(Bucket::from_secs(from)), minutes)
    }

    /// The next stretch of the same length.
    pub fn next(self) -> Self {
        Stretch::new(Span::of(self.last().next()), self.minutes)
    }

    /// When it may be summarized: its last second's close time.
    pub fn close_time(self, grace: std::time::Duration) -> bagel_proto::Micros {
        self.last().close_time(grace)
    }

    /// `minutes` minutes from `first`; 0 minutes is taken as 1.
    pub fn new(first: Span, minutes: u32) -> Self {
        Stretch {
            first,
            minutes: minutes.max(1),
        }
    }

    /// Its minutes, in order.
    pub fn spans(self) -> impl Iterator<Item = Span> {
        let mut s = self.first;
        (0..self.minutes).map(move |_| {
            let here = s;
            s = s.next();
            here
        })
    }

    /// Its first second.
    pub fn from(self) -> Bucket {
        self.first.first()
    }

    /// Its last second.
    pub fn last(self) -> Bucket {
        Bucket::from_secs(self.from().secs() + u64::from(self.minutes) * SPAN_SECS - 1)
    }

    /// Whether the second `b` lies in it.
    pub fn contains(self, b: Bucket) -> bool {
        (self.from()..=self.last()).contains(&b)
    }

    /// Its summary's object name in the log
    /// (`_summary/<first second>.<seconds>`).
    pub fn name(self) -> String {
        format!(
            "{SUMMARY_DIR}/{}.{}",
            self.from().secs(),
            u64::from(self.minutes) * SPAN_SECS
        )
    }

    /// The stretch a summary's object name ([`Stretch::name`]) names.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::parse(name.strip_prefix(SUMMARY_DIR)?.strip_prefix('/')?)
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        let (from, len) = name.split_once('.')?;
        let (from, len): (u64, u64) = (from.parse().ok()?, len.parse().ok()?);
        if from % SPAN_SECS != 0 || len == 0 || len % SPAN_SECS != 0 || len / SPAN_SECS > u64::from(u32::MAX)
        {
            return None;
        }
        Some(Stretch::new(
            Span::of(Bucket::from_secs(from)),
            (len / SPAN_SECS) as u32,
        ))
    }
}

impl std::fmt::Display for Stretch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.from(), self.last())
    }
}

/// A tombstone's name in `_seal/` ends so: no seal (a number) or intent
/// (`.intent`) does.
pub const SUFFIX: &str = ".removed";
pub(crate) const TOMBSTONE_MAGIC: &str = "bagel-removed v1";
/// A tombstone is three short lines: anything bigger was not written by
/// retention.
pub(crate) const MAX_TOMBSTONE_BYTES: u64 = 256;

/// A minute retention removed, and the summary that holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tombstone {
    /// The minute removed.
    pub span: Span,
    /// The summary retention checked the minute's bags against before
    /// removing them.
    pub summary: Stretch,
}

impl Tombstone {
    pub(crate) fn encode(&self) -> Bytes {
        Bytes::from(format!(
            "{TOMBSTONE_MAGIC}\n{}\n{}\n",
            self.span.first().secs(),
            self.summary.name()
        ))
    }

    pub(crate) fn decode(span: Span, bytes: &[u8]) -> std::result::Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
        let mut lines = text.lines();
        if lines.next() != Some(TOMBSTONE_MAGIC) {
            return Err(format!("does not start with {TOMBSTONE_MAGIC:?}"));
        }
        let start: u64 = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or("no minute start")?;
        if start != span.first().secs() {
            return Err(format!("names minute {start}, not {}", span.first().secs()));
        }
        let summary = lines
            .next()
            .and_then(Stretch::from_name)
            .ok_or("no summary name")?;
        if !summary.contains(span.first()) {
            return Err(format!(
                "names summary {}, which does not hold the minute",
                summary.name()
            ));
        }
        if lines.next().is_some() {
            return Err("more than three lines".into());
        }
        Ok(Tombstone { span, summary })
    }
}

/// The tombstone's object name in the log (`_seal/<minute start>.removed`).
pub fn tombstone_name(span: Span) -> String {
    format!("{SEAL_DIR}/{}{SUFFIX}", span.first().secs())
}
