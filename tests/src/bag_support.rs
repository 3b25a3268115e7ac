//! Bag helpers: temp stores on a directory, on the real S3 server and on the
//! real NFS server that `tests/run.sh` starts, and test leases signed like
//! the server signs them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::store::faults::{AppendsThrough, FaultyFs, KillSwitch, RequestCounts, TestObjectStore};
use bagel_bags::store::fsops::{FsOps, StdFs};
use bagel_bags::store::nfs::NfsFs;
use bagel_bags::store::object::ObjectBagStore;
use bagel_bags::{self as bag, BagStore, TimeoutStore};
use bagel_proto::Micros;
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
    crate::need_env("AWS_ENDPOINT", "the S3 server (moto)");
    crate::need_env("BAGEL_S3_BUCKET", "the S3 server (moto)")
}

/// The store URL of a fresh directory on the real NFS server that
/// `tests/run.sh` (via `nfs_start`) sets up, over NFS `version` 3 or 4, and
/// that directory on this machine (the export is local). Panics, never
/// skips, when the server is missing.
pub fn nfs_dir(version: u8) -> (String, PathBuf) {
    let export = crate::need_env("BAGEL_NFS_EXPORT_DIR", "the NFS server (nfs-ganesha)");
    let sub = unique("t");
    (
        crate::sub_url(&crate::nfs_url(version), &sub),
        PathBuf::from(export).join(sub),
    )
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

    /// A store handle; `kill` makes it die after that many low-level
    /// operations (file ops or S3 requests).
    pub async fn store_with(&self, kill: KillSwitch) -> (Arc<dyn BagStore>, Option<Arc<RequestCounts>>) {
        let timeout = Duration::from_secs(20);
        let (store, counts): (Arc<dyn BagStore>, _) = match self {
            Backend::Posix { dir } => {
                let fs: Arc<dyn FsOps> = Arc::new(FaultyFs::new(Arc::new(StdFs::new(dir.path())), kill));
                (Arc::new(DirectoryStore::new(fs, true)), None)
            }
            Backend::S3 { bucket, prefix } => {
                let inner = bag::store::url::s3_from_env(bucket).expect("S3 client from env");
                let test = TestObjectStore::new(inner, kill);
                let counts = test.counts.clone();
                let os: Arc<dyn ObjectStore> = Arc::new(test);
                (
                    Arc::new(ObjectBagStore::new(os, prefix, self.url())),
                    Some(counts),
                )
            }
            Backend::Nfs { url, .. } => {
                let nfs = NfsFs::open(url, timeout).await.expect("NFS client");
                let fs: Arc<dyn FsOps> = Arc::new(FaultyFs::new(Arc::new(nfs), kill));
                (Arc::new(DirectoryStore::new(fs, true)), None)
            }
        };
        (Arc::new(TimeoutStore::new(store, timeout)), counts)
    }

    pub async fn store(&self) -> Arc<dyn BagStore> {
        let (s, _) = self.store_with(KillSwitch::never()).await;
        s
    }
}

/// The three stores of the bag conformance suite: a directory holds a bag
/// in one file, S3 each batch in an object of its own.
#[async_trait::async_trait]
impl crate::conformance::bags::BagEnv for Backend {
    async fn store(&self) -> Arc<dyn BagStore> {
        Backend::store(self).await
    }

    async fn store_with(&self, kill: KillSwitch) -> Arc<dyn BagStore> {
        Backend::store_with(self, kill).await.0
    }

    async fn read_raw(&self, key: &str) -> Vec<u8> {
        match self {
            Backend::Posix { .. } | Backend::Nfs { .. } => {
                let path = self.local_root().expect("a directory").join(key);
                std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
            }
            Backend::S3 { bucket, prefix } => {
                let os = bag::store::url::s3_from_env(bucket).expect("S3 client from env");
                let key = object_store::path::Path::from(format!("{prefix}/{key}"));
                let got = os
                    .get_opts(&key, Default::default())
                    .await
                    .unwrap_or_else(|e| panic!("get {key}: {e}"));
                got.bytes()
                    .await
                    .unwrap_or_else(|e| panic!("read {key}: {e}"))
                    .to_vec()
            }
        }
    }

