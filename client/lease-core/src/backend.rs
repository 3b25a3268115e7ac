//! [`LeaseBackend`]: where leases live. The lease handle ([`crate::Lease`]),
//! its renewal, loss and write rights are the same whatever keeps the
//! leases: one bagel server (`bagel_client::Client`, or a `Coalescer`
//! batching over one), or a backend another crate supplies (S3 conditional
//! writes, several servers).
//!
//! A backend answers with checked [`Grant`]s and [`Renewal`]s: each carries
//! the witnesses that state it, verified against the keys the backend
//! trusts; the bag writer and the audit check them again against their own
//! keys. The handle reads one thing in them: each witness's `issued_at_us`
//! and deadline bound the lease's validity on the monotonic clock (the TTL
//! left when it was issued), so a backend states when it made each grant
//! or renewal, never zero.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, Micros};

use crate::error::{Error, Result};
use crate::types::{
    Grant, History, LeaseRef, ListedName, Metadata, Mode, NameState, ReleaseOptions, Renewal, ServerInfo,
    WatchEvent, WatchTarget,
};

/// One acquire, as the [`crate::AcquireBuilder`] resolved it.
#[derive(Clone, Debug)]
pub struct AcquireSpec {
    /// All or none.
    pub names: Vec<String>,
    /// Absolute (Unix µs): what the caller asked for, or, with `ttl`, the
    /// local clock's estimate of it (for backends that only take absolute
    /// deadlines).
    pub deadline: Micros,
    /// A TTL counted from the grant, on the backend's clock: a lease
    /// server is asked for it as such (`ttl_us`), so time the request
    /// spends on the way or waiting for a busy name is not taken off the
    /// lease, and a client clock behind the server's does not shorten it.
    /// `None`: `deadline` is what was asked for.
    pub ttl: Option<Duration>,
    /// What the lease is to grant.
    pub mode: Mode,
    /// Free text for operators.
    pub owner: String,
    /// How long the backend may wait for busy names (zero: refuse at once).
    pub wait: Duration,
    /// The holder's public key for this lease (ed25519, raw), to be stated
    /// in every witness of it: the holder signs its batches with the secret
    /// half, so a copy of a witness cannot vouch for other bytes. `None`:
    /// the witnesses say nothing of the holder (as from an old client).
    pub holder_key: Option<[u8; 32]>,
}

/// What a backend says of itself, for operators (`bagel lease
/// server-info`): a server's info, each server's, or a lease store's
/// settings (there is no server to ask).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum BackendInfo {
    /// One lease server, at `url`.
    Server {
        /// The server's URL.
        url: String,
        /// What it says of itself.
        info: ServerInfo,
    },
    /// Several lease servers: (URL, info) of each, in the order a
    /// multi-server acquire visits them (by member id).
    Servers(Vec<(String, ServerInfo)>),
    /// A lease store without a server (S3 conditional writes).
    Store(StoreInfo),
}

/// The settings of a lease store without a server, and the keys its
/// witnesses are signed with.
#[derive(Clone, Debug)]
pub struct StoreInfo {
    /// The store's URL.
    pub location: String,
    /// The key this client signs its witnesses with.
    pub key_id: String,
    /// Leases are longer than this...
    pub min_ttl: Duration,
    /// ...and at most this long.
    pub max_ttl: Duration,
    /// The longest one acquire waits for a busy name.
    pub max_wait: Duration,
    /// How long after its deadline others take over a lease, at least.
    pub clock_margin: Duration,
    /// Every key published in the store.
    pub keys: KeyRing,
}

/// The refusal of an operation a backend cannot answer (the trait's
/// default for the operator's calls): not retryable.
pub fn not_supported(what: &str, location: &str) -> Error {
    Error::Unsupported {
        what: what.to_owned(),
        location: location.to_owned(),
    }
}

/// An operator's call that not every backend answers: whether one does is
/// what it states in [`LeaseBackend::offers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// [`LeaseBackend::list_names`].
    List,
    /// [`LeaseBackend::watch_names`].
    Watch,
}

impl Call {
    /// The call as an operator names it (`list`, `watch`).
    pub fn as_str(self) -> &'static str {
        match self {
            Call::List => "list",
            Call::Watch => "watch",
        }
    }
}

/// Whether a backend answers a [`Call`], as it states it: so that a tool
/// can refuse before starting (a `list --watch` that could list but not
/// watch) and say why in the backend's own words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offer {
    /// It does.
    Yes,
    /// Each of its servers does, alone; the backend as a whole does not
    /// (`why`: "revisions are per server").
    EachServer {
        /// Why the backend as a whole does not, in its own words.
        why: String,
    },
    /// It does not (`why`: "S3 has no change notifications"; `None`: it
    /// says no more).
    No {
        /// Why not, in the backend's own words.
        why: Option<String>,
    },
}

