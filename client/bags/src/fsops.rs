//! The small set of file operations the POSIX bag uses, chosen because they
//! behave the same on a local disk and over NFS (close-to-open consistency;
//! metadata writes execute on the server): list a directory, link a
//! prepared file, open an existing file, create with `O_CREAT|O_EXCL`,
//! append to a single-writer file and close it, open+stat, open+read, chmod.
//! Plus `mkdir` (exclusive by nature) and removing a private temporary file
//! nobody else ever opens. **No rename.**
//!
//! Paths are relative to the store root, `/`-separated. The [`StdFs`]
//! implementation runs each call on tokio's blocking pool; a userspace NFS
//! client can implement the same trait.

use std::fmt;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

/// What `stat` tells the bag protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub len: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub is_dir: bool,
}

impl FileStat {
    /// No write bit set for anyone: the protocol's "read-only" signal.
    /// (Never tested by trying to write: root ignores modes.)
    pub fn read_only(&self) -> bool {
        self.mode & 0o222 == 0
    }
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
}

/// NFS-safe file operations. See the module docs.
///
/// Answers must come from the server, not from a client cache: `stat`,
/// `open_append`'s stat and `read` see other clients' closed writes and
/// chmods at once (close-to-open), `list_dir` revalidates the directory.
#[async_trait]
pub trait FsOps: Send + Sync + fmt::Debug {
    /// Where this points, for messages.
    fn describe(&self) -> String;
    /// Lists a directory (opening it, which revalidates NFS caches).
    async fn list_dir(&self, dir: &str) -> io::Result<Vec<DirEntry>>;
    /// Creates a directory and its parents; existing ones are fine.
    async fn create_dir_all(&self, dir: &str) -> io::Result<()>;
    /// `O_CREAT|O_EXCL` then writes `contents` (optionally fsynced) and
    /// closes. `Ok(false)` if the file already existed.
    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> io::Result<bool>;
    /// `link(2)`. `Ok(false)` if `to` already existed.
    async fn link(&self, from: &str, to: &str) -> io::Result<bool>;
    /// Opens (creating if missing) a single-writer file for appending and
    /// returns its stat as opened, so the caller can check size and mode
    /// before writing.
    async fn open_append(&self, path: &str) -> io::Result<(Box<dyn AppendFile>, FileStat)>;
    /// open + fstat. Like `read` and `chmod`, never follows a symbolic link
    /// and refuses what is not a regular file or directory, with an error
    /// [`is_not_plain`] recognises.
    async fn stat(&self, path: &str) -> io::Result<FileStat>;
    /// open + read up to `limit` bytes (all when `None`) of a regular file,
    /// never more than it holds when opened.
    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes>;
    /// chmod: the "closed" signal on data files and bag directories.
    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()>;
    /// Removes a private temporary file that only this process ever used.
    async fn remove_private(&self, path: &str) -> io::Result<()>;
}

/// An open single-writer file.
#[async_trait]
pub trait AppendFile: Send + fmt::Debug {
    /// Appends `data`, optionally fsyncs, and closes (the write becomes
    /// visible to other NFS clients on close).
    async fn append_and_close(self: Box<Self>, data: Bytes, sync: bool) -> io::Result<()>;
}

/// [`FsOps`] over `std::fs` on a local or kernel-mounted directory.
#[derive(Clone, Debug)]
pub struct StdFs {
    root: PathBuf,
}

impl StdFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        StdFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn full(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("blocking task failed: {e}")))?
}

/// `fstat` that bypasses cached attributes (`statx` with
/// `AT_STATX_FORCE_SYNC`): a kernel NFS client, or a FUSE mount with an
/// `attr_timeout`, asks the server instead of answering from a cache that
/// may be seconds old, so another client's appends and chmods are seen now.
/// It also refreshes the cached size that later reads on this open file are
/// bounded by. On a local file system it is a plain `fstat`.
fn fresh_stat(f: &std::fs::File) -> io::Result<FileStat> {
    fresh_stat_typed(f).map(|(st, _)| st)
}

/// [`fresh_stat`], with the file's type.
fn fresh_stat_typed(f: &std::fs::File) -> io::Result<(FileStat, rustix::fs::FileType)> {
    use rustix::fs::{AtFlags, FileType, StatxFlags};
    let st = rustix::fs::statx(
        f,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_FORCE_SYNC,
        StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::SIZE,
    )?;
    let mode = u32::from(st.stx_mode);
    let kind = FileType::from_raw_mode(mode);
    Ok((
        FileStat {
            len: st.stx_size,
            mode: mode & 0o7777,
            is_dir: kind == FileType::Directory,
        },
        kind,
    ))
}

