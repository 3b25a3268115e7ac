//! Bag helpers: temp stores on a directory, on the real S3 server and on the
//! real NFS server that `tests/run.sh` starts, and test leases signed like
//! the server signs them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_client::bag::faults::{FaultyFs, KillSwitch, RequestCounts, TestObjectStore};
use bagel_client::bag::fsops::{FsOps, StdFs};
use bagel_client::bag::nfs::NfsFs;
use bagel_client::bag::posix::PosixStore;
use bagel_client::bag::s3::S3Store;
use bagel_client::bag::{self, BagState, BagStore, Bucket, ListedItem, Listing, Receipt};
use bagel_proto::Micros;
use bytes::Bytes;
use object_store::ObjectStore;
use rand::Rng as _;

/// The `bagel` binary built next to this test executable.
pub fn bagel_bin() -> PathBuf {
    crate::bin("bagel")
}

/// A random name part, so tests sharing one bucket or root never collide.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:012x}", rand::thread_rng().gen_range(0..1u64 << 48))
}

/// The S3 bucket from the environment `tests/run.sh` (via `s3_start`)
/// sets up. Panics, never skips, when it is missing.
pub fn s3_bucket() -> String {
    for var in ["AWS_ENDPOINT", "BAGEL_S3_BUCKET"] {
        if std::env::var(var).map_or(true, |v| v.is_empty()) {
            panic!(
                "{var} is not set: the S3 tests need the S3 server that tests/run.sh starts \
                 (for a local run: source tests/support/common.sh; source tests/support/s3.sh; s3_start)"
            );
        }
    }
    std::env::var("BAGEL_S3_BUCKET").expect("checked above")
}

/// The store URL of a fresh directory on the real NFS server that
/// `tests/run.sh` (via `nfs_start`) sets up, over NFS `version` 3 or 4, and
/// that directory on this machine (the export is local). Panics, never
/// skips, when the server is missing.
pub fn nfs_dir(version: u8) -> (String, PathBuf) {
    let mut vals = Vec::new();
    for var in [
        format!("BAGEL_NFS_URL_V{version}"),
        "BAGEL_NFS_EXPORT_DIR".to_owned(),
    ] {
        match std::env::var(&var) {
            Ok(v) if !v.is_empty() => vals.push(v),
            _ => panic!(
                "{var} is not set: the NFS tests need the NFS server (nfs-ganesha) that tests/run.sh starts \
                 (for a local run: cargo build --workspace --bins; source tests/support/common.sh; \
                 source tests/support/nfs.sh; nfs_start)"
            ),
        }
    }
    let sub = unique("t");
    let (base, query) = vals[0].split_once('?').unwrap_or((&vals[0], ""));
    let url = format!("{}/{sub}?{query}", base.trim_end_matches('/'));
    (url, PathBuf::from(&vals[1]).join(sub))
}

/// Which backend a conformance test runs on.
#[derive(Debug)]
pub enum Backend {
    Posix {
        dir: tempfile::TempDir,
    },
    S3 {
        bucket: String,
        prefix: String,
    },
    /// The POSIX bag through the userspace NFS client (`nfs://` URL);
    /// `local` is the same directory seen directly on this machine.
    Nfs {
        url: String,
        local: PathBuf,
    },
}

