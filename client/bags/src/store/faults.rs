//! Wrappers for tests: a process "killed" after N storage operations (every
//! later operation fails, as if the process had died between two protocol
//! steps), and a request counter for the S3 store.
//!
//! They wrap the lowest layer ([`FsOps`], [`ObjectStore`]) so the real bag
//! protocol code runs unchanged above them.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

use crate::store::fsops::{AppendFile, DirEntry, FileStat, FsOps};
use crate::{BagState, BagStore, Bucket, ListedItem, Listing, Receipt, Result};

/// Lets `n` operations through, then fails every later one.
#[derive(Clone, Debug)]
pub struct KillSwitch {
    left: Arc<AtomicI64>,
}

impl KillSwitch {
    /// Dies after `n` operations.
    pub fn after(n: i64) -> Self {
        KillSwitch {
            left: Arc::new(AtomicI64::new(n)),
        }
    }

    /// Never dies (a counter only).
    pub fn never() -> Self {
        Self::after(i64::MAX)
    }

    /// Whether the next operation may run; counts it.
    fn pass(&self) -> bool {
        self.left.fetch_sub(1, Ordering::SeqCst) > 0
    }

    /// Whether it has failed an operation: the simulated process is dead.
    pub fn dead(&self) -> bool {
        self.left.load(Ordering::SeqCst) < 0
    }
}

fn killed() -> io::Error {
    io::Error::other("injected fault: process killed before this operation")
}

/// [`FsOps`] that dies after N operations.
#[derive(Debug)]
pub struct FaultyFs {
    inner: Arc<dyn FsOps>,
    kill: KillSwitch,
}

impl FaultyFs {
    /// Pass calls to `inner` until `kill` dies.
    pub fn new(inner: Arc<dyn FsOps>, kill: KillSwitch) -> Self {
        FaultyFs { inner, kill }
    }

    fn check(&self) -> io::Result<()> {
        if self.kill.pass() { Ok(()) } else { Err(killed()) }
    }
}

#[async_trait]
impl FsOps for FaultyFs {
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
    async fn list_dir(&self, dir: &str) -> io::Result<Vec<DirEntry>> {
        self.check()?;
        self.inner.list_dir(dir).await
    }
    async fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        self.check()?;
        self.inner.create_dir_all(dir).await
    }
    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> io::Result<bool> {
        self.check()?;
        self.inner.create_exclusive(path, contents, sync).await
    }
    async fn link(&self, from: &str, to: &str) -> io::Result<bool> {
        self.check()?;
        self.inner.link(from, to).await
    }
    async fn open_append(&self, path: &str) -> io::Result<(Box<dyn AppendFile>, FileStat)> {
        self.check()?;
        self.inner.open_append(path).await
    }
    async fn stat(&self, path: &str) -> io::Result<FileStat> {
        self.check()?;
        self.inner.stat(path).await
    }
    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes> {
        self.check()?;
        self.inner.read(path, limit).await
    }
    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()> {
        self.check()?;
        self.inner.chmod(path, mode).await
    }
    async fn remove(&self, path: &str) -> io::Result<()> {
        self.check()?;
        self.inner.remove(path).await
    }
    async fn remove_dir(&self, path: &str) -> io::Result<()> {
        self.check()?;
        self.inner.remove_dir(path).await
    }
}

/// Request counts seen by a [`TestObjectStore`].
#[derive(Debug, Default)]
pub struct RequestCounts {
    /// PUTs, conditional or not, copies and renames.
    pub puts: AtomicU64,
    /// GETs, whole or ranged.
    pub gets: AtomicU64,
    /// HEADs.
    pub heads: AtomicU64,
    /// LIST calls, with or without a delimiter.
    pub lists: AtomicU64,
    /// DELETEs.
    pub deletes: AtomicU64,
}

impl RequestCounts {
    /// PUTs so far.
    pub fn puts(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }
    /// GETs so far.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }
    /// HEADs so far.
    pub fn heads(&self) -> u64 {
        self.heads.load(Ordering::SeqCst)
    }
    /// LISTs so far.
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::SeqCst)
    }
    /// Starts counting afresh.
    pub fn reset(&self) {
        for c in [&self.puts, &self.gets, &self.heads, &self.lists, &self.deletes] {
            c.store(0, Ordering::SeqCst);
        }
    }
}

/// An [`ObjectStore`] wrapper that counts requests and can die after N.
#[derive(Debug)]
pub struct TestObjectStore {
    inner: Arc<dyn ObjectStore>,
    kill: KillSwitch,
    /// The requests counted so far; clone the `Arc` to read them while it runs.
    pub counts: Arc<RequestCounts>,
}

impl TestObjectStore {
    /// Pass requests to `inner`, counting them, until `kill` dies.
    pub fn new(inner: Arc<dyn ObjectStore>, kill: KillSwitch) -> Self {
        TestObjectStore {
            inner,
            kill,
            counts: Arc::default(),
        }
    }

