//! The lease client's domain types: what the server says, in Rust terms.
//! The protobuf types stay behind the conversions in `wire`; nothing in
//! this crate's public API is generated code.

use std::fmt;
use std::time::Duration;

use bagel_proto::{Micros, pb};

/// What a lease grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// May write.
    Full,
    /// Reserves names without the right to write; a full acquire of one of
    /// them breaks it. Turn it full with [`crate::Lease::upgrade`].
    Tentative,
}

impl Mode {
    /// The word the CLI and logs use: `full`, `tentative`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Tentative => "tentative",
        }
    }
}

/// How the lease before the current one on a name ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ended {
    /// Nothing came before, and nothing is inherited.
    None,
    /// Released, publishing its watermark.
    Released,
    /// Its deadline passed without a release; the deadline is the watermark.
    Broken,
    /// The server holds no record (it restarted, or forgot an idle name);
    /// the watermark is its forgotten floor.
    Unknown,
}

impl Ended {
    /// The word the CLI's JSON uses: `none`, `released`, `broken`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::None => "none",
            Ended::Released => "released",
            Ended::Broken => "broken",
            Ended::Unknown => "unknown",
        }
    }
}

/// What a grant inherits on one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Previous {
    /// The previous lease, when known.
    pub lease_id: Option<String>,
    /// Every message written under earlier leases is at or below this.
    pub watermark: Micros,
    /// How the previous lease ended ([`Ended::None`] when there was none).
    pub ended: Ended,
    /// When it was released or found broken (zero when unknown or none).
    pub ended_at: Micros,
    /// Bags that can hold a timestamp below this may still change: close
    /// them before reading what earlier holders wrote.
    pub unsettled_until: Option<Micros>,
    /// When the previous lease was granted, when known.
    pub granted_at: Option<Micros>,
}

/// One name of a grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameGrant {
    /// The leased name.
    pub name: String,
    /// Strictly increases with every grant of the name, across restarts.
    pub fencing_token: u64,
    /// What this name inherits from the lease before (its watermark, how
    /// it ended, which bags are unsettled).
    pub previous: Previous,
}

/// A witness: the exact bytes of the server's signed statement of a grant,
/// its signature and the signing key's id. Verify it with
/// [`bagel_proto::verify_witness`]-equivalent tools, or carry it to the bag
/// writer (a lease's [`crate::Lease::rights`] does).
#[derive(Clone, PartialEq, Eq)]
pub struct Witness(pub(crate) pb::Witness);

impl Witness {
    /// The signed body, exactly as the server encoded it.
    pub fn body(&self) -> &[u8] {
        &self.0.body
    }
    /// The ed25519 signature over the body (or, batched, over the batch's
    /// Merkle root).
    pub fn signature(&self) -> &[u8] {
        &self.0.signature
    }
    /// The id of the key that signed it, as [`ServerInfo::keys`] lists it.
    pub fn key_id(&self) -> &str {
        &self.0.key_id
    }
    /// For a witness signed in a batch: its leaf index and Merkle path
    /// (see `witness.proto`).
    pub fn merkle(&self) -> Option<(u32, &[prost::bytes::Bytes])> {
        self.0
            .batched
            .then_some((self.0.leaf_index, self.0.merkle_path.as_slice()))
    }
    /// The wire form (its bytes shared, not copied).
    pub fn to_pb(&self) -> pb::Witness {
        self.0.clone()
    }
    /// The witness from its parts (for example read back from a file).
    pub fn from_parts(
        body: Vec<u8>,
        signature: Vec<u8>,
        key_id: String,
        merkle: Option<(u32, Vec<Vec<u8>>)>,
    ) -> Self {
        let (batched, leaf_index, merkle_path) = match merkle {
            Some((i, path)) => (true, i, path),
            None => (false, 0, Vec::new()),
        };
        Witness(bagel_proto::witness::compact(pb::Witness {
            body: body.into(),
            signature: signature.into(),
            key_id,
            batched,
            leaf_index,
            merkle_path: merkle_path.into_iter().map(Into::into).collect(),
        }))
    }
}