impl Backend {
    pub fn posix() -> Self {
        Backend::Posix {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn s3() -> Self {
        Backend::S3 {
            bucket: s3_bucket(),
            prefix: unique("t"),
        }
    }

    /// NFS `version` 3 or 4.
    pub fn nfs(version: u8) -> Self {
        let (url, local) = nfs_dir(version);
        Backend::Nfs { url, local }
    }

    pub fn url(&self) -> String {
        match self {
            Backend::Posix { dir } => format!("file://{}", dir.path().display()),
            Backend::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
            Backend::Nfs { url, .. } => url.clone(),
        }
    }

    /// The store's root as a directory of this machine (POSIX and NFS).
    pub fn local_root(&self) -> Option<PathBuf> {
        match self {
            Backend::Posix { dir } => Some(dir.path().to_owned()),
            Backend::Nfs { local, .. } => Some(local.clone()),
            Backend::S3 { .. } => None,
        }
    }

    pub fn is_s3(&self) -> bool {
        matches!(self, Backend::S3 { .. })
    }

    /// A store handle; `kill` makes it die after that many low-level
    /// operations (file ops or S3 requests).
    pub async fn store_with(&self, kill: KillSwitch) -> (Arc<dyn BagStore>, Option<Arc<RequestCounts>>) {
        let timeout = Duration::from_secs(20);
        match self {
            Backend::Posix { dir } => {
                let fs: Arc<dyn FsOps> = Arc::new(FaultyFs::new(Arc::new(StdFs::new(dir.path())), kill));
                (Arc::new(PosixStore::new(fs, true, timeout)), None)
            }
            Backend::S3 { bucket, prefix } => {
                let inner = bag::store_url::s3_from_env(bucket).expect("S3 client from env");
                let test = TestObjectStore::new(inner, kill);
                let counts = test.counts.clone();
                let os: Arc<dyn ObjectStore> = Arc::new(test);
                let s3 = S3Store::new(os, prefix, timeout, self.url());
                (Arc::new(s3), Some(counts))
            }
            Backend::Nfs { url, .. } => {
                let nfs = NfsFs::open(url, timeout).await.expect("NFS client");
                let fs: Arc<dyn FsOps> = Arc::new(FaultyFs::new(Arc::new(nfs), kill));
                (Arc::new(PosixStore::new(fs, true, timeout)), None)
            }
        }
    }

    pub async fn store(&self) -> Arc<dyn BagStore> {
        let (s, _) = self.store_with(KillSwitch::never()).await;
        s
    }
}

pub use bagel_client::bag::testing::TestLeases;

/// A one-shot hook run inside the next `append`, before the append itself:
/// lets a test make an append land after something else happened (a close,
/// the clock moving on).
pub type Hook = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>;

/// A [`BagStore`] that delegates, running a [`Hook`] before the next append.
#[derive(Debug)]
pub struct HookStore {
    pub inner: Arc<dyn BagStore>,
    hook: std::sync::Mutex<Option<HookBox>>,
}

struct HookBox(Hook);

impl std::fmt::Debug for HookBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl HookStore {
    pub fn new(inner: Arc<dyn BagStore>) -> Self {
        HookStore {
            inner,
            hook: std::sync::Mutex::new(None),
        }
    }

    pub fn before_next_append(&self, hook: Hook) {
        *self.hook.lock().unwrap() = Some(HookBox(hook));
    }
}

#[async_trait]
impl BagStore for HookStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn append(
        &self,
        log: &str,
        bucket: Bucket,
        writer_file: &str,
        sequence: u64,
        record: Bytes,
    ) -> bag::Result<Receipt> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(HookBox(h)) = hook {
            h().await;
        }
        self.inner
            .append(log, bucket, writer_file, sequence, record)
            .await
    }
    async fn closing_started(&self, log: &str, bucket: Bucket) -> bag::Result<bool> {
        self.inner.closing_started(log, bucket).await
    }
    async fn close(&self, log: &str, bucket: Bucket) -> bag::Result<Listing> {
        self.inner.close(log, bucket).await
    }
    async fn state(&self, log: &str, bucket: Bucket) -> bag::Result<BagState> {
        self.inner.state(log, bucket).await
    }
    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> bag::Result<Bytes> {
        self.inner.read_item(log, bucket, item, limit).await
    }
    async fn list_level(&self, log: &str, parts: &[String]) -> bag::Result<Vec<String>> {
        self.inner.list_level(log, parts).await
    }
    async fn log_start(&self, log: &str) -> bag::Result<Option<Bucket>> {
        self.inner.log_start(log).await
    }
    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> bag::Result<()> {
        self.inner.mark_log_start(log, bucket).await
    }
}

/// A fixed, recent instant in the middle of a second, for manual clocks.
pub fn t0() -> Micros {
    Micros::from_micros(1_900_000_000_250_000)
}
