//! Lease helpers: one lease-handle environment over any backend (the real
//! `bagel-server`, several as a cluster, S3 conditional writes on the real
//! S3 server, or the in-memory backend of `memory_lease`), and a private S3
//! server a test may stop.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bagel_cli::{LeaseBackendOptions, open_lease_backend};
use bagel_client::{AcquireBuilder, History, LeaseBackend, NameState, TimeOptions, TimeSource};
use bagel_proto::KeyRing;
use bagel_proto::clock::SystemClock;
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend, S3LeaseConfig};
use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};

use crate::{MemoryLeaseBackend, Roughtime, ServerProcess, s3_bucket, unique};

/// The S3 lease settings of the tests: short TTLs allowed, and a clock
/// margin of 14 s: the test Roughtime server (roughenough 2.2) reports a
/// 5 s radius, so every client's error bound is 5 s and some (offset, RTT),
/// and a client refuses a margin below twice its bound. Takeovers after
/// expiry thus come 14 s after the deadline.
pub fn s3_test_config() -> S3LeaseConfig {
    S3LeaseConfig::default()
        .with_min_ttl(Duration::from_millis(10))
        .with_clock_margin(S3_TEST_CLOCK_MARGIN)
}

/// The clock margin of [`s3_test_config`], for `--clock-margin`.
pub const S3_TEST_CLOCK_MARGIN: Duration = Duration::from_secs(14);

/// Signed time from the test suite's Roughtime server.
pub fn roughtime_time() -> TimeSource {
    TimeSource::roughtime(vec![Roughtime::from_env().server()], TimeOptions::default())
}

/// An S3 lease backend on a fresh prefix of the test bucket, its time
/// checked against the test Roughtime server.
pub async fn s3_backend_at(prefix: &str, cfg: S3LeaseConfig) -> Arc<S3LeaseBackend> {
    let store = LeaseStore::from_url(&s3_lease_url(prefix), cfg.op_timeout).expect("lease store URL");
    let backend = S3LeaseBackend::open(
        store,
        bagel_proto::Signer::generate(),
        LeaseTime::Signed(roughtime_time()),
        cfg,
    )
    .await
    .expect("open the S3 lease store");
    Arc::new(backend)
}

/// `s3://<test bucket>/<prefix>`.
pub fn s3_lease_url(prefix: &str) -> String {
    format!("s3://{}/{prefix}", s3_bucket())
}

/// Where the leases of a conformance test live: any [`LeaseBackend`],
/// with what keeps it running. Every operation goes through the trait, so
/// a new backend joins the suite ([`crate::conformance::lease`]) through
/// [`LeaseEnv::of`], with a module in `tests/tests/lease_conformance.rs`.
#[derive(Debug)]
pub struct LeaseEnv {
    backend: Arc<dyn LeaseBackend>,
    takeover_wait: Duration,
    /// The servers behind the backend, stopped on drop.
    _servers: Vec<ServerProcess>,
}

impl LeaseEnv {
    /// Any backend: `takeover_wait` is how long a waiter needs to take
    /// over an expired lease of it (see [`LeaseEnv::takeover_wait`]).
    pub fn of(backend: Arc<dyn LeaseBackend>, takeover_wait: Duration) -> Self {
        LeaseEnv {
            backend,
            takeover_wait,
            _servers: Vec::new(),
        }
    }

    /// A fresh `bagel-server` (restart wait skipped).
    pub async fn server() -> Self {
        let server = ServerProcess::start_ready(&[]).await;
        let backend = open_lease_backend(&server.url, &LeaseBackendOptions::default())
            .await
            .expect("connect to bagel-server");
        LeaseEnv {
            _servers: vec![server],
            ..LeaseEnv::of(backend, SERVER_TAKEOVER_WAIT)
        }
    }

    /// Three fresh `bagel-server`s as one [`bagel_client::Cluster`] (names
    /// routed over them, a lease of several names in parts).
    pub async fn cluster() -> Self {
        let servers = futures::future::join_all((0..3).map(|_| ServerProcess::start_ready(&[]))).await;
        let list = servers
            .iter()
            .map(|s| s.url.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let backend = open_lease_backend(&list, &LeaseBackendOptions::default())
            .await
            .expect("connect to the bagel-servers");
        LeaseEnv {
            _servers: servers,
            ..LeaseEnv::of(backend, SERVER_TAKEOVER_WAIT)
        }
    }

    /// A fresh prefix on the real S3 server.
    pub async fn s3() -> Self {
        let backend = s3_backend_at(&unique("leases"), s3_test_config()).await;
        LeaseEnv::of(backend, Duration::from_secs(30))
    }

    /// A fresh [`MemoryLeaseBackend`] on the system clock (the scenarios
    /// compare with `Micros::now()`): one clock decides, so an expired lease
    /// is taken over at its deadline, within the max wait.
    pub async fn memory() -> Self {
        let backend = MemoryLeaseBackend::new(Arc::new(SystemClock));
        let takeover_wait = backend.limits().lease.max_wait;
        LeaseEnv::of(Arc::new(backend), takeover_wait)
    }

    pub fn backend(&self) -> Arc<dyn LeaseBackend> {
        Arc::clone(&self.backend)
    }

    /// How long a test waits to take over an expired lease: within the
    /// server's and the memory backend's max wait (10 s); on S3, past the
    /// clock margin and both clock bounds (14 s or more, see
    /// `s3_test_config`).
    pub fn takeover_wait(&self) -> Duration {
        self.takeover_wait
    }

    pub fn acquire<I, S>(&self, names: I) -> AcquireBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireBuilder::new(self.backend(), names)
    }

