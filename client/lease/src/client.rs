//! [`Client`]: a connection to one lease server, and its lease backend.
//!
//! Layout: this file connects (checking the server's keys) and makes
//! each unary call; `connect_hints` turns a failed connection into what
//! to do about it; `watch` is a watch's stream of events.

mod connect_hints;
mod watch;

pub use watch::{Watch, WatchMessage, WatchOptions};

use connect_hints::{hint_client_certificate, hint_tls_server, with_tls_hint};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use bagel_proto::clock::{Clock, SystemClock};
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_proto::{KeyRing, Micros, pb};
use tonic::transport::{Channel, Endpoint};

use crate::acquire::AcquireBuilder;
use crate::backend::{
    AcquireSpec, BackendInfo, Call, LeaseBackend, Listed, ListedAt, Listing, NameRoute, Offer, WatchStream,
};
use crate::error::{Error, Result};
use crate::grpc_error::from_status;
use crate::options::{ClientOptions, check_server_url};
use crate::server_keys::ServerKeys;
use crate::types::{
    Grant, History, LeaseRef, ListPage, Metadata, NameState, ReleaseOptions, Renewal, ServerInfo, WatchTarget,
};
use crate::verify;

/// How many bytes of answers the server may send ahead of this client's
/// reading, per connection and per call. HTTP/2's default, 64 KiB for a
/// whole connection, is less than one answer to a batch of a few hundred
/// grants: with two calls in flight on one connection the server stopped
/// after each answer until the client's window update came back, and both
/// sides sat idle (33 % fewer session cycles with two streams than with
/// one, at half the CPU).
const RECEIVE_CONNECTION_WINDOW: u32 = 4 << 20;
const RECEIVE_STREAM_WINDOW: u32 = 1 << 20;

/// Adds the bearer token of [`ClientOptions::bearer_token`], if any, to
/// every call.
#[derive(Clone, Debug, Default)]
pub(crate) struct Auth(Option<crate::options::BearerToken>);

impl tonic::service::Interceptor for Auth {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            req.metadata_mut().insert("authorization", token.0.clone());
        }
        Ok(req)
    }
}

pub(crate) type Rpc = LeaseServiceClient<tonic::service::interceptor::InterceptedService<Channel, Auth>>;

/// A connection to one lease server, with the keys its witnesses are
/// checked against. Cheap to clone (clones share the HTTP/2 connection).
///
/// It is a [`crate::LeaseBackend`]: [`Client::acquire`] gives a
/// [`crate::Lease`] that renews itself over this connection. Every call
/// is bounded by [`ClientOptions::call_timeout`] when set, and answers
/// [`Error::Timeout`] past it; a server that cannot be reached is
/// [`Error::Connect`] or [`Error::Unavailable`] (both retryable).
#[derive(Clone, Debug)]
pub struct Client {
    rpc: Rpc,
    /// The URL, and what else is fixed per connection (one pointer, so a
    /// `Client` stays small to clone and to hold).
    remote: Arc<Remote>,
    /// Pinned, or learned from the server (and learned again when it signs
    /// with a key not seen yet: see [`ServerKeys`]).
    keys: Arc<ServerKeys>,
    clock: Arc<dyn Clock>,
    max_ttl: Duration,
}

#[derive(Debug)]
struct Remote {
    url: String,
    /// How to open another connection to the same server (TLS included),
    /// for [`Client::on_new_connection`].
    endpoint: Endpoint,
    /// Bound on each unary call ([`ClientOptions::call_timeout`]).
    call_timeout: Option<Duration>,
    /// The bearer token every call carries, if any.
    auth: Auth,
    /// The server's max wait per acquire, as it said at connect (longer
    /// waits are made of several, see [`crate::long_wait`]).
    max_wait: Duration,
    /// The identity the server announced at connect (its `--server-id`,
    /// or what it derives from its key or address): what a cluster routes
    /// names by.
    server_id: String,
    /// The member lists the server announced (`--members`, then
    /// `--next-members`); empty when it has none.
    members: Vec<Vec<String>>,
}

