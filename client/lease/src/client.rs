//! [`Client`]: a connection to one lease server, and its lease backend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use bagel_proto::clock::{Clock, SystemClock};
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_proto::{KeyRing, Micros, pb};
use tonic::transport::{Channel, Endpoint};

use crate::acquire::AcquireBuilder;
use crate::backend::{AcquireSpec, LeaseBackend};
use crate::error::{Error, Result};
use crate::types::{Grant, History, LeaseRef, Metadata, NameState, ReleaseOptions, Renewal, ServerInfo};
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

    /// Starts an acquire of `names` on this server.
    pub fn acquire<I, S>(&self, names: I) -> AcquireBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireBuilder::new(Arc::new(self.clone()), names)
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
}

/// One lease server, unary calls: every answer's witness checked against
/// the server's keys.
#[async_trait]
impl LeaseBackend for Client {
    fn location(&self) -> String {
        self.url.to_string()
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        let resp = self.rpc().acquire(acquire_request(spec)).await?.into_inner();
        let grant = resp.grant.ok_or_else(|| Error::Witness {
            reason: "acquire response has no grant".into(),
        })?;
        verify::grant(grant, Some(&self.keys), &mut None)
    }

    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        let req = renew_request(lease, deadline, metadata);
        let resp = self.rpc().renew(req).await?.into_inner();
        verify::renewal(resp, &lease.id, Some(&self.keys), &mut None)
    }

    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        let resp = self.rpc().upgrade(upgrade_request(lease)).await?.into_inner();
        let grant = resp.grant.ok_or_else(|| Error::Witness {
            reason: "upgrade response has no grant".into(),
        })?;
        verify::grant(grant, Some(&self.keys), &mut None)
    }

    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        let resp = self
            .rpc()
            .release(release_request(lease, options))
            .await?
            .into_inner();
        Ok(Micros::from_micros(resp.watermark_us))
    }
}

// --- the requests, one place for unary calls and batches -----------------

pub(crate) fn acquire_request(spec: AcquireSpec) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: spec.names,
        deadline_us: spec.deadline.as_micros(),
        owner: spec.owner,
        mode: pb::Mode::from(spec.mode).into(),
        wait_us: u64::try_from(spec.wait.as_micros()).unwrap_or(u64::MAX),
    }
}

pub(crate) fn renew_request(
    lease: &LeaseRef,
    deadline: Micros,
    metadata: Option<Metadata>,
) -> pb::RenewRequest {
    pb::RenewRequest {
        lease_id: lease.id.clone(),
        token: lease.token.clone(),
        deadline_us: deadline.as_micros(),
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