    /// The keys the witnesses of this backend verify with.
    pub async fn keys(&self) -> KeyRing {
        self.backend.trusted_keys().await.expect("trusted keys")
    }

    pub async fn describe(&self, names: &[&str]) -> Vec<NameState> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        self.backend.describe(&names).await.unwrap()
    }

    pub async fn history(&self, name: &str) -> History {
        self.backend.history(name).await.unwrap()
    }
}

/// A server's max wait, within which an expired lease is taken over.
const SERVER_TAKEOVER_WAIT: Duration = Duration::from_secs(10);

/// An S3 server of this test's own (the suite's script, moto behind one
/// lock), on a free port with a bucket made at start, so the test can stop
/// it. Killed on drop.
#[derive(Debug)]
pub struct PrivateS3 {
    child: Child,
    pub endpoint: String,
    pub bucket: String,
    journal: Option<PathBuf>,
}

impl PrivateS3 {
    /// Starts `$BAGEL_S3_SERVER` (set by `tests/support/s3.sh`), waiting
    /// for its "listening" line and then for a connection to be accepted.
    pub async fn start() -> PrivateS3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        PrivateS3::start_on(port, None).await
    }

    /// Like [`PrivateS3::start`], journaling every change to `journal`: a
    /// server started again on the same journal ([`PrivateS3::restart`])
    /// replays it, as the fault run's S3 server does after kill -9.
    pub async fn start_journaled(journal: &Path) -> PrivateS3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        PrivateS3::start_on(port, Some(journal.to_owned())).await
    }

    /// Kills it (SIGKILL) and starts it again on the same port and journal.
    pub async fn restart(&mut self) {
        self.kill();
        let port = self
            .endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the endpoint's port");
        let fresh = PrivateS3::start_on(port, self.journal.take()).await;
        *self = fresh;
    }

    async fn start_on(port: u16, journal: Option<PathBuf>) -> PrivateS3 {
        let cmd = crate::need_env(
            "BAGEL_S3_SERVER",
            "the S3 server command (tests/support/s3.sh sets it)",
        );
        let mut parts = cmd.split_whitespace();
        let prog = parts.next().expect("BAGEL_S3_SERVER is empty");
        let bucket = "private".to_owned();
        let mut command = Command::new(prog);
        command
            .args(parts)
            .args(["127.0.0.1", &port.to_string(), "--bucket", &bucket]);
        if let Some(journal) = &journal {
            command.arg("--journal").arg(journal);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the S3 server");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref() {
                if line.expect("read S3 server stdout").contains(" listening on ") {
                    std::thread::spawn(move || for _ in lines {});
                    std::thread::spawn(move || std::io::copy(&mut { stderr }, &mut std::io::sink()));
                    return;
                }
            }
            let mut why = String::new();
            let _ = std::io::Read::read_to_string(&mut { stderr }, &mut why);
            panic!("the S3 server exited before listening: {why}");
        })
        .await
        .expect("reader task");
        // It prints before it binds: a refused connection is retried
        // briefly, never for long.
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                tokio::time::Instant::now() < give_up,
                "S3 server not accepting within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        PrivateS3 {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket,
            journal,
        }
    }

    /// A client of it, with conditional PUTs and few retries (a stopped
    /// server should fail calls quickly).
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        let s3 = AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_bucket_name(&self.bucket)
            .with_region("us-east-1")
            .with_access_key_id("bagel")
            .with_secret_access_key("bagel-secret")
            .with_virtual_hosted_style_request(false)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .build()
            .expect("S3 client");
        Arc::new(s3)
    }

    /// The environment a `bagel` process needs to use it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
        ]
    }

    /// `s3://private/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// Stops it (SIGKILL): every later request fails.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateS3 {
    fn drop(&mut self) {
        self.kill();
    }
}