/// A witness as it travels (what a backend answering over the wire hands
/// its grants), in one allocation of its own: it is kept as long as its
/// lease, and decoded it shares the whole answer's buffer
/// ([`bagel_proto::witness::compact`]).
impl From<pb::Witness> for Witness {
    fn from(w: pb::Witness) -> Self {
        Witness(bagel_proto::witness::compact(w))
    }
}

impl Witness {
    /// A witness derived from a lean answer
    /// (`bagel_proto::signed_range::FoldedRange::witness`), which is in one
    /// allocation of its own already: kept as it is, not copied again.
    pub fn derived(w: pb::Witness) -> Self {
        Witness(w)
    }
}

impl fmt::Debug for Witness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Witness")
            .field("key_id", &self.0.key_id)
            .field("body_bytes", &self.0.body.len())
            .field("batched", &self.0.batched)
            .finish()
    }
}

/// A lease as a server granted it (acquire or upgrade), its witness checked.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The lease's id, unique on its backend.
    pub lease_id: String,
    /// The holder's secret. Keep it out of logs.
    pub token: String,
    /// When the lease ends unless renewed (µs, the server's clock).
    pub deadline: Micros,
    /// Every message written under this lease must be strictly later.
    pub min_timestamp: Micros,
    /// Each leased name, with its fencing token and what it inherits.
    pub names: Vec<NameGrant>,
    /// What the lease grants.
    pub mode: Mode,
    /// The statements of this grant, checked: one per server (or store)
    /// that took part, never empty. Each states a deadline at or after
    /// `deadline` and a mode at least `mode`.
    pub witnesses: Vec<Witness>,
    /// For a lease over several servers, each server's part (empty for a
    /// lease from one server).
    pub servers: Vec<ServerPart>,
}

/// Which server holds which names of a combined lease, and under which of
/// its leases (for lease files and operators).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerPart {
    /// The server's URL.
    pub server: String,
    /// The id of the key the server signed this part's witness with (names
    /// are routed by the server's configured identity, not by its key).
    pub key_id: String,
    /// The server's lease id.
    pub lease_id: String,
    /// The names this server holds.
    pub names: Vec<String>,
}

impl Grant {
    /// The first witness (the only one from a single server).
    pub fn witness(&self) -> &Witness {
        &self.witnesses[0]
    }

    /// The lease by id, token and names.
    pub fn lease_ref(&self) -> LeaseRef {
        LeaseRef::new(self.lease_id.clone(), self.token.clone())
            .with_names(self.names.iter().map(|n| n.name.clone()))
    }
}

/// A renewal as the backend answered it, its witnesses checked.
#[derive(Clone, Debug)]
pub struct Renewal {
    /// The lease's deadline now (µs, the server's clock); never earlier
    /// than before the renewal.
    pub deadline: Micros,
    /// What the lease grants now.
    pub mode: Mode,
    /// As in [`Grant::witnesses`]: each states at least `deadline`.
    pub witnesses: Vec<Witness>,
}

impl Renewal {
    /// The first witness (the only one from a single server).
    pub fn witness(&self) -> &Witness {
        &self.witnesses[0]
    }
}

/// A lease named by id and token (and, for backends that find leases by
/// name, its names), for tools that hold a lease across processes (the
/// CLI). Library users hold a [`crate::Lease`] instead.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseRef {
    /// The lease's id.
    pub id: String,
    /// The holder's secret ([`Grant::token`]). Keep it out of logs.
    pub token: String,
    /// The leased names; a bagel server finds a lease by id alone and
    /// ignores them.
    pub names: Vec<String>,
}

impl LeaseRef {
    /// The lease by id and token, with no names (enough for a bagel
    /// server).
    pub fn new(id: impl Into<String>, token: impl Into<String>) -> Self {
        LeaseRef {
            id: id.into(),
            token: token.into(),
            names: Vec::new(),
        }
    }

    /// The same reference naming the leased names, for backends that find
    /// a lease by name (the S3 lease store).
    #[must_use]
    pub fn with_names<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.names = names.into_iter().map(Into::into).collect();
        self
    }
}

impl fmt::Debug for LeaseRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A token is a secret: never log it.
        f.debug_struct("LeaseRef")
            .field("id", &self.id)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

/// Where a holder stored its updates, as it tells the server on renew or
/// release (bounded by the server's metadata limit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Metadata {
    /// The holder's own bytes (a location, a manifest), opaque to bagel.
    Data(Vec<u8>),
    /// "Could be anywhere".
    Wildcard,
}

