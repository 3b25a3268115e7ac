//! [`Client`]: a connection to one lease server.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::clock::{Clock, SystemClock};
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_proto::{KeyRing, Micros, pb};
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseOptions};

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
        let url = url.into();
        let rpc = Self::channel(&url).await?;
        let mut client = Client {
            rpc,
            url: Arc::from(url),
            keys: Arc::new(KeyRing::new()),
            clock: Arc::new(SystemClock),
            max_ttl: Duration::from_secs(10),
        };
        let info = client.server_info().await?;
        let mut keys = KeyRing::new();
        for k in &info.keys {
            keys.insert_bytes(&k.ed25519).map_err(|e| Error::Witness {
                reason: format!("server published a bad key {}: {e}", k.key_id),
            })?;
        }
        client.keys = Arc::new(keys);
        client.max_ttl = Duration::from_micros(info.max_ttl_us);
        Ok(client)
    }

    /// Connects trusting only `keys` for witnesses.
    pub async fn connect_pinned(url: impl Into<String>, keys: KeyRing) -> Result<Self> {
        let url = url.into();
        let rpc = Self::channel(&url).await?;
        let mut client = Client {
            rpc,
            url: Arc::from(url),
            keys: Arc::new(keys),
            clock: Arc::new(SystemClock),
            max_ttl: Duration::from_secs(10),
        };
        let info = client.server_info().await?;
        client.max_ttl = Duration::from_micros(info.max_ttl_us);
        Ok(client)
    }

    async fn channel(url: &str) -> Result<LeaseServiceClient<Channel>> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|source| Error::Connect {
                url: url.to_owned(),
                source,
            })?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint.connect().await.map_err(|source| Error::Connect {
            url: url.to_owned(),
            source,
        })?;
        Ok(LeaseServiceClient::new(channel))
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
            mode: pb::Mode::Full,
            owner: String::new(),
            wait: Duration::ZERO,
            options: LeaseOptions::default(),
            prepare_reading: None,
        }
    }

    pub async fn server_info(&self) -> Result<pb::ServerInfoResponse> {
        Ok(self
            .rpc()
            .server_info(pb::ServerInfoRequest {})
            .await?
            .into_inner())
    }

    pub async fn describe<I, S>(&self, names: I) -> Result<Vec<pb::NameState>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = pb::DescribeRequest {
            names: names.into_iter().map(Into::into).collect(),
        };
        Ok(self.rpc().describe(req).await?.into_inner().names)
    }

    pub async fn history(&self, name: impl Into<String>) -> Result<pb::HistoryResponse> {
        let req = pb::HistoryRequest { name: name.into() };
        Ok(self.rpc().history(req).await?.into_inner())
    }

    /// A recent signed time from the server (for writers without their own
    /// time authority).
    pub async fn signed_now(&self) -> Result<pb::SignedNowResponse> {
        Ok(self.rpc().signed_now(pb::SignedNowRequest {}).await?.into_inner())
    }

    /// Low-level calls by lease id and token, for tools that hold a lease
    /// across processes (the CLI). Library users hold a [`Lease`] instead.
    pub async fn renew_raw(&self, req: pb::RenewRequest) -> Result<pb::RenewResponse> {
        Ok(self.renew_checked(req).await?.0)
    }

    /// Renews and checks the answer's witness: signed by a trusted key, of
    /// this lease, stating the deadline the answer says.
    pub(crate) async fn renew_checked(
        &self,
        req: pb::RenewRequest,
    ) -> Result<(pb::RenewResponse, pb::WitnessBody)> {
        let lease_id = req.lease_id.clone();
        let resp = self.rpc().renew(req).await?.into_inner();
        let witness = resp.witness.as_ref().ok_or_else(|| Error::Witness {
            reason: "renew response has no witness".into(),
        })?;
        let body = bagel_proto::verify_witness(witness, &self.keys).map_err(|e| Error::Witness {
            reason: e.to_string(),
        })?;
        if body.lease_id != lease_id || body.deadline_us != resp.deadline_us {
            return Err(Error::Witness {
                reason: format!(
                    "renewal witness does not state lease {lease_id} until {}",
                    resp.deadline_us
                ),
            });
        }
        Ok((resp, body))
    }

    pub async fn upgrade_raw(&self, req: pb::UpgradeRequest) -> Result<pb::LeaseGrant> {
        let resp = self.rpc().upgrade(req).await?.into_inner();
        let grant = resp.grant.ok_or_else(|| Error::Witness {
            reason: "upgrade response has no grant".into(),
        })?;
        crate::lease::check_grant(&grant, &self.keys)?;
        Ok(grant)
    }

    /// One `Batch` call; see [`crate::Coalescer`] for coalescing many
    /// tasks' operations into batches.
    pub async fn batch_raw(&self, ops: Vec<pb::BatchOp>) -> Result<Vec<pb::BatchResult>> {
        Ok(self
            .rpc()
            .batch(pb::BatchRequest { ops })
            .await?
            .into_inner()
            .results)
    }

    pub async fn release_raw(&self, req: pb::ReleaseRequest) -> Result<pb::ReleaseResponse> {
        Ok(self.rpc().release(req).await?.into_inner())
    }
}

