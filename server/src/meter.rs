//! What the gRPC edge measures, and the log line of every refusal.
//!
//! Why not the metrics library's own `Family<…, Histogram>`: it takes a lock
//! per observation (a read lock to find the labelled series, then the
//! histogram's mutex). Here every series is pre-allocated in a fixed array
//! indexed by small enums (method × status code), so an observation is a
//! few relaxed atomic adds and label cardinality is bounded by
//! construction: no lease name, owner or lease id ever becomes a label.
//! `crate::http::metrics` turns these into the exposition at scrape time.
//!
//! [`Metered`] is the lease service: it times every unary call around the
//! handlers of `Service` (inherent methods, so one boxed future per call), counts
//! conflicts by mode, and logs every refused call once, at debug level,
//! with the names or lease it was about, the holder and the reason (never
//! the token). Operations inside `Batch` and `Session` are counted and
//! logged by [`Meters::batch`], which `Service::batch_ops` calls.

use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bagel_proto::pb;
use pb::lease_service_server::LeaseService;
use tokio_stream::Stream;
use tonic::{Code, Request, Response, Status};

use crate::service::Service;

/// A histogram with fixed bounds and atomic buckets.
#[derive(Debug)]
pub struct Histo {
    /// Upper bounds (inclusive) in the unit observed, ascending.
    bounds: &'static [u64],
    /// One per bound, then +Inf. Not cumulative.
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histo {
    pub fn new(bounds: &'static [u64]) -> Self {
        Histo {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum.fetch_add(v, Relaxed);
    }

    /// `(sum, count, buckets)` with bounds and sum multiplied by `scale`
    /// (e.g. 1e-9 for nanoseconds to seconds). Bucket counts are per
    /// bucket, not cumulative (the encoder accumulates them).
    pub fn snapshot(&self, scale: f64) -> (f64, u64, Vec<(f64, u64)>) {
        let mut count = 0;
        let mut out = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.load(Relaxed);
            count += n;
            let le = self.bounds.get(i).map_or(f64::INFINITY, |&b| b as f64 * scale);
            out.push((le, n));
        }
        (self.sum.load(Relaxed) as f64 * scale, count, out)
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }
}

/// RPC latency bounds, nanoseconds: 50 µs to 10 s (an acquire may wait
/// server-side for up to `--max-wait`).
const LATENCY_NS: &[u64] = &[
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Sizes of batches and signature groups (the signing group holds at most
/// 512; a batch at most `--max-batch-ops`, 1024 by default).
pub const SIZES: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

/// The gRPC methods of the lease service, as metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Acquire,
    Upgrade,
    Renew,
    Release,
    Batch,
    Describe,
    History,
    ServerInfo,
    SignedNow,
    List,
    Watch,
}

impl Method {
    pub const ALL: [Method; 11] = [
        Method::Acquire,
        Method::Upgrade,
        Method::Renew,
        Method::Release,
        Method::Batch,
        Method::Describe,
        Method::History,
        Method::ServerInfo,
        Method::SignedNow,
        Method::List,
        Method::Watch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Acquire => "Acquire",
            Method::Upgrade => "Upgrade",
            Method::Renew => "Renew",
            Method::Release => "Release",
            Method::Batch => "Batch",
            Method::Describe => "Describe",
            Method::History => "History",
            Method::ServerInfo => "ServerInfo",
            Method::SignedNow => "SignedNow",
            Method::List => "List",
            Method::Watch => "Watch",
        }
    }
}

/// The operations inside a `Batch` or `Session` request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Acquire,
    Renew,
    Upgrade,
    Release,
    /// An operation with no operation set.
    Empty,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Acquire, Op::Renew, Op::Upgrade, Op::Release, Op::Empty];

    pub fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Upgrade => "upgrade",
            Op::Release => "release",
            Op::Empty => "empty",
        }
    }

    fn of(op: &pb::BatchOp) -> Op {
        use pb::batch_op::Op as O;
        match &op.op {
            Some(O::Acquire(_)) => Op::Acquire,
            Some(O::Renew(_)) => Op::Renew,
            Some(O::Upgrade(_)) => Op::Upgrade,
            Some(O::Release(_)) => Op::Release,
            None => Op::Empty,
        }
    }
}

