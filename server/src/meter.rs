//! What the gRPC edge measures.
//!
//! Why not the metrics library's own `Family<…, Histogram>`: it takes a lock
//! per observation (a read lock to find the labelled series, then the
//! histogram's mutex). Here every series is pre-allocated in a fixed array
//! indexed by small enums (method × status code), so an observation is a
//! few relaxed atomic adds and label cardinality is bounded by
//! construction: no lease name, owner or lease id ever becomes a label.
//! `crate::http::metrics` turns these into the exposition at scrape time.
//!
//! Only the meters live here, not who feeds them: `crate::grpc` times and
//! counts every unary call, and `Service::batch_ops` counts the operations
//! inside `Batch` and `Session`. Both hand over a gRPC code computed from
//! the domain error (`Error::code`), because the exposition's labels are
//! gRPC code names; the refusal's log line is `crate::refusal`'s.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bagel_proto::pb;
use tonic::Code;

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

    pub fn of(op: &pb::BatchOp) -> Op {
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

/// The label value of `code` (`code_name` of its index).
pub fn code_label(code: Code) -> &'static str {
    code_name(code_index(code))
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

    /// An acquire refused because a name was held, by its request's `mode`.
    pub fn conflict(&self, mode: i32) {
        self.conflicts[usize::from(is_tentative(mode))].fetch_add(1, Relaxed);
    }

    /// One operation inside a batch or a session group, by its outcome.
    pub fn op(&self, op: Op, code: Code) {
        self.ops[op as usize][code_index(code)].fetch_add(1, Relaxed);
    }

    pub fn sessions_open(&self) -> i64 {
        self.sessions_open.load(Relaxed)
    }

    pub fn session_opened(&self) {
        self.sessions_open.fetch_add(1, Relaxed);
    }

    pub fn session_closed(&self) {
        self.sessions_open.fetch_sub(1, Relaxed);
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
