//! [`FsOps`] over a userspace NFS client (the [`nfs`] crate, NFSv3 and
//! NFSv4.2 over TCP), for hosts that cannot mount NFS. The bag protocol in
//! [`posix`](crate::posix) runs unchanged on top. Why this crate, which NFS
//! operations each [`FsOps`] call becomes, and what NFS semantics the
//! protocol designs around: see `NFS.md` next to this file.
//!
//! Store URL: `nfs://host[:port]/path[?version=3|4&mountport=N&export=/e&connections=N]`.
//! * `version` — `3` (default) or `4` (NFSv4.2 with sessions).
//! * `port` — the NFS port (default 2049). `mountport` — the NFSv3 MOUNT
//!   port; without it the client asks the portmapper on port 111.
//! * `path` — for NFSv4 a path in the server's pseudo file system; for
//!   NFSv3 an export followed by a directory inside it. The export is the
//!   longest prefix of `path` the server lets us MOUNT, unless `export=`
//!   names it. The directory is created if missing.
//! * `connections` — how many TCP connections (each its own NFS client
//!   state) calls are spread over (default 4).
//!
//! The client keeps **no** attribute, name or data cache (it only remembers
//! which directories exist, which the protocol never undoes): every call goes to
//! the server (NFSv3 resolves each path with LOOKUPs from the export root;
//! NFSv4 sends one COMPOUND starting at PUTROOTFH). So the stale-cache
//! hazards of kernel clients cannot arise here; they are tested with the
//! `std::fs` backend on caching FUSE mounts instead.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::RngCore as _;

use crate::fsops::{AppendFile, DirEntry, FileStat, FsOps};

/// NFS protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NfsVersion {
    V3,
    /// NFSv4.2 (the crate speaks minor version 2 with sessions).
    V4,
}

/// A parsed `nfs://` store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NfsTarget {
    pub host: String,
    /// NFS port; `None` means 2049.
    pub port: Option<u16>,
    /// `/`-separated, absolute, no trailing slash (`""` is the root).
    pub path: String,
    pub version: NfsVersion,
    /// NFSv3 MOUNT port; `None` asks the portmapper.
    pub mount_port: Option<u16>,
    /// NFSv3 export, when given instead of probed.
    pub export: Option<String>,
    pub connections: usize,
}

const DEFAULT_CONNECTIONS: usize = 4;
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

impl NfsTarget {
    /// Parses `nfs://host[:port]/path[?query]`; the error says what is wrong.
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("nfs://")
            .ok_or("an NFS URL starts with nfs://")?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p.parse::<u16>().map_err(|e| format!("bad port {p:?}: {e}"))?;
                (h, Some(port))
            }
            _ => (authority, None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("no host: nfs://host[:port]/export/dir".into());
        }
        let path = normalize(path)?;
        let mut t = NfsTarget {
            host: host.to_owned(),
            port,
            path,
            version: NfsVersion::V3,
            mount_port: None,
            export: None,
            connections: DEFAULT_CONNECTIONS,
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("bad query part {kv:?}"))?;
            match k {
                "version" | "vers" => {
                    t.version = match v {
                        "3" => NfsVersion::V3,
                        "4" | "4.2" => NfsVersion::V4,
                        _ => return Err(format!("version must be 3 or 4 (4.2), not {v:?}")),
                    }
                }
                "mountport" => {
                    t.mount_port = Some(v.parse().map_err(|e| format!("bad mountport {v:?}: {e}"))?)
                }
                "export" => {
                    let e = normalize(v)?;
                    if !is_prefix(&e, &t.path) {
                        return Err(format!("export {v:?} is not a prefix of the path {:?}", t.path));
                    }
                    t.export = Some(e);
                }
                "connections" => {
                    t.connections = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| format!("connections must be 1 to 64, not {v:?}"))?
                }
                _ => return Err(format!("unknown query parameter {k:?}")),
            }
        }
        Ok(t)
    }
}

impl fmt::Display for NfsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(f, "nfs://{host}")?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        write!(f, "{}", if self.path.is_empty() { "/" } else { &self.path })?;
        let v = match self.version {
            NfsVersion::V3 => "3",
            NfsVersion::V4 => "4",
        };
        write!(f, "?version={v}")?;
        if let Some(p) = self.mount_port {
            write!(f, "&mountport={p}")?;
        }
        if let Some(e) = &self.export {
            write!(f, "&export={}", if e.is_empty() { "/" } else { e })?;
        }
        if self.connections != DEFAULT_CONNECTIONS {
            write!(f, "&connections={}", self.connections)?;
        }
        Ok(())
    }
}

