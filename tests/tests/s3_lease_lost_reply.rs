//! A conditional PUT whose answer is lost (issue 23.10): the store applied
//! it, the client never heard. Either the client's HTTP layer retries the
//! same PUT and gets 412 (its own write changed the ETag), or the call
//! fails. Both used to read as a lost race (the acquirer then waited out
//! its own phantom lease, a release reported failure) or as a failure;
//! the backend now rereads the object and recognises its own write.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bagel_client::{AcquireBuilder, LeaseOptions};
use bagel_proto::Signer;
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend};
use bagel_tests::{roughtime_time, s3_bucket, s3_lease_url, s3_test_config, unique};
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// How the answer of a PUT is lost.
#[derive(Clone, Copy, Debug)]
enum Lost {
    /// The PUT lands; the client retries it (as `object_store` does after a
    /// dropped connection) and returns the retry's answer: a 412.
    RetriedInto412,
    /// The PUT lands; the client sees an error.
    Error,
}

/// `inner`, losing the answers of the next `armed` PUTs to lease objects.
#[derive(Debug)]
struct LosesReplies {
    inner: Arc<dyn ObjectStore>,
    armed: Arc<AtomicU32>,
    how: Lost,
}

impl fmt::Display for LosesReplies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "loses-replies({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for LosesReplies {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let lease_object = location.as_ref().contains("/leases/");
        let lose = lease_object
            && self
                .armed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if !lose {
            return self.inner.put_opts(location, payload, opts).await;
        }
        self.inner
            .put_opts(location, payload.clone(), opts.clone())
            .await?;
        match self.how {
            Lost::RetriedInto412 => self.inner.put_opts(location, payload, opts).await,
            Lost::Error => Err(object_store::Error::Generic {
                store: "test",
                source: "connection reset after the request was sent".into(),
            }),
        }
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }
    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Acquire (fresh object and takeover of a released one), renew and
/// release, each with its PUT's answer lost: each succeeds, and the next
/// holder finds the release.
async fn every_operation_survives_a_lost_answer(how: Lost) {
    let armed = Arc::new(AtomicU32::new(0));
    let store = LosesReplies {
        inner: bagel_bags::store::url::s3_from_env(&s3_bucket()).unwrap(),
        armed: Arc::clone(&armed),
        how,
    };
    let cfg = s3_test_config();
    let prefix = unique("lostreply");
    let store = LeaseStore::new(Arc::new(store), &prefix, s3_lease_url(&prefix), cfg.op_timeout);
    let backend = Arc::new(
        S3LeaseBackend::open(
            store,
            Signer::generate(),
            LeaseTime::Signed(roughtime_time()),
            cfg,
        )
        .await
        .unwrap(),
    );
    let acquire = || {
        AcquireBuilder::new(Arc::clone(&backend) as _, ["n"])
            .ttl(Duration::from_secs(10))
            .options(LeaseOptions::default().with_auto_renew(false))
    };
    let mut previous = None;
    for round in 0..2 {
        armed.store(1, Ordering::SeqCst);
        let lease = acquire()
            .send()
            .await
            .unwrap_or_else(|e| panic!("{how:?} round {round}: acquire: {e}"));
        assert_eq!(armed.load(Ordering::SeqCst), 0, "the answer was lost");
        assert_eq!(
            lease.names()[0].previous.lease_id,
            previous,
            "{how:?} round {round}"
        );
        armed.store(1, Ordering::SeqCst);
        lease
            .renew()
            .await
            .unwrap_or_else(|e| panic!("{how:?} round {round}: renew: {e}"));
        armed.store(1, Ordering::SeqCst);
        let id = lease.id().to_owned();
        lease
            .release(None)
            .await
            .unwrap_or_else(|e| panic!("{how:?} round {round}: release: {e}"));
        assert_eq!(armed.load(Ordering::SeqCst), 0);
        previous = Some(id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_retried_into_412_after_it_landed_is_recognised_as_ours() {
    every_operation_survives_a_lost_answer(Lost::RetriedInto412).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_landed_but_answered_an_error_is_recognised_as_ours() {
    every_operation_survives_a_lost_answer(Lost::Error).await;
}