/// Number of gRPC status codes (OK = 0 … UNAUTHENTICATED = 16).
pub const CODES: usize = 17;

/// The canonical name of a gRPC status code, as a label value.
pub fn code_name(code: usize) -> &'static str {
    const NAMES: [&str; CODES] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(code).copied().unwrap_or("UNKNOWN")
}

fn code_index(code: Code) -> usize {
    (code as usize).min(CODES - 1)
}

/// Whether a request's `mode` field asks for a tentative lease (0 and 1
/// are full).
fn is_tentative(mode: i32) -> bool {
    mode == pb::Mode::Tentative as i32
}

/// Everything the gRPC edge counts. One per server.
#[derive(Debug)]
pub struct Meters {
    /// `[method][code]`.
    rpc: Vec<[Histo; CODES]>,
    /// `[op][code]`: operations inside batches and sessions.
    ops: Vec<[AtomicU64; CODES]>,
    /// Acquires refused because a name was held (their final answer), by
    /// the requested mode: `[full, tentative]`.
    conflicts: [AtomicU64; 2],
    /// Operations per `Batch` call or per group a `Session` ran at once.
    pub batch_sizes: Histo,
    sessions_open: AtomicI64,
}

impl Default for Meters {
    fn default() -> Self {
        Meters {
            rpc: Method::ALL
                .iter()
                .map(|_| std::array::from_fn(|_| Histo::new(LATENCY_NS)))
                .collect(),
            ops: Op::ALL
                .iter()
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            conflicts: Default::default(),
            batch_sizes: Histo::new(SIZES),
            sessions_open: AtomicI64::new(0),
        }
    }
}

impl Meters {
    pub fn rpc(&self, method: Method, code: Code, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.rpc[method as usize][code_index(code)].observe(ns);
    }

    /// The latency histogram of `method` answered with `code` (index).
    pub fn rpc_histo(&self, method: Method, code: usize) -> &Histo {
        &self.rpc[method as usize][code]
    }

    pub fn op_count(&self, op: Op, code: usize) -> u64 {
        self.ops[op as usize][code].load(Relaxed)
    }

    /// Refused acquires, `(full, tentative)`.
    pub fn conflicts(&self) -> (u64, u64) {
        (self.conflicts[0].load(Relaxed), self.conflicts[1].load(Relaxed))
    }

    fn conflict(&self, mode: i32) {
        self.conflicts[usize::from(is_tentative(mode))].fetch_add(1, Relaxed);
    }

    pub fn sessions_open(&self) -> i64 {
        self.sessions_open.load(Relaxed)
    }

    /// Counts a batch's (or session group's) operations by outcome and
    /// logs each refused one.
    pub(crate) fn batch(&self, ops: &[pb::BatchOp], results: &[pb::BatchResult]) {
        use pb::batch_result::Result as R;
        self.batch_sizes.observe(ops.len() as u64);
        for (op, result) in ops.iter().zip(results) {
            let kind = Op::of(op);
            let (code, refusal) = match &result.result {
                Some(R::Error(e)) => (usize::try_from(e.code).unwrap_or(2).min(CODES - 1), Some(e)),
                _ => (0, None),
            };
            self.ops[kind as usize][code].fetch_add(1, Relaxed);
            let Some(e) = refusal else { continue };
            if let (Some(pb::batch_op::Op::Acquire(a)), true) = (&op.op, e.code == Code::Aborted as i32) {
                self.conflict(a.mode);
            }
            log_refusal(
                kind.name(),
                &Subject::of_op(op),
                e.conflict.as_ref(),
                code_name(code),
                &e.message,
            );
        }
    }
}

/// What a refused request was about, for its log line.
#[derive(Debug)]
struct Subject<'a> {
    names: &'a [String],
    lease: &'a str,
}