/// What a release says besides its watermark.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ReleaseOptions {
    /// At least every timestamp written under the lease (a lease handle
    /// takes at least what its writers wrote).
    pub watermark: Option<Micros>,
    /// The signed time the watermark is checked against (else the server's
    /// clock).
    pub signed_time: Option<bagel_proto::SignedReading>,
    /// Where the holder stored its updates, for the next holder (and
    /// `bagel history`); `None` says nothing.
    pub metadata: Option<Metadata>,
    /// Some write under the lease may still land.
    pub unsettled: bool,
    /// The holder closed every bag below this.
    pub settled_through: Option<Micros>,
    /// What the whole lease inherited, over every server it is held on.
    /// A server carries its own chain forward by itself; a lease over
    /// several servers (a cluster while migrating) may have inherited on
    /// one server what another never heard of, so each part's release
    /// carries this on. A [`crate::Lease`] fills it in.
    pub inherited: Option<Inherited>,
}

/// What a lease inherited from the holders before it (see
/// [`ReleaseOptions::inherited`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inherited {
    /// The highest watermark any part inherited (the lease's
    /// `min_timestamp`).
    pub watermark: Micros,
    /// Bags below this were unsettled when the lease was granted.
    pub unsettled_until: Option<Micros>,
}

impl ReleaseOptions {
    /// These options for one part of a lease held on several servers:
    /// the watermark raised to what the whole lease inherited, and the
    /// release marked unsettled if the lease inherited unsettled bags it
    /// did not close. So the next holder on this server inherits what a
    /// predecessor on another server left, as it would on that server.
    pub fn carrying_inherited(&self) -> ReleaseOptions {
        let mut o = self.clone();
        if let Some(inh) = self.inherited {
            o.watermark = o.watermark.max(Some(inh.watermark)).filter(|w| *w > Micros::ZERO);
            o.unsettled |= inh
                .unsettled_until
                .is_some_and(|until| o.settled_through.is_none_or(|s| s < until));
        }
        o
    }
}

impl ReleaseOptions {
    /// Publish at least `watermark` (µs).
    #[must_use]
    pub fn with_watermark(mut self, watermark: Micros) -> Self {
        self.watermark = Some(watermark);
        self
    }
    /// Check the watermark against this signed time, not the server's
    /// clock.
    #[must_use]
    pub fn with_signed_time(mut self, signed: bagel_proto::SignedReading) -> Self {
        self.signed_time = Some(signed);
        self
    }
    /// Tell the next holder where the updates are.
    #[must_use]
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = Some(metadata);
        self
    }
    /// Say that some write under the lease may still land, so the next
    /// holder closes its bags before reading.
    #[must_use]
    pub fn with_unsettled(mut self, unsettled: bool) -> Self {
        self.unsettled = unsettled;
        self
    }
    /// Say that the holder closed every bag below `through` (µs).
    #[must_use]
    pub fn with_settled_through(mut self, through: Micros) -> Self {
        self.settled_through = Some(through);
        self
    }
}

/// Who holds a name now, as refused acquires and `describe` say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The name refused.
    pub name: String,
    /// The lease that holds it.
    pub holder_lease_id: String,
    /// Who holds it: the owner it acquired as (its certificate's subject
    /// under mutual TLS).
    pub holder_owner: String,
    /// What the holder's lease grants.
    pub holder_mode: Mode,
    /// Retry after this instant (µs, the server's clock).
    pub holder_deadline: Micros,
    /// The server that refused, when the lease spans several (its URL).
    pub server: Option<String>,
}

/// A name's state, for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameState {
    /// The name described.
    pub name: String,
    /// Who holds it now; `None` when nobody does (or the holder's deadline
    /// passed).
    pub holder: Option<Holder>,
    /// What the next holder would inherit if granted now.
    pub previous: Previous,
    /// The last fencing token issued (0 when the server has no record).
    pub fencing_token: u64,
    /// False when the server has no record of the name.
    pub known: bool,
}

/// The current holder of a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The holder's lease.
    pub lease_id: String,
    /// The owner it acquired as (its certificate's subject under mutual
    /// TLS).
    pub owner: String,
    /// What its lease grants.
    pub mode: Mode,
    /// When its lease ends unless renewed (µs, the server's clock).
    pub deadline: Micros,
    /// The name's fencing token under this lease.
    pub fencing_token: u64,
    /// When the lease was granted (µs, the server's clock).
    pub granted_at: Micros,
}

