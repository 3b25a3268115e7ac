//! A closable bag of single-writer logs on a directory: local, mounted over
//! NFS, or reached through the userspace NFS client (any [`FsOps`]).
//!
//! ```text
//! <root>/<log>/2026/11/21/05/51/52/   one directory per bag (UTC second)
//!     <writer>.<instance>.<gen>.log   one append-only data file per writer
//!     prelock                         "a close has started"
//!     lock                            the bag: `name size` per data file
//! <root>/<log>/_start/<unix seconds>  writers' start marks (see the writer)
//! <root>/<log>/_seal/<minute start>    minute seals (see `crate::seal`), and
//!                                     `.removed` tombstones (`crate::tombstone`)
//! ```
//!
//! Close (any process, concurrently, every step idempotent):
//! 1. ensure `prelock` exists (`O_CREAT|O_EXCL`; EEXIST is fine);
//! 2. chmod every data file read-only;
//! 3. write a private `.lock.<random>` listing every data file and its size;
//! 4. `link(2)` it to `lock` (EEXIST: someone closed first; use theirs);
//! 5. chmod the directory read-only.
//!
//! Write: ensure the directory; open or create the data file; refuse if its
//! mode is read-only, or if it is empty and `prelock`/`lock` exist; append
//! the framed batch; close. The [`Writer`](crate::Writer) then does the
//! late-write check.
//!
//! Tests run as root, which ignores modes, so nothing here relies on
//! `EACCES`: read-only-ness is read from the mode bits and from the presence
//! of `prelock`/`lock`.

use std::io;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::store::fsops::{FsOps, StdFs};
use crate::store::{START_DIR, earliest_start};
use crate::{BagState, BagStore, Bucket, Error, ListedItem, Listing, Receipt, Result};

/// The file whose existence says a close of the bag has started.
pub const PRELOCK: &str = "prelock";
/// The file listing what the closed bag holds ([`Listing`]).
pub const LOCK: &str = "lock";
/// Data files end with this; everything else in a bag directory is ignored.
pub const DATA_SUFFIX: &str = ".log";

/// A lock is one short line per writer file of one second: this many bytes
/// is ~80,000 writers. A bigger `lock` is not one a closer wrote, and is not
/// read whole.
pub const MAX_LOCK_BYTES: u64 = 8 << 20;
/// The longest file name most file systems store (`NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;

const READ_ONLY_FILE: u32 = 0o444;
const READ_ONLY_DIR: u32 = 0o555;

/// The POSIX bag store over some [`FsOps`].
#[derive(Clone, Debug)]
pub struct DirectoryStore {
    fs: Arc<dyn FsOps>,
    sync: bool,
}

impl DirectoryStore {
    /// A store on `fs`'s root; `sync` fsyncs data and lock files before a
    /// write or close is acknowledged ([`crate::BagConfig::sync`]).
    pub fn new(fs: Arc<dyn FsOps>, sync: bool) -> Self {
        DirectoryStore { fs, sync }
    }

    /// On a local (or kernel-mounted) directory through `std::fs`.
    pub fn local(root: impl Into<std::path::PathBuf>, sync: bool) -> Self {
        Self::new(Arc::new(StdFs::new(root)), sync)
    }

    fn dir(log: &str, bucket: Bucket) -> String {
        format!("{log}/{}", bucket.path())
    }