/// `/a//b/` → `/a/b`; `/` → ``. Rejects `.` and `..`.
fn normalize(path: &str) -> Result<String, String> {
    let mut out = String::new();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if seg == "." || seg == ".." {
            return Err(format!("path {path:?} may not contain . or .."));
        }
        out.push('/');
        out.push_str(seg);
    }
    Ok(out)
}

fn is_prefix(prefix: &str, path: &str) -> bool {
    path == prefix || path.starts_with(&format!("{prefix}/")) || prefix.is_empty()
}

/// One connection, with its own NFS client state.
enum Conn {
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

fn is_exist(e: &nfs::Error) -> bool {
    e.is_already_exists()
}

/// Whether the connection is still usable after this error: the server
/// answered with an NFS status, so the RPC stream is in step.
fn connection_ok(e: &nfs::Error) -> bool {
    matches!(e, nfs::Error::Nfs { .. } | nfs::Error::NfsV4 { .. })
}

/// How often a listing that the server called stale is started over.
const LIST_RESTARTS: u64 = 5;

/// A READDIR the server cut short because the directory changed under it
/// (a path-based call has no handle of ours that could really be stale).
fn restartable_listing(e: &nfs::Error) -> bool {
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

impl Conn {
    async fn list(&mut self, dir: &str) -> nfs::Result<Vec<DirEntry>> {
        match self {
            Conn::V3(c) => {
                let mut out = Vec::new();
                for e in c.read_dir(dir).await? {
                    if e.name == "." || e.name == ".." {
                        continue;
                    }
                    let is_dir = match &e.attributes {
                        Some(a) => a.file_type == nfs::v3::FileType::Directory,
                        // READDIR without attributes: ask.
                        None => c.is_dir(&join(dir, &e.name)).await?,
                    };
                    out.push(DirEntry { name: e.name, is_dir });
                }
                Ok(out)
            }
            Conn::V4(c) => {
                let mut out = Vec::new();
                for e in c.read_dir(dir).await? {
                    let is_dir = match e.attributes.file_type {
                        Some(t) => t == nfs::v4::FileType::Directory,
                        None => c.is_dir(&join(dir, &e.name)).await?,
                    };
                    out.push(DirEntry { name: e.name, is_dir });
                }
                Ok(out)
            }
        }
    }

    async fn mkdir_all(&mut self, dir: &str) -> nfs::Result<()> {
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
    async fn create_new(&mut self, path: &str) -> nfs::Result<bool> {
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

    async fn write_at(&mut self, path: &str, offset: u64, data: &[u8], sync: bool) -> nfs::Result<()> {
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

    async fn link(&mut self, from: &str, to: &str) -> nfs::Result<bool> {
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

    async fn stat(&mut self, path: &str) -> nfs::Result<FileStat> {
        match self {
            Conn::V3(c) => {
                let a = c.metadata(path).await?;
                Ok(FileStat {
                    len: a.size,
                    mode: a.mode & 0o7777,
                    is_dir: a.file_type == nfs::v3::FileType::Directory,
                })
            }
            Conn::V4(c) => {
                let a = c.metadata(path).await?;
                let missing = |what: &str| nfs::Error::Protocol(format!("server sent no {what} for {path}"));
                Ok(FileStat {
                    len: a.size.ok_or_else(|| missing("size"))?,
                    mode: a.mode.ok_or_else(|| missing("mode"))? & 0o7777,
                    is_dir: a.file_type.ok_or_else(|| missing("type"))? == nfs::v4::FileType::Directory,
                })
            }
        }
    }

    async fn read(&mut self, path: &str, limit: Option<u64>) -> nfs::Result<Vec<u8>> {
        match (self, limit) {
            (Conn::V3(c), Some(n)) => c.read_range(path, 0, n).await,
            (Conn::V3(c), None) => c.read(path).await,
            (Conn::V4(c), Some(n)) => c.read_range(path, 0, n).await,
            (Conn::V4(c), None) => c.read(path).await,
        }
    }

    async fn chmod(&mut self, path: &str, mode: u32) -> nfs::Result<()> {
        match self {
            Conn::V3(c) => c.set_mode(path, mode).await,
            Conn::V4(c) => c.set_mode(path, mode).await,
        }
    }

    async fn remove(&mut self, path: &str) -> nfs::Result<()> {
        match self {
            Conn::V3(c) => c.remove(path).await,
            Conn::V4(c) => c.remove(path).await,
        }
    }
}

/// `base` + `/` + `rel` (either may be empty; both empty is the root, `/`).
fn join(base: &str, rel: &str) -> String {
    match (base.is_empty(), rel.is_empty()) {
        (true, true) => "/".to_owned(),
        (false, true) => base.to_owned(),
        (true, false) => format!("/{}", rel.trim_start_matches('/')),
        (false, false) => format!("{base}/{}", rel.trim_start_matches('/')),
    }
}

/// Maps a client error to `io::Error`, keeping the kinds the bag protocol
/// looks at (`NotFound`, `AlreadyExists`, `PermissionDenied`).
fn to_io(op: &str, path: &str, e: nfs::Error) -> io::Error {
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

struct Shared {
    target: NfsTarget,
    /// NFSv3: the export MOUNTed; NFSv4: unused.
    export: String,
    /// Where the store root is, as the client's paths name it (v3: inside
    /// the export; v4: from the pseudo root).
    base: String,
    timeout: Duration,
    /// One slot per connection; `None` until (re)connected. Locking rule: a
    /// slot's tokio mutex is held for exactly one `FsOps` call, across its
    /// awaits, so calls on one connection never interleave on the wire.
    slots: Vec<tokio::sync::Mutex<Option<Conn>>>,
    next: AtomicUsize,
    /// Directories known to exist: the one thing this client remembers.
    /// The protocol never removes or renames a directory, so "it existed"
    /// stays true; if someone else removes one anyway, the next create in
    /// it fails with NotFound and this set is forgotten. Saves a LOOKUP per
    /// path component (NFSv3) or a GETATTR compound per component (NFSv4)
    /// on every append. A std mutex, never held across an await.
    known_dirs: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Bound on [`Shared::known_dirs`]; it is simply cleared when full.
const KNOWN_DIRS_MAX: usize = 100_000;

/// [`FsOps`] over NFSv3 or NFSv4.2 without a kernel mount. Cheap to clone.
#[derive(Clone)]
pub struct NfsFs {
    shared: Arc<Shared>,
}

impl fmt::Debug for NfsFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NfsFs")
            .field("target", &self.shared.target.to_string())
            .field("export", &self.shared.export)
            .field("base", &self.shared.base)
            .finish()
    }
}

/// A connection taken from its slot for one call. If the call's future is
/// dropped mid-RPC (a timeout), the connection may be out of step with the
/// server, so it is dropped and the next call reconnects.
struct Lease<'a> {
    guard: tokio::sync::MutexGuard<'a, Option<Conn>>,
    busy: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.busy {
            *self.guard = None;
        }
    }
}

impl Lease<'_> {
    async fn conn(&mut self, shared: &Shared) -> io::Result<&mut Conn> {
        self.busy = true;
        if self.guard.is_none() {
            *self.guard = Some(connect(shared, &shared.export).await?);
        }
        Ok(self.guard.as_mut().expect("just connected"))
    }

    fn done<T>(&mut self, r: nfs::Result<T>) -> nfs::Result<T> {
        self.busy = false;
        if let Err(e) = &r
            && !connection_ok(e)
        {
            *self.guard = None;
        }
        r
    }
}

async fn connect(shared: &Shared, export: &str) -> io::Result<Conn> {
    connect_target(&shared.target, export, shared.timeout)
        .await
        .map_err(|e| to_io("connect", &shared.target.to_string(), e))
}

async fn connect_target(t: &NfsTarget, export: &str, timeout: Duration) -> nfs::Result<Conn> {
    let port = t.port.unwrap_or(2049);
    match t.version {
        NfsVersion::V3 => {
            let export = if export.is_empty() { "/" } else { export };
            let mut b = nfs::v3::tokio::Client::builder(t.host.clone(), export)
                .nfs_port(port)
                .timeout(Some(timeout));
            if let Some(mp) = t.mount_port {
                b = b.mount_port(mp);
            }
            Ok(Conn::V3(Box::new(b.connect().await?)))
        }
        NfsVersion::V4 => {
            // A distinct owner per connection: each is its own NFSv4 client.
            let owner = format!(
                "bagel-{}-{:016x}",
                std::process::id(),
                rand::thread_rng().next_u64()
            );
            let c = nfs::v4::tokio::Client::builder(t.host.clone())
                .port(port)
                .owner_id(owner.into_bytes())
                .timeout(Some(timeout))
                .connect()
                .await?;
            Ok(Conn::V4(Box::new(c)))
        }
    }
}

impl NfsFs {
    /// Connects (finding the NFSv3 export), creates the store directory if
    /// missing, and returns the backend. `timeout` bounds each RPC.
    pub async fn connect(target: NfsTarget, timeout: Duration) -> io::Result<Self> {
        let (export, base, first) = match target.version {
            NfsVersion::V4 => {
                let c = connect_target(&target, "", timeout)
                    .await
                    .map_err(|e| to_io("connect", &target.to_string(), e))?;
                (String::new(), target.path.clone(), c)
            }
            NfsVersion::V3 => Self::mount_v3(&target, timeout).await?,
        };
        let mut first = first;
        first
            .mkdir_all(&base)
            .await
            .map_err(|e| to_io("mkdir", &base, e))?;
        let n = target.connections.max(1);
        let mut slots = Vec::with_capacity(n);
        slots.push(tokio::sync::Mutex::new(Some(first)));
        for _ in 1..n {
            slots.push(tokio::sync::Mutex::new(None));
        }
        Ok(NfsFs {
            shared: Arc::new(Shared {
                target,
                export,
                base,
                timeout,
                slots,
                next: AtomicUsize::new(0),
                known_dirs: Default::default(),
            }),
        })
    }

    /// Opens the store at an `nfs://` URL.
    pub async fn open(url: &str, timeout: Duration) -> io::Result<Self> {
        let t = NfsTarget::parse(url)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}")))?;
        Self::connect(t, timeout).await
    }

    /// MOUNTs the given export, or the longest prefix of the path that the
    /// server accepts.
    async fn mount_v3(t: &NfsTarget, timeout: Duration) -> io::Result<(String, String, Conn)> {
        let candidates: Vec<String> = match &t.export {
            Some(e) => vec![e.clone()],
            None => {
                let mut v = vec![t.path.clone()];
                let mut p = t.path.as_str();
                while let Some(i) = p.rfind('/') {
                    p = &p[..i];
                    v.push(p.to_owned());
                }
                v
            }
        };
        let mut errors = Vec::new();
        for export in candidates {
            match connect_target(t, &export, timeout).await {
                Ok(c) => {
                    let base = t.path[export.len()..].to_owned();
                    return Ok((export, base, c));
                }
                Err(e @ nfs::Error::Mount { .. }) => {
                    errors.push(format!("{}: {e}", if export.is_empty() { "/" } else { &export }))
                }
                Err(e) => return Err(to_io("mount", &export, e)),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{t}: no prefix of {:?} could be mounted over NFSv3 ({})",
                t.path,
                errors.join("; ")
            ),
        ))
    }

    /// The connection protocol and where the store root is on the server.
    pub fn target(&self) -> &NfsTarget {
        &self.shared.target
    }

    fn full(&self, rel: &str) -> String {
        join(&self.shared.base, rel)
    }

    fn known_dirs(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.shared.known_dirs.lock().expect("known_dirs lock poisoned")
    }

    /// Takes a free connection if there is one, else waits for the next in
    /// turn.
    async fn lease(&self) -> Lease<'_> {
        let slots = &self.shared.slots;
        let start = self.shared.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..slots.len() {
            if let Ok(guard) = slots[(start + i) % slots.len()].try_lock() {
                return Lease { guard, busy: false };
            }
        }
        Lease {
            guard: slots[start % slots.len()].lock().await,
            busy: false,
        }
    }
}