/// A name's recent renewals and releases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Oldest first.
    pub entries: Vec<HistoryEntry>,
    /// Older entries were dropped for the memory budget.
    pub truncated: bool,
}

/// What a [`HistoryEntry`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryEvent {
    /// The holder renewed its lease.
    Renewed,
    /// The holder released its lease.
    Released,
}

/// One renewal or release of a name, as [`History`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The lease renewed or released.
    pub lease_id: String,
    /// The owner it was acquired as.
    pub owner: String,
    /// Renewed or released.
    pub event: HistoryEvent,
    /// When (µs, the server's clock).
    pub at: Micros,
    /// For a release, the watermark it published; for a renewal, the one
    /// the lease inherited (µs).
    pub watermark: Micros,
    /// Where the holder said its updates are; `None` when it said nothing.
    pub metadata: Option<Metadata>,
}

/// A lease server's keys, limits, readiness and clock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// The id the server states in its witnesses (random unless
    /// configured).
    pub server_id: String,
    /// The server's release version.
    pub version: String,
    /// When this incarnation started.
    pub epoch: Micros,
    /// Raw ed25519 public keys by key id.
    pub keys: Vec<(String, [u8; 32])>,
    /// A lease must last longer than this.
    pub min_ttl: Duration,
    /// A lease may last at most this long; a restart waits it out.
    pub max_ttl: Duration,
    /// The longest one acquire may wait for busy names.
    pub max_wait: Duration,
    /// No grants before this (restart wait).
    pub ready_at: Micros,
    /// Whether it grants now (its restart wait is over and its clock is
    /// healthy).
    pub ready: bool,
    /// The server's clock when it answered (µs).
    pub now: Micros,
    /// Where its time comes from, and whether it trusts it.
    pub clock: ClockStatus,
    /// What a name the server has no record of inherits as its watermark
    /// (µs): raised as idle records are forgotten.
    pub forgotten_floor: Micros,
    /// Started with `--unsafe-skip-restart-wait`: an earlier incarnation's
    /// leases may still be live. For development only.
    pub unsafe_skip_restart_wait: bool,
    /// The most names one request may name.
    pub max_names_per_request: u32,
    /// The longest name, in bytes.
    pub max_name_bytes: u32,
    /// The longest owner, in bytes.
    pub max_owner_bytes: u32,
    /// The most [`Metadata`] a renew or release may carry, in bytes.
    pub max_metadata_bytes: u32,
    /// How far a watermark may be ahead of its signed time.
    pub timestamp_tolerance: Duration,
    /// The server's access policy (`--acl`) and this client under it;
    /// `None` when the server has none (every client may do anything).
    /// Boxed: most servers have none, and `ServerInfo` travels in enums.
    pub access: Option<Box<AccessInfo>>,
    /// The member lists the server serves in (`--members`, then
    /// `--next-members`), each as server ids; empty when it was started
    /// without them. Such a server grants only names it owns under one
    /// of these lists (`bagel_proto::routing`).
    pub members: Vec<Vec<String>>,
}

/// A server's access policy as one client sees it: who the server takes
/// it for, and what it may do.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AccessInfo {
    /// Loads of the policy that took effect since the server started.
    pub policy_version: u64,
    /// SHA-256 (hex) of the policy file in effect.
    pub policy_sha256: String,
    /// Its client certificate's subject or its bearer token's identity;
    /// empty when it has none.
    pub identity: String,
    /// Why it has none, when it has none.
    pub identity_problem: String,
    /// Name prefixes and the permissions ("lease", "read") on them.
    pub grants: Vec<(String, Vec<String>)>,
}

/// Where a server's time comes from, and whether it trusts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClockStatus {
    /// Where the time comes from.
    pub source: ClockSource,
    /// The current bound on the server clock's error.
    pub error_bound: Duration,
    /// False when the clock is off by more than the tolerance: no grants.
    pub healthy: bool,
    /// What the server says of its clock, for a person (the fault, when
    /// there is one).
    pub detail: String,
}

