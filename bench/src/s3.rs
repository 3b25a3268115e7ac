//! S3 conditional-write leases (the seeds' "CASAAS" lease and the If-Match
//! lock with fencing tokens), against the S3 server the tests use: moto
//! 5.2.5 served one request at a time (`tests/support/s3_server.py`), since
//! plain moto lets two racing conditional PUTs both win.
//!
//! One lease object per name holds `{owner, expires_at_us, token}`. Acquire:
//! GET it; absent → create-only PUT (`If-None-Match: *`); present and expired
//! or released → PUT `If-Match: <etag>` with the fencing token + 1; present
//! and live → conflict. Release: PUT `If-Match: <our etag>` with
//! `expires_at_us = 0`, keeping the token (deleting would reset it). So a
//! cycle is GET + PUT + PUT. Only single names: S3 has no multi-object
//! conditional write.
//!
//! [`BagelS3Driver`] is bagel's own S3 lease backend (`bagel-s3-lease`),
//! the big brother of the peer above, run on the same server: one JSON
//! object per name with the holder, the previous holder's record and a
//! history, fencing tokens, client-signed witnesses, multi-name
//! all-or-nothing. Acquire: the names' GETs together, then one conditional
//! PUT per name in name order; release: one `If-Match` PUT per name (the
//! ETag is cached), together. One name: GET + PUT + PUT, as the peer.

use std::net::SocketAddr;
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bagel_client::{AcquireSpec, Error as LeaseError, LeaseBackend as _, LeaseRef, Mode, ReleaseOptions};
use bagel_proto::Micros;
use bagel_proto::clock::SystemClock;
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend, S3LeaseConfig};
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{ClientOptions, GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};
use tokio::process::Command;

use crate::driver::LeaseDriver;
use crate::procs::{Server, WorkDir, free_port, http_status};

pub const BUCKET: &str = "bagel-bench";

/// Starts the serialized moto server with `python` (a venv with
/// `moto[server]`) running `script`, waits for `/moto-api/`, and creates the
/// bucket.
pub async fn start(work: &WorkDir, python: &FsPath, script: &FsPath) -> Result<Server> {
    anyhow::ensure!(script.exists(), "S3 server script {} not found", script.display());
    let port = free_port()?;
    let mut cmd = Command::new(python);
    cmd.arg(script).arg("127.0.0.1").arg(port.to_string());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    // moto keeps everything in memory: no data directory.
    let mut server = Server::spawn("s3", work, cmd, addr, None)?;
    server
        .wait_ready(Duration::from_secs(60), |addr| async move {
            matches!(http_status(addr, "GET", "/moto-api/").await, Ok(200))
        })
        .await?;
    let code = http_status(addr, "PUT", &format!("/{BUCKET}")).await?;
    anyhow::ensure!(code == 200, "creating bucket {BUCKET}: HTTP {code}");
    Ok(server)
}

/// An object_store client for the bucket at `addr`, with conditional PUTs.
pub fn store(addr: SocketAddr) -> Result<Arc<dyn ObjectStore>> {
    let s3 = AmazonS3Builder::new()
        .with_endpoint(format!("http://{addr}"))
        .with_allow_http(true)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id("bench")
        .with_secret_access_key("bench-secret")
        .with_virtual_hosted_style_request(false)
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_client_options(ClientOptions::new().with_allow_http(true))
        .build()
        .context("building the S3 client")?;
    Ok(Arc::new(s3))
}

#[derive(Debug, Serialize, Deserialize)]
struct LeaseBody {
    owner: String,
    /// 0 once released.
    expires_at_us: u64,
    /// Fencing token: +1 on every grant.
    token: u64,
}

#[derive(Debug)]
pub struct S3Driver {
    store: Arc<dyn ObjectStore>,
    owner: String,
}

#[derive(Debug)]
pub struct S3Held {
    path: Path,
    e_tag: Option<String>,
    token: u64,
}

impl S3Driver {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            owner: format!("bench-{}", std::process::id()),
        }
    }

    async fn put(
        &self,
        path: &Path,
        body: &LeaseBody,
        mode: PutMode,
    ) -> object_store::Result<Option<String>> {
        let payload = PutPayload::from(serde_json::to_vec(body).expect("serializable"));
        let r = self.store.put_opts(path, payload, PutOptions::from(mode)).await?;
        Ok(r.e_tag)
    }
}