impl<'a> Subject<'a> {
    fn of_op(op: &'a pb::BatchOp) -> Self {
        use pb::batch_op::Op as O;
        match &op.op {
            Some(O::Acquire(a)) => Subject::names(&a.names),
            Some(O::Renew(r)) => Subject::lease(&r.lease_id),
            Some(O::Upgrade(u)) => Subject::lease(&u.lease_id),
            Some(O::Release(r)) => Subject::lease(&r.lease_id),
            None => Subject::lease(""),
        }
    }

    fn names(names: &'a [String]) -> Self {
        Subject { names, lease: "" }
    }

    fn lease(lease: &'a str) -> Self {
        Subject { names: &[], lease }
    }
}

/// One debug line per refusal. The fields are the request's names (at
/// most a few, and never more than the request's own size limits), the
/// lease it was about, the holder that stood in the way, and the reason
/// (the status message, which never contains a token).
fn log_refusal(
    op: &str,
    subject: &Subject<'_>,
    conflict: Option<&pb::LeaseConflict>,
    code: &str,
    reason: &str,
) {
    if !refusals_logged() {
        return;
    }
    const SHOWN: usize = 8;
    let names = match subject.names.len() {
        0 => String::new(),
        n if n <= SHOWN => subject.names.join(","),
        n => format!("{},… ({n} names)", subject.names[..SHOWN].join(",")),
    };
    let (name, holder, holder_owner) = match conflict {
        Some(c) => (
            c.name.as_str(),
            c.holder_lease_id.as_str(),
            c.holder_owner.as_str(),
        ),
        None => ("", "", ""),
    };
    tracing::debug!(
        target: "bagel_server::refusal",
        op,
        code,
        names = %names,
        lease = subject.lease,
        name,
        holder,
        holder_owner,
        reason,
        "refused"
    );
}

/// Whether refusals are logged at all: only then does a unary call keep a
/// copy of what it was about (its names or lease id), so that with debug
/// logging off the metering allocates nothing per request.
fn refusals_logged() -> bool {
    tracing::enabled!(target: "bagel_server::refusal", tracing::Level::DEBUG)
}

/// The conflict carried in a refused acquire's status details (a
/// `google.rpc.Status`, see [`bagel_proto::details`]).
fn conflict_of(status: &Status) -> Option<pb::LeaseConflict> {
    if status.code() != Code::Aborted {
        return None;
    }
    bagel_proto::details::conflict_of(status.details())
}

/// The lease service, timed and counted (see the module docs).
#[derive(Clone, Debug)]
pub struct Metered(pub Service);

impl Metered {
    fn meters(&self) -> &Meters {
        &self.0.inner.meters
    }

