//! One scriptable in-memory store, for tests and the deterministic
//! simulation (feature `testing`): the *real* store code over memory, and
//! a script that may delay or fail any call.
//!
//! * [`MemFs`]: the [`FsOps`] a [`DirectoryStore`] runs over, in memory,
//!   with a POSIX file system's semantics as the directory store sees them
//!   (hard links share one file, `O_CREAT|O_EXCL`, `link` refusing an
//!   existing name, `rmdir` only of an empty directory, an append through
//!   an open file reaching that file even once unlinked, modes kept but
//!   not enforced, as for root). So the directory store's own naming
//!   holds: a writer's data file `<stem>.<gen>.log` is appended to across
//!   its batches, and re-created at offset 0 once retention removed it.
//! * [`memory_directory`] and [`memory_s3`]: the directory store over a
//!   [`MemFs`], and the object store over `object_store`'s `InMemory`
//!   (create-only PUTs, ETags, one object per batch named by its
//!   sequence): each store's semantics, each by its own code.
//! * [`Scripted`]: any store, each call first asked of a [`Script`]: how
//!   long to stall before it, whether it fails (before taking effect, or
//!   after, as a timed-out call that may have landed), how long to stall
//!   after it; and each call and its outcome told to the script, which
//!   keeps the history. On tokio's paused clock the stalls are simulated
//!   time, so a seeded script makes one reproducible interleaving.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::store::directory::DirectoryStore;
use crate::store::fsops::{AppendFile, DirEntry, FileStat, FsOps};
use crate::store::object::ObjectBagStore;
use crate::{BagState, BagStore, Bucket, Error, ListedItem, Listing, Receipt, Result};

/// One file: shared by every name linked to it, and by open appenders.
#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    mode: u32,
}

#[derive(Debug)]
enum Node {
    Dir { mode: u32 },
    File(Arc<Mutex<Inode>>),
}

/// An in-memory file tree with the semantics [`FsOps`] promises; see the
/// module docs.
#[derive(Debug, Default)]
pub struct MemFs {
    /// Every directory and file by its path ("" is the root, always there).
    nodes: Mutex<BTreeMap<String, Node>>,
}

fn not_found(path: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{path}: no such file or directory"),
    )
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

impl MemFs {
    /// An empty tree.
    pub fn new() -> Self {
        MemFs::default()
    }

    fn is_dir(nodes: &BTreeMap<String, Node>, dir: &str) -> bool {
        dir.is_empty() || matches!(nodes.get(dir), Some(Node::Dir { .. }))
    }

    fn parent_must_exist(nodes: &BTreeMap<String, Node>, path: &str) -> io::Result<()> {
        match Self::is_dir(nodes, parent(path)) {
            true => Ok(()),
            false => Err(not_found(parent(path))),
        }
    }