/// The held names of [`LeaseBackend::list_names`]: at most the limit
/// asked, in name order, and the revision each listing reflects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// A name held on two servers (while migrating) is listed by each.
    pub names: Vec<Listed>,
    /// The revision of each place listed: every event up to it shows in
    /// the listing, so a watch from it misses nothing after. One entry for
    /// a backend that is one place; one per server for several.
    pub revisions: Vec<ListedAt>,
}

/// A held name, and the server that listed it when the backend is several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// `None`: the backend is one place.
    pub server: Option<String>,
    /// The name and its holder.
    pub name: ListedName,
}

/// The watch revision a listing of one place reflects (0: that place
/// keeps no revisions, as a server from before them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedAt {
    /// `None`: the backend is one place.
    pub server: Option<String>,
    /// The revision the listing reflects.
    pub revision: u64,
}

/// How [`LeaseBackend::watch_names`] starts a watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// Resume: the events after this revision (one received, or a List's).
    pub from_revision: Option<u64>,
    /// How long the watch may go without a message before the server sends
    /// a progress message (10 ms to 1 h); `None`: the server's (5 s).
    pub progress_interval: Option<Duration>,
}

/// What a watch receives: an event, or how far it has got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchMessage {
    /// Something happened to a watched name.
    Event(WatchEvent),
    /// Every event of the watch up to `revision` has been received: resume
    /// from it. Sent as the watch starts (after the events resumed) and
    /// when it was quiet for the progress interval.
    Progress {
        /// Every event up to this revision has been received.
        revision: u64,
    },
}

/// A started watch, as [`LeaseBackend::watch_names`] returns it.
#[async_trait]
pub trait WatchStream: Send + fmt::Debug {
    /// The next event or progress message; `Ok(None)` when the backend
    /// ended the watch without an error. A watcher that fell behind ends
    /// with [`Error::WatchDropped`]; one whose revisions the backend can
    /// no longer follow with [`Error::WatchRevision`].
    async fn next_message(&mut self) -> Result<Option<WatchMessage>>;

    /// The revision to resume from: of the last event or progress message
    /// received (or the one resumed from, before any).
    fn last_revision(&self) -> Option<u64>;
}

/// Who owns a name among several servers, now and (while migrating) next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The name routed.
    pub name: String,
    /// The owner in the current list: (URL, key id, empty while not
    /// known: names are routed by identity, not by key).
    pub current: (String, String),
    /// The owner in the next list, while migrating.
    pub next: Option<(String, String)>,
    /// The identity of the current owner (what the name is routed by).
    pub current_identity: String,
    /// The identity of the next owner, while migrating.
    pub next_identity: Option<String>,
}

/// Where a name is leased, as [`LeaseBackend::route_name`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameRoute {
    /// One lease server, at this URL (every name's).
    Server(String),
    /// A lease store without a server, at this URL (every name's).
    Store(String),
    /// Among several servers: the one owning the name, and next.
    Servers(Route),
}