/// Runs one client call on a leased connection and maps its error.
macro_rules! call {
    ($self:ident, $op:literal, $path:expr, |$c:ident| $body:expr) => {{
        let path: &str = $path;
        let mut lease = $self.lease().await;
        let $c = lease.conn(&$self.shared).await?;
        let r = $body.await;
        lease.done(r).map_err(|e| to_io($op, path, e))
    }};
}

#[async_trait]
impl FsOps for NfsFs {
    fn describe(&self) -> String {
        self.shared.target.to_string()
    }

    async fn list_dir(&self, dir: &str) -> io::Result<Vec<DirEntry>> {
        let p = self.full(dir);
        // ganesha 4.3 answered READDIR with NFS4ERR_STALE while other
        // clients were changing the directory (six concurrent closers of one
        // bag); a listing is idempotent, so it is simply started over.
        let mut tries = 0;
        loop {
            let r = {
                let mut lease = self.lease().await;
                let c = lease.conn(&self.shared).await?;
                let r = c.list(&p).await;
                lease.done(r)
            };
            match r {
                Err(e) if restartable_listing(&e) && tries < LIST_RESTARTS => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                }
                r => return r.map_err(|e| to_io("READDIR", &p, e)),
            }
        }
    }

    async fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        let p = self.full(dir);
        if self.known_dirs().contains(&p) {
            return Ok(());
        }
        call!(self, "MKDIR", &p, |c| c.mkdir_all(&p))?;
        let mut known = self.known_dirs();
        if known.len() >= KNOWN_DIRS_MAX {
            known.clear();
        }
        known.insert(p);
        Ok(())
    }

    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> io::Result<bool> {
        let p = self.full(path);
        let created = call!(self, "CREATE", &p, |c| c.create_new(&p))?;
        if created && !contents.is_empty() {
            call!(self, "WRITE", &p, |c| c.write_at(&p, 0, contents, sync))?;
        }
        Ok(created)
    }

    async fn link(&self, from: &str, to: &str) -> io::Result<bool> {
        let (a, b) = (self.full(from), self.full(to));
        call!(self, "LINK", &b, |c| c.link(&a, &b))
    }

    async fn open_append(&self, path: &str) -> io::Result<(Box<dyn AppendFile>, FileStat)> {
        let p = self.full(path);
        // O_CREAT without O_EXCL, built from an exclusive create: never
        // UNCHECKED, which may reset the attributes (the mode) of a file that
        // exists.
        call!(self, "CREATE", &p, |c| c.create_new(&p)).inspect_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                self.known_dirs().clear(); // a directory we knew is gone
            }
        })?;
        let st = call!(self, "GETATTR", &p, |c| c.stat(&p))?;
        let file = NfsAppendFile {
            fs: self.clone(),
            path: p,
            offset: st.len,
        };
        Ok((Box::new(file), st))
    }

    async fn stat(&self, path: &str) -> io::Result<FileStat> {
        let p = self.full(path);
        call!(self, "GETATTR", &p, |c| c.stat(&p))
    }

    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes> {
        let p = self.full(path);
        call!(self, "READ", &p, |c| c.read(&p, limit)).map(Bytes::from)
    }

    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()> {
        let p = self.full(path);
        call!(self, "SETATTR", &p, |c| c.chmod(&p, mode))
    }

    async fn remove_private(&self, path: &str) -> io::Result<()> {
        let p = self.full(path);
        call!(self, "REMOVE", &p, |c| c.remove(&p))
    }
}