    fn file(nodes: &BTreeMap<String, Node>, path: &str) -> io::Result<Arc<Mutex<Inode>>> {
        match nodes.get(path) {
            Some(Node::File(f)) => Ok(Arc::clone(f)),
            Some(Node::Dir { .. }) => Err(crate::store::fsops::not_plain("a directory, not a regular file")),
            None => Err(not_found(path)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Node>> {
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct MemAppend(Arc<Mutex<Inode>>);

#[async_trait]
impl AppendFile for MemAppend {
    async fn append_and_close(self: Box<Self>, data: Bytes, _sync: bool) -> io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .data
            .extend_from_slice(&data);
        Ok(())
    }
}

#[async_trait]
impl FsOps for MemFs {
    fn describe(&self) -> String {
        "memory://".into()
    }

    async fn list_dir(&self, dir: &str) -> io::Result<Vec<DirEntry>> {
        let nodes = self.lock();
        if !Self::is_dir(&nodes, dir) {
            return Err(not_found(dir));
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        Ok(nodes
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| !k.is_empty() && !k[prefix.len()..].contains('/'))
            .map(|(k, n)| DirEntry {
                name: k[prefix.len()..].to_owned(),
                is_dir: matches!(n, Node::Dir { .. }),
                is_link: false,
            })
            .collect())
    }

    async fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        let mut nodes = self.lock();
        let mut at = String::new();
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            match nodes.get(&at) {
                Some(Node::Dir { .. }) => {}
                Some(Node::File(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{at}: a file"),
                    ));
                }
                None => {
                    nodes.insert(at.clone(), Node::Dir { mode: 0o755 });
                }
            }
        }
        Ok(())
    }

    async fn create_exclusive(&self, path: &str, contents: &[u8], _sync: bool) -> io::Result<bool> {
        let mut nodes = self.lock();
        Self::parent_must_exist(&nodes, path)?;
        if nodes.contains_key(path) {
            return Ok(false);
        }
        let inode = Inode {
            data: contents.to_vec(),
            mode: 0o644,
        };
        nodes.insert(path.to_owned(), Node::File(Arc::new(Mutex::new(inode))));
        Ok(true)
    }

    async fn link(&self, from: &str, to: &str) -> io::Result<bool> {
        let mut nodes = self.lock();
        let file = Self::file(&nodes, from)?;
        Self::parent_must_exist(&nodes, to)?;
        if nodes.contains_key(to) {
            return Ok(false);
        }
        nodes.insert(to.to_owned(), Node::File(file));
        Ok(true)
    }

    async fn open_append(&self, path: &str) -> io::Result<(Box<dyn AppendFile>, FileStat)> {
        let mut nodes = self.lock();
        Self::parent_must_exist(&nodes, path)?;
        let file = match nodes.get(path) {
            Some(_) => Self::file(&nodes, path)?,
            None => {
                let f = Arc::new(Mutex::new(Inode {
                    data: Vec::new(),
                    mode: 0o644,
                }));
                nodes.insert(path.to_owned(), Node::File(Arc::clone(&f)));
                f
            }
        };
        let st = {
            let i = file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            FileStat {
                len: i.data.len() as u64,
                mode: i.mode,
                is_dir: false,
            }
        };
        Ok((Box::new(MemAppend(file)), st))
    }

    async fn stat(&self, path: &str) -> io::Result<FileStat> {
        let nodes = self.lock();
        match nodes.get(path) {
            Some(Node::Dir { mode }) => Ok(FileStat {
                len: 0,
                mode: *mode,
                is_dir: true,
            }),
            Some(Node::File(f)) => {
                let i = f.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                Ok(FileStat {
                    len: i.data.len() as u64,
                    mode: i.mode,
                    is_dir: false,
                })
            }
            None if path.is_empty() => Ok(FileStat {
                len: 0,
                mode: 0o755,
                is_dir: true,
            }),
            None => Err(not_found(path)),
        }
    }

    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes> {
        let file = Self::file(&self.lock(), path)?;
        let i = file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = limit.map_or(i.data.len(), |l| (l as usize).min(i.data.len()));
        Ok(Bytes::copy_from_slice(&i.data[..n]))
    }

    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()> {
        let mut nodes = self.lock();
        match nodes.get_mut(path) {
            Some(Node::Dir { mode: m }) => *m = mode,
            Some(Node::File(f)) => f.lock().unwrap_or_else(std::sync::PoisonError::into_inner).mode = mode,
            None => return Err(not_found(path)),
        }
        Ok(())
    }

    async fn remove(&self, path: &str) -> io::Result<()> {
        let mut nodes = self.lock();
        match nodes.get(path) {
            Some(Node::File(_)) => {
                nodes.remove(path);
                Ok(())
            }
            Some(Node::Dir { .. }) => Err(io::Error::other(format!("{path}: is a directory"))),
            None => Err(not_found(path)),
        }
    }

    async fn remove_dir(&self, path: &str) -> io::Result<()> {
        let mut nodes = self.lock();
        match nodes.get(path) {
            Some(Node::Dir { .. }) => {
                let prefix = format!("{path}/");
                if nodes
                    .range(prefix.clone()..)
                    .next()
                    .is_some_and(|(k, _)| k.starts_with(&prefix))
                {
                    return Err(io::Error::other(format!("{path}: directory not empty")));
                }
                nodes.remove(path);
                Ok(())
            }
            Some(Node::File(_)) => Err(io::Error::other(format!("{path}: not a directory"))),
            None => Err(not_found(path)),
        }
    }
}

/// The directory store (as on a local disk or NFS) over a fresh [`MemFs`].
pub fn memory_directory() -> DirectoryStore {
    DirectoryStore::new(Arc::new(MemFs::new()), false)
}

/// The S3 store over a fresh in-memory object store (create-only PUTs and
/// `If-Match` honoured, as S3 honours them).
pub fn memory_s3() -> ObjectBagStore {
    ObjectBagStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        "bags",
        "memory-s3://bags".into(),
    )
}

/// A store call, as a [`Script`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The [`BagStore`] method (`append`, `close`, `put_first`, ...).
    pub op: &'static str,
    /// What it is on: the log and bag, or the protocol object's name.
    pub on: String,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op, self.on)
    }
}

