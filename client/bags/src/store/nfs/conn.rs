//! One NFS connection (v3 or v4) and the `FsOps` calls as NFS operations,
//! with errors mapped to the `io::Error` kinds the bag protocol reads.

use std::fmt;
use std::io;

use crate::store::fsops::{DirEntry, FileStat, Kind};

const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// One connection, with its own NFS client state.
pub(super) enum Conn {
    V3(Box<nfs::v3::tokio::Client>),
    V4(Box<nfs::v4::tokio::Client>),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::V3(_) => "Conn::V3",
            Conn::V4(_) => "Conn::V4",
        })
    }
}

pub(super) fn is_exist(e: &nfs::Error) -> bool {
    e.is_already_exists()
}

/// Whether the connection is still usable after this error: the server
/// answered with an NFS status, so the RPC stream is in step.
pub(super) fn connection_ok(e: &nfs::Error) -> bool {
    matches!(e, nfs::Error::Nfs { .. } | nfs::Error::NfsV4 { .. })
}

/// How often a listing that the server called stale is started over.
pub(super) const LIST_RESTARTS: u64 = 5;

/// A READDIR the server cut short because the directory changed under it
/// (a path-based call has no handle of ours that could really be stale).
pub(super) fn restartable_listing(e: &nfs::Error) -> bool {
    e.is_stale_handle()
        || matches!(
            e,
            nfs::Error::Nfs {
                status: nfs::v3::NfsStatus::BadCookie | nfs::v3::NfsStatus::NotSync,
                ..
            } | nfs::Error::NfsV4 {
                status: nfs::v4::Status::BadCookie,
                ..
            }
        )
}

/// How often a read whose open state the server dropped is started over.
pub(super) const READ_RESTARTS: u64 = 5;

/// A path-based NFSv4 read opens the file, reads with that open's state
/// and closes it, all in one call: a state error on it means the server
/// let go of the open between two of our steps (ganesha 4.3 answered
/// NFS4ERR_BAD_STATEID to the read of a summary while concurrent
/// summarizers linked and removed their temporary names of the same
/// file). A read holds nothing across calls, so it is simply started over.
pub(super) fn restartable_read(e: &nfs::Error) -> bool {
    matches!(
        e,
        nfs::Error::NfsV4 {
            status: nfs::v4::Status::BadStateId
                | nfs::v4::Status::OldStateId
                | nfs::v4::Status::StaleStateId
                | nfs::v4::Status::Expired
                | nfs::v4::Status::AdminRevoked,
            ..
        }
    )
}

impl Conn {
    pub(super) async fn list(&mut self, dir: &str) -> nfs::Result<Vec<DirEntry>> {
        match self {
            Conn::V3(c) => {
                let mut out = Vec::new();
                for e in c.read_dir(dir).await? {
                    if e.name == "." || e.name == ".." {
                        continue;
                    }
                    let (is_dir, is_link) = match &e.attributes {
                        Some(a) => (
                            a.file_type == nfs::v3::FileType::Directory,
                            a.file_type == nfs::v3::FileType::Symlink,
                        ),
                        // READDIR without attributes: ask.
                        None => (c.is_dir(&join(dir, &e.name)).await?, false),
                    };
                    out.push(DirEntry {
                        name: e.name,
                        is_dir,
                        is_link,
                    });
                }
                Ok(out)
            }
            Conn::V4(c) => {
                let mut out = Vec::new();
                for e in c.read_dir(dir).await? {
                    let (is_dir, is_link) = match e.attributes.file_type {
                        Some(t) => (t == nfs::v4::FileType::Directory, t == nfs::v4::FileType::Symlink),
                        None => (c.is_dir(&join(dir, &e.name)).await?, false),
                    };
                    out.push(DirEntry {
                        name: e.name,
                        is_dir,
                        is_link,
                    });
                }
                Ok(out)
            }
        }
    }

    pub(super) async fn mkdir_all(&mut self, dir: &str) -> nfs::Result<()> {
        if dir.is_empty() || dir == "/" {
            return Ok(());
        }
        match self {
            Conn::V3(c) => c.create_dir_all(dir, DIR_MODE).await,
            Conn::V4(c) => c.create_dir_all(dir, DIR_MODE).await,
        }
    }

