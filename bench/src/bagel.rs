//! bagel: `bagel-server` (release build) on 127.0.0.1, driven through the
//! generated gRPC client of `bagel-proto`.
//!
//! A lease cycle is `Acquire(names, deadline = now + ttl)` then
//! `Release(lease_id, token, watermark = 0)` ("wrote nothing"): two round
//! trips, whatever the number of names. [`BagelDriver`] makes one unary RPC
//! per operation; [`BagelBatchedDriver`] goes through `bagel-client`'s
//! `Coalescer`, which packs the operations of concurrent tasks into batches
//! (one signature per batch), sent as `Batch` RPCs or pipelined on one
//! `Session` stream, and checks every grant's witness.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use bagel_client::{BearerToken, Client, ClientOptions, CoalesceOptions, Coalescer, LeaseOptions, Transport};
use bagel_proto::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use tokio::process::Command;
use tonic::Code;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::driver::LeaseDriver;
use crate::floor::FloorRow;
use crate::procs::{Server, WorkDir, free_port};

/// How to start a `bagel-server`.
#[derive(Debug, Clone)]
pub struct ServerOpts {
    pub max_ttl: Duration,
    /// Development flag: grant at once instead of waiting out the max TTL.
    pub skip_restart_wait: bool,
    /// An access policy file to start it with (`--acl`): see [`BenchAcl`].
    pub acl: Option<PathBuf>,
}

/// `--bagel-acl`: an access policy that grants one bearer token `lease`
/// and `read` on every name, written into the work dir, and that token,
/// which the drivers then send on every call. The sweep's results then
/// include what the policy costs the server on each call (the token's
/// hash looked up, the grant checked for each name) and what the header
/// costs the client.
#[derive(Debug)]
pub struct BenchAcl {
    /// The policy file, for `bagel-server --acl`.
    pub path: PathBuf,
    token: String,
}

impl BenchAcl {
    /// Writes the policy for a fresh random token into `work`.
    pub fn write(work: &WorkDir) -> Result<Self> {
        let token = crate::driver::random_token();
        let path = work.path.join("bench-acl.toml");
        std::fs::write(&path, acl_policy(&token)).with_context(|| format!("writing {}", path.display()))?;
        Ok(Self { path, token })
    }

    /// The bearer token the policy knows (as identity `bench`).
    pub fn token(&self) -> &str {
        &self.token
    }
}

/// The policy of [`BenchAcl`]. Its prefix is `""`, every name: the sweep
/// draws `bench-<system>-n<N>-c<C>-<id>` and `bench-<system>-paced-<id>`,
/// and a grant on every name keeps a call from ever being refused for its
/// name, whatever prefix a point uses (the server looks each name up in
/// the grants all the same).
fn acl_policy(token: &str) -> String {
    let sha256 = bagel_proto::hex::encode(&bagel_proto::acl::hash_token(token));
    format!(
        "# bagel-bench --bagel-acl: one token, lease and read on every name.\n\
         [[token]]\nidentity = \"bench\"\nsha256 = \"{sha256}\"\n\n\
         [[grant]]\nidentity = \"bench\"\nprefixes = [\"\"]\npermissions = [\"lease\", \"read\"]\n"
    )
}

/// Spawns `bagel-server` on a free port without waiting for it.
pub fn spawn(work: &WorkDir, binary: &Path, opts: &ServerOpts) -> Result<Server> {
    anyhow::ensure!(
        binary.exists(),
        "{} not found: build it with `cargo build --release -p bagel-server` \
         (or pass --bagel-server PATH)",
        binary.display()
    );
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut cmd = Command::new(binary);
    cmd.arg("--listen")
        .arg(addr.to_string())
        .arg("--max-ttl")
        .arg(humantime::format_duration(opts.max_ttl).to_string());
    if opts.skip_restart_wait {
        cmd.arg("--unsafe-skip-restart-wait");
    }
    if let Some(acl) = &opts.acl {
        // Without TLS the server warns that tokens cross the network in
        // the clear: here they cross only 127.0.0.1.
        cmd.arg("--acl").arg(acl);
    }
    // bagel keeps its state in RAM only: no data directory.
    Server::spawn("bagel", work, cmd, addr, None)
}