/// Where a scripted call fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fail {
    /// It does not fail.
    #[default]
    No,
    /// It times out before reaching the store: no effect.
    Before,
    /// It took effect, and then timed out: the caller cannot tell.
    After,
}

/// What a [`Script`] does with one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Stall the caller this long before the call.
    pub before: Duration,
    /// Whether, and where, it fails ([`Error::Timeout`], as a
    /// [`crate::TimeoutStore`] fails a call that hung).
    pub fail: Fail,
    /// Stall the caller this long after it (before its answer arrives).
    pub after: Duration,
}

/// Decides each call's fate and hears how it went: a test's hooks, or a
/// simulation's seeded scheduler and its history.
pub trait Script: Send + Sync + fmt::Debug {
    /// The fate of `call`, asked as it is made.
    fn plan(&self, call: &Call) -> Plan;
    /// `call` reached (or, failed before, did not reach) the store and
    /// returned `outcome` (short, for people).
    fn done(&self, call: &Call, outcome: &str) {
        let _ = (call, outcome);
    }
}

/// Any store, each call planned by a [`Script`]; see the module docs.
#[derive(Debug)]
pub struct Scripted {
    inner: Arc<dyn BagStore>,
    script: Arc<dyn Script>,
}

impl Scripted {
    /// `inner`, every call run as `script` plans it.
    pub fn new(inner: Arc<dyn BagStore>, script: Arc<dyn Script>) -> Self {
        Scripted { inner, script }
    }

    async fn run<T: fmt::Debug>(
        &self,
        op: &'static str,
        on: String,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let call_id = Call { op, on };
        let plan = self.script.plan(&call_id);
        crate::pace::sleep(plan.before).await;
        let timeout = || Error::Timeout {
            op: call_id.to_string(),
            after: Duration::from_secs(30),
        };
        if plan.fail == Fail::Before {
            self.script.done(&call_id, "timed out (not sent)");
            return Err(timeout());
        }
        let out = call.await;
        let shown = match &out {
            Ok(v) => brief(&format!("{v:?}")),
            Err(e) => format!("error: {}", brief(&e.to_string())),
        };
        crate::pace::sleep(plan.after).await;
        if plan.fail == Fail::After {
            self.script.done(&call_id, &format!("{shown}, then timed out"));
            return Err(timeout());
        }
        self.script.done(&call_id, &shown);
        out
    }
}

/// At most 120 characters of `s`, for a history line.
fn brief(s: &str) -> String {
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[async_trait]
impl BagStore for Scripted {
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
        let on = format!(
            "{log}/{bucket} {writer_file} #{sequence} ({} bytes)",
            record.len()
        );
        self.run(
            "append",
            on,
            self.inner.append(log, bucket, writer_file, sequence, record),
        )
        .await
    }

    async fn closing_started(&self, log: &str, bucket: Bucket) -> Result<bool> {
        self.run(
            "closing_started",
            format!("{log}/{bucket}"),
            self.inner.closing_started(log, bucket),
        )
        .await
    }

    async fn close(&self, log: &str, bucket: Bucket) -> Result<Listing> {
        self.run("close", format!("{log}/{bucket}"), self.inner.close(log, bucket))
            .await
    }

    async fn state(&self, log: &str, bucket: Bucket) -> Result<BagState> {
        self.run("state", format!("{log}/{bucket}"), self.inner.state(log, bucket))
            .await
    }

    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> Result<Bytes> {
        let on = format!("{log}/{bucket} {} limit {limit:?}", item.name);
        self.run("read_item", on, async {
            self.inner
                .read_item(log, bucket, item, limit)
                .await
                .map(|b| Len(b.len(), b))
        })
        .await
        .map(|Len(_, b)| b)
    }

    async fn list_level(&self, log: &str, parts: &[String]) -> Result<Vec<String>> {
        self.run(
            "list_level",
            format!("{log}/{}", parts.join("/")),
            self.inner.list_level(log, parts),
        )
        .await
    }

    async fn log_start(&self, log: &str) -> Result<Option<Bucket>> {
        self.run("log_start", log.to_owned(), self.inner.log_start(log))
            .await
    }

    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> Result<()> {
        self.run(
            "mark_log_start",
            format!("{log} {bucket}"),
            self.inner.mark_log_start(log, bucket),
        )
        .await
    }

    async fn put_first(&self, log: &str, name: &str, body: Bytes) -> Result<Option<Bytes>> {
        let on = format!("{log}/{name} ({} bytes)", body.len());
        self.run("put_first", on, async {
            self.inner
                .put_first(log, name, body)
                .await
                .map(|theirs| theirs.map(|b| Len(b.len(), b)))
        })
        .await
        .map(|theirs| theirs.map(|Len(_, b)| b))
    }

    async fn get_named(&self, log: &str, name: &str, max: u64) -> Result<Option<Bytes>> {
        self.run("get_named", format!("{log}/{name}"), async {
            self.inner
                .get_named(log, name, max)
                .await
                .map(|got| got.map(|b| Len(b.len(), b)))
        })
        .await
        .map(|got| got.map(|Len(_, b)| b))
    }

    async fn remove_named(&self, log: &str, name: &str) -> Result<()> {
        self.run(
            "remove_named",
            format!("{log}/{name}"),
            self.inner.remove_named(log, name),
        )
        .await
    }

    async fn list_named(&self, log: &str, dir: &str) -> Result<Vec<String>> {
        self.run(
            "list_named",
            format!("{log}/{dir}"),
            self.inner.list_named(log, dir),
        )
        .await
    }

    async fn remove_bag(&self, log: &str, bucket: Bucket) -> Result<()> {
        self.run(
            "remove_bag",
            format!("{log}/{bucket}"),
            self.inner.remove_bag(log, bucket),
        )
        .await
    }
}

