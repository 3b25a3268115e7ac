//! `bagel.open_store` and what a bag store does from Python: writers
//! under a lease, ordered and checked reads, the audit, a metronome,
//! summaries and retention.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bagel_bags::audit::{AuditConfig, AuditMessage};
use bagel_bags::{self as bag, BagConfig, BagStore, Bucket, ReadOptions};
use bagel_client::TimeSource;
use bagel_proto::clock::{CheckedClock, SystemClock, Unvouched};
use bagel_proto::{KeyRing, Micros};
use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client::{Client, Env, seconds};
use crate::errors::Failure;
use crate::lease::Lease;
use crate::runtime::{awaitable, block_on, handle};

#[derive(Debug)]
struct Opened {
    store: Arc<dyn BagStore>,
    url: String,
    cfg: BagConfig,
    /// The client whose signed time closes bags and whose keys verify.
    env: Option<Arc<Env>>,
    /// Keys given to `open_store`, trusted beside the client's.
    keys: KeyRing,
}

impl Opened {
    /// The keys reads and audits verify with: those given, and the
    /// client's; `None` (nothing verified) when there are neither.
    async fn keys(&self) -> Result<Option<KeyRing>, Failure> {
        let mut ring = self.keys.clone();
        if let Some(env) = &self.env {
            ring.merge(&env.trusted_keys().await?);
        }
        Ok((!ring.is_empty()).then_some(ring))
    }

    /// The clock bags are closed on: the client's signed time; without a
    /// client, none (a read then closes nothing and skips open bags).
    fn closer(&self) -> Arc<dyn CheckedClock> {
        match &self.env {
            Some(env) => Arc::new(env.time.clone()),
            None => Arc::new(Unvouched(
                "no client given to open_store: bags are closed only on a clock signed time vouches for"
                    .into(),
            )),
        }
    }
}

/// A bag store: a directory (`file:///dir` or a path), `s3://bucket/prefix`
/// or `nfs://host/export/dir`. Open it with `bagel.open_store`.
#[pyclass(frozen, module = "bagel._bagel")]
#[derive(Debug)]
pub struct Store {
    opened: Mutex<Option<Arc<Opened>>>,
}

impl Store {
    fn get(&self) -> Result<Arc<Opened>, Failure> {
        self.opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| Failure::closed("the store is closed"))
    }
}

fn ring(keys: Vec<String>, what: &str) -> Result<KeyRing, Failure> {
    let mut ring = KeyRing::new();
    for k in keys {
        let raw: [u8; 32] = bagel_proto::hex::decode_array(&k).map_err(|e| {
            Failure::invalid(format!(
                "{what}: {k:?} is not an ed25519 public key (64 hex digits): {e}"
            ))
        })?;
        ring.insert_bytes(&raw)
            .map_err(|e| Failure::invalid(format!("{what}: {k:?}: {e}")))?;
    }
    Ok(ring)
}

/// Opens the bag store at `url`: a directory path or `file:///dir`,
/// `s3://bucket/prefix` (endpoint and credentials from `AWS_*`), or
/// `nfs://host/export/dir`.
///
/// With `client`, reads and audits verify with its witness keys, and reads
/// and metronomes close bags on its signed time. `keys`: more trusted
/// public keys (64 hex digits each). `grace`: seconds after its second
/// that a bag closes (every writer, closer and reader of a store must
/// agree; default 2).
#[pyfunction]
#[pyo3(signature = (url, *, client=None, keys=None, grace=None))]
pub fn open_store(
    py: Python<'_>,
    url: String,
    client: Option<PyRef<'_, Client>>,
    keys: Option<Vec<String>>,
    grace: Option<f64>,
) -> PyResult<Store> {
    let mut cfg = BagConfig::default();
    if let Some(g) = grace {
        cfg = cfg.with_grace(seconds("grace", g)?);
    }
    let keys = ring(keys.unwrap_or_default(), "keys")?;
    let env = client.map(|c| Arc::clone(&c.env));
    let url = if url.contains("://") {
        url
    } else {
        let abs = std::path::absolute(&url).map_err(|e| Failure::invalid(format!("store {url}: {e}")))?;
        format!("file://{}", abs.display())
    };
    let store = block_on(py, {
        let (url, cfg) = (url.clone(), cfg.clone());
        async move { Ok(bag::open_store(&url, &cfg).await?) }
    })?;
    Ok(Store {
        opened: Mutex::new(Some(Arc::new(Opened {
            store,
            url,
            cfg,
            env,
            keys,
        }))),
    })
}

