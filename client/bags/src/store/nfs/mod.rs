//! [`FsOps`] over a userspace NFS client (the [`nfs`] crate, NFSv3 and
//! NFSv4.2 over TCP), for hosts that cannot mount NFS. The bag protocol in
//! [`directory`](crate::store::directory) runs unchanged on top. Why this crate, which NFS
//! operations each [`FsOps`] call becomes, and what NFS semantics the
//! protocol designs around: see `../NFS.md`.
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

pub(crate) mod conn;
mod target;

use crate::store::fsops::{AppendFile, DirEntry, FileStat, FsOps};

use conn::{
    Conn, LIST_RESTARTS, READ_RESTARTS, connection_ok, join, restartable_listing, restartable_read, to_io,
};
pub use target::{NfsTarget, NfsVersion};

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

impl NfsFs {
    /// GETATTR of `p` (full path), refusing by name what is not a regular
    /// file (or a directory when `dir_ok`): a symbolic link, FIFO, socket
    /// or device, with the directory store's words and error kind.
    async fn plain(&self, p: &str, dir_ok: bool) -> io::Result<FileStat> {
        let (st, kind) = call!(self, "GETATTR", p, |c| c.stat(p))?;
        crate::store::fsops::refuse_unless_plain(kind, dir_ok)?;
        Ok(st)
    }
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
        let st = self.plain(&p, false).await?;
        let file = NfsAppendFile {
            fs: self.clone(),
            path: p,
            offset: st.len,
        };
        Ok((Box::new(file), st))
    }

    async fn stat(&self, path: &str) -> io::Result<FileStat> {
        let p = self.full(path);
        self.plain(&p, true).await
    }

    /// Reads no more than the file held at GETATTR (nor than `limit`), and
    /// only a regular file: as the directory store does.
    async fn read(&self, path: &str, limit: Option<u64>) -> io::Result<Bytes> {
        let p = self.full(path);
        let st = self.plain(&p, false).await?;
        let n = limit.map_or(st.len, |l| l.min(st.len));
        let mut tries = 0;
        loop {
            let r = {
                let mut lease = self.lease().await;
                let c = lease.conn(&self.shared).await?;
                let r = c.read(&p, Some(n)).await;
                lease.done(r)
            };
            match r {
                Err(e) if restartable_read(&e) && tries < READ_RESTARTS => {
                    tries += 1;
                    tracing::debug!(path = %p, error = %e, "NFS read lost its open state; reading again");
                    tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                }
                r => return r.map(Bytes::from).map_err(|e| to_io("READ", &p, e)),
            }
        }
    }

    async fn chmod(&self, path: &str, mode: u32) -> io::Result<()> {
        let p = self.full(path);
        self.plain(&p, true).await?;
        call!(self, "SETATTR", &p, |c| c.chmod(&p, mode))
    }

    async fn remove(&self, path: &str) -> io::Result<()> {
        let p = self.full(path);
        call!(self, "REMOVE", &p, |c| c.remove(&p))
    }

    async fn remove_dir(&self, path: &str) -> io::Result<()> {
        let p = self.full(path);
        call!(self, "RMDIR", &p, |c| c.rmdir(&p))
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