fn is_conflict(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }
    )
}

impl LeaseDriver for S3Driver {
    type Held = S3Held;

    fn max_names(&self) -> usize {
        1
    }

    async fn acquire(&self, _worker: usize, names: &[String], ttl: Duration) -> Result<Option<S3Held>> {
        let [name] = names else {
            bail!("S3 leases take one name at a time");
        };
        let path = Path::from(format!("leases/{name}"));
        let now = Micros::now();
        let (mode, token) = match self.store.get_opts(&path, GetOptions::default()).await {
            Ok(got) => {
                let e_tag = got.meta.e_tag.clone();
                let version = got.meta.version.clone();
                let current: LeaseBody =
                    serde_json::from_slice(&got.bytes().await?).context("lease object is not a lease")?;
                if current.expires_at_us > u64::from(now) {
                    return Ok(None);
                }
                (
                    PutMode::Update(UpdateVersion { e_tag, version }),
                    current.token + 1,
                )
            }
            Err(object_store::Error::NotFound { .. }) => (PutMode::Create, 1),
            Err(e) => return Err(e.into()),
        };
        let body = LeaseBody {
            owner: self.owner.clone(),
            expires_at_us: u64::from(now.saturating_add(ttl)),
            token,
        };
        match self.put(&path, &body, mode).await {
            Ok(e_tag) => Ok(Some(S3Held { path, e_tag, token })),
            Err(e) if is_conflict(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn release(&self, _worker: usize, held: S3Held) -> Result<()> {
        let body = LeaseBody {
            owner: self.owner.clone(),
            expires_at_us: 0,
            token: held.token,
        };
        let mode = PutMode::Update(UpdateVersion {
            e_tag: held.e_tag,
            version: None,
        });
        self.put(&held.path, &body, mode)
            .await
            .context("releasing (lease lost?)")?;
        Ok(())
    }
}

/// bagel's S3 lease backend as a bench peer.
///
/// Time: the local clock, self-signed (the bench starts no Roughtime
/// server). With Roughtime, a client asks it about once a second, not per
/// operation, so the lease path measured is the same.
#[derive(Debug)]
pub struct BagelS3Driver {
    backend: S3LeaseBackend,
}

impl BagelS3Driver {
    /// Opens the backend on `store` (probing it and publishing its key),
    /// accepting TTLs up to `ttl`.
    pub async fn open(store: Arc<dyn ObjectStore>, ttl: Duration) -> Result<Self> {
        let cfg = S3LeaseConfig::default()
            .with_max_ttl(ttl.max(Duration::from_secs(60)))
            .with_op_timeout(Duration::from_secs(10))
            .with_history_per_name(0);
        let prefix = "bagel-s3-leases";
        let leases = LeaseStore::new(store, prefix, format!("s3://{BUCKET}/{prefix}"), cfg.op_timeout);
        let backend = S3LeaseBackend::open(
            leases,
            bagel_proto::Signer::generate(),
            LeaseTime::UnsafeLocalClock(Arc::new(SystemClock)),
            cfg,
        )
        .await
        .context("opening the S3 lease backend")?;
        Ok(Self { backend })
    }
}

impl LeaseDriver for BagelS3Driver {
    type Held = LeaseRef;

    fn max_names(&self) -> usize {
        64
    }

    async fn acquire(&self, _worker: usize, names: &[String], ttl: Duration) -> Result<Option<LeaseRef>> {
        let spec = AcquireSpec {
            names: names.to_vec(),
            deadline: Micros::now().saturating_add(ttl),
            ttl: None,
            mode: Mode::Full,
            owner: "bench".into(),
            wait: Duration::ZERO,
            holder_key: None,
        };
        match self.backend.acquire_lease(spec).await {
            Ok(grant) => Ok(Some(grant.lease_ref())),
            Err(LeaseError::Busy { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn release(&self, _worker: usize, held: LeaseRef) -> Result<()> {
        self.backend
            .release_lease(&held, ReleaseOptions::default())
            .await
            .context("releasing (lease lost?)")?;
        Ok(())
    }
}
