//! A writer whose clock (and the time source vouching for it) is 30 s behind
//! true time, while a reader on true time has already closed the bags it
//! writes into: every write it acknowledges is in the reader's listing, on
//! the directory store and on S3. The writer's clock cannot be trusted to
//! say a bag is far from closing, so the late ones are refused
//! (`LateRejected`, or `BagClosed` where the append itself saw the close),
//! never acknowledged and lost.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::store::fsops::{AppendFile, DirEntry, FileStat, FsOps, StdFs};
use bagel_bags::{self as bag, BagConfig, BagStore, Bucket, Error, ReadOptions, Writer};
use bagel_proto::clock::{AssumedExact, Clock as _, ManualClock};
use bagel_tests::{Backend, TestLeases, payloads, t0};
use bytes::Bytes;

/// How far the writer's clock is behind true time.
const SKEW: Duration = Duration::from_secs(30);

use bagel_tests::writer_at_t0 as writer;

/// What a reader on true time reads of the whole log (closing and sealing
/// whatever is past due on its clock).
async fn read_all(store: &dyn BagStore, leases: &TestLeases, truth: &ManualClock) -> BTreeSet<String> {
    let opts = ReadOptions::default().with_keys(Some(leases.keys()));
    let report = bag::read(store, "log", &opts, &BagConfig::default(), &AssumedExact(truth))
        .await
        .unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    payloads(&report).into_iter().collect()
}

/// Writes `payload`; its text when acknowledged. A refusal must say the
/// bag was closed without it.
async fn write(w: &Writer, payload: &str) -> Option<String> {
    match w.write(Bytes::from(payload.to_owned())).await {
        Ok(_) => Some(payload.to_owned()),
        Err(e @ (Error::LateRejected { .. } | Error::BagClosed { .. })) => {
            println!("{payload}: refused: {e}");
            None
        }
        Err(e) => panic!("{payload}: {e:?}"),
    }
}

/// The writer writes one message; a reader on true time reads (closing its
/// bag and sealing its minute, whose close time true time has passed); then
/// the writer, its clock still far from those close times, writes into the
/// closed bag and into a second of the sealed minute that held no bag.
/// Every acknowledged message must be one the reader reads.
async fn acknowledged_writes_are_read(store: Arc<dyn BagStore>) {
    let leases = TestLeases::default();
    let clock = ManualClock::new(t0());
    let truth = ManualClock::new(t0().saturating_add(SKEW));
    let w = writer(store.clone(), &clock, &leases);
    let mut acked = BTreeSet::new();
    acked.extend(write(&w, "before the close").await);
    assert_eq!(acked.len(), 1, "the first write is on time");
    assert_eq!(read_all(store.as_ref(), &leases, &truth).await, acked);

    // Into the bag the reader closed.
    clock.advance(Duration::from_millis(100));
    assert_eq!(Bucket::of(clock.now()), Bucket::of(t0()));
    acked.extend(write(&w, "into the closed bag").await);
    // Into a second the reader's seal of the minute closed empty.
    clock.advance(Duration::from_secs(2));
    assert_ne!(Bucket::of(clock.now()), Bucket::of(t0()));
    acked.extend(write(&w, "into a sealed-out second").await);

    assert_eq!(
        read_all(store.as_ref(), &leases, &truth).await,
        acked,
        "every acknowledged write is read, and only those"
    );
    assert_eq!(acked.len(), 1, "both late writes are refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_writer_behind_true_time_never_loses_an_acknowledged_write() {
    acknowledged_writes_are_read(Backend::s3().store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_a_writer_behind_true_time_never_loses_an_acknowledged_write() {
    acknowledged_writes_are_read(Backend::posix().store().await).await;
}

/// File operations that close the bag (as a closer on true time would) in
/// the instant between a writer opening its data file and appending to it:
/// the directory store's own refusal (the file's mode, `prelock`) is
/// checked at open, so it cannot see a close that starts after.
#[derive(Debug)]
struct CloseBeforeAppend {
    inner: Arc<StdFs>,
    /// The bag to close, once.
    close: std::sync::Mutex<Option<Bucket>>,
}

#[derive(Debug)]
struct ClosingFile {
    inner: Box<dyn AppendFile>,
    fs: Arc<StdFs>,
    bucket: Option<Bucket>,
}

#[async_trait::async_trait]
impl AppendFile for ClosingFile {
    async fn append_and_close(self: Box<Self>, data: Bytes, sync: bool) -> std::io::Result<()> {
        if let Some(bucket) = self.bucket {
            let closer = DirectoryStore::new(self.fs.clone(), false);
            closer.close("log", bucket).await.unwrap();
        }
        self.inner.append_and_close(data, sync).await
    }
}

#[async_trait::async_trait]
impl FsOps for CloseBeforeAppend {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn create_dir_all(&self, path: &str) -> std::io::Result<()> {
        self.inner.create_dir_all(path).await
    }
    async fn list_dir(&self, path: &str) -> std::io::Result<Vec<DirEntry>> {
        self.inner.list_dir(path).await
    }
    async fn open_append(&self, path: &str) -> std::io::Result<(Box<dyn AppendFile>, FileStat)> {
        let (file, st) = self.inner.open_append(path).await?;
        let bucket = self.close.lock().unwrap().take();
        let file = ClosingFile {
            inner: file,
            fs: self.inner.clone(),
            bucket,
        };
        Ok((Box::new(file), st))
    }
    async fn stat(&self, path: &str) -> std::io::Result<FileStat> {
        self.inner.stat(path).await
    }
    async fn read(&self, path: &str, limit: Option<u64>) -> std::io::Result<Bytes> {
        self.inner.read(path, limit).await
    }
    async fn chmod(&self, path: &str, mode: u32) -> std::io::Result<()> {
        self.inner.chmod(path, mode).await
    }
    async fn remove(&self, path: &str) -> std::io::Result<()> {
        self.inner.remove(path).await
    }
    async fn create_exclusive(&self, path: &str, data: &[u8], sync: bool) -> std::io::Result<bool> {
        self.inner.create_exclusive(path, data, sync).await
    }
    async fn link(&self, from: &str, to: &str) -> std::io::Result<bool> {
        self.inner.link(from, to).await
    }
    async fn remove_dir(&self, path: &str) -> std::io::Result<()> {
        self.inner.remove_dir(path).await
    }
}

/// A close that starts after the directory store's append checked the bag
/// but before its bytes land lists the data file without them: the writer
/// must look for the close after its append, whatever its clock says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_a_close_between_open_and_append_rejects_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(CloseBeforeAppend {
        inner: Arc::new(StdFs::new(dir.path())),
        close: std::sync::Mutex::new(None),
    });
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::new(fs.clone(), false));
    let leases = TestLeases::default();
    let clock = ManualClock::new(t0());
    let truth = ManualClock::new(t0().saturating_add(SKEW));
    let w = writer(store.clone(), &clock, &leases);
    let mut acked = BTreeSet::new();
    acked.extend(write(&w, "before the close").await);
    assert_eq!(acked.len(), 1, "the first write is on time");

    *fs.close.lock().unwrap() = Some(Bucket::of(t0()));
    clock.advance(Duration::from_millis(100));
    acked.extend(write(&w, "appended after the close listed the file").await);

    assert_eq!(
        read_all(store.as_ref(), &leases, &truth).await,
        acked,
        "every acknowledged write is read, and only those"
    );
    assert_eq!(acked.len(), 1, "the late write is refused");
}