/// A time bound from Python: microseconds since the epoch.
fn micros(t: Option<u64>, default: Micros) -> Micros {
    t.map_or(default, Micros::from_micros)
}

/// What `read` and `read_async` read: the range, and closing past-due
/// bags only with a client's signed time to close them on.
fn read_options(
    opened: &Opened,
    start: Option<u64>,
    end: Option<u64>,
    trust_summarizer: Option<Vec<String>>,
    include_open: bool,
) -> Result<ReadOptions, Failure> {
    let mut options = ReadOptions::default()
        .with_range(micros(start, Micros::ZERO), micros(end, Micros::MAX))
        .with_include_open(include_open)
        .with_close_past_due(opened.env.is_some());
    if let Some(keys) = trust_summarizer {
        options = options.with_trusted_summarizers(ring(keys, "trust_summarizer")?);
    }
    Ok(options)
}

/// Refuses a log nobody ever wrote or closed (a mistyped name or store), as
/// `bagel read` does: it has no entry at all, where an empty log has its
/// start mark or closed bags. Asked before reading, which may close
/// (create) past bags.
async fn existing(opened: &Opened, log: &str) -> Result<(), Failure> {
    bag::validate_log(log)?;
    if opened.store.list_level(log, &[]).await?.is_empty() {
        return Err(Failure::log_not_found(log, &opened.url));
    }
    Ok(())
}

async fn read(
    opened: Arc<Opened>,
    log: String,
    options: ReadOptions,
) -> Result<(bag::ReadReport, bool), Failure> {
    existing(&opened, &log).await?;
    let keys = opened.keys().await?;
    let verifying = keys.is_some();
    let options = options.with_keys(keys).with_roughtime_keys(
        opened
            .env
            .as_ref()
            .map_or_else(Vec::new, |e| e.time.roughtime_keys()),
    );
    let clock = opened.closer();
    let report = bag::read(opened.store.as_ref(), &log, &options, &opened.cfg, clock.as_ref()).await?;
    Ok((report, verifying))
}

async fn audit(opened: Arc<Opened>, log: String, from: Micros, to: Micros) -> Result<AuditReport, Failure> {
    let Some(keys) = opened.keys().await? else {
        return Err(Failure::invalid(
            "an audit checks witnesses: open the store with client= or keys=",
        ));
    };
    let roughtime_keys = opened
        .env
        .as_ref()
        .map_or_else(Vec::new, |e| e.time.roughtime_keys());
    let options = ReadOptions::default()
        .with_range(from, to)
        .with_keys(Some(keys.clone()))
        .with_roughtime_keys(roughtime_keys.clone());
    let clock = opened.closer();
    let report = bag::read(opened.store.as_ref(), &log, &options, &opened.cfg, clock.as_ref()).await?;
    let messages = AuditMessage::from_report(&report, &log);
    let mut cfg = AuditConfig::new(keys.clone());
    let local = keys;
    cfg.verify_time = Arc::new(move |st| {
        bagel_proto::verify_signed_time(st, &local, &roughtime_keys).map_err(|e| e.to_string())
    });
    let mut result = bagel_bags::audit::audit(&messages, &cfg);
    result
        .violations
        .extend(bagel_bags::audit::problem_violations(&report.problems, &log));
    let last = Bucket::of(to.saturating_sub(Duration::from_micros(1)));
    let summaries =
        bagel_bags::audit::audit_summaries(opened.store.as_ref(), &log, Bucket::of(from), last).await?;
    result.violations.extend(summaries.violations);
    Ok(AuditReport {
        messages: result.messages,
        leases: result.leases,
        names: result.names,
        longest_chain: result.longest_chain,
        chain_gaps: result.chain_gaps,
        unbound_messages: result.unbound_messages,
        violations: result.violations.iter().map(ToString::to_string).collect(),
        unchecked_summaries: summaries.unchecked.iter().map(ToString::to_string).collect(),
    })
}