    async fn read_lock(&self, log: &str, bucket: Bucket, dir: &str) -> Result<Listing> {
        let path = format!("{dir}/{LOCK}");
        let corrupt = |reason: String| Error::CorruptLock {
            log: log.to_owned(),
            bucket,
            reason,
        };
        let bytes = match self.fs.read(&path, Some(MAX_LOCK_BYTES + 1)).await {
            Ok(b) => b,
            Err(e) if crate::store::fsops::is_not_plain(&e) => return Err(corrupt(format!("`lock` is {e}"))),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        if bytes.len() as u64 > MAX_LOCK_BYTES {
            return Err(corrupt(format!(
                "over {MAX_LOCK_BYTES} bytes: not a lock a closer wrote"
            )));
        }
        Listing::decode(&bytes).map_err(corrupt)
    }

    async fn list(&self, dir: &str) -> Result<Option<Vec<crate::store::fsops::DirEntry>>> {
        match self.fs.list_dir(dir).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("list", dir, e)),
        }
    }

    async fn data_files_with_sizes(
        &self,
        dir: &str,
        entries: &[crate::store::fsops::DirEntry],
    ) -> Result<Vec<ListedItem>> {
        let mut items = Vec::new();
        for e in entries.iter().filter(|e| is_data_file(e)) {
            let path = format!("{dir}/{}", e.name);
            let st = self
                .fs
                .stat(&path)
                .await
                .map_err(|err| Error::io("stat", &path, err))?;
            items.push(ListedItem {
                name: e.name.clone(),
                size: st.len,
                etag: None,
            });
        }
        items.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(items)
    }

    async fn append_inner(
        &self,
        log: &str,
        bucket: Bucket,
        writer_file: &str,
        record: Bytes,
    ) -> Result<Receipt> {
        let closed = || Error::BagClosed {
            log: log.to_owned(),
            bucket,
        };
        let dir = Self::dir(log, bucket);
        self.fs
            .create_dir_all(&dir)
            .await
            .map_err(|e| Error::io("mkdir", &dir, e))?;
        let name = format!("{writer_file}{DATA_SUFFIX}");
        let path = format!("{dir}/{name}");
        let (file, st) = match self.fs.open_append(&path).await {
            Ok(x) => x,
            // Only a non-root writer sees this; root ignores modes.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(closed()),
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        if st.read_only() {
            return Err(closed());
        }
        if st.len == 0 {
            let entries = self.list(&dir).await?.unwrap_or_default();
            if entries.iter().any(|e| e.name == PRELOCK || e.name == LOCK) {
                return Err(closed());
            }
        }
        let end = st.len + record.len() as u64;
        file.append_and_close(record, self.sync)
            .await
            .map_err(|e| Error::io("append", &path, e))?;
        Ok(Receipt {
            item: name,
            end,
            etag: None,
        })
    }

    async fn close_inner(&self, log: &str, bucket: Bucket) -> Result<Listing> {
        let dir = Self::dir(log, bucket);
        // A bag nobody wrote to is created so it can be closed: a late
        // writer must find it closed, not missing.
        self.fs
            .create_dir_all(&dir)
            .await
            .map_err(|e| Error::io("mkdir", &dir, e))?;
        let entries = self.list(&dir).await?.unwrap_or_default();
        if entries.iter().any(|e| e.name == LOCK) {
            let listing = self.read_lock(log, bucket, &dir).await?;
            self.mark_dir_read_only(&dir).await?;
            return Ok(listing);
        }
        // 1. prelock.
        let prelock = format!("{dir}/{PRELOCK}");
        self.fs
            .create_exclusive(&prelock, b"", self.sync)
            .await
            .map_err(|e| Error::io("create", &prelock, e))?;
        // 2. data files read-only (listing again: files created before the
        //    prelock must all be seen).
        let entries = self.list(&dir).await?.unwrap_or_default();
        for e in entries.iter().filter(|e| is_data_file(e)) {
            let path = format!("{dir}/{}", e.name);
            self.fs
                .chmod(&path, READ_ONLY_FILE)
                .await
                .map_err(|err| Error::io("chmod", &path, err))?;
        }
        // 3. a private lock file with every data file and its size.
        let listing = Listing {
            items: self.data_files_with_sizes(&dir, &entries).await?,
        };
        let tmp = format!("{dir}/.lock.{:016x}", crate::pace::random_u64());
        self.fs
            .create_exclusive(&tmp, &listing.encode(), self.sync)
            .await
            .map_err(|e| Error::io("create", &tmp, e))?;
        // 4. link it into place; EEXIST means another closer won.
        let lock = format!("{dir}/{LOCK}");
        let linked = self.fs.link(&tmp, &lock).await;
        let _ = self.fs.remove(&tmp).await;
        let linked = linked.map_err(|e| Error::io("link", &lock, e))?;
        let listing = if linked {
            listing
        } else {
            self.read_lock(log, bucket, &dir).await?
        };
        // 5. directory read-only.
        self.mark_dir_read_only(&dir).await?;
        Ok(listing)
    }

    async fn mark_dir_read_only(&self, dir: &str) -> Result<()> {
        let st = self.fs.stat(dir).await.map_err(|e| Error::io("stat", dir, e))?;
        if !st.read_only() {
            self.fs
                .chmod(dir, READ_ONLY_DIR)
                .await
                .map_err(|e| Error::io("chmod", dir, e))?;
        }
        Ok(())
    }
}

