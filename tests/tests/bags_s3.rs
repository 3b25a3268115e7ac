//! S3-specific checks on the real S3 server: one PUT per batch on the happy
//! path (after a writer's one-time start mark), and refusing a store that
//! ignores conditional writes.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_bags::faults::KillSwitch;
use bagel_bags::s3::S3Store;
use bagel_bags::{self as bag, BagConfig, Error, Writer};
use bagel_proto::clock::ManualClock;
use bagel_tests::{Backend, TestLeases, t0, unique};
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_is_exactly_one_put_per_batch() {
    let backend = Backend::s3();
    let (store, counts) = backend.store_with(KillSwitch::never()).await;
    let counts = counts.unwrap();
    let clock = ManualClock::new(t0());
    let leases = TestLeases::default();
    let lease = leases.lease(
        "l1",
        t0().saturating_sub(Duration::from_secs(1)),
        t0().saturating_add(Duration::from_secs(60)),
    );
    let w = Writer::new(
        store,
        &unique("log"),
        "w1",
        Arc::new(lease),
        Arc::new(clock.clone()),
        leases.time(Arc::new(clock.clone())),
        BagConfig::default(),
    )
    .unwrap();
    // The first write of a writer also looks for (one LIST) and makes (one
    // PUT) the log's start mark; count from after it.
    w.write(Bytes::from("first")).await.unwrap();
    assert_eq!((counts.puts(), counts.lists()), (2, 1));
    counts.reset();
    let batches = 20u64;
    for i in 0..batches {
        let batch = (0..10).map(|j| Bytes::from(format!("m{i}-{j}"))).collect();
        w.write_batch(batch).await.unwrap();
        clock.advance(Duration::from_millis(30));
    }
    println!(
        "S3 requests for {batches} batches: {} PUT, {} GET, {} HEAD, {} LIST",
        counts.puts(),
        counts.gets(),
        counts.heads(),
        counts.lists()
    );
    assert_eq!(counts.puts(), batches);
    assert_eq!(counts.gets() + counts.heads() + counts.lists(), 0);
}

/// A store that drops `If-None-Match: *`, as some S3 look-alikes do.
#[derive(Debug)]
struct IgnoresConditions(Arc<dyn ObjectStore>);

impl fmt::Display for IgnoresConditions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ignores-conditions({})", self.0)
    }
}

#[async_trait]
impl ObjectStore for IgnoresConditions {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if matches!(opts.mode, PutMode::Create) {
            opts.mode = PutMode::Overwrite;
        }
        self.0.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.0.get_opts(location, options).await
    }
    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.0.get_ranges(location, ranges).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_ignores_conditional_writes_is_refused() {
    let bucket = bagel_tests::s3_bucket();
    let real = bag::store_url::s3_from_env(&bucket).unwrap();
    let honest = S3Store::new(real.clone(), &unique("p"), "honest".into());
    honest.probe_conditional_put().await.unwrap();
    let liar = S3Store::new(Arc::new(IgnoresConditions(real)), &unique("p"), "liar".into());
    let err = liar.probe_conditional_put().await.unwrap_err();
    assert!(matches!(err, Error::ConditionalWritesIgnored { .. }), "{err:?}");
    assert!(err.to_string().contains("ignores conditional writes"), "{err}");
    assert!(err.is_permanent());
}