/// Starts `bagel-server` and waits until its health service says SERVING.
pub async fn start(work: &WorkDir, binary: &Path, opts: &ServerOpts) -> Result<Server> {
    let mut server = spawn(work, binary, opts)?;
    server
        .wait_ready(Duration::from_secs(30), |addr| async move {
            health(addr).await.unwrap_or(false)
        })
        .await?;
    Ok(server)
}

async fn connect(addr: SocketAddr) -> Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await?)
}

/// True when the standard grpc.health.v1 service answers SERVING.
pub async fn health(addr: SocketAddr) -> Result<bool> {
    let mut h = HealthClient::new(connect(addr).await?);
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    Ok(r.status == ServingStatus::Serving as i32)
}

/// `authorization: Bearer <token>`, made once for all the calls.
fn bearer(token: Option<&str>) -> Result<Option<MetadataValue<Ascii>>> {
    token
        .map(|t| format!("Bearer {t}").parse())
        .transpose()
        .context("the bearer token is no header value")
}

/// `message` as a call, with `authorization` if there is one.
fn authorized<T>(message: T, authorization: Option<&MetadataValue<Ascii>>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Some(value) = authorization {
        req.metadata_mut().insert("authorization", value.clone());
    }
    req
}

/// The round-trip floor: the standard health check over one connection,
/// back to back (it reads one flag; no lease work, no signature).
pub async fn floor(addr: SocketAddr, warmup: Duration, duration: Duration) -> Result<FloorRow> {
    let h = HealthClient::new(connect(addr).await?);
    crate::floor::measure("bagel", "grpc.health.v1 Check", warmup, duration, || {
        let mut h = h.clone();
        async move {
            h.check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await?;
            Ok(())
        }
    })
    .await
}

/// Bare unary calls in the shape of [`BagelDriver`]'s cycles, for the CPU
/// floor (`cpu_floor`): a pool of connections, worker `i` on connection
/// `i % pool`, and a "cycle" of two health checks (no lease work, no
/// signature) where a lease cycle makes an acquire and a release.
#[derive(Debug)]
pub struct BareCallDriver {
    conns: Vec<HealthClient<Channel>>,
}

impl BareCallDriver {
    /// With `token` (`--bagel-acl`), each connection first makes one
    /// Describe with it, outside the measurement: under an access policy
    /// the server closes a connection none of whose calls was identified
    /// `--first-request-timeout` (10 s) after accept, however many calls
    /// it makes, and health checks identify nobody. Once identified, it is
    /// kept as the lease drivers' connections are. The health checks
    /// themselves carry no token (health is not under the policy).
    pub async fn connect(addr: SocketAddr, pool: usize, token: Option<&str>) -> Result<Self> {
        let authorization = bearer(token)?;
        let mut conns = Vec::with_capacity(pool);
        for _ in 0..pool.max(1) {
            let ch = connect(addr).await.context("connecting to bagel")?;
            if authorization.is_some() {
                let describe = pb::DescribeRequest {
                    names: vec!["bench-bare-identify".into()],
                };
                LeaseServiceClient::new(ch.clone())
                    .describe(authorized(describe, authorization.as_ref()))
                    .await
                    .context("identifying a CPU-floor connection")?;
            }
            conns.push(HealthClient::new(ch));
        }
        Ok(Self { conns })
    }

    async fn call(&self, worker: usize) -> Result<()> {
        let mut c = self.conns[worker % self.conns.len()].clone();
        c.check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?;
        Ok(())
    }
}

impl LeaseDriver for BareCallDriver {
    type Held = ();