impl Client {
    /// Connects and learns the server's public keys and max TTL from
    /// `ServerInfo`. Use [`Client::connect_pinned`] to trust only keys you
    /// already know, [`Client::connect_with`] for TLS or time bounds.
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Self::open(url.into(), None, &ClientOptions::default()).await
    }

    /// Connects trusting only `keys` for witnesses.
    pub async fn connect_pinned(url: impl Into<String>, keys: KeyRing) -> Result<Self> {
        Self::open(url.into(), Some(keys), &ClientOptions::default()).await
    }

    /// [`Client::connect`] with [`ClientOptions`]: TLS (`https://` URLs
    /// need it), and bounds on connecting and on each call.
    pub async fn connect_with(url: impl Into<String>, options: &ClientOptions) -> Result<Self> {
        Self::open(url.into(), None, options).await
    }

    /// [`Client::connect_pinned`] with [`ClientOptions`].
    pub async fn connect_pinned_with(
        url: impl Into<String>,
        keys: KeyRing,
        options: &ClientOptions,
    ) -> Result<Self> {
        Self::open(url.into(), Some(keys), options).await
    }

    /// This client (same server, keys and options) over an HTTP/2
    /// connection of its own, opened on first use.
    ///
    /// Why: every call of one connection passes through one connection
    /// task on each side, so one connection keeps a server's work on about
    /// one core however many cores it has; a [`crate::Coalescer`] spreads
    /// its session streams over a few of these
    /// ([`crate::CoalesceOptions::with_connections`]).
    pub fn on_new_connection(&self) -> Client {
        Client {
            rpc: LeaseServiceClient::with_interceptor(
                self.remote.endpoint.connect_lazy(),
                self.remote.auth.clone(),
            ),
            ..self.clone()
        }
    }

    async fn open(url: String, pinned: Option<KeyRing>, options: &ClientOptions) -> Result<Self> {
        check_server_url(&url).map_err(|message| Error::Config {
            message: format!("server URL {message}"),
        })?;
        let connect_error = |source: tonic::transport::Error| Error::Connect {
            url: url.clone(),
            source: with_tls_hint(source.into()),
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(connect_error)?
            .tcp_nodelay(true)
            .initial_connection_window_size(RECEIVE_CONNECTION_WINDOW)
            .initial_stream_window_size(RECEIVE_STREAM_WINDOW)
            .connect_timeout(options.connect_timeout);
        let url_is_https = url.starts_with("https://");
        if url_is_https {
            let tls = options.tls.as_ref().ok_or_else(|| Error::Config {
                message: format!(
                    "server {url} is https:// but no TLS configuration was given (the CA to trust)"
                ),
            })?;
            endpoint = endpoint
                .tls_config(tls.to_tonic(options.connect_timeout)?)
                .map_err(connect_error)?;
        }
        // The endpoint's own bound covers the TCP connect only; this one
        // also covers the TLS and HTTP/2 handshakes.
        let channel = tokio::time::timeout(options.connect_timeout, endpoint.clone().connect())
            .await
            .map_err(|_| Error::Timeout {
                url: url.clone(),
                call: "connect",
                after: options.connect_timeout,
            })?
            .map_err(connect_error)?;
        let auth = Auth(options.bearer_token.clone());
        let mut client = Client {
            rpc: LeaseServiceClient::with_interceptor(channel, auth.clone()),
            remote: Arc::new(Remote {
                url,
                endpoint,
                call_timeout: options.call_timeout,
                auth,
                max_wait: Duration::from_secs(10),
                server_id: String::new(),
                members: Vec::new(),
            }),
            keys: Arc::new(ServerKeys::learned(KeyRing::new(), None)),
            clock: Arc::new(SystemClock),
            max_ttl: Duration::from_secs(10),
        };
        // The first call: a failure here is often the TLS setup's, which
        // only the status (before it becomes the core's error) shows.
        let mut rpc = client.rpc();
        let first = client.call_status(
            "ServerInfo",
            Duration::ZERO,
            rpc.server_info(pb::ServerInfoRequest {}),
        );
        // Connecting ends with this answer. Without a call bound, the
        // connect bound covers it: a server that accepts and never answers
        // (frozen) fails the connect, retryably, rather than hanging it.
        let answer = match client.remote.call_timeout {
            Some(_) => first.await,
            None => tokio::time::timeout(options.connect_timeout, first)
                .await
                .unwrap_or_else(|_| {
                    Err(CallFailure::Timeout(Error::Timeout {
                        url: client.remote.url.clone(),
                        call: "ServerInfo",
                        after: options.connect_timeout,
                    }))
                }),
        };
        let info = match answer {
            Ok(info) => ServerInfo::from_pb(info).map_err(|reason| Error::Witness { reason })?,
            Err(CallFailure::Timeout(e)) => return Err(e),
            Err(CallFailure::Status(s)) => {
                return Err(match &options.tls {
                    Some(tls) if url_is_https => hint_client_certificate(s, tls.has_identity()),
                    _ if !url_is_https => {
                        hint_tls_server(s, &client.remote.url, options.connect_timeout).await
                    }
                    _ => from_status(s),
                });
            }
        };
        client.max_ttl = info.max_ttl;
        client.remote = Arc::new(Remote {
            url: client.remote.url.clone(),
            endpoint: client.remote.endpoint.clone(),
            call_timeout: client.remote.call_timeout,
            auth: client.remote.auth.clone(),
            max_wait: info.max_wait,
            server_id: info.server_id.clone(),
            members: info.members.clone(),
        });
        client.keys = Arc::new(match pinned {
            Some(keys) => {
                check_pinned(&client.remote.url, &keys, &info)?;
                ServerKeys::pinned(keys)
            }
            None => ServerKeys::learned(
                published_keys(&info)?,
                info.keys.first().map(|(id, _)| id.clone()),
            ),
        });
        Ok(client)
    }

    /// Learns the server's keys again when a witness it sent names a key
    /// not trusted yet and the keys were learned, not pinned (a server
    /// restarted without its key file). A failure here leaves the keys as
    /// they were: the witness then fails verification, as it would have.
    pub(crate) async fn learn_key_of(&self, witness: Option<&pb::Witness>) {
        self.learn_key(witness.map(|w| w.key_id.as_str())).await;
    }

    /// As [`learn_key_of`](Self::learn_key_of), for the id of a key that
    /// signed something (a lean answer's range).
    pub(crate) async fn learn_key(&self, key_id: Option<&str>) {
        if let Some(key_id) = key_id
            && self.keys.should_learn(key_id)
        {
            self.learn_keys().await;
        }
    }

    /// Asks the server for its keys and trusts them beside those learned
    /// before (never for pinned keys).
    pub(crate) async fn learn_keys(&self) -> bool {
        if self.keys.is_pinned() {
            return false;
        }
        let learned = async {
            let info = self.server_info().await?;
            let ring = published_keys(&info)?;
            self.keys
                .learn(&ring, info.keys.first().map(|(id, _)| id.clone()));
            Ok::<_, Error>(())
        };
        match learned.await {
            Ok(()) => {
                tracing::info!(server = %self.remote.url, "learned the server's keys again (it signs with a key not seen before)");
                true
            }
            Err(e) => {
                tracing::warn!(server = %self.remote.url, error = %e, "could not learn the server's keys again");
                false
            }
        }
    }

    /// Runs one unary call, bounded by the call timeout (plus `extra`, the
    /// time the server was allowed to wait).
    async fn call<T>(
        &self,
        call: &'static str,
        extra: Duration,
        rpc: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        self.call_status(call, extra, rpc).await.map_err(|f| match f {
            CallFailure::Status(s) => from_status(s),
            CallFailure::Timeout(e) => e,
        })
    }

    /// [`Self::call`], with a failing status kept as such.
    async fn call_status<T>(
        &self,
        call: &'static str,
        extra: Duration,
        rpc: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> std::result::Result<T, CallFailure> {
        let Some(limit) = self.remote.call_timeout else {
            return rpc
                .await
                .map(tonic::Response::into_inner)
                .map_err(CallFailure::Status);
        };
        let after = limit.saturating_add(extra);
        match tokio::time::timeout(after, rpc).await {
            Ok(answer) => answer
                .map(tonic::Response::into_inner)
                .map_err(CallFailure::Status),
            Err(_) => Err(CallFailure::Timeout(Error::Timeout {
                url: self.remote.url.clone(),
                call,
                after,
            })),
        }
    }

    /// Uses `clock` for TTL arithmetic and local validity checks.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The server URL as given to `connect` (`http://` or `https://`).
    pub fn url(&self) -> &str {
        &self.remote.url
    }

    /// The keys witnesses are verified against now (a snapshot: learned
    /// keys grow when the server signs with a new one).
    pub fn keys(&self) -> Arc<KeyRing> {
        self.keys.ring()
    }

    /// The id of the key the server signs with, as last learned (the
    /// pinned key's when pinned).
    pub(crate) fn signing_key_id(&self) -> Option<String> {
        self.keys.signing()
    }

    /// The identity the server announced at connect (ServerInfo's
    /// `server_id`): what a [`crate::Cluster`] routes its names by.
    pub fn server_id(&self) -> &str {
        &self.remote.server_id
    }

    /// The member lists the server announced at connect (its `--members`,
    /// then `--next-members`), each as server ids; empty when it was
    /// started without them.
    pub fn members(&self) -> &[Vec<String>] {
        &self.remote.members
    }

    /// The server's max TTL, as it said at connect.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The local clock leases from this client judge their validity and
    /// schedule renewals by (the system clock unless
    /// [`Client::with_clock`]).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub(crate) fn rpc(&self) -> Rpc {
        self.rpc.clone()
    }

    /// Starts an acquire of `names` on this server.
    pub fn acquire<I, S>(&self, names: I) -> AcquireBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireBuilder::new(Arc::new(self.clone()), names)
    }

    /// The server's keys, limits, readiness and clock status, asked now
    /// (connect asked once; this is fresh).
    ///
    /// # Errors
    /// Transport errors as for any call; [`Error::Witness`] when the
    /// answer states a key that is not a valid ed25519 key.
    pub async fn server_info(&self) -> Result<ServerInfo> {
        let info = self
            .call(
                "ServerInfo",
                Duration::ZERO,
                self.rpc().server_info(pb::ServerInfoRequest {}),
            )
            .await?;
        ServerInfo::from_pb(info).map_err(|reason| Error::Witness { reason })
    }

    /// The state of each of `names` now, in the order asked: its holder
    /// (if its deadline has not passed) and what a new holder would
    /// inherit. Needs the `read` permission under an access policy.
    pub async fn describe<I, S>(&self, names: I) -> Result<Vec<NameState>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = pb::DescribeRequest {
            names: names.into_iter().map(Into::into).collect(),
        };
        let names = self
            .call("Describe", Duration::ZERO, self.rpc().describe(req))
            .await?
            .names;
        Ok(names.into_iter().map(NameState::from).collect())
    }

    /// `name`'s recent renewals (those that stated metadata) and
    /// releases, oldest first, as far as the server's history budget
    /// keeps them ([`History::truncated`] says when older ones were
    /// dropped). Needs the `read` permission under an access policy.
    pub async fn history(&self, name: impl Into<String>) -> Result<History> {
        let req = pb::HistoryRequest { name: name.into() };
        Ok(self
            .call("History", Duration::ZERO, self.rpc().history(req))
            .await?
            .into())
    }

    /// One page of the names held now that start with `prefix` (`""`:
    /// all), in name order: the first with `page: None`, then each with
    /// the previous page's [`ListPage::next_page`]. `page_size` 0 asks for
    /// the server's default (100); the server cuts a larger one to its
    /// [`ListPage::max_page_size`]. [`ListPage::revision`] is the watch
    /// revision the page reflects: watch from the first page's to miss
    /// nothing that happens after the listing.
    pub async fn list(&self, prefix: &str, page: Option<&str>, page_size: u32) -> Result<ListPage> {
        let req = pb::ListRequest {
            prefix: prefix.to_owned(),
            page_size,
            page_token: page.unwrap_or_default().to_owned(),
        };
        Ok(self
            .call("List", Duration::ZERO, self.rpc().list(req))
            .await?
            .into())
    }

    /// Every name held now under `prefix`, through all pages, with the
    /// first page's revision: [`Client::watch`] from it then sends every
    /// event after the listing (or refuses with
    /// [`Error::WatchRevision`]: list again). An event the listing already
    /// shows may come again; each carries the name's state after it, so
    /// applying it again changes nothing.
    pub async fn list_all(&self, prefix: &str) -> Result<ListPage> {
        let mut all = self.list(prefix, None, 0).await?;
        while let Some(next) = all.next_page.take() {
            let page = self.list(prefix, Some(&next), 0).await?;
            all.names.extend(page.names);
            all.next_page = page.next_page;
        }
        Ok(all)
    }

    /// Follows what happens to `target`'s names: grants, renewals,
    /// upgrades, releases, breaks, expiries, as they happen. With
    /// `from_revision` (one received, or a List's), first the events after
    /// it; [`Error::WatchRevision`] when the server cannot start there (no
    /// longer kept, of an earlier incarnation, ahead): list again. The
    /// client's timeout bounds the start only. See
    /// [`Client::watch_with`].
    pub async fn watch(&self, target: WatchTarget, from_revision: Option<u64>) -> Result<Watch> {
        let options = WatchOptions {
            from_revision,
            ..Default::default()
        };
        self.watch_with(target, options).await
    }

    /// [`Client::watch`] with its options. The watch always asks for
    /// progress messages, so [`Watch::last_revision`] is a revision to
    /// resume from as soon as the watch has started, and stays one on a
    /// quiet watch of few names (whose last event may be long gone from
    /// the server's memory).
    pub async fn watch_with(&self, target: WatchTarget, options: WatchOptions) -> Result<Watch> {
        let (names, prefix) = match target {
            WatchTarget::Names(names) => (names, String::new()),
            WatchTarget::Prefix(prefix) => (Vec::new(), prefix),
        };
        let req = pb::WatchRequest {
            names,
            prefix,
            from_revision: options.from_revision.unwrap_or(0),
            progress_notify: true,
            progress_interval_us: options
                .progress_interval
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        };
        let events = self.call("Watch", Duration::ZERO, self.rpc().watch(req)).await?;
        Ok(Watch {
            events,
            last_revision: options.from_revision,
        })
    }

    /// A recent signed time from the server, checked against its keys (for
    /// writers without their own time authority: see
    /// [`crate::TimeSource::lease_server`]).
    pub(crate) async fn signed_now(&self) -> Result<pb::SignedTime> {
        let resp = self
            .call(
                "SignedNow",
                Duration::ZERO,
                self.rpc().signed_now(pb::SignedNowRequest {}),
            )
            .await?;
        resp.signed_time.ok_or_else(|| Error::NoSignedTime {
            detail: format!("lease server {} sent no signed time", self.remote.url),
        })
    }
}

