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
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use bagel_client::{Client, CoalesceOptions, Coalescer, LeaseOptions, Transport};
use bagel_proto::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use tokio::process::Command;
use tonic::Code;
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
    pub async fn connect(addr: SocketAddr, pool: usize) -> Result<Self> {
        let mut conns = Vec::with_capacity(pool);
        for _ in 0..pool.max(1) {
            let ch = connect(addr).await.context("connecting to bagel")?;
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
        let mut conns = Vec::with_capacity(pool);
        for _ in 0..pool.max(1) {
            let ch = connect(addr).await.context("connecting to bagel")?;
            conns.push(LeaseServiceClient::new(ch));
        }
        Ok(Self {
            conns,
            owner: format!("bench-{}", std::process::id()),
        })
    }

    fn conn(&self, worker: usize) -> LeaseServiceClient<Channel> {
        self.conns[worker % self.conns.len()].clone()
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
        let req = acquire_request(&self.owner, names, ttl);
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
        c.release(held.release_request()).await?;
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
        let client = bagel_client::Client::connect(format!("http://{addr}"))
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