    fn check(&self, counter: &AtomicU64) -> object_store::Result<()> {
        if !self.kill.pass() {
            return Err(object_store::Error::Generic {
                store: "TestObjectStore",
                source: Box::new(killed()),
            });
        }
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl fmt::Display for TestObjectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "test({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for TestObjectStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check(&self.counts.puts)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check(&self.counts.puts)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let counter = if options.head {
            &self.counts.heads
        } else {
            &self.counts.gets
        };
        self.check(counter)?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.check(&self.counts.gets)?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        if let Err(e) = self.check(&self.counts.deletes) {
            return futures::stream::once(futures::future::ready(Err(e))).boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if let Err(e) = self.check(&self.counts.lists) {
            return futures::stream::once(futures::future::ready(Err(e))).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.check(&self.counts.lists)?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.check(&self.counts.puts)?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        self.check(&self.counts.puts)?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// One append, as an [`AppendsThrough`] store hands it on.
#[derive(Debug)]
pub struct Append {
    /// The log written to.
    pub log: String,
    /// The bag written to.
    pub bucket: Bucket,
    /// The writer's file stem, naming its data file or object.
    pub writer_file: String,
    /// The record's first sequence number.
    pub sequence: u64,
    /// The framed record.
    pub record: Bytes,
}

impl Append {
    /// Does it on `store`.
    pub async fn to(self, store: &dyn BagStore) -> Result<Receipt> {
        store
            .append(
                &self.log,
                self.bucket,
                &self.writer_file,
                self.sequence,
                self.record,
            )
            .await
    }
}

/// What an [`AppendsThrough`] store does with each append.
pub type Through = dyn Fn(Arc<dyn BagStore>, Append) -> BoxFuture<'static, Result<Receipt>> + Send + Sync;

/// A store whose appends go through a function, which may delay them, run
/// something first (a close, the clock moving on), or detach them and
/// report a timeout while they still land; every other call goes straight
/// to the inner store. The one way tests reorder a write against the rest
/// of the protocol.
pub struct AppendsThrough {
    inner: Arc<dyn BagStore>,
    through: Box<Through>,
}

impl fmt::Debug for AppendsThrough {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppendsThrough")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl AppendsThrough {
    /// Send every append to `inner` through `through`, which is handed
    /// the inner store and the append and does it ([`Append::to`]) when it likes.
    pub fn new(
        inner: Arc<dyn BagStore>,
        through: impl Fn(Arc<dyn BagStore>, Append) -> BoxFuture<'static, Result<Receipt>> + Send + Sync + 'static,
    ) -> Self {
        AppendsThrough {
            inner,
            through: Box::new(through),
        }
    }
}

#[async_trait]
impl BagStore for AppendsThrough {
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
        let append = Append {
            log: log.to_owned(),
            bucket,
            writer_file: writer_file.to_owned(),
            sequence,
            record,
        };
        (self.through)(Arc::clone(&self.inner), append).await
    }
    async fn closing_started(&self, log: &str, bucket: Bucket) -> Result<bool> {
        self.inner.closing_started(log, bucket).await
    }
    async fn close(&self, log: &str, bucket: Bucket) -> Result<Listing> {
        self.inner.close(log, bucket).await
    }
    async fn close_all(&self, log: &str, buckets: &[Bucket]) -> Result<Vec<Listing>> {
        self.inner.close_all(log, buckets).await
    }
    async fn state(&self, log: &str, bucket: Bucket) -> Result<BagState> {
        self.inner.state(log, bucket).await
    }
    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> Result<Bytes> {
        self.inner.read_item(log, bucket, item, limit).await
    }
    async fn list_level(&self, log: &str, parts: &[String]) -> Result<Vec<String>> {
        self.inner.list_level(log, parts).await
    }
    async fn log_start(&self, log: &str) -> Result<Option<Bucket>> {
        self.inner.log_start(log).await
    }
    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> Result<()> {
        self.inner.mark_log_start(log, bucket).await
    }
    async fn put_first(&self, log: &str, name: &str, body: Bytes) -> Result<Option<Bytes>> {
        self.inner.put_first(log, name, body).await
    }
    async fn get_named(&self, log: &str, name: &str, max: u64) -> Result<Option<Bytes>> {
        self.inner.get_named(log, name, max).await
    }
    async fn remove_named(&self, log: &str, name: &str) -> Result<()> {
        self.inner.remove_named(log, name).await
    }
    async fn list_named(&self, log: &str, dir: &str) -> Result<Vec<String>> {
        self.inner.list_named(log, dir).await
    }
    async fn remove_bag(&self, log: &str, bucket: Bucket) -> Result<()> {
        self.inner.remove_bag(log, bucket).await
    }
}