    /// Records a unary call's latency and outcome, logging a refusal.
    fn finish<T>(
        &self,
        method: Method,
        start: Instant,
        subject: Subject<'_>,
        result: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        self.meters().rpc(method, code, start.elapsed());
        // The conflict is decoded back out of the status only for a line
        // that is logged.
        if let Err(status) = &result
            && refusals_logged()
        {
            let conflict = conflict_of(status);
            log_refusal(
                method.name(),
                &subject,
                conflict.as_ref(),
                code_name(code_index(code)),
                status.message(),
            );
        }
        result
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl LeaseService for Metered {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Reply<pb::AcquireResponse> {
        let start = Instant::now();
        let mode = request.get_ref().mode;
        let names = refusals_logged().then(|| request.get_ref().names.clone());
        let result = self.0.acquire(request).await;
        if matches!(&result, Err(s) if s.code() == Code::Aborted) {
            self.meters().conflict(mode);
        }
        let subject = Subject::names(names.as_deref().unwrap_or_default());
        self.finish(Method::Acquire, start, subject, result)
    }

    async fn upgrade(&self, request: Request<pb::UpgradeRequest>) -> Reply<pb::UpgradeResponse> {
        let start = Instant::now();
        let lease = refusals_logged().then(|| request.get_ref().lease_id.clone());
        let result = self.0.upgrade(request).await;
        let subject = Subject::lease(lease.as_deref().unwrap_or_default());
        self.finish(Method::Upgrade, start, subject, result)
    }

    async fn renew(&self, request: Request<pb::RenewRequest>) -> Reply<pb::RenewResponse> {
        let start = Instant::now();
        let lease = refusals_logged().then(|| request.get_ref().lease_id.clone());
        let result = self.0.renew(request).await;
        let subject = Subject::lease(lease.as_deref().unwrap_or_default());
        self.finish(Method::Renew, start, subject, result)
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Reply<pb::ReleaseResponse> {
        let start = Instant::now();
        let lease = refusals_logged().then(|| request.get_ref().lease_id.clone());
        let result = self.0.release(request).await;
        let subject = Subject::lease(lease.as_deref().unwrap_or_default());
        self.finish(Method::Release, start, subject, result)
    }

    async fn batch(&self, request: Request<pb::BatchRequest>) -> Reply<pb::BatchResponse> {
        let start = Instant::now();
        let result = self.0.batch(request).await;
        self.finish(Method::Batch, start, Subject::lease(""), result)
    }

    type SessionStream = SessionAnswers;

    /// Sessions are long-lived, so they are counted while open rather than
    /// timed; their groups of operations go through [`Meters::batch`].
    async fn session(
        &self,
        request: Request<tonic::Streaming<pb::BatchRequest>>,
    ) -> Reply<Self::SessionStream> {
        let answers = self.0.session(request).await?.into_inner();
        self.meters().sessions_open.fetch_add(1, Relaxed);
        Ok(Response::new(SessionAnswers {
            answers,
            service: self.0.clone(),
        }))
    }

    async fn describe(&self, request: Request<pb::DescribeRequest>) -> Reply<pb::DescribeResponse> {
        let start = Instant::now();
        let result = self.0.describe(request).await;
        self.finish(Method::Describe, start, Subject::lease(""), result)
    }

    async fn history(&self, request: Request<pb::HistoryRequest>) -> Reply<pb::HistoryResponse> {
        let start = Instant::now();
        let name = refusals_logged().then(|| vec![request.get_ref().name.clone()]);
        let result = self.0.history(request).await;
        let subject = Subject::names(name.as_deref().unwrap_or_default());
        self.finish(Method::History, start, subject, result)
    }

    async fn server_info(&self, request: Request<pb::ServerInfoRequest>) -> Reply<pb::ServerInfoResponse> {
        let start = Instant::now();
        let result = self.0.server_info(request).await;
        self.finish(Method::ServerInfo, start, Subject::lease(""), result)
    }

    async fn list(&self, request: Request<pb::ListRequest>) -> Reply<pb::ListResponse> {
        let start = Instant::now();
        let result = self.0.list(request).await;
        self.finish(Method::List, start, Subject::lease(""), result)
    }

    type WatchStream = crate::service::WatchStream;

    /// Watches are long-lived: only their start is timed.
    async fn watch(&self, request: Request<pb::WatchRequest>) -> Reply<Self::WatchStream> {
        let start = Instant::now();
        let result = self.0.watch(request).await;
        self.finish(Method::Watch, start, Subject::lease(""), result)
    }

    async fn signed_now(&self, request: Request<pb::SignedNowRequest>) -> Reply<pb::SignedNowResponse> {
        let start = Instant::now();
        let result = self.0.signed_now(request).await;
        self.finish(Method::SignedNow, start, Subject::lease(""), result)
    }
}

/// A session's answers; counts the session as closed when dropped.
#[derive(Debug)]
pub struct SessionAnswers {
    answers: crate::session::Answers,
    service: Service,
}

impl Stream for SessionAnswers {
    type Item = Result<pb::BatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.answers).poll_next(cx)
    }
}

impl Drop for SessionAnswers {
    fn drop(&mut self) {
        self.service.inner.meters.sessions_open.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let h = Histo::new(&[1, 2, 4]);
        for v in [0, 1, 2, 3, 4, 5, 100] {
            h.observe(v);
        }
        let (sum, count, buckets) = h.snapshot(1.0);
        assert_eq!((sum, count), (115.0, 7));
        assert_eq!(buckets, vec![(1.0, 2), (2.0, 1), (4.0, 2), (f64::INFINITY, 2)]);
    }
}