/// Publishes a summary of every closed stretch of `minutes` minutes of
/// `log` not yet summarized, sealing its minutes first, as `bagel
/// summarize` does; returns the names of the summaries made.
async fn summarize(opened: Arc<Opened>, log: String, minutes: u32) -> Result<Vec<String>, Failure> {
    use bagel_bags::summary::{self, Stretch};
    let now = bag::closer_now(opened.closer().as_ref()).await?;
    let store = opened.store.as_ref();
    let Some(start) = store.log_start(&log).await? else {
        return Err(Failure::log_not_found(&log, &opened.url));
    };
    let held: std::collections::BTreeSet<_> = summary::list(store, &log)
        .await?
        .iter()
        .flat_map(|st| st.spans())
        .collect();
    let mut made = Vec::new();
    let mut stretch = Stretch::aligned(start, minutes);
    while stretch.close_time(opened.cfg.grace) <= now {
        if !stretch.spans().all(|s| held.contains(&s)) {
            for span in stretch.spans() {
                bagel_bags::seal::seal(store, &log, span).await?;
            }
            let done = summary::summarize(store, &log, stretch).await?;
            if done.created {
                made.push(done.name);
            }
        }
        stretch = stretch.next();
    }
    Ok(made)
}

async fn retain(
    opened: Arc<Opened>,
    log: String,
    keep_bags: Duration,
    keep_summaries: Option<Duration>,
) -> Result<BTreeMap<&'static str, u64>, Failure> {
    let now = bag::closer_now(opened.closer().as_ref()).await?;
    let r = bagel_bags::retain::retain(opened.store.as_ref(), &log, now, keep_bags, keep_summaries).await?;
    Ok(BTreeMap::from([
        ("summaries_checked", r.summaries_checked as u64),
        ("bags_removed", r.bags_removed as u64),
        ("summaries_removed", r.summaries_removed as u64),
        ("kept", r.kept.len() as u64),
    ]))
}

#[pymethods]
impl Store {
    /// A writer of `log` under `lease`: `write([b"...", ...])` stores one
    /// batch and returns each message's timestamp (µs), all inside the
    /// lease and above every earlier holder's watermark. `writer_id`
    /// names this writer in the log (default `<host>-<pid>-<random>`).
    #[pyo3(signature = (log, lease, *, writer_id=None))]
    fn writer(&self, log: &str, lease: PyRef<'_, Lease>, writer_id: Option<String>) -> PyResult<Writer> {
        let opened = self.get()?;
        let held = &lease.held;
        let writer = bag::Writer::new(
            Arc::clone(&opened.store),
            log,
            &writer_id.unwrap_or_else(bag::Writer::default_writer_id),
            Arc::clone(&held.rights),
            Arc::new(SystemClock),
            Arc::new(held.env.time.clone()),
            opened.cfg.clone(),
        )
        .map_err(Failure::from)?;
        Ok(Writer {
            writer: Arc::new(writer),
            time: held.env.time.clone(),
        })
    }