/// Why `name` cannot be one of a bag's data files, if it cannot: the
/// writer's naming rule (`<writer id>.<instance>.<generation>.log`, from
/// `[A-Za-z0-9._-]`, not starting with `.` or `_`). So a lock can only name
/// files inside its own bag directory: no separator, no `..`, no absolute
/// path, nothing of the protocol's own (`lock`, `prelock`, `.lock.*`).
pub fn data_file_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Some("not 1 to 255 bytes");
    }
    if name.starts_with('.') || name.starts_with('_') {
        return Some("starts with '.' or '_'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Some("not a plain file name: only [A-Za-z0-9._-] (no '/')");
    }
    if !name.ends_with(DATA_SUFFIX) || name.len() == DATA_SUFFIX.len() {
        return Some("not a data file name (<writer>.<instance>.<generation>.log)");
    }
    None
}

fn is_data_file(e: &crate::store::fsops::DirEntry) -> bool {
    !e.is_dir && e.name.ends_with(DATA_SUFFIX) && !e.name.starts_with('.')
}

#[async_trait]
impl BagStore for DirectoryStore {
    fn describe(&self) -> String {
        self.fs.describe()
    }

    async fn append(
        &self,
        log: &str,
        bucket: Bucket,
        writer_file: &str,
        _sequence: u64,
        record: Bytes,
    ) -> Result<Receipt> {
        self.append_inner(log, bucket, writer_file, record).await
    }

    async fn closing_started(&self, log: &str, bucket: Bucket) -> Result<bool> {
        let dir = Self::dir(log, bucket);
        let entries = self.list(&dir).await?.unwrap_or_default();
        Ok(entries.iter().any(|e| e.name == PRELOCK || e.name == LOCK))
    }

    async fn close(&self, log: &str, bucket: Bucket) -> Result<Listing> {
        self.close_inner(log, bucket).await
    }

