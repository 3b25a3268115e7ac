//! [`Client`]: a connection to one lease server, and [`AcquireBuilder`].

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::clock::{Clock, SystemClock};
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_proto::{KeyRing, Micros, pb};
use tonic::transport::{Channel, Endpoint};

use crate::coalesce::Coalescer;
use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseOptions};
use crate::types::{
    Grant, History, LeaseRef, Metadata, Mode, NameState, ReleaseOptions, Renewal, ServerInfo,
};
use crate::verify;

/// A connection to one lease server, with the keys its witnesses are
/// checked against. Cheap to clone (clones share the HTTP/2 connection).
#[derive(Clone, Debug)]
pub struct Client {
    rpc: LeaseServiceClient<Channel>,
    url: Arc<str>,
    keys: Arc<KeyRing>,
    clock: Arc<dyn Clock>,
    max_ttl: Duration,
}

impl Client {
    /// Connects and learns the server's public keys and max TTL from
    /// `ServerInfo`. Use [`Client::connect_pinned`] to trust only keys you
    /// already know.
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Self::open(url.into(), None).await
    }

    /// Connects trusting only `keys` for witnesses.
    pub async fn connect_pinned(url: impl Into<String>, keys: KeyRing) -> Result<Self> {
        Self::open(url.into(), Some(keys)).await
    }

    async fn open(url: String, pinned: Option<KeyRing>) -> Result<Self> {
        let connect_error = |source| Error::Connect {
            url: url.clone(),
            source,
        };
        let channel = Endpoint::from_shared(url.clone())
            .map_err(connect_error)?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(connect_error)?;
        let mut client = Client {
            rpc: LeaseServiceClient::new(channel),
            url: Arc::from(url),
            keys: Arc::new(KeyRing::new()),
            clock: Arc::new(SystemClock),
            max_ttl: Duration::from_secs(10),
        };
        let info = client.server_info().await?;
        client.max_ttl = info.max_ttl;
        client.keys = Arc::new(match pinned {
            Some(keys) => keys,
            None => {
                let mut ring = KeyRing::new();
                for (id, raw) in &info.keys {
                    ring.insert_bytes(raw).map_err(|e| Error::Witness {
                        reason: format!("server published a bad key {id}: {e}"),
                    })?;
                }
                ring
            }
        });
        Ok(client)
    }

    /// Uses `clock` for TTL arithmetic and local validity checks.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The keys witnesses are verified against.
    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    /// The server's max TTL, as it said at connect.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub(crate) fn rpc(&self) -> LeaseServiceClient<Channel> {
        self.rpc.clone()
    }

    /// Starts an acquire of `names`.
    pub fn acquire<I, S>(&self, names: I) -> AcquireBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireBuilder {
            client: self.clone(),
            names: names.into_iter().map(Into::into).collect(),
            deadline: DeadlineSpec::Ttl(self.max_ttl),
            mode: Mode::Full,
            owner: String::new(),
            wait: Duration::ZERO,
            options: LeaseOptions::default(),
            via: None,
        }
    }

    pub async fn server_info(&self) -> Result<ServerInfo> {
        let info = self
            .rpc()
            .server_info(pb::ServerInfoRequest {})
            .await?
            .into_inner();
        ServerInfo::from_pb(info).map_err(|reason| Error::Witness { reason })
    }

    pub async fn describe<I, S>(&self, names: I) -> Result<Vec<NameState>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = pb::DescribeRequest {
            names: names.into_iter().map(Into::into).collect(),
        };
        let names = self.rpc().describe(req).await?.into_inner().names;
        Ok(names.into_iter().map(NameState::from).collect())
    }

    pub async fn history(&self, name: impl Into<String>) -> Result<History> {
        let req = pb::HistoryRequest { name: name.into() };
        Ok(self.rpc().history(req).await?.into_inner().into())
    }

    /// A recent signed time from the server, checked against its keys (for
    /// writers without their own time authority: see
    /// [`crate::TimeSource::lease_server`]).
    pub(crate) async fn signed_now(&self) -> Result<pb::SignedTime> {
        let resp = self.rpc().signed_now(pb::SignedNowRequest {}).await?.into_inner();
        resp.signed_time.ok_or_else(|| Error::NoSignedTime {
            detail: format!("lease server {} sent no signed time", self.url),
        })
    }

    // --- operations on a lease by id and token (see [`LeaseRef`]) -------

    /// Renews a lease to `deadline` (or keeps its later one).
    pub async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.renew_via(None, lease, deadline, metadata).await
    }

    /// Turns a tentative lease full; fails if a name was broken meanwhile.
    pub async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        self.upgrade_via(None, lease).await
    }

    /// Releases a lease; returns the watermark the server stored.
    pub async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        self.release_via(None, lease, options).await
    }

    // --- every lease operation goes out through one of these -------------

    pub(crate) async fn acquire_via(
        &self,
        via: Option<&Coalescer>,
        req: pb::AcquireRequest,
    ) -> Result<Grant> {
        match via {
            Some(c) => c.acquire(req).await,
            None => {
                let resp = self.rpc().acquire(req).await?.into_inner();
                let grant = resp.grant.ok_or_else(|| Error::Witness {
                    reason: "acquire response has no grant".into(),
                })?;
                verify::grant(grant, Some(&self.keys), &mut None)
            }
        }
    }

    pub(crate) async fn renew_via(
        &self,
        via: Option<&Coalescer>,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        let req = pb::RenewRequest {
            lease_id: lease.id.clone(),
            token: lease.token.clone(),
            deadline_us: deadline.as_micros(),
            metadata: metadata.as_ref().map(pb::Metadata::from),
        };
        match via {
            Some(c) => c.renew(req).await,
            None => {
                let resp = self.rpc().renew(req).await?.into_inner();
                verify::renewal(resp, &lease.id, Some(&self.keys), &mut None)
            }
        }
    }

    pub(crate) async fn upgrade_via(&self, via: Option<&Coalescer>, lease: &LeaseRef) -> Result<Grant> {
        let req = pb::UpgradeRequest {
            lease_id: lease.id.clone(),
            token: lease.token.clone(),
        };
        match via {
            Some(c) => c.upgrade(req).await,
            None => {
                let resp = self.rpc().upgrade(req).await?.into_inner();
                let grant = resp.grant.ok_or_else(|| Error::Witness {
                    reason: "upgrade response has no grant".into(),
                })?;
                verify::grant(grant, Some(&self.keys), &mut None)
            }
        }
    }

    pub(crate) async fn release_via(
        &self,
        via: Option<&Coalescer>,
        lease: &LeaseRef,
        o: ReleaseOptions,
    ) -> Result<Micros> {
        let req = pb::ReleaseRequest {
            lease_id: lease.id.clone(),
            token: lease.token.clone(),
            watermark_us: o.watermark.map_or(0, Micros::as_micros),
            signed_time: o.signed_time.map(|s| s.signed),
            metadata: o.metadata.as_ref().map(pb::Metadata::from),
            unsettled: o.unsettled,
            settled_through_us: o.settled_through.map_or(0, Micros::as_micros),
        };
        match via {
            Some(c) => c.release(req).await,
            None => {
                let resp = self.rpc().release(req).await?.into_inner();
                Ok(Micros::from_micros(resp.watermark_us))
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum DeadlineSpec {
    Ttl(Duration),
    At(Micros),
}

/// Options of one acquire. Defaults: full mode, TTL = the server's max TTL,
/// no server-side wait, background renewal on, unary calls.
#[derive(Debug)]
#[must_use = "call .send() to acquire"]
pub struct AcquireBuilder {
    client: Client,
    names: Vec<String>,
    deadline: DeadlineSpec,
    mode: Mode,
    owner: String,
    wait: Duration,
    options: LeaseOptions,
    via: Option<Coalescer>,
}

impl AcquireBuilder {
    /// Deadline = now + `ttl` (renewals keep extending by `ttl`).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.deadline = DeadlineSpec::Ttl(ttl);
        self
    }

    /// An absolute deadline. Renewals then extend by the TTL this implies.
    pub fn deadline(mut self, deadline: Micros) -> Self {
        self.deadline = DeadlineSpec::At(deadline);
        self
    }

    /// Reserve only; write after [`Lease::upgrade`].
    pub fn tentative(mut self) -> Self {
        self.mode = Mode::Tentative;
        self
    }

    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Let the server wait up to `wait` for busy names (not with
    /// [`AcquireBuilder::via`]: batched acquires cannot wait).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Renewal interval, safety margin, whether to renew at all.
    pub fn options(mut self, options: LeaseOptions) -> Self {
        self.options = options;
        self
    }

    /// Sends the acquire, and later the lease's renewals, upgrade and
    /// release, through `coalescer`: batched with other tasks' operations,
    /// one RPC and one signature per batch.
    pub fn via(mut self, coalescer: &Coalescer) -> Self {
        self.via = Some(coalescer.clone());
        self
    }

    pub async fn send(self) -> Result<Lease> {
        let now = self.client.clock.now();
        let (deadline, ttl) = match self.deadline {
            DeadlineSpec::Ttl(ttl) => (now.saturating_add(ttl), ttl),
            DeadlineSpec::At(at) => (at, at.duration_since(now)),
        };
        if self.via.is_some() && !self.wait.is_zero() {
            return Err(Error::Rejected {
                code: tonic::Code::InvalidArgument,
                message: "wait: batched acquires cannot wait; acquire without .via() to wait".into(),
            });
        }
        let req = pb::AcquireRequest {
            names: self.names,
            deadline_us: deadline.as_micros(),
            owner: self.owner,
            mode: pb::Mode::from(self.mode).into(),
            wait_us: u64::try_from(self.wait.as_micros()).unwrap_or(u64::MAX),
        };
        let grant = self.client.acquire_via(self.via.as_ref(), req).await?;
        Ok(Lease::start(self.client, self.via, grant, ttl, self.options))
    }
}