/// Bytes shown in a history line by their length only.
struct Len(usize, Bytes);

impl fmt::Debug for Len {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directory store's own tests' promise, over memory: a data file
    /// appended twice holds both records; once retention removed the bag,
    /// the same writer file is re-created at offset 0.
    #[tokio::test]
    async fn a_removed_bag_is_re_created_at_offset_zero() {
        let store = memory_directory();
        let b = Bucket::from_secs(1_900_000_005);
        let first = store
            .append("log", b, "w.1.0", 0, Bytes::from_static(b"abcd"))
            .await
            .unwrap();
        let second = store
            .append("log", b, "w.1.0", 1, Bytes::from_static(b"ef"))
            .await
            .unwrap();
        assert_eq!((first.end, second.end, second.item.as_str()), (4, 6, "w.1.0.log"));
        let listing = store.close("log", b).await.unwrap();
        assert_eq!(listing.items.len(), 1);
        assert_eq!(listing.items[0].size, 6);
        assert!(
            store
                .append("log", b, "w.1.0", 2, Bytes::from_static(b"g"))
                .await
                .is_err()
        );
        store.remove_bag("log", b).await.unwrap();
        let again = store
            .append("log", b, "w.1.0", 2, Bytes::from_static(b"g"))
            .await
            .unwrap();
        assert_eq!(again.end, 1, "{again:?}");
    }

    /// One object per batch on the S3 store, named by its sequence.
    #[tokio::test]
    async fn the_s3_store_names_one_object_per_batch() {
        let store = memory_s3();
        let b = Bucket::from_secs(1_900_000_005);
        let r = store
            .append("log", b, "w.1.0", 7, Bytes::from_static(b"abcd"))
            .await
            .unwrap();
        assert_eq!(r.item, format!("w.1.0.{:020}", 7));
        assert_eq!(store.close("log", b).await.unwrap().items.len(), 1);
    }

    #[derive(Debug, Default)]
    struct Failing(Mutex<Vec<String>>);

    impl Script for Failing {
        fn plan(&self, call: &Call) -> Plan {
            Plan {
                fail: if call.op == "append" {
                    Fail::After
                } else {
                    Fail::No
                },
                ..Plan::default()
            }
        }
        fn done(&self, call: &Call, outcome: &str) {
            self.0.lock().unwrap().push(format!("{call} -> {outcome}"));
        }
    }

    /// A call failed after it took effect landed: the caller hears a
    /// timeout, the bag holds the record, the history says both.
    #[tokio::test]
    async fn a_call_that_fails_after_it_landed_is_in_the_store() {
        let script = Arc::new(Failing::default());
        let inner: Arc<dyn BagStore> = Arc::new(memory_directory());
        let store = Scripted::new(Arc::clone(&inner), script.clone());
        let b = Bucket::from_secs(1_900_000_005);
        let err = store
            .append("log", b, "w.1.0", 0, Bytes::from_static(b"abcd"))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert_eq!(inner.close("log", b).await.unwrap().items.len(), 1);
        let history = script.0.lock().unwrap().join("\n");
        assert!(
            history.contains("append log/") && history.contains("then timed out"),
            "{history}"
        );
    }
}