/// Where a server's signed time comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// The server signs its own clock readings (local time agent).
    Local,
    /// Roughtime answers, kept as proofs anyone can verify.
    Roughtime,
}

mod wire;
use wire::micros;

/// A held name, as `bagel_client::Client::list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedName {
    /// The held name.
    pub name: String,
    /// Who holds it.
    pub holder: Holder,
}

/// One page of held names, in name order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    /// The held names of this page; empty when no (more) name is held.
    pub names: Vec<ListedName>,
    /// Pass this to get the next page; `None` on the last.
    pub next_page: Option<String>,
    /// The most names the server puts in one page.
    pub max_page_size: u32,
    /// The watch revision the page reflects: every event up to it shows
    /// (a later one may too). Watch from the first page's revision to miss
    /// nothing after the listing. 0 from a server before revisions.
    pub revision: u64,
}

impl From<pb::ListResponse> for ListPage {
    fn from(r: pb::ListResponse) -> Self {
        ListPage {
            names: r
                .names
                .into_iter()
                .map(|n| {
                    let h = n.holder.unwrap_or_default();
                    ListedName {
                        name: n.name,
                        holder: Holder {
                            mode: h.mode().into(),
                            lease_id: h.lease_id,
                            owner: h.owner,
                            deadline: micros(h.deadline_us),
                            fencing_token: h.fencing_token,
                            granted_at: micros(h.granted_at_us),
                        },
                    }
                })
                .collect(),
            next_page: (!r.next_page_token.is_empty()).then_some(r.next_page_token),
            max_page_size: r.max_page_size,
            revision: r.revision,
        }
    }
}

/// Which names a watch follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchTarget {
    /// Exactly these names.
    Names(Vec<String>),
    /// Every name starting with this (`""`: every name).
    Prefix(String),
}

/// What happened to a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchEventKind {
    /// A lease on it was granted.
    Granted,
    /// Its holder renewed.
    Renewed,
    /// Its holder's tentative lease turned full.
    Upgraded,
    /// Its holder released it.
    Released,
    /// Taken from its holder by a grant (a full holder past its deadline,
    /// or a tentative one preempted).
    Broken,
    /// The holder's deadline passed without a release.
    Expired,
}

impl WatchEventKind {
    /// The word the CLI uses: `granted`, `renewed`, `upgraded`,
    /// `released`, `broken`, `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEventKind::Granted => "granted",
            WatchEventKind::Renewed => "renewed",
            WatchEventKind::Upgraded => "upgraded",
            WatchEventKind::Released => "released",
            WatchEventKind::Broken => "broken",
            WatchEventKind::Expired => "expired",
        }
    }
}

/// One event of a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// Grows with every event on the server; resume after it with
    /// `from_revision`.
    pub revision: u64,
    /// What happened.
    pub kind: WatchEventKind,
    /// The name it happened to.
    pub name: String,
    /// The lease it happened to.
    pub lease_id: String,
    /// The owner that lease was acquired as.
    pub owner: String,
    /// What that lease grants after the event.
    pub mode: Mode,
    /// The lease's deadline after the event (µs, the server's clock).
    pub deadline: Micros,
    /// When it happened, on the server's clock.
    pub at: Micros,
}

impl WatchEvent {
    /// `None` for a kind this client does not know (a newer server).
    pub fn from_pb(e: pb::WatchEvent) -> Option<Self> {
        let kind = match e.kind() {
            pb::WatchEventKind::Granted => WatchEventKind::Granted,
            pb::WatchEventKind::Renewed => WatchEventKind::Renewed,
            pb::WatchEventKind::Upgraded => WatchEventKind::Upgraded,
            pb::WatchEventKind::Released => WatchEventKind::Released,
            pb::WatchEventKind::Broken => WatchEventKind::Broken,
            pb::WatchEventKind::Expired => WatchEventKind::Expired,
            // Progress is not an event (see `bagel_client::WatchMessage`).
            pb::WatchEventKind::Unspecified | pb::WatchEventKind::Progress => return None,
        };
        Some(WatchEvent {
            revision: e.revision,
            kind,
            mode: e.mode().into(),
            name: e.name,
            lease_id: e.lease_id,
            owner: e.owner,
            deadline: micros(e.deadline_us),
            at: micros(e.at_us),
        })
    }
}