/// The keys `info` publishes, each checked to be a key.
fn published_keys(info: &ServerInfo) -> Result<KeyRing> {
    let mut ring = KeyRing::new();
    for (id, raw) in &info.keys {
        ring.insert_bytes(raw).map_err(|e| Error::Witness {
            reason: format!("server published a bad key {id}: {e}"),
        })?;
    }
    Ok(ring)
}

/// Refuses a server that presents none of the pinned keys: its witnesses
/// would all fail to verify, one by one, with a message about a witness
/// rather than about the server.
fn check_pinned(url: &str, pinned: &KeyRing, info: &ServerInfo) -> Result<()> {
    if info.keys.iter().any(|(id, _)| pinned.get(id).is_some()) {
        return Ok(());
    }
    Err(Error::KeyMismatch {
        url: url.to_owned(),
        pinned: pinned.ids().collect::<Vec<_>>().join(", "),
        presented: info.keys.iter().map(|(id, _)| id.clone()).collect(),
    })
}

/// How one unary call failed, before it becomes the core's [`Error`]: the
/// status (the server's, or the transport's on this side), or no answer
/// within the call timeout.
enum CallFailure {
    Status(tonic::Status),
    Timeout(Error),
}

/// One lease server, unary calls: every answer's witness checked against
/// the server's keys.
impl Client {
    /// Sends one `Renew` and checks the witness of the answer.
    async fn renew(&self, req: pb::RenewRequest, lease: &LeaseRef) -> Result<Renewal> {
        let resp = self.call("Renew", Duration::ZERO, self.rpc().renew(req)).await?;
        self.learn_key_of(resp.witness.as_ref()).await;
        verify::renewal(
            resp,
            &lease.id,
            Some(&self.keys()),
            &mut verify::Verified::default(),
        )
    }
}

