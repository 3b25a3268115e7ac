//! [`TimeoutStore`]: every storage call of a store, bounded in time.
//!
//! One wrapper rather than a timeout in each method of each backend, as
//! `object_store` does with its `limit` and `throttle` wrappers: a
//! backend only speaks its protocol, and [`crate::open_store`] wraps it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::bucket::Bucket;
use crate::error::{Error, Result};
use crate::listing::{ListedItem, Listing, Receipt};
use crate::store::{BagState, BagStore};

/// A [`BagStore`] whose every call gives up with [`Error::Timeout`] after
/// `after`. A call given up on may still complete in the background (a
/// blocking file call, a request already sent): writers treat such a write
/// as of unknown outcome.
#[derive(Debug)]
pub struct TimeoutStore {
    inner: Arc<dyn BagStore>,
    after: Duration,
}

impl TimeoutStore {
    /// Bound every call to `inner` by `after` (usually [`crate::BagConfig::op_timeout`]).
    pub fn new(inner: Arc<dyn BagStore>, after: Duration) -> Self {
        TimeoutStore { inner, after }
    }

    async fn timed<T>(&self, op: impl FnOnce() -> String, fut: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.after, fut).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                op: op(),
                after: self.after,
            }),
        }
    }
}

#[async_trait]
impl BagStore for TimeoutStore {
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
    ) -> Result<Receipt> {
        self.timed(
            || format!("append to {log}/{}", bucket.path()),
            self.inner.append(log, bucket, writer_file, sequence, record),
        )
        .await
    }

    async fn closing_started(&self, log: &str, bucket: Bucket) -> Result<bool> {
        self.timed(
            || format!("look for a close of {log}/{}", bucket.path()),
            self.inner.closing_started(log, bucket),
        )
        .await
    }

    async fn close(&self, log: &str, bucket: Bucket) -> Result<Listing> {
        self.timed(
            || format!("close {log}/{}", bucket.path()),
            self.inner.close(log, bucket),
        )
        .await
    }

    /// Bounded by the timeout once per bag: the bags are closed in one
    /// call, but each is a close's worth of work.
    async fn close_all(&self, log: &str, buckets: &[Bucket]) -> Result<Vec<Listing>> {
        let n = u32::try_from(buckets.len()).unwrap_or(u32::MAX).max(1);
        let after = self.after.saturating_mul(n);
        match tokio::time::timeout(after, self.inner.close_all(log, buckets)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                op: format!("close {} bags of {log}", buckets.len()),
                after,
            }),
        }
    }

    async fn state(&self, log: &str, bucket: Bucket) -> Result<BagState> {
        self.timed(
            || format!("state of {log}/{}", bucket.path()),
            self.inner.state(log, bucket),
        )
        .await
    }

    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> Result<Bytes> {
        self.timed(
            || format!("read {log}/{}/{}", bucket.path(), item.name),
            self.inner.read_item(log, bucket, item, limit),
        )
        .await
    }

    async fn list_level(&self, log: &str, parts: &[String]) -> Result<Vec<String>> {
        self.timed(
            || format!("list {log}/{}", parts.join("/")),
            self.inner.list_level(log, parts),
        )
        .await
    }

    async fn log_start(&self, log: &str) -> Result<Option<Bucket>> {
        self.timed(
            || format!("list the start marks of {log}"),
            self.inner.log_start(log),
        )
        .await
    }

    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> Result<()> {
        self.timed(
            || format!("mark the start of {log} at {bucket}"),
            self.inner.mark_log_start(log, bucket),
        )
        .await
    }

    async fn put_first(&self, log: &str, name: &str, body: Bytes) -> Result<Option<Bytes>> {
        self.timed(
            || format!("create {log}/{name}"),
            self.inner.put_first(log, name, body),
        )
        .await
    }

    async fn get_named(&self, log: &str, name: &str, max: u64) -> Result<Option<Bytes>> {
        self.timed(
            || format!("read {log}/{name}"),
            self.inner.get_named(log, name, max),
        )
        .await
    }

    async fn remove_named(&self, log: &str, name: &str) -> Result<()> {
        self.timed(
            || format!("remove {log}/{name}"),
            self.inner.remove_named(log, name),
        )
        .await
    }

    async fn remove_bag(&self, log: &str, bucket: Bucket) -> Result<()> {
        self.timed(
            || format!("remove {log}/{}", bucket.path()),
            self.inner.remove_bag(log, bucket),
        )
        .await
    }

    async fn list_named(&self, log: &str, dir: &str) -> Result<Vec<String>> {
        self.timed(|| format!("list {log}/{dir}"), self.inner.list_named(log, dir))
            .await
    }
}