    async fn state(&self, log: &str, bucket: Bucket) -> Result<BagState> {
        let dir = Self::dir(log, bucket);
        let entries = match self.fs.list_dir(&dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BagState::Open(Vec::new())),
            // A link in place of the bag directory (or above it): the bag
            // is refused by name, nothing under the link is read.
            Err(e) if crate::store::fsops::is_not_plain(&e) => {
                return Err(Error::CorruptLock {
                    log: log.to_owned(),
                    bucket,
                    reason: format!("the bag directory {dir} is {e}"),
                });
            }
            Err(e) => return Err(Error::io("list", &dir, e)),
        };
        if entries.iter().any(|e| e.name == LOCK) {
            return Ok(BagState::Closed(self.read_lock(log, bucket, &dir).await?));
        }
        Ok(BagState::Open(self.data_files_with_sizes(&dir, &entries).await?))
    }

    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> Result<Bytes> {
        let refused = |reason: String| Error::ItemRefused {
            log: log.to_owned(),
            bucket,
            item: item.name.clone(),
            reason,
        };
        if let Some(why) = data_file_name_problem(&item.name) {
            return Err(refused(why.to_owned()));
        }
        let path = format!("{}/{}", Self::dir(log, bucket), item.name);
        match self.fs.read(&path, limit).await {
            Ok(b) => Ok(b),
            Err(e) if crate::store::fsops::is_not_plain(&e) => Err(refused(e.to_string())),
            Err(e) => Err(Error::io("read", &path, e)),
        }
    }

    async fn log_start(&self, log: &str) -> Result<Option<Bucket>> {
        let dir = format!("{log}/{START_DIR}");
        let entries = self.list(&dir).await?.unwrap_or_default();
        Ok(earliest_start(entries.iter().map(|e| e.name.as_str())))
    }

    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> Result<()> {
        let dir = format!("{log}/{START_DIR}");
        let path = format!("{dir}/{}", bucket.secs());
        self.fs
            .create_dir_all(&dir)
            .await
            .map_err(|e| Error::io("mkdir", &dir, e))?;
        self.fs
            .create_exclusive(&path, b"", self.sync)
            .await
            .map_err(|e| Error::io("create", &path, e))?;
        Ok(())
    }

    async fn put_first(&self, log: &str, name: &str, body: Bytes) -> Result<Option<Bytes>> {
        let path = format!("{log}/{name}");
        let dir = path.rsplit_once('/').map_or(log, |(d, _)| d).to_owned();
        self.fs
            .create_dir_all(&dir)
            .await
            .map_err(|e| Error::io("mkdir", &dir, e))?;
        // Written whole under a private name, then linked into place: no
        // reader ever sees a part of it, and EEXIST means another was first.
        let tmp = format!("{dir}/.tmp.{:016x}", crate::pace::random_u64());
        self.fs
            .create_exclusive(&tmp, &body, self.sync)
            .await
            .map_err(|e| Error::io("create", &tmp, e))?;
        let linked = self.fs.link(&tmp, &path).await;
        let _ = self.fs.remove(&tmp).await;
        if linked.map_err(|e| Error::io("link", &path, e))? {
            return Ok(None);
        }
        let max = (body.len() as u64).max(MAX_LOCK_BYTES);
        self.get_named(log, name, max).await?.map(Some).ok_or_else(|| {
            Error::io(
                "read",
                &path,
                io::Error::other("it existed a moment ago and is gone"),
            )
        })
    }

    async fn get_named(&self, log: &str, name: &str, max: u64) -> Result<Option<Bytes>> {
        let path = format!("{log}/{name}");
        match self.fs.read(&path, Some(max.saturating_add(1))).await {
            Ok(b) if b.len() as u64 > max => Err(Error::invalid(
                "protocol object",
                path,
                format!("over {max} bytes: not one the protocol wrote"),
            )),
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if crate::store::fsops::is_not_plain(&e) => {
                Err(Error::invalid("protocol object", path, e.to_string()))
            }
            Err(e) => Err(Error::io("read", &path, e)),
        }
    }

    async fn remove_named(&self, log: &str, name: &str) -> Result<()> {
        let path = format!("{log}/{name}");
        match self.fs.remove(&path).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::io("remove", &path, e)),
            _ => Ok(()),
        }
    }

    async fn remove_bag(&self, log: &str, bucket: Bucket) -> Result<()> {
        let dir = Self::dir(log, bucket);
        let Some(entries) = self.list(&dir).await? else {
            return Ok(());
        };
        // Writable again, so that a process that is not root may unlink.
        self.fs
            .chmod(&dir, 0o755)
            .await
            .map_err(|e| Error::io("chmod", &dir, e))?;
        let mut files: Vec<&str> = entries
            .iter()
            .filter(|e| !e.is_dir)
            .map(|e| e.name.as_str())
            .collect();
        // The lock last: a bag half removed still reads as closed.
        files.sort_by_key(|n| (*n == LOCK, *n == PRELOCK));
        for name in files {
            let path = format!("{dir}/{name}");
            match self.fs.remove(&path).await {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(Error::io("remove", &path, e)),
                _ => {}
            }
        }
        match self.fs.remove_dir(&dir).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(Error::io("rmdir", &dir, e)),
            _ => {}
        }
        // The minute's directory too, once it is empty (best effort: a
        // bag of it may still be there, or be written).
        if let Some((minute, _)) = dir.rsplit_once('/') {
            let _ = self.fs.remove_dir(minute).await;
        }
        Ok(())
    }

    async fn list_named(&self, log: &str, dir: &str) -> Result<Vec<String>> {
        let dir = format!("{log}/{dir}");
        Ok(self
            .list(&dir)
            .await?
            .unwrap_or_default()
            .into_iter()
            .filter(|e| !e.is_dir && !e.name.starts_with('.'))
            .map(|e| e.name)
            .collect())
    }

    async fn list_level(&self, log: &str, parts: &[String]) -> Result<Vec<String>> {
        let dir = if parts.is_empty() {
            log.to_owned()
        } else {
            format!("{log}/{}", parts.join("/"))
        };
        Ok(self
            .list(&dir)
            .await?
            .unwrap_or_default()
            .into_iter()
            // A link in place of a directory is kept: opening what is
            // under it fails by name (links are not followed), so the
            // bag is reported rather than silently left out.
            .filter(|e| e.is_dir || e.is_link)
            .map(|e| e.name)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::data_file_name_problem;

    #[test]
    fn only_data_file_names_of_the_bag_itself_pass() {
        assert_eq!(data_file_name_problem("host-1.pid-7.0badcafe.0.log"), None);
        for bad in [
            "../../../outside/evil.log",
            "/dev/zero",
            "..",
            ".lock.0123.log",
            "_x.log",
            "lock",
            "prelock",
            "a/b.log",
            ".log",
            "x.log\n",
            "",
        ] {
            assert!(data_file_name_problem(bad).is_some(), "{bad:?} passed");
        }
        assert!(data_file_name_problem(&format!("{}.log", "a".repeat(252))).is_some());
    }
}