    async fn write_raw(&self, key: &str, bytes: Vec<u8>) {
        match self {
            Backend::Posix { .. } | Backend::Nfs { .. } => {
                let path = self.local_root().expect("a directory").join(key);
                std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()))
            }
            Backend::S3 { bucket, prefix } => {
                let os = bag::store::url::s3_from_env(bucket).expect("S3 client from env");
                let key = object_store::path::Path::from(format!("{prefix}/{key}"));
                os.put_opts(&key, bytes.into(), Default::default())
                    .await
                    .unwrap_or_else(|e| panic!("put {key}: {e}"));
            }
        }
    }
}

pub use bagel_bags::testing::{TestLease, TestLeases};

/// A test lease as the CLI's lease file (`bagel write --lease FILE`).
pub fn lease_json(l: &TestLease) -> bagel_cli::contract::LeaseJson {
    use bagel_cli::contract::{LeaseJson, ModeJson, WitnessJson};
    let witness = bagel_client::Witness::from(l.witness.clone());
    LeaseJson {
        lease_id: l.lease_id.clone(),
        token: "token".into(),
        deadline_us: l.deadline.as_micros(),
        min_timestamp_us: l.min_timestamp.as_micros(),
        mode: ModeJson::Full,
        names: Vec::new(),
        witness: WitnessJson::from(&witness),
        witnesses: Vec::new(),
        server: None,
        servers: Vec::new(),
        holder_secret: l
            .holder
            .as_ref()
            .map(|h| bagel_proto::hex::encode(&h.signing_key().to_bytes())),
    }
}

/// A one-shot hook run inside the next `append`, before the append itself:
/// lets a test make an append land after something else happened (a close,
/// the clock moving on).
pub type Hook = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>;

/// A store that runs a [`Hook`] before its next append.
pub struct HookStore {
    store: Arc<dyn BagStore>,
    hook: Arc<std::sync::Mutex<Option<Hook>>>,
}

impl std::fmt::Debug for HookStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl HookStore {
    pub fn new(inner: Arc<dyn BagStore>) -> Self {
        let hook: Arc<std::sync::Mutex<Option<Hook>>> = Arc::default();
        let next = Arc::clone(&hook);
        let store = AppendsThrough::new(inner, move |inner, append| {
            let hook = next.lock().expect("hook").take();
            Box::pin(async move {
                if let Some(h) = hook {
                    h().await;
                }
                append.to(&*inner).await
            })
        });
        HookStore {
            store: Arc::new(store),
            hook,
        }
    }

    /// The store to write through.
    pub fn store(&self) -> Arc<dyn BagStore> {
        Arc::clone(&self.store)
    }

    pub fn before_next_append(&self, hook: Hook) {
        *self.hook.lock().expect("hook") = Some(hook);
    }
}

/// Reads all of `log`, verified with the test leases' keys, and insists
/// nothing was rejected or damaged.
pub async fn read_clean(
    store: &dyn BagStore,
    log: &str,
    leases: &TestLeases,
    cfg: &bag::BagConfig,
    clock: &dyn bagel_proto::clock::Clock,
) -> bag::ReadReport {
    let opts = bag::ReadOptions::default().with_keys(Some(leases.keys()));
    let r = bag::read(store, log, &opts, cfg, &bagel_proto::clock::AssumedExact(clock))
        .await
        .unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    r
}

/// The payloads of a read, as text, in order.
pub fn payloads(r: &bag::ReadReport) -> Vec<String> {
    r.messages
        .iter()
        .map(|m| String::from_utf8(m.payload.to_vec()).unwrap())
        .collect()
}

/// A fixed, recent instant in the middle of a second, for manual clocks.
pub fn t0() -> Micros {
    Micros::from_micros(1_900_000_000_250_000)
}

/// Writer `w1` of log `log` on `clock`, under test lease `l1` (from a
/// second before [`t0`] for an hour), with the default bag config.
pub fn writer_at_t0(
    store: Arc<dyn BagStore>,
    clock: &bagel_proto::clock::ManualClock,
    leases: &TestLeases,
) -> bag::Writer {
    let lease = leases.lease(
        "l1",
        t0().saturating_sub(Duration::from_secs(1)),
        t0().saturating_add(Duration::from_secs(3600)),
    );
    bag::Writer::new(
        store,
        "log",
        "w1",
        Arc::new(lease),
        Arc::new(clock.clone()),
        leases.time(Arc::new(clock.clone())),
        bag::BagConfig::default(),
    )
    .unwrap()
}