    /// Reads `log` from `start` to `end` (µs; default: all of it), in
    /// timestamp order, and returns an iterator of `Message`.
    ///
    /// Past-due bags are closed first (on the client's signed time; without
    /// a client nothing is closed and open bags are skipped). Stretches
    /// whose bags retention removed are read from their summaries;
    /// `trust_summarizer` (keys, 64 hex digits) takes attested summaries
    /// without re-checking every signature. The iterator's `rejected`,
    /// `problems` and `verified` say what did not check, and
    /// `open_bags_skipped` which bags were not read because they are still
    /// open (a write a moment ago is in one: close it first, with a
    /// metronome, or read with `include_open=True`). Raises `LogNotFound`
    /// for a log nobody ever wrote or closed in this store.
    #[pyo3(signature = (log, *, start=None, end=None, trust_summarizer=None, include_open=false))]
    fn read(
        &self,
        py: Python<'_>,
        log: String,
        start: Option<u64>,
        end: Option<u64>,
        trust_summarizer: Option<Vec<String>>,
        include_open: bool,
    ) -> PyResult<Messages> {
        let opened = self.get()?;
        let options = read_options(&opened, start, end, trust_summarizer, include_open)?;
        let (report, verifying) = block_on(py, read(opened, log, options))?;
        Ok(Messages::new(report, verifying))
    }

    /// `read`, awaitable.
    #[pyo3(signature = (log, *, start=None, end=None, trust_summarizer=None, include_open=false))]
    fn read_async<'py>(
        &self,
        py: Python<'py>,
        log: String,
        start: Option<u64>,
        end: Option<u64>,
        trust_summarizer: Option<Vec<String>>,
        include_open: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opened = self.get()?;
        let options = read_options(&opened, start, end, trust_summarizer, include_open)?;
        awaitable(py, async move {
            let (report, verifying) = read(opened, log, options).await?;
            Ok(Messages::new(report, verifying))
        })
    }

    /// Checks `log` from `start` to `end` (µs) from the store alone:
    /// every witness and signature, that no two holders of a name
    /// overlapped, the chains of grants and watermarks, and every summary
    /// against its bags. Returns an `AuditReport`.
    #[pyo3(signature = (log, *, start=None, end=None))]
    fn audit(
        &self,
        py: Python<'_>,
        log: String,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<AuditReport> {
        let opened = self.get()?;
        block_on(
            py,
            audit(opened, log, micros(start, Micros::ZERO), micros(end, Micros::MAX)),
        )
    }

    /// `audit`, awaitable.
    #[pyo3(signature = (log, *, start=None, end=None))]
    fn audit_async<'py>(
        &self,
        py: Python<'py>,
        log: String,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opened = self.get()?;
        awaitable(
            py,
            audit(opened, log, micros(start, Micros::ZERO), micros(end, Micros::MAX)),
        )
    }

    /// A metronome closing `logs` (a name or a list) at every close time,
    /// in the background between `start()` and `stop()`, or as a context
    /// manager. Needs the store opened with a client (it closes on the
    /// client's signed time).
    #[pyo3(signature = (logs, *, max_idle_listing=None))]
    fn metronome(&self, logs: &Bound<'_, PyAny>, max_idle_listing: Option<f64>) -> PyResult<Metronome> {
        let opened = self.get()?;
        if opened.env.is_none() {
            return Err(Failure::invalid(
                "a metronome closes bags on signed time: open the store with client=",
            )
            .into());
        }
        let logs: Vec<String> = match logs.extract::<String>() {
            Ok(one) => vec![one],
            Err(_) => logs.extract()?,
        };
        for log in &logs {
            bag::validate_log(log).map_err(Failure::from)?;
        }
        let idle = max_idle_listing
            .map(|s| seconds("max_idle_listing", s))
            .transpose()?;
        let (through, _) = watch::channel(BTreeMap::new());
        Ok(Metronome {
            opened,
            logs,
            idle,
            through: Arc::new(through),
            running: Mutex::new(None),
        })
    }

    /// Publishes summaries of `log`'s closed stretches of `minutes`
    /// minutes not yet summarized; returns the names made.
    #[pyo3(signature = (log, *, minutes=1))]
    fn summarize(&self, py: Python<'_>, log: String, minutes: u32) -> PyResult<Vec<String>> {
        let opened = self.get()?;
        block_on(py, summarize(opened, log, minutes))
    }

    /// Removes the bags of `log` older than `keep_bags` seconds (at least
    /// 600) whose summary checks against them; with `keep_summaries`,
    /// also summaries older than that. Returns counts.
    #[pyo3(signature = (log, *, keep_bags, keep_summaries=None))]
    fn retain(
        &self,
        py: Python<'_>,
        log: String,
        keep_bags: f64,
        keep_summaries: Option<f64>,
    ) -> PyResult<BTreeMap<&'static str, u64>> {
        let opened = self.get()?;
        let keep_bags = seconds("keep_bags", keep_bags)?;
        let keep_summaries = keep_summaries.map(|s| seconds("keep_summaries", s)).transpose()?;
        block_on(py, retain(opened, log, keep_bags, keep_summaries))
    }

    /// Closes the store: later calls raise `Closed`. Writers already made
    /// keep their own handle on it.
    fn close(&self) {
        self.opened.lock().unwrap_or_else(PoisonError::into_inner).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.close();
    }

    fn __repr__(&self) -> String {
        match self.get() {
            Ok(o) => format!("<bagel.Store {}>", o.url),
            Err(_) => "<bagel.Store (closed)>".to_owned(),
        }
    }
}