#[async_trait]
impl LeaseBackend for Client {
    fn location(&self) -> String {
        self.remote.url.clone()
    }

    fn describe_self(&self) -> String {
        format!("the lease server at {}", self.url())
    }

    fn offers(&self, _call: Call) -> Offer {
        Offer::Yes
    }

    /// Pages through the server's bounded pages; the revision is the
    /// first page's (every later page reflects at least that one).
    async fn list_names(&self, prefix: &str, limit: usize) -> Result<Listing> {
        let mut names = Vec::new();
        let mut page: Option<String> = None;
        let mut revision = None;
        while names.len() < limit || revision.is_none() {
            let want = u32::try_from(limit.saturating_sub(names.len()).max(1)).unwrap_or(u32::MAX);
            let p = self.list(prefix, page.as_deref(), want).await?;
            revision.get_or_insert(p.revision);
            names.extend(p.names);
            match p.next_page {
                Some(next) => page = Some(next),
                None => break,
            }
        }
        names.truncate(limit);
        Ok(Listing {
            names: names
                .into_iter()
                .map(|name| Listed { server: None, name })
                .collect(),
            revisions: vec![ListedAt {
                server: None,
                revision: revision.unwrap_or(0),
            }],
        })
    }

    async fn watch_names(&self, target: WatchTarget, options: WatchOptions) -> Result<Box<dyn WatchStream>> {
        Ok(Box::new(self.watch_with(target, options).await?))
    }

