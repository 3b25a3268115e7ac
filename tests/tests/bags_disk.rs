//! POSIX-only damage: a torn tail, and a full disk (a 1 MiB tmpfs).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::store::fsops::{AppendFile, DirEntry, FileStat, FsOps, StdFs};
use bagel_bags::{self as bag, BagConfig, BagStore, Bucket, Error, ReadOptions, frame};
use bagel_proto::clock::{AssumedExact, ManualClock};
use bagel_tests::{TestLeases, t0};
use bytes::Bytes;

use bagel_tests::writer_at_t0 as writer;

/// Reads all of "log", checking signatures with the test leases' keys.
async fn read_all(store: &dyn BagStore, leases: &TestLeases, clock: &ManualClock) -> bag::ReadReport {
    let opts = ReadOptions::default().with_keys(Some(leases.keys()));
    bag::read(store, "log", &opts, &BagConfig::default(), &AssumedExact(&clock))
        .await
        .unwrap()
}

/// The one data file in a bag directory (its name carries the writer's
/// random instance).
fn data_file(bag: &std::path::Path) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(bag)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_tail_is_reported_in_open_and_closed_bags() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), true));
    let clock = ManualClock::new(t0());
    let leases = TestLeases::default();
    let w = writer(store.clone(), &clock, &leases);
    w.write(Bytes::from("whole")).await.unwrap();
    // A torn append: half of a record at the tail of the data file.
    let b = Bucket::of(t0());
    let path = data_file(&dir.path().join("log").join(b.path()));
    let rec = frame::encode(b"a record that never finished");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&rec[..rec.len() / 2])
        .unwrap();
    let keys = Some(leases.keys());
    let open = bag::read(
        store.as_ref(),
        "log",
        &ReadOptions::default()
            .with_include_open(true)
            .with_keys(keys.clone()),
        &BagConfig::default(),
        &AssumedExact(&clock),
    )
    .await
    .unwrap();
    assert_eq!(open.messages.len(), 1);
    assert_eq!(open.problems.len(), 1);
    assert!(open.problems[0].in_open_bag && open.problems[0].what.contains("incomplete"));
    // Closed with the torn bytes inside the listed size: still one message, and reported.
    clock.advance(Duration::from_secs(5));
    let closed = bag::read(
        store.as_ref(),
        "log",
        &ReadOptions::default().with_keys(keys),
        &BagConfig::default(),
        &AssumedExact(&clock),
    )
    .await
    .unwrap();
    assert_eq!(closed.messages.len(), 1);
    assert_eq!(closed.problems.len(), 1, "{:?}", closed.problems);
    assert!(closed.problems[0].what.contains("torn"), "{:?}", closed.problems);
}

/// Unmounts on drop, also when the test fails.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(
            st.success(),
            "mount -t tmpfs failed: this test needs root (tests run as root)"
        );
        Tmpfs(dir.to_owned())
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_fails_the_write_clearly_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(dir.path(), "1m");
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), true));
    let clock = ManualClock::new(t0());
    let leases = TestLeases::default();
    let w = writer(store.clone(), &clock, &leases);
    let mut acked = BTreeSet::new();
    let mut err = None;
    for i in 0..1000 {
        let batch: Vec<Bytes> = (0..50)
            .map(|j| Bytes::from(format!("{i:04}-{j:03}-{}", "x".repeat(90))))
            .collect();
        match w.write_batch(batch.clone()).await {
            Ok(_) => acked.extend(batch),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
        clock.advance(Duration::from_micros(100));
    }
    let err = err.expect("a 1 MiB file system never filled up");
    assert!(
        matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull),
        "{err:?}"
    );
    assert!(err.to_string().contains("No space left"), "{err}");
    assert!(!acked.is_empty());
    // The operator frees space; the bag is closed and read: every
    // acknowledged message is there, the failed batch is not.
    fs.resize("4m");
    clock.advance(Duration::from_secs(5));
    let r = read_all(store.as_ref(), &leases, &clock).await;
    let got: BTreeSet<Bytes> = r.messages.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(got.len(), r.messages.len());
    assert_eq!(got, acked);
    assert!(r.rejected.is_empty());
    // A torn record of the failed batch may sit inside the listed size; it is reported, not read.
    assert!(
        r.problems.iter().all(|p| p.what.contains("torn")),
        "{:?}",
        r.problems
    );
    drop(fs);
}