    /// GUARDED create (v3 CREATE with createmode GUARDED; v4 OPEN with
    /// GUARDED4 then CLOSE): the server refuses if the name exists.
    /// `Ok(false)` when it did.
    pub(super) async fn create_new(&mut self, path: &str) -> nfs::Result<bool> {
        let r = match self {
            Conn::V3(c) => c.create_new(path, FILE_MODE).await,
            Conn::V4(c) => c.create_new_with_mode(path, FILE_MODE).await,
        };
        match r {
            Ok(()) => Ok(true),
            Err(e) if is_exist(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn write_at(
        &mut self,
        path: &str,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> nfs::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        match self {
            Conn::V3(c) => {
                let stable = if sync {
                    nfs::v3::StableHow::FileSync
                } else {
                    nfs::v3::StableHow::Unstable
                };
                c.write_at_with_stability(path, offset, data, stable).await
            }
            // OPEN(share WRITE) + WRITE(FILE_SYNC) + CLOSE: the crate always
            // writes FILE_SYNC over v4.
            Conn::V4(c) => c.write_at(path, offset, data).await,
        }
    }

    pub(super) async fn link(&mut self, from: &str, to: &str) -> nfs::Result<bool> {
        let r = match self {
            Conn::V3(c) => c.hard_link(from, to).await,
            Conn::V4(c) => c.hard_link(from, to).await,
        };
        match r {
            Ok(()) => Ok(true),
            Err(e) if is_exist(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// GETATTR: the stat, and what the path is (LOOKUP hands back a
    /// link's own handle, never its target's: a link is seen as one).
    pub(super) async fn stat(&mut self, path: &str) -> nfs::Result<(FileStat, Kind)> {
        match self {
            Conn::V3(c) => {
                let a = c.metadata(path).await?;
                let kind = match a.file_type {
                    nfs::v3::FileType::Regular => Kind::Regular,
                    nfs::v3::FileType::Directory => Kind::Directory,
                    nfs::v3::FileType::Symlink => Kind::Symlink,
                    nfs::v3::FileType::Fifo => Kind::Fifo,
                    nfs::v3::FileType::BlockDevice | nfs::v3::FileType::CharacterDevice => Kind::Device,
                    nfs::v3::FileType::Socket => Kind::Socket,
                };
                let st = FileStat {
                    len: a.size,
                    mode: a.mode & 0o7777,
                    is_dir: kind == Kind::Directory,
                };
                Ok((st, kind))
            }
            Conn::V4(c) => {
                let a = c.metadata(path).await?;
                let missing = |what: &str| nfs::Error::Protocol(format!("server sent no {what} for {path}"));
                let kind = match a.file_type.ok_or_else(|| missing("type"))? {
                    nfs::v4::FileType::Regular => Kind::Regular,
                    nfs::v4::FileType::Directory => Kind::Directory,
                    nfs::v4::FileType::Symlink => Kind::Symlink,
                    nfs::v4::FileType::Fifo => Kind::Fifo,
                    nfs::v4::FileType::BlockDevice | nfs::v4::FileType::CharacterDevice => Kind::Device,
                    nfs::v4::FileType::Socket => Kind::Socket,
                    _ => Kind::Other,
                };
                let st = FileStat {
                    len: a.size.ok_or_else(|| missing("size"))?,
                    mode: a.mode.ok_or_else(|| missing("mode"))? & 0o7777,
                    is_dir: kind == Kind::Directory,
                };
                Ok((st, kind))
            }
        }
    }

    pub(super) async fn read(&mut self, path: &str, limit: Option<u64>) -> nfs::Result<Vec<u8>> {
        match (self, limit) {
            (Conn::V3(c), Some(n)) => c.read_range(path, 0, n).await,
            (Conn::V3(c), None) => c.read(path).await,
            (Conn::V4(c), Some(n)) => c.read_range(path, 0, n).await,
            (Conn::V4(c), None) => c.read(path).await,
        }
    }

    pub(super) async fn chmod(&mut self, path: &str, mode: u32) -> nfs::Result<()> {
        match self {
            Conn::V3(c) => c.set_mode(path, mode).await,
            Conn::V4(c) => c.set_mode(path, mode).await,
        }
    }

    pub(super) async fn remove(&mut self, path: &str) -> nfs::Result<()> {
        match self {
            Conn::V3(c) => c.remove(path).await,
            Conn::V4(c) => c.remove(path).await,
        }
    }

    pub(super) async fn rmdir(&mut self, path: &str) -> nfs::Result<()> {
        match self {
            Conn::V3(c) => c.rmdir(path).await,
            Conn::V4(c) => c.rmdir(path).await,
        }
    }
}

/// `base` + `/` + `rel` (either may be empty; both empty is the root, `/`).
pub(super) fn join(base: &str, rel: &str) -> String {
    match (base.is_empty(), rel.is_empty()) {
        (true, true) => "/".to_owned(),
        (false, true) => base.to_owned(),
        (true, false) => format!("/{}", rel.trim_start_matches('/')),
        (false, false) => format!("{base}/{}", rel.trim_start_matches('/')),
    }
}

/// Maps a client error to `io::Error`, keeping the kinds the bag protocol
/// looks at (`NotFound`, `AlreadyExists`, `PermissionDenied`).
pub(super) fn to_io(op: &str, path: &str, e: nfs::Error) -> io::Error {
    let kind = if e.is_not_found() {
        io::ErrorKind::NotFound
    } else if e.is_already_exists() {
        io::ErrorKind::AlreadyExists
    } else if e.is_permission_denied() {
        io::ErrorKind::PermissionDenied
    } else if let nfs::Error::Io(io) = &e {
        io.kind()
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("NFS {op} {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use nfs::v4::Status;

    use super::*;

    fn v4(status: Status) -> nfs::Error {
        nfs::Error::NfsV4 {
            operation: "READ",
            status,
        }
    }

    /// Only the loss of the call's own open state starts a read over: a
    /// missing file, a refusal or a broken connection is the caller's.
    #[test]
    fn a_read_restarts_only_when_its_open_state_was_dropped() {
        for s in [
            Status::BadStateId,
            Status::OldStateId,
            Status::StaleStateId,
            Status::Expired,
            Status::AdminRevoked,
        ] {
            assert!(restartable_read(&v4(s)), "{s:?}");
        }
        for s in [Status::NoEnt, Status::Access, Status::Io, Status::Stale] {
            assert!(!restartable_read(&v4(s)), "{s:?}");
        }
        let io = nfs::Error::Io(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
        assert!(!restartable_read(&io));
    }
}