/// Writes batches of messages to one log under one lease.
#[pyclass(frozen, module = "bagel._bagel")]
#[derive(Debug)]
pub struct Writer {
    writer: Arc<bag::Writer>,
    /// The signed time its batches carry, whose clock check says why a
    /// batch was refused for want of it.
    time: TimeSource,
}

fn payloads(messages: Vec<Vec<u8>>) -> Vec<Bytes> {
    messages.into_iter().map(Bytes::from).collect()
}

#[pymethods]
impl Writer {
    /// Stores `messages` (a list of bytes) as one batch; returns their
    /// timestamps (µs). Raises `LeaseLost` when the lease no longer gives
    /// the right to write, `LateRejected` when a closer closed the bag
    /// first (the batch is in no reader's view), `ClockOff` when this
    /// host's clock is off.
    fn write(&self, py: Python<'_>, messages: Vec<Vec<u8>>) -> PyResult<Vec<u64>> {
        let (writer, time) = (Arc::clone(&self.writer), self.time.clone());
        let batch = payloads(messages);
        block_on(py, async move { stamps(writer.write_batch(batch).await, &time) })
    }

    /// `write`, awaitable.
    fn write_async<'py>(&self, py: Python<'py>, messages: Vec<Vec<u8>>) -> PyResult<Bound<'py, PyAny>> {
        let (writer, time) = (Arc::clone(&self.writer), self.time.clone());
        let batch = payloads(messages);
        awaitable(py, async move { stamps(writer.write_batch(batch).await, &time) })
    }

    /// The highest timestamp this writer wrote (µs), or `None`.
    #[getter]
    fn max_written(&self) -> Option<u64> {
        self.writer.max_written().map(|m| m.as_micros())
    }

    #[getter]
    fn writer_id(&self) -> &str {
        self.writer.writer_id()
    }
}

fn stamps(r: bag::Result<Vec<Micros>>, time: &TimeSource) -> Result<Vec<u64>, Failure> {
    match r {
        Ok(stamps) => Ok(stamps.into_iter().map(|t| t.as_micros()).collect()),
        Err(e) => Err(Failure::from(e).on_clock(time)),
    }
}

/// One message read: `timestamp` (µs), `writer` (the writer id),
/// `sequence`, `payload` (bytes), `lease_ids` and `verified` (every check
/// made and held; never without keys).
#[pyclass(frozen, get_all, module = "bagel._bagel")]
#[derive(Debug)]
pub struct Message {
    timestamp: u64,
    writer: String,
    sequence: u64,
    payload: Py<PyBytes>,
    lease_ids: Vec<String>,
    verified: bool,
    /// The bag (second) it was read from, as `YYYY-MM-DDThh:mm:ssZ`.
    bag: String,
}

#[pymethods]
impl Message {
    fn __repr__(&self) -> String {
        format!(
            "Message(timestamp={}, writer={:?}, sequence={}, verified={})",
            self.timestamp, self.writer, self.sequence, self.verified
        )
    }
}