/// [`FsOps`] whose next append pauses between `open` and `write` to run a
/// hook: lets a closer run in exactly the window a slow writer leaves.
#[derive(Debug)]
struct PausingFs {
    inner: StdFs,
    hook: std::sync::Mutex<Option<HookCell>>,
}

struct HookCell(bagel_tests::Hook);

impl std::fmt::Debug for HookCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

#[derive(Debug)]
struct PausingFile {
    inner: Box<dyn AppendFile>,
    hook: Option<HookCell>,
}

#[async_trait::async_trait]
impl AppendFile for PausingFile {
    async fn append_and_close(self: Box<Self>, data: Bytes, sync: bool) -> std::io::Result<()> {
        if let Some(HookCell(h)) = self.hook {
            h().await;
        }
        self.inner.append_and_close(data, sync).await
    }
}

#[async_trait::async_trait]
impl FsOps for PausingFs {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn list_dir(&self, dir: &str) -> std::io::Result<Vec<DirEntry>> {
        self.inner.list_dir(dir).await
    }
    async fn create_dir_all(&self, dir: &str) -> std::io::Result<()> {
        self.inner.create_dir_all(dir).await
    }
    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> std::io::Result<bool> {
        self.inner.create_exclusive(path, contents, sync).await
    }
    async fn link(&self, from: &str, to: &str) -> std::io::Result<bool> {
        self.inner.link(from, to).await
    }
    async fn open_append(&self, path: &str) -> std::io::Result<(Box<dyn AppendFile>, FileStat)> {
        let (inner, st) = self.inner.open_append(path).await?;
        let hook = self.hook.lock().unwrap().take();
        Ok((Box::new(PausingFile { inner, hook }), st))
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
    async fn remove_dir(&self, path: &str) -> std::io::Result<()> {
        self.inner.remove_dir(path).await
    }
}

/// The classic late write on a bag of logs: the writer opened its
/// (non-empty, writable) data file, a closer then listed it and took the
/// lock, and only then did the append land. The writer must find that its
/// end offset is past the listed size and not acknowledge the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_landing_past_the_listed_size_is_not_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(PausingFs {
        inner: StdFs::new(dir.path()),
        hook: std::sync::Mutex::new(None),
    });
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::new(fs.clone(), true));
    let closer: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), true));
    let clock = ManualClock::new(t0());
    let leases = TestLeases::default();
    let w = writer(store.clone(), &clock, &leases);
    w.write(Bytes::from("first")).await.unwrap();
    let b = Bucket::of(t0());
    let (c, k) = (clock.clone(), closer.clone());
    *fs.hook.lock().unwrap() = Some(HookCell(Box::new(move || {
        Box::pin(async move {
            c.set(b.close_time(BagConfig::default().grace));
            k.close("log", b).await.unwrap();
        })
    })));
    let err = w.write(Bytes::from("second")).await.unwrap_err();
    assert!(matches!(err, Error::LateRejected { .. }), "{err:?}");
    // The bytes are in the file, past the listed size; no reader sees them.
    let listing = closer.close("log", b).await.unwrap();
    let on_disk = std::fs::metadata(data_file(&dir.path().join("log").join(b.path())))
        .unwrap()
        .len();
    assert!(on_disk > listing.items[0].size);
    let r = read_all(closer.as_ref(), &leases, &clock).await;
    assert_eq!(r.messages.len(), 1);
    assert_eq!(r.messages[0].payload, Bytes::from("first"));
    assert!(r.problems.is_empty() && r.rejected.is_empty());
}
