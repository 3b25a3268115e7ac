//! An [`FsOps`] wrapper that counts every call by kind, to measure what the
//! bag protocol costs per write and per close on each backend (see
//! `NFS.md`). It changes nothing else.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;

use crate::store::fsops::{AppendFile, DirEntry, FileStat, FsOps};

/// The kinds of [`FsOps`] call, in the order the protocol tends to use them.
pub const OPS: [&str; 11] = [
    "create_dir_all",
    "open_append",
    "append_and_close",
    "list_dir",
    "create_exclusive",
    "stat",
    "chmod",
    "link",
    "read",
    "remove",
    "remove_dir",
];

/// Call counts, shared between a [`CountingFs`] and whoever reads them.
#[derive(Debug, Default)]
pub struct OpCounts {
    counts: [AtomicU64; OPS.len()],
}

impl OpCounts {
    fn bump(&self, op: &'static str) {
        let i = OPS.iter().position(|o| *o == op).expect("known op");
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, by op name (zeros included).
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        OPS.iter()
            .zip(&self.counts)
            .map(|(op, n)| (*op, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// All calls so far.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|n| n.load(Ordering::Relaxed)).sum()
    }

    /// Sets every count back to zero.
    pub fn reset(&self) {
        for n in &self.counts {
            n.store(0, Ordering::Relaxed);
        }
    }
}

impl fmt::Display for OpCounts {
    /// `op=n` for every op called at least once, in [`OPS`] order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (op, n) in OPS.iter().zip(&self.counts) {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                if !first {
                    f.write_str(" ")?;
                }
                write!(f, "{op}={n}")?;
                first = false;
            }
        }
        Ok(())
    }
}

/// [`FsOps`] that counts the calls it passes on.
#[derive(Debug)]
pub struct CountingFs {
    inner: Arc<dyn FsOps>,
    /// The calls counted so far; clone the `Arc` to read them while it runs.
    pub counts: Arc<OpCounts>,
}

impl CountingFs {
    /// Count the calls passed on to `inner`, from zero.
    pub fn new(inner: Arc<dyn FsOps>) -> Self {
        CountingFs {
            inner,
            counts: Arc::default(),
        }
    }
}

#[async_trait]
impl FsOps for CountingFs {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn list_dir(&self, dir: &str) -> io::Result<Vec<DirEntry>> {
        self.counts.bump("list_dir");
        self.inner.list_dir(dir).await
    }
    async fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        self.counts.bump("create_dir_all");
        self.inner.create_dir_all(dir).await
    }
    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> io::Result<bool> {
        self.counts.bump("create_exclusive");
        self.inner.create_exclusive(path, contents, sync).await
    }
    async fn link(&self, from: &str, to: &str) -> io::Result<bool> {
        self.counts.bump("link");
        self.inner.link(from, to).await
    }
    async fn open_append(&self, path: &str) -> io::Result<(Box<dyn AppendFile>, FileStat)> {
        self.counts.bump("open_append");
        let (file, st) = self.inner.open_append(path).await?;
        let file = CountingAppend {
            inner: file,
            counts: self.counts.clone(),
        };
        Ok((Box::new(file), st))
    }
    async fn stat(&self, path: &str) -> io::Result<FileStat> {
        self.counts.bump("stat");
        self.inner.stat(path).await
    }
    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes> {
        self.counts.bump("read");
        self.inner.read(path, limit).await
    }
    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()> {
        self.counts.bump("chmod");
        self.inner.chmod(path, mode).await
    }
    async fn remove(&self, path: &str) -> io::Result<()> {
        self.counts.bump("remove");
        self.inner.remove(path).await
    }
    async fn remove_dir(&self, path: &str) -> io::Result<()> {
        self.counts.bump("remove_dir");
        self.inner.remove_dir(path).await
    }
}

#[derive(Debug)]
struct CountingAppend {
    inner: Box<dyn AppendFile>,
    counts: Arc<OpCounts>,
}

#[async_trait]
impl AppendFile for CountingAppend {
    async fn append_and_close(self: Box<Self>, data: Bytes, sync: bool) -> io::Result<()> {
        self.counts.bump("append_and_close");
        self.inner.append_and_close(data, sync).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fsops::StdFs;

    #[tokio::test]
    async fn counts_calls() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CountingFs::new(Arc::new(StdFs::new(dir.path())));
        let counts = fs.counts.clone();
        fs.create_dir_all("a").await.unwrap();
        let (f, st) = fs.open_append("a/x.log").await.unwrap();
        assert_eq!(st.len, 0);
        f.append_and_close(Bytes::from_static(b"hi"), false)
            .await
            .unwrap();
        assert!(fs.create_exclusive("a/p", b"", false).await.unwrap());
        assert!(!fs.create_exclusive("a/p", b"", false).await.unwrap());
        assert_eq!(fs.list_dir("a").await.unwrap().len(), 2);
        assert_eq!(
            counts.to_string(),
            "create_dir_all=1 open_append=1 append_and_close=1 list_dir=1 create_exclusive=2"
        );
        assert_eq!(counts.total(), 6);
        assert_eq!(counts.snapshot()["link"], 0);
        counts.reset();
        assert_eq!(counts.total(), 0);
    }
}