/// The error for a path that is not a plain file of the store: a symbolic
/// link, a FIFO, a device, a socket. Kind `InvalidData`, so callers can
/// tell it from a failure of the storage itself.
fn not_plain(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Whether `e` says a path is not a plain file of the store (see
/// [`FsOps::stat`]): the item is refused, rather than the storage failing.
pub fn is_not_plain(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData
}

/// Opens `p` read-only without following a symbolic link in its last
/// component (`O_NOFOLLOW`) and without waiting for a writer on a FIFO
/// (`O_NONBLOCK`), then accepts only a regular file (or a directory when
/// `dir_ok`). Whoever can write to the store must not make a reader follow
/// a link out of the root, read `/dev/zero`, chmod a file elsewhere, or
/// wait forever on a pipe.
fn open_plain(p: &Path, dir_ok: bool) -> io::Result<(std::fs::File, FileStat)> {
    use rustix::fs::{FileType, OFlags};
    let flags = (OFlags::NOFOLLOW | OFlags::NONBLOCK).bits();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(i32::try_from(flags).unwrap_or(i32::MAX))
        .open(p)
        .map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                not_plain("a symbolic link (links are not followed)")
            } else {
                e
            }
        })?;
    let (st, kind) = fresh_stat_typed(&f)?;
    match kind {
        FileType::RegularFile => Ok((f, st)),
        FileType::Directory if dir_ok => Ok((f, st)),
        FileType::Directory => Err(not_plain("a directory, not a regular file")),
        FileType::Fifo => Err(not_plain("a FIFO, not a regular file")),
        FileType::CharacterDevice | FileType::BlockDevice => Err(not_plain("a device, not a regular file")),
        FileType::Socket => Err(not_plain("a socket, not a regular file")),
        _ => Err(not_plain("not a regular file")),
    }
}

#[async_trait]
impl FsOps for StdFs {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    async fn list_dir(&self, dir: &str) -> io::Result<Vec<DirEntry>> {
        let p = self.full(dir);
        blocking(move || {
            let mut out = Vec::new();
            for e in std::fs::read_dir(&p)? {
                let e = e?;
                let Ok(name) = e.file_name().into_string() else {
                    continue; // not ours: we only create UTF-8 names
                };
                out.push(DirEntry {
                    name,
                    is_dir: e.file_type()?.is_dir(),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        let p = self.full(dir);
        blocking(move || {
            if p.is_dir() {
                return Ok(());
            }
            std::fs::DirBuilder::new().recursive(true).create(&p)
        })
        .await
    }

    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> io::Result<bool> {
        let p = self.full(path);
        let contents = contents.to_vec();
        blocking(move || {
            let mut f = match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&p)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
                Err(e) => return Err(e),
            };
            f.write_all(&contents)?;
            if sync {
                f.sync_all()?;
            }
            Ok(true)
        })
        .await
    }

    async fn link(&self, from: &str, to: &str) -> io::Result<bool> {
        let (a, b) = (self.full(from), self.full(to));
        blocking(move || match std::fs::hard_link(&a, &b) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        })
        .await
    }

    async fn open_append(&self, path: &str) -> io::Result<(Box<dyn AppendFile>, FileStat)> {
        let p = self.full(path);
        blocking(move || {
            let f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o644)
                .open(&p)?;
            let st = fresh_stat(&f)?;
            Ok((Box::new(StdAppendFile { file: f }) as Box<dyn AppendFile>, st))
        })
        .await
    }

    async fn stat(&self, path: &str) -> io::Result<FileStat> {
        let p = self.full(path);
        blocking(move || open_plain(&p, true).map(|(_, st)| st)).await
    }

    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes> {
        let p = self.full(path);
        blocking(move || {
            // Reads stop at the size the kernel believes; the fresh stat in
            // `open_plain` makes it current, and bounds the buffer: never
            // more than the file holds, nor than the caller's limit.
            let (f, st) = open_plain(&p, false)?;
            let n = limit.map_or(st.len, |l| l.min(st.len));
            let mut buf = Vec::with_capacity(usize::try_from(n).unwrap_or(usize::MAX));
            f.take(n).read_to_end(&mut buf)?;
            Ok(Bytes::from(buf))
        })
        .await
    }

    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()> {
        let p = self.full(path);
        // Through the opened file (fchmod), so a symbolic link planted in a
        // bag cannot point a closer's chmod at a file outside the store.
        blocking(move || {
            let (f, _) = open_plain(&p, true)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))
        })
        .await
    }

    async fn remove_private(&self, path: &str) -> io::Result<()> {
        let p = self.full(path);
        blocking(move || std::fs::remove_file(&p)).await
    }
}

#[derive(Debug)]
struct StdAppendFile {
    file: std::fs::File,
}

#[async_trait]
impl AppendFile for StdAppendFile {
    async fn append_and_close(self: Box<Self>, data: Bytes, sync: bool) -> io::Result<()> {
        let mut file = self.file;
        blocking(move || {
            file.write_all(&data)?;
            if sync {
                file.sync_data()?;
            }
            drop(file);
            Ok(())
        })
        .await
    }
}
