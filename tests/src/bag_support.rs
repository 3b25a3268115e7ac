//! Bag helpers: temp stores on a directory and on the real S3 server that
//! `tests/run.sh` starts, and test leases signed like the server signs them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_client::bag::faults::{FaultyFs, KillSwitch, RequestCounts, TestObjectStore};
use bagel_client::bag::fsops::{FsOps, StdFs};
use bagel_client::bag::posix::PosixStore;
use bagel_client::bag::s3::S3Store;
use bagel_client::bag::{self, BagState, BagStore, Bucket, ListedItem, Listing, Receipt};
use bagel_client::json::{LeaseJson, WitnessJson};
use bagel_proto::{Micros, Signer, pb};
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

/// Which backend a conformance test runs on.
#[derive(Debug)]
pub enum Backend {
    Posix { dir: tempfile::TempDir },
    S3 { bucket: String, prefix: String },
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

    pub fn url(&self) -> String {
        match self {
            Backend::Posix { dir } => format!("file://{}", dir.path().display()),
            Backend::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
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
        }
    }

    pub async fn store(&self) -> Arc<dyn BagStore> {
        let (s, _) = self.store_with(KillSwitch::never()).await;
        s
    }
}

/// Signs leases the way the lease server does.
#[derive(Debug)]
pub struct TestLeases {
    pub signer: Signer,
}

impl Default for TestLeases {
    fn default() -> Self {
        TestLeases {
            signer: Signer::generate(),
        }
    }
}

impl TestLeases {
    pub fn keys(&self) -> bagel_proto::KeyRing {
        [self.signer.verifying_key()].into_iter().collect()
    }

    /// The public key as the hex `bagel read --key` takes.
    pub fn key_hex(&self) -> String {
        self.signer
            .verifying_key()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn witness(&self, lease_id: &str, min: Micros, deadline: Micros) -> pb::Witness {
        let body = pb::WitnessBody {
            lease_id: lease_id.to_owned(),
            names: vec![pb::WitnessName {
                name: "tenant".into(),
                fencing_token: 1,
                previous: None,
            }],
            owner: "tests".into(),
            mode: pb::Mode::Full as i32,
            kind: pb::WitnessKind::Acquire as i32,
            deadline_us: deadline.as_micros(),
            min_timestamp_us: min.as_micros(),
            issued_at_us: min.as_micros(),
            server_id: "test-server".into(),
            ..Default::default()
        };
        bagel_proto::sign_witness(&self.signer, &body)
    }

    /// A full lease as `bagel acquire --json` prints it.
    pub fn lease(&self, lease_id: &str, min: Micros, deadline: Micros) -> LeaseJson {
        LeaseJson {
            lease_id: lease_id.to_owned(),
            token: "token".into(),
            deadline_us: deadline.as_micros(),
            min_timestamp_us: min.as_micros(),
            mode: "full".into(),
            names: Vec::new(),
            witness: WitnessJson::from(&self.witness(lease_id, min, deadline)),
            server: None,
        }
    }
}

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
}

/// A fixed, recent instant in the middle of a second, for manual clocks.
pub fn t0() -> Micros {
    Micros::from_micros(1_900_000_000_250_000)
}