/// A data file opened for appending: the WRITE goes at the size seen when
/// it was opened (one writer per file, so nobody else moves the end).
#[derive(Debug)]
struct NfsAppendFile {
    fs: NfsFs,
    path: String,
    offset: u64,
}

#[async_trait]
impl AppendFile for NfsAppendFile {
    async fn append_and_close(self: Box<Self>, data: Bytes, sync: bool) -> io::Result<()> {
        let fs = &self.fs;
        let p = &self.path;
        call!(fs, "WRITE", p, |c| c.write_at(p, self.offset, &data, sync))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = NfsTarget::parse("nfs://127.0.0.1:2050/bagel/x/?version=4&connections=2").unwrap();
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, Some(2050));
        assert_eq!(t.path, "/bagel/x");
        assert_eq!(t.version, NfsVersion::V4);
        assert_eq!(t.connections, 2);
        assert_eq!(
            t.to_string(),
            "nfs://127.0.0.1:2050/bagel/x?version=4&connections=2"
        );
        assert_eq!(NfsTarget::parse(&t.to_string()).unwrap(), t);

        let t = NfsTarget::parse("nfs://h/e/d?mountport=20491&export=/e").unwrap();
        assert_eq!((t.port, t.mount_port), (None, Some(20491)));
        assert_eq!(t.export.as_deref(), Some("/e"));
        assert_eq!(t.version, NfsVersion::V3);
        assert_eq!(t.to_string(), "nfs://h/e/d?version=3&mountport=20491&export=/e");
        assert_eq!(NfsTarget::parse(&t.to_string()).unwrap(), t);

        let t = NfsTarget::parse("nfs://[::1]:20490/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", Some(20490), "")
        );

        for bad in [
            "nfs:///x",
            "nfs://h:x/",
            "nfs://h/a/../b",
            "nfs://h/x?version=2",
            "nfs://h/x?export=/y",
            "nfs://h/x?connections=0",
            "nfs://h/x?what=1",
            "file:///x",
        ] {
            assert!(NfsTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn joins_paths() {
        assert_eq!(join("", ""), "/");
        assert_eq!(join("", "a/b"), "/a/b");
        assert_eq!(join("/x", "a"), "/x/a");
        assert_eq!(join("/x", ""), "/x");
        assert!(is_prefix("", "/a"));
        assert!(is_prefix("/a", "/a/b"));
        assert!(!is_prefix("/a", "/ab"));
    }
}