/// The messages of a read, in order, as an iterator; `rejected` and
/// `problems` (lists of str) say what was found wrong, `verified` whether
/// everything read checked, and `open_bags_skipped` what was not read.
#[pyclass(module = "bagel._bagel")]
#[derive(Debug)]
pub struct Messages {
    messages: std::vec::IntoIter<bag::reader::Message>,
    verifying: bool,
    /// The messages that failed a check, with why (`"<timestamp> <writer> <sequence>: <reason>"`).
    #[pyo3(get)]
    rejected: Vec<String>,
    /// Damage, duplicates, misplaced batches and missing bags met.
    #[pyo3(get)]
    problems: Vec<String>,
    /// Keys were given, every message read passed every check, and nothing read was rejected or
    /// damaged. Says nothing of the bags not read: see `open_bags_skipped`.
    #[pyo3(get)]
    verified: bool,
    /// How many closed bags were read (summaries not counted).
    #[pyo3(get)]
    closed_bags_read: u64,
    /// How many messages the read returned.
    #[pyo3(get)]
    count: usize,
    /// The bags in range that were still open and so not read, as `YYYY-MM-DDThh:mm:ssZ` (the
    /// form of `Message.bag`): their messages are not in this read. Empty when the read saw the
    /// whole range.
    #[pyo3(get)]
    open_bags_skipped: Vec<String>,
    /// Why this read closed nothing although it was to close past-due bags (this host's clock
    /// could not be vouched for), or `None`.
    #[pyo3(get)]
    close_refused: Option<String>,
}

impl Messages {
    fn new(report: bag::ReadReport, verifying: bool) -> Self {
        let verified = verifying
            && report.messages.iter().all(bag::reader::Message::verified)
            && report.rejected.is_empty()
            && report
                .problems
                .iter()
                .all(|p| p.in_open_bag && p.kind == bag::ProblemKind::Damaged);
        Messages {
            count: report.messages.len(),
            verifying,
            rejected: report
                .rejected
                .iter()
                .map(|r| {
                    format!(
                        "{} {} {}: {}",
                        r.message.timestamp.as_micros(),
                        r.message.writer_id,
                        r.message.sequence,
                        r.reason
                    )
                })
                .collect(),
            problems: report
                .problems
                .iter()
                .map(|p| format!("bag {} item {}: {}", p.bucket, p.item, p.what))
                .collect(),
            verified,
            closed_bags_read: report.closed_bags_read,
            open_bags_skipped: report.skipped_open.iter().map(ToString::to_string).collect(),
            close_refused: report.close_refused,
            messages: report.messages.into_iter(),
        }
    }
}

#[pymethods]
impl Messages {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> Option<Message> {
        let m = self.messages.next()?;
        Some(Message {
            timestamp: m.timestamp.as_micros(),
            verified: self.verifying && m.verified(),
            payload: PyBytes::new(py, &m.payload).unbind(),
            bag: m.bucket.to_string(),
            writer: m.writer_id,
            sequence: m.sequence,
            lease_ids: m.lease_ids,
        })
    }

    fn __len__(&self) -> usize {
        self.messages.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Messages(count={}, verified={}, rejected={}, problems={}, open_bags_skipped={})",
            self.count,
            if self.verified { "True" } else { "False" },
            self.rejected.len(),
            self.problems.len(),
            self.open_bags_skipped.len()
        )
    }
}

/// What an audit found: counts, and `violations` (str each); `clean` when
/// there are none.
#[pyclass(frozen, get_all, module = "bagel._bagel")]
#[derive(Debug)]
pub struct AuditReport {
    messages: usize,
    leases: usize,
    names: usize,
    longest_chain: usize,
    chain_gaps: usize,
    unbound_messages: usize,
    violations: Vec<String>,
    unchecked_summaries: Vec<String>,
}

#[pymethods]
impl AuditReport {
    /// No violations.
    #[getter]
    fn clean(&self) -> bool {
        self.violations.is_empty()
    }