    fn max_names(&self) -> usize {
        // The names the load loop draws are not sent.
        usize::MAX
    }

    async fn acquire(&self, worker: usize, _names: &[String], _ttl: Duration) -> Result<Option<()>> {
        self.call(worker).await.map(Some)
    }

    async fn release(&self, worker: usize, (): ()) -> Result<()> {
        self.call(worker).await
    }
}

/// The client side: a pool of gRPC connections (HTTP/2), worker `i` on
/// connection `i % pool`.
#[derive(Debug)]
pub struct BagelDriver {
    conns: Vec<LeaseServiceClient<Channel>>,
    owner: String,
    /// `authorization: Bearer <token>` for every call (`--bagel-acl`),
    /// made once. Put on each request by hand rather than through an
    /// interceptor, so that without a token a call is exactly what it was.
    authorization: Option<MetadataValue<Ascii>>,
}

#[derive(Debug)]
pub struct BagelHeld {
    lease_id: String,
    token: String,
}

/// The cycle's acquire: a full lease on `names`, deadline `ttl` from now,
/// no waiting (a held name is a conflict).
fn acquire_request(owner: &str, names: &[String], ttl: Duration) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.to_vec(),
        deadline_us: Micros::now().saturating_add(ttl).into(),
        owner: owner.to_owned(),
        mode: pb::Mode::Full as i32,
        wait_us: 0,
        ..Default::default()
    }
}

impl BagelHeld {
    /// The cycle's release. Wrote nothing: watermark 0 carries the inherited
    /// watermark forward.
    fn release_request(self) -> pb::ReleaseRequest {
        pb::ReleaseRequest {
            lease_id: self.lease_id,
            token: self.token,
            watermark_us: 0,
            ..Default::default()
        }
    }
}

impl BagelDriver {
    pub async fn connect(addr: SocketAddr, pool: usize) -> Result<Self> {
        Self::connect_with_token(addr, pool, None).await
    }

    /// With a bearer token sent on every call (see [`BenchAcl`]).
    pub async fn connect_with_token(addr: SocketAddr, pool: usize, token: Option<&str>) -> Result<Self> {
        let authorization = bearer(token)?;
        let mut conns = Vec::with_capacity(pool);
        for _ in 0..pool.max(1) {
            let ch = connect(addr).await.context("connecting to bagel")?;
            conns.push(LeaseServiceClient::new(ch));
        }
        Ok(Self {
            conns,
            owner: format!("bench-{}", std::process::id()),
            authorization,
        })
    }

    fn conn(&self, worker: usize) -> LeaseServiceClient<Channel> {
        self.conns[worker % self.conns.len()].clone()
    }

    /// `message` as a call, with the token if there is one.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        authorized(message, self.authorization.as_ref())
    }

    /// One acquire as a probe of the restart quarantine: `Ok(true)` once
    /// granted, `Ok(false)` while the server refuses grants (UNAVAILABLE).
    pub async fn try_grant(&self, name: &str, ttl: Duration) -> Result<bool> {
        match self.acquire(0, &[name.to_string()], ttl).await {
            Ok(Some(held)) => {
                self.release(0, held).await?;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => match e.downcast_ref::<tonic::Status>() {
                Some(s) if s.code() == Code::Unavailable => Ok(false),
                _ => Err(e),
            },
        }
    }
}

impl LeaseDriver for BagelDriver {
    type Held = BagelHeld;

    fn max_names(&self) -> usize {
        // Well under the server's max_names_per_request.
        16
    }

    async fn acquire(&self, worker: usize, names: &[String], ttl: Duration) -> Result<Option<BagelHeld>> {
        let mut c = self.conn(worker);
        let req = self.request(acquire_request(&self.owner, names, ttl));
        match c.acquire(req).await {
            Ok(r) => {
                let grant = r.into_inner().grant.context("AcquireResponse without grant")?;
                Ok(Some(BagelHeld {
                    lease_id: grant.lease_id,
                    token: grant.token,
                }))
            }
            Err(s) if s.code() == Code::Aborted => Ok(None),
            Err(s) => Err(s.into()),
        }
    }