    fn route_name(&self, _name: &str) -> Result<NameRoute> {
        Ok(NameRoute::Server(self.url().to_owned()))
    }

    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        Client::describe(self, names.iter().cloned()).await
    }

    async fn history(&self, name: &str) -> Result<History> {
        Client::history(self, name).await
    }

    async fn trusted_keys(&self) -> Result<KeyRing> {
        Ok((*self.keys()).clone())
    }

    async fn info(&self) -> Result<BackendInfo> {
        Ok(BackendInfo::Server {
            url: self.url().to_owned(),
            info: self.server_info().await?,
        })
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    fn max_wait(&self) -> Option<Duration> {
        Some(self.remote.max_wait)
    }

    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        let wait = spec.wait;
        let resp = self
            .call("Acquire", wait, self.rpc().acquire(acquire_request(spec)))
            .await?;
        let grant = resp.grant.ok_or_else(|| Error::Witness {
            reason: "acquire response has no grant".into(),
        })?;
        self.learn_key_of(grant.witness.as_ref()).await;
        verify::grant(grant, Some(&self.keys()), &mut verify::Verified::default())
    }

    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.renew(renew_request(lease, RenewTo::Deadline(deadline), metadata), lease)
            .await
    }

    /// Sent as `ttl_us`: the server counts it from its own clock.
    async fn renew_lease_ttl(
        &self,
        lease: &LeaseRef,
        ttl: Duration,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.renew(renew_request(lease, RenewTo::Ttl(ttl), metadata), lease)
            .await
    }

    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        let resp = self
            .call(
                "Upgrade",
                Duration::ZERO,
                self.rpc().upgrade(upgrade_request(lease)),
            )
            .await?;
        let grant = resp.grant.ok_or_else(|| Error::Witness {
            reason: "upgrade response has no grant".into(),
        })?;
        self.learn_key_of(grant.witness.as_ref()).await;
        verify::grant(grant, Some(&self.keys()), &mut verify::Verified::default())
    }

    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        let resp = self
            .call(
                "Release",
                Duration::ZERO,
                self.rpc().release(release_request(lease, options)),
            )
            .await?;
        Ok(Micros::from_micros(resp.watermark_us))
    }
}

