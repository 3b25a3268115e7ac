//! What goes into the table and what comes out: its limits, the requests
//! the edge has validated, and the grants, releases and views it answers.
//! Plain data; the rules are in the table itself.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::{Micros, pb};

use super::{HeldLimits, Holder, LeaseId, Metadata, Mode, Previous, Token};

/// Limits of the table. Validation of sizes happens at the edge; these are
/// the rules that need the clock or the state.
#[derive(Clone, Debug)]
pub struct TableConfig {
    /// Number of shards (at most [`MAX_SHARDS`](super::MAX_SHARDS)).
    pub shards: usize,
    /// A deadline must be later than `now + min_ttl`.
    pub min_ttl: Duration,
    /// A deadline may be at most `now + max_ttl`.
    pub max_ttl: Duration,
    /// When this incarnation started (its epoch).
    pub started: Micros,
    /// No grant before this instant (restart quarantine).
    pub ready_at: Micros,
    /// What a name with no record inherits at start.
    pub initial_floor: Micros,
    /// Idle name records kept before the oldest are forgotten.
    pub max_records: usize,
    /// History entries kept per name.
    pub history_per_name: usize,
    /// Bytes of history kept over all names.
    pub history_budget_bytes: usize,
    /// Acquires waiting for one name, and in all.
    pub max_waiters_per_name: usize,
    pub max_waiters: usize,
    /// Names held at once: in all, per owner, per peer.
    pub held: HeldLimits,
    /// Watchers' buffers and the events kept for resuming.
    pub watch: crate::watch::WatchConfig,
    /// The incarnation part of this table's watch revisions (see
    /// [`crate::watch::incarnation`]).
    pub incarnation: u32,
}

impl TableConfig {
    /// A config for tests: ready at once, floor zero.
    pub fn for_tests(max_ttl: Duration) -> Self {
        TableConfig {
            shards: 8,
            min_ttl: Duration::from_millis(1),
            max_ttl,
            started: Micros::ZERO,
            ready_at: Micros::ZERO,
            initial_floor: Micros::ZERO,
            max_records: 1_000_000,
            history_per_name: 8,
            history_budget_bytes: 1 << 20,
            max_waiters_per_name: 1024,
            max_waiters: 65_536,
            held: HeldLimits::default(),
            watch: Default::default(),
            incarnation: 0,
        }
    }
}

/// An acquire request, validated at the edge: names sorted and unique.
#[derive(Clone, Debug)]
pub struct AcquireSpec {
    pub names: Vec<Arc<str>>,
    pub deadline: Micros,
    pub owner: Arc<str>,
    pub mode: Mode,
    /// The client's address, for the per-peer quota (`None`: not known).
    pub peer: Option<std::net::IpAddr>,
    /// The holder's public key, stated in every witness of the lease.
    pub holder_key: Option<Arc<[u8; 32]>>,
}

/// One name of a grant.
#[derive(Clone, Debug, PartialEq)]
pub struct NameGrant {
    pub name: Arc<str>,
    pub fencing: u64,
    pub previous: Previous,
}

/// A lease as granted, upgraded or renewed: what the witness states.
#[derive(Clone, Debug)]
pub struct Grant {
    pub lease: LeaseId,
    pub token: Token,
    pub owner: Arc<str>,
    pub mode: Mode,
    pub deadline: Micros,
    /// Max of the names' previous watermarks; writes must be strictly later.
    pub min_timestamp: Micros,
    pub names: Vec<NameGrant>,
    /// The holder's public key, as it asked at acquire.
    pub holder_key: Option<Arc<[u8; 32]>>,
}

/// The outcome of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The highest watermark now stored among the lease's names.
    pub watermark: Micros,
}

/// What a release says.
#[derive(Clone, Debug, Default)]
pub struct ReleaseSpec {
    pub watermark: Micros,
    pub signed_time: Option<Arc<pb::SignedTime>>,
    pub metadata: Option<Metadata>,
    /// Some write under the lease may still land (its outcome is unknown).
    pub unsettled: bool,
    /// The holder closed every bag that can hold a timestamp below this.
    pub settled_through: Micros,
}

/// A name's state for operators.
#[derive(Clone, Debug, PartialEq)]
pub struct NameView {
    pub name: Arc<str>,
    pub holder: Option<Holder>,
    /// The holder's owner.
    pub owner: Option<Arc<str>>,
    pub previous: Previous,
    pub fencing: u64,
    pub known: bool,
    /// Acquires waiting for the name.
    pub waiters: usize,
}