    async fn release(&self, worker: usize, held: BagelHeld) -> Result<()> {
        let mut c = self.conn(worker);
        c.release(self.request(held.release_request())).await?;
        Ok(())
    }
}

/// The same cycle through `bagel-client`'s `Coalescer` (batched RPCs,
/// witnesses verified), over one connection.
#[derive(Debug)]
pub struct BagelBatchedDriver {
    client: Client,
    coalescer: Coalescer,
    owner: String,
}

impl BagelBatchedDriver {
    pub async fn connect(addr: SocketAddr, transport: Transport) -> Result<Self> {
        Self::connect_with(addr, CoalesceOptions::default().with_transport(transport)).await
    }

    /// With the coalescer's options spelled out (`--coalesce-*`).
    pub async fn connect_with(addr: SocketAddr, options: CoalesceOptions) -> Result<Self> {
        Self::connect_with_token(addr, options, None).await
    }

    /// ... and a bearer token the client sends on every call (see
    /// [`BenchAcl`]).
    pub async fn connect_with_token(
        addr: SocketAddr,
        options: CoalesceOptions,
        token: Option<&str>,
    ) -> Result<Self> {
        let mut client_options = ClientOptions::default();
        if let Some(t) = token {
            client_options =
                client_options.with_bearer_token(BearerToken::new(t).map_err(anyhow::Error::msg)?);
        }
        let client = Client::connect_with(format!("http://{addr}"), &client_options)
            .await
            .context("connecting bagel-client")?;
        Ok(Self {
            coalescer: Coalescer::new(client.clone(), options),
            client,
            owner: format!("bench-{}", std::process::id()),
        })
    }
}

impl LeaseDriver for BagelBatchedDriver {
    type Held = bagel_client::Lease;

    fn max_names(&self) -> usize {
        16
    }

    /// The library's fast path, as users take it: the lease handle, its
    /// acquire and release batched through the coalescer (a cycle is too
    /// short to need renewing).
    async fn acquire(&self, _worker: usize, names: &[String], ttl: Duration) -> Result<Option<Self::Held>> {
        let acquired = self
            .client
            .acquire(names.iter().cloned())
            .ttl(ttl)
            .owner(&self.owner)
            .options(LeaseOptions::default().with_auto_renew(false))
            .via(&self.coalescer)
            .send()
            .await;
        held_or_busy(acquired)
    }

    async fn release(&self, _worker: usize, held: Self::Held) -> Result<()> {
        held.release(None).await?;
        Ok(())
    }
}

/// A lease-handle acquire as a driver's answer: the lease, `None` when a
/// name is busy (a conflict, counted), or the error.
pub fn held_or_busy(
    acquired: bagel_client::Result<bagel_client::Lease>,
) -> Result<Option<bagel_client::Lease>> {
    match acquired {
        Ok(lease) => Ok(Some(lease)),
        Err(bagel_client::Error::Busy { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use bagel_proto::acl::{Permission, Policy, hash_token};

    #[test]
    fn the_acl_policy_grants_its_token_lease_and_read_on_every_name() {
        let p = Policy::parse(&super::acl_policy("t0k3n")).unwrap();
        let identity = p.token_identity(&hash_token("t0k3n")).unwrap();
        assert_eq!(identity, "bench");
        assert!(p.token_identity(&hash_token("other")).is_none());
        let g = p.grants_for(identity);
        for name in ["bench-bagel-n1-c16-42", "bench-bagel-session-paced-7", "x"] {
            assert!(g.allows(Permission::Lease, name), "{name}");
            assert!(g.allows(Permission::Read, name), "{name}");
        }
    }
}