/// The operations a lease handle needs from where leases live, and those
/// an operator asks of it (describe, history, trusted keys, info, list,
/// watch, routing), which have defaults refusing them for a backend that
/// cannot answer.
///
/// Operations name a lease by [`LeaseRef`] (id, token and names) so that
/// another process holding only the lease file can renew or release it.
///
/// Whatever only some backends answer (list, watch, routing) is a method
/// too, refused by default, and [`Self::offers`] states it beforehand: a
/// tool holding an `Arc<dyn LeaseBackend>` never asks which backend it
/// holds, and names it as it names itself ([`Self::describe_self`]). A
/// backend owns what it holds (`'static`): the lease handle keeps it, as
/// an `Arc<dyn LeaseBackend>`, for as long as the lease lives.
#[async_trait]
pub trait LeaseBackend: Send + Sync + fmt::Debug + 'static {
    /// Where the leases live, for messages and lease files (a server URL,
    /// an S3 prefix).
    fn location(&self) -> String;

    /// The backend as a message names it: "the lease server at URL", "the
    /// S3 lease backend"; by default "the lease backend at LOCATION".
    fn describe_self(&self) -> String {
        format!("the lease backend at {}", self.location())
    }

    /// Whether the backend answers `call` (by default: no, and
    /// [`Self::list_names`] and [`Self::watch_names`] refuse).
    fn offers(&self, call: Call) -> Offer {
        let _ = call;
        Offer::No { why: None }
    }

    /// Up to `limit` held names starting with `prefix` (`""`: all), in
    /// name order (see [`Listing`]).
    async fn list_names(&self, prefix: &str, limit: usize) -> Result<Listing> {
        let _ = (prefix, limit);
        Err(not_supported(Call::List.as_str(), &self.location()))
    }

    /// Follows what happens to `target`'s names as it happens: grants,
    /// renewals, upgrades, releases, breaks, expiries. With
    /// `options.from_revision`, first the events after it, or
    /// [`Error::WatchRevision`] when the backend cannot start there (list
    /// again).
    async fn watch_names(&self, target: WatchTarget, options: WatchOptions) -> Result<Box<dyn WatchStream>> {
        let _ = (target, options);
        Err(not_supported(Call::Watch.as_str(), &self.location()))
    }

    /// Where `name` is leased.
    fn route_name(&self, name: &str) -> Result<NameRoute> {
        let _ = name;
        Err(not_supported("routing", &self.location()))
    }

    /// Where a grant came from when that is one place, as lease files
    /// name it (a server URL, a lease store URL): [`Self::location`] by
    /// default; `None` for several servers (each part of a grant names
    /// its own).
    fn single_location(&self) -> Option<String> {
        Some(self.location())
    }

    /// What the next holder of each name would find now, in the order
    /// asked.
    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        let _ = names;
        Err(not_supported("describe", &self.location()))
    }

    /// A name's recent renewals (with metadata) and releases.
    async fn history(&self, name: &str) -> Result<History> {
        let _ = name;
        Err(not_supported("history", &self.location()))
    }

    /// Every key a witness of this backend may be signed with (as known
    /// now): what a reader or an audit of its bags trusts.
    async fn trusted_keys(&self) -> Result<KeyRing> {
        Err(not_supported("listing the trusted keys", &self.location()))
    }

    /// What the backend says of itself (see [`BackendInfo`]).
    async fn info(&self) -> Result<BackendInfo> {
        Err(not_supported("server info", &self.location()))
    }

    /// The clock TTLs are counted on and local validity is checked against.
    fn clock(&self) -> Arc<dyn Clock>;

    /// The longest lease this backend grants.
    fn max_ttl(&self) -> Duration;

    /// The longest wait one acquire may ask for, when known: longer waits
    /// are made of several ([`crate::long_wait`]). `None`: unknown (a
    /// refusal naming it is then learnt from).
    fn max_wait(&self) -> Option<Duration> {
        None
    }

    /// Takes every name of `spec`, or none.
    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant>;

    /// Extends a lease to `deadline` (a later deadline already held is
    /// kept); a renewal never shortens.
    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal>;

    /// Extends a lease to `ttl` past the renewal, counted on the clock the
    /// backend judges deadlines by (a lease server's, at the renewal, as
    /// `RenewRequest.ttl_us`), so neither a local clock that is off nor
    /// the time the request spends on the way moves the deadline. A later
    /// deadline already held is kept. The default counts from
    /// [`Self::clock`], which is right for a backend whose clock is the
    /// one deadlines are judged by; a backend that forwards to another
    /// (a server, several servers) overrides it.
    async fn renew_lease_ttl(
        &self,
        lease: &LeaseRef,
        ttl: Duration,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        let deadline = self.clock().now().saturating_add(ttl);
        self.renew_lease(lease, deadline, metadata).await
    }

    /// Turns a tentative lease full; fails if a name was taken meanwhile.
    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant>;

    /// Ends a lease, publishing a watermark for the next holder; returns
    /// the watermark stored.
    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros>;
}

#[async_trait]
impl<B: LeaseBackend + ?Sized> LeaseBackend for Arc<B> {
    fn location(&self) -> String {
        (**self).location()
    }
    fn single_location(&self) -> Option<String> {
        (**self).single_location()
    }
    fn describe_self(&self) -> String {
        (**self).describe_self()
    }
    fn offers(&self, call: Call) -> Offer {
        (**self).offers(call)
    }
    async fn list_names(&self, prefix: &str, limit: usize) -> Result<Listing> {
        (**self).list_names(prefix, limit).await
    }
    async fn watch_names(&self, target: WatchTarget, options: WatchOptions) -> Result<Box<dyn WatchStream>> {
        (**self).watch_names(target, options).await
    }
    fn route_name(&self, name: &str) -> Result<NameRoute> {
        (**self).route_name(name)
    }
    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        (**self).describe(names).await
    }
    async fn history(&self, name: &str) -> Result<History> {
        (**self).history(name).await
    }
    async fn trusted_keys(&self) -> Result<KeyRing> {
        (**self).trusted_keys().await
    }
    async fn info(&self) -> Result<BackendInfo> {
        (**self).info().await
    }
    fn clock(&self) -> Arc<dyn Clock> {
        (**self).clock()
    }
    fn max_ttl(&self) -> Duration {
        (**self).max_ttl()
    }
    fn max_wait(&self) -> Option<Duration> {
        (**self).max_wait()
    }
    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        (**self).acquire_lease(spec).await
    }
    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        (**self).renew_lease(lease, deadline, metadata).await
    }
    async fn renew_lease_ttl(
        &self,
        lease: &LeaseRef,
        ttl: Duration,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        (**self).renew_lease_ttl(lease, ttl, metadata).await
    }
    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        (**self).upgrade_lease(lease).await
    }
    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        (**self).release_lease(lease, options).await
    }
}
