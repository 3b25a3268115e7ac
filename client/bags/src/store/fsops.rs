//! The small set of file operations the POSIX bag uses, chosen because they
//! behave the same on a local disk and over NFS (close-to-open consistency;
//! metadata writes execute on the server): list a directory, link a
//! prepared file, open an existing file, create with `O_CREAT|O_EXCL`,
//! append to a single-writer file and close it, open+stat, open+read, chmod.
//! Plus `mkdir` (exclusive by nature) and `unlink` (of a private temporary
//! file, or of a span's seal intent once its seal exists). **No rename.**
//!
//! Paths are relative to the store root, `/`-separated. The [`StdFs`]
//! implementation runs each call on tokio's blocking pool; a userspace NFS
//! client can implement the same trait.

use std::fmt;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

/// What `stat` tells the bag protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    /// Size in bytes.
    pub len: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// A directory (a bag or a level of the calendar tree).
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
    /// Its name within the directory listed.
    pub name: String,
    /// A directory.
    pub is_dir: bool,
    /// A symbolic link (never followed; `is_dir` is false for it).
    pub is_link: bool,
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
    /// `unlink(2)` of a file: a private temporary file that only this
    /// process ever used, or a span's seal intent once the seal exists
    /// (see [`crate::seal`]). Never a file another process may still be
    /// deciding on.
    async fn remove(&self, path: &str) -> io::Result<()>;
    /// `rmdir(2)` of an empty directory: retention, removing a bag whose
    /// summary holds it ([`crate::retain`]).
    async fn remove_dir(&self, path: &str) -> io::Result<()>;
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
    /// File operations on paths relative to `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        StdFs { root: root.into() }
    }

    /// The directory every path is relative to.
    pub fn root(&self) -> &Path {
        &self.root
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
/// Also gives the file's type.
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
pub(crate) fn not_plain(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Whether `e` says a path is not a plain file of the store (see
/// [`FsOps::stat`]): the item is refused, rather than the storage failing.
pub fn is_not_plain(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData
}

/// Opens `rel` beneath `root` read-only without following a symbolic
/// link, in its last component or above it (see [`crate::store::beneath`]), and
/// without waiting for a writer on a FIFO (`O_NONBLOCK`), then accepts
/// only a regular file (or a directory when `dir_ok`). Whoever can write
/// to the store must not make a reader follow a link out of the root,
/// read `/dev/zero`, chmod a file elsewhere, or wait forever on a pipe.
fn open_plain(root: &Path, rel: &str, dir_ok: bool) -> io::Result<(std::fs::File, FileStat)> {
    use rustix::fs::{Mode, OFlags};
    let fd = crate::store::beneath::open(root, rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
    let f = std::fs::File::from(fd);
    let (st, kind) = fresh_stat_typed(&f)?;
    plain_kind(kind, dir_ok)?;
    Ok((f, st))
}

/// What a path is, as far as the store's rules go; the directory store and
/// the NFS store map their own file types to it, so both refuse the same
/// things with the same words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Device,
    Socket,
    Other,
}

/// Refuses what is not a regular file (or a directory when `dir_ok`),
/// naming what it is.
pub(crate) fn refuse_unless_plain(kind: Kind, dir_ok: bool) -> io::Result<()> {
    match kind {
        Kind::Regular => Ok(()),
        Kind::Directory if dir_ok => Ok(()),
        Kind::Directory => Err(not_plain("a directory, not a regular file")),
        Kind::Fifo => Err(not_plain("a FIFO, not a regular file")),
        Kind::Device => Err(not_plain("a device, not a regular file")),
        Kind::Socket => Err(not_plain("a socket, not a regular file")),
        Kind::Symlink => Err(not_plain("a symbolic link (links are not followed)")),
        Kind::Other => Err(not_plain("not a regular file")),
    }
}

fn plain_kind(kind: rustix::fs::FileType, dir_ok: bool) -> io::Result<()> {
    use rustix::fs::FileType;
    let kind = match kind {
        FileType::RegularFile => Kind::Regular,
        FileType::Directory => Kind::Directory,
        FileType::Symlink => Kind::Symlink,
        FileType::Fifo => Kind::Fifo,
        FileType::CharacterDevice | FileType::BlockDevice => Kind::Device,
        FileType::Socket => Kind::Socket,
        _ => Kind::Other,
    };
    refuse_unless_plain(kind, dir_ok)
}

#[async_trait]
impl FsOps for StdFs {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    /// Entries that are symbolic links are listed as such (`is_link`), not
    /// followed: a link in place of a bag directory shows up, and is
    /// refused by name when opened.
    async fn list_dir(&self, dir: &str) -> io::Result<Vec<DirEntry>> {
        let (root, dir) = (self.root.clone(), dir.to_owned());
        blocking(move || {
            use rustix::fs::{AtFlags, FileType, Mode, OFlags};
            let fd =
                crate::store::beneath::open(&root, &dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            let mut entries = rustix::fs::Dir::read_from(&fd)?;
            let mut out = Vec::new();
            while let Some(e) = entries.read() {
                let e = e?;
                let Ok(name) = e.file_name().to_str().map(str::to_owned) else {
                    continue; // not ours: we only create UTF-8 names
                };
                if name == "." || name == ".." {
                    continue;
                }
                let kind = match e.file_type() {
                    FileType::Unknown => FileType::from_raw_mode(
                        rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?.st_mode,
                    ),
                    kind => kind,
                };
                out.push(DirEntry {
                    name,
                    is_dir: kind == FileType::Directory,
                    is_link: kind == FileType::Symlink,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        let (root, dir) = (self.root.clone(), dir.to_owned());
        blocking(move || {
            crate::store::beneath::create_dir_all(&root, &dir, rustix::fs::Mode::from_raw_mode(0o777))
        })
        .await
    }

    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> io::Result<bool> {
        use rustix::fs::{Mode, OFlags};
        let (root, path) = (self.root.clone(), path.to_owned());
        let contents = contents.to_vec();
        blocking(move || {
            let (dir, name) = crate::store::beneath::parent(&root, &path)?;
            let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let mut f = match rustix::fs::openat(&dir, name.as_str(), flags, Mode::from_raw_mode(0o644)) {
                Ok(fd) => std::fs::File::from(fd),
                Err(rustix::io::Errno::EXIST) => return Ok(false),
                Err(e) => return Err(e.into()),
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
        let (root, from, to) = (self.root.clone(), from.to_owned(), to.to_owned());
        blocking(move || {
            let (from_dir, from_name) = crate::store::beneath::parent(&root, &from)?;
            let (to_dir, to_name) = crate::store::beneath::parent(&root, &to)?;
            // No AT_SYMLINK_FOLLOW: a link in `from` is linked, not followed.
            match rustix::fs::linkat(
                &from_dir,
                from_name.as_str(),
                &to_dir,
                to_name.as_str(),
                rustix::fs::AtFlags::empty(),
            ) {
                Ok(()) => Ok(true),
                Err(rustix::io::Errno::EXIST) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    async fn open_append(&self, path: &str) -> io::Result<(Box<dyn AppendFile>, FileStat)> {
        use rustix::fs::{Mode, OFlags};
        let (root, path) = (self.root.clone(), path.to_owned());
        blocking(move || {
            let flags = OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NONBLOCK;
            let fd = crate::store::beneath::open(&root, &path, flags, Mode::from_raw_mode(0o644))?;
            let f = std::fs::File::from(fd);
            let (st, kind) = fresh_stat_typed(&f)?;
            plain_kind(kind, false)?;
            Ok((Box::new(StdAppendFile { file: f }) as Box<dyn AppendFile>, st))
        })
        .await
    }

    async fn stat(&self, path: &str) -> io::Result<FileStat> {
        let (root, path) = (self.root.clone(), path.to_owned());
        blocking(move || open_plain(&root, &path, true).map(|(_, st)| st)).await
    }

    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes> {
        let (root, path) = (self.root.clone(), path.to_owned());
        blocking(move || {
            // Reads stop at the size the kernel believes; the fresh stat in
            // `open_plain` makes it current, and bounds the buffer: never
            // more than the file holds, nor than the caller's limit.
            let (f, st) = open_plain(&root, &path, false)?;
            let n = limit.map_or(st.len, |l| l.min(st.len));
            let mut buf = Vec::with_capacity(usize::try_from(n).unwrap_or(usize::MAX));
            f.take(n).read_to_end(&mut buf)?;
            Ok(Bytes::from(buf))
        })
        .await
    }

    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()> {
        let (root, path) = (self.root.clone(), path.to_owned());
        // Through the opened file (fchmod), so a symbolic link planted in a
        // bag cannot point a closer's chmod at a file outside the store.
        blocking(move || {
            let (f, _) = open_plain(&root, &path, true)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))
        })
        .await
    }

    async fn remove(&self, path: &str) -> io::Result<()> {
        self.unlink(path, rustix::fs::AtFlags::empty()).await
    }

    async fn remove_dir(&self, path: &str) -> io::Result<()> {
        self.unlink(path, rustix::fs::AtFlags::REMOVEDIR).await
    }
}

impl StdFs {
    /// `unlinkat` of `path` beneath the root (a file, or with `REMOVEDIR`
    /// an empty directory).
    async fn unlink(&self, path: &str, flags: rustix::fs::AtFlags) -> io::Result<()> {
        let (root, path) = (self.root.clone(), path.to_owned());
        blocking(move || {
            let (dir, name) = crate::store::beneath::parent(&root, &path)?;
            Ok(rustix::fs::unlinkat(&dir, name.as_str(), flags)?)
        })
        .await
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