// --- the requests, one place for unary calls and batches -----------------

/// A relative TTL goes as `ttl_us` with no `deadline_us` (the server
/// refuses both at once).
pub(crate) fn acquire_request(spec: AcquireSpec) -> pb::AcquireRequest {
    let (deadline_us, ttl_us) = match spec.ttl {
        Some(ttl) => (0, bagel_proto::duration_micros(ttl).max(1)),
        None => (spec.deadline.as_micros(), 0),
    };
    pb::AcquireRequest {
        names: spec.names,
        deadline_us,
        ttl_us,
        owner: spec.owner,
        mode: pb::Mode::from(spec.mode).into(),
        wait_us: u64::try_from(spec.wait.as_micros()).unwrap_or(u64::MAX),
        holder_key: spec.holder_key.map_or_else(Vec::new, |k| k.to_vec()),
    }
}

/// What a renewal asks for: exactly one of `RenewRequest`'s
/// `deadline_us` and `ttl_us` is set.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RenewTo {
    /// An absolute deadline (Unix µs).
    Deadline(Micros),
    /// A TTL the server counts from its clock at the renewal.
    Ttl(Duration),
}

pub(crate) fn renew_request(lease: &LeaseRef, to: RenewTo, metadata: Option<Metadata>) -> pb::RenewRequest {
    let (deadline_us, ttl_us) = match to {
        RenewTo::Deadline(deadline) => (deadline.as_micros(), 0),
        // 0 would mean "unset": the shortest TTL sent is 1 µs (refused by
        // the server's minimum, naming it).
        RenewTo::Ttl(ttl) => (0, bagel_proto::duration_micros(ttl).max(1)),
    };
    pb::RenewRequest {
        lease_id: lease.id.clone(),
        token: lease.token.clone(),
        deadline_us,
        ttl_us,
        metadata: metadata.as_ref().map(pb::Metadata::from),
    }
}

pub(crate) fn upgrade_request(lease: &LeaseRef) -> pb::UpgradeRequest {
    pb::UpgradeRequest {
        lease_id: lease.id.clone(),
        token: lease.token.clone(),
    }
}

pub(crate) fn release_request(lease: &LeaseRef, o: ReleaseOptions) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        lease_id: lease.id.clone(),
        token: lease.token.clone(),
        watermark_us: o.watermark.map_or(0, Micros::as_micros),
        signed_time: o.signed_time.map(|s| s.signed),
        metadata: o.metadata.as_ref().map(pb::Metadata::from),
        unsettled: o.unsettled,
        settled_through_us: o.settled_through.map_or(0, Micros::as_micros),
    }
}