    fn __repr__(&self) -> String {
        format!(
            "AuditReport(messages={}, leases={}, names={}, violations={})",
            self.messages,
            self.leases,
            self.names,
            self.violations.len()
        )
    }
}

/// Closes bags of its logs at every close time, in the background.
/// `with store.metronome("log") as m:` starts it and stops it on exit.
#[pyclass(frozen, module = "bagel._bagel")]
#[derive(Debug)]
pub struct Metronome {
    opened: Arc<Opened>,
    logs: Vec<String>,
    idle: Option<Duration>,
    /// Per log, the last second through which every bag is closed.
    through: Arc<watch::Sender<BTreeMap<String, Bucket>>>,
    running: Mutex<Option<(CancellationToken, tokio::task::JoinHandle<()>)>>,
}

/// Records each log's closed-through second for `Metronome.wait_closed`.
struct Through(Arc<watch::Sender<BTreeMap<String, Bucket>>>);

impl bag::CloseObserver for Through {
    fn closed(&self, _: &str, _: Bucket, _: Duration, _: usize) {}
    fn failed(&self, _: &str, _: Bucket, _: &bag::Error) {}
    fn caught_up(&self, log: &str, through: Bucket) {
        self.0.send_modify(|m| {
            let at = m.entry(log.to_owned()).or_insert(through);
            *at = (*at).max(through);
        });
    }
}

#[pymethods]
impl Metronome {
    /// Starts closing in the background (idempotent).
    fn start(&self) -> PyResult<()> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.is_some() {
            return Ok(());
        }
        let env = self.opened.env.as_ref().expect("checked when made");
        let mut m = bag::Metronome::new(
            Arc::clone(&self.opened.store),
            self.logs.clone(),
            self.opened.cfg.clone(),
            Arc::new(env.time.clone()),
        )
        .map_err(Failure::from)?
        .with_observer(Arc::new(Through(Arc::clone(&self.through))));
        if let Some(idle) = self.idle {
            m = m.with_max_idle_listing(idle);
        }
        let shutdown = CancellationToken::new();
        let task = handle()?.spawn(m.run(shutdown.clone(), |_| {}));
        *running = Some((shutdown, task));
        Ok(())
    }

    /// Stops it and waits for the round in progress.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some((shutdown, task)) = running {
            shutdown.cancel();
            block_on(py, async move {
                let _ = task.await;
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Blocks until every bag of `log` up to `timestamp` (µs) is closed;
    /// `False` if `timeout` seconds pass first.
    #[pyo3(signature = (log, timestamp, *, timeout=30.0))]
    fn wait_closed(&self, py: Python<'_>, log: String, timestamp: u64, timeout: f64) -> PyResult<bool> {
        let want = Bucket::of(Micros::from_micros(timestamp));
        let limit = seconds("timeout", timeout)?;
        let mut rx = self.through.subscribe();
        block_on(py, async move {
            let done = rx.wait_for(|m| m.get(&log).is_some_and(|&b| b >= want));
            Ok(tokio::time::timeout(limit, done).await.is_ok_and(|r| r.is_ok()))
        })
    }

    /// One round now, outside the background loop: closes what is due.
    /// Returns how many bags it closed.
    fn tick(&self, py: Python<'_>) -> PyResult<u64> {
        let env = self.opened.env.as_ref().expect("checked when made");
        let mut m = bag::Metronome::new(
            Arc::clone(&self.opened.store),
            self.logs.clone(),
            self.opened.cfg.clone(),
            Arc::new(env.time.clone()),
        )
        .map_err(Failure::from)?
        .with_observer(Arc::new(Through(Arc::clone(&self.through))));
        let time = env.time.clone();
        block_on(py, async move {
            match m.tick().await {
                Ok(tick) => Ok(tick.closed),
                Err(e) => Err(Failure::from(e).on_clock(&time)),
            }
        })
    }

    fn __enter__(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Self>> {
        slf.get().start()?;
        let _ = py;
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.stop(py)
    }
}