#[derive(Clone, Copy, Debug)]
enum DeadlineSpec {
    Ttl(Duration),
    At(Micros),
}

/// Options of one acquire. Defaults: full mode, TTL = the server's max TTL,
/// no server-side wait, background renewal on.
#[derive(Debug)]
#[must_use = "call .send() to acquire"]
pub struct AcquireBuilder {
    client: Client,
    names: Vec<String>,
    deadline: DeadlineSpec,
    mode: pb::Mode,
    owner: String,
    wait: Duration,
    options: LeaseOptions,
    prepare_reading: Option<PrepareReading>,
}

/// Bags to close before a lease with a broken or unknown predecessor is
/// handed out (see [`AcquireBuilder::close_predecessor_bags`]).
#[derive(Clone, Debug)]
struct PrepareReading {
    store: Arc<dyn crate::bag::BagStore>,
    logs: Vec<String>,
    cfg: crate::bag::BagConfig,
}

impl AcquireBuilder {
    /// Don't hand the lease out until, if a predecessor was broken or is
    /// unknown, every bag of `logs` up to its watermark is closed (the
    /// design's sad path; see [`Lease::close_predecessor_bags`]). On the
    /// happy path this costs nothing.
    pub fn close_predecessor_bags(
        mut self,
        store: Arc<dyn crate::bag::BagStore>,
        logs: Vec<String>,
        cfg: crate::bag::BagConfig,
    ) -> Self {
        self.prepare_reading = Some(PrepareReading { store, logs, cfg });
        self
    }

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
        self.mode = pb::Mode::Tentative;
        self
    }

    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Let the server wait up to `wait` for busy names.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Renewal interval, safety margin, whether to renew at all.
    pub fn options(mut self, options: LeaseOptions) -> Self {
        self.options = options;
        self
    }

    pub async fn send(self) -> Result<Lease> {
        let now = self.client.clock.now();
        let (deadline, ttl) = match self.deadline {
            DeadlineSpec::Ttl(ttl) => (now.saturating_add(ttl), ttl),
            DeadlineSpec::At(at) => (at, at.duration_since(now)),
        };
        let req = pb::AcquireRequest {
            names: self.names,
            deadline_us: deadline.as_micros(),
            owner: self.owner,
            mode: self.mode.into(),
            wait_us: self.wait.as_micros() as u64,
        };
        let resp = self.client.rpc().acquire(req).await?.into_inner();
        let grant = resp.grant.ok_or_else(|| Error::Witness {
            reason: "acquire response has no grant".into(),
        })?;
        crate::lease::check_grant(&grant, &self.client.keys)?;
        let lease = Lease::start(self.client, grant, ttl, self.options);
        if let Some(p) = &self.prepare_reading {
            lease
                .close_predecessor_bags(&*p.store, &p.logs, &p.cfg)
                .await
                .map_err(|e| Error::Storage {
                    retryable: e.is_retryable(),
                    message: format!("closing the predecessor's bags: {e}"),
                })?;
        }
        Ok(lease)
    }
}
