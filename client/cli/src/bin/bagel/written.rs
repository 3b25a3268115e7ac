//! What `bagel write` wrote under a lease, kept for whoever releases it
//! (`bagel release`, `bagel acquire --hold`, `bagel run`): the release must
//! publish at least the highest timestamp written, or the next holder
//! could write below acknowledged messages.
//!
//! Two files per lease in `<state dir>/leases/`:
//! * `<lease id>.written`, one line per record, appended and fsynced:
//!   `<highest µs> p <run>` **before** a batch is handed to the store
//!   (so a `bagel write` killed at any instant, even by SIGKILL, leaves
//!   what it may have written), and `<highest µs> <uncertain 0|1> <run>`
//!   when the run ends. A run with a `p` line and no final line was cut
//!   off: its last batch may still land, so the release says "unsettled".
//!   (Lines without a run, `<µs> <0|1>`, are final lines of older
//!   versions.) Appends of a line are atomic, so concurrent writers under
//!   one lease are fine.
//! * `<lease id>.lock`: every `bagel write` holds a shared `flock` on it
//!   while it runs; a release takes it exclusively, so it waits for the
//!   writers of the lease to end before it reads what they wrote, and
//!   marks the file `released` so that no `bagel write` starts under the
//!   lease after. The kernel drops a killed process's lock: a `kill -9`
//!   never leaves the lease unreleasable.
//!
//! The state directory is `$BAGEL_STATE_DIR`, else `$XDG_STATE_HOME/bagel`,
//! else `~/.local/state/bagel`, else (no `HOME`) `$TMPDIR/bagel-<uid>`. A
//! release on another machine than the writes must pass `--watermark`.
//!
//! Every file bagel keeps (these, `bagel run`'s lease files, the S3 lease
//! key) holds or guards a secret, so it lives in a [`PrivateDir`]: a
//! directory opened without following a link and checked to be this
//! user's and writable by no one else, created 0700 when missing. Anything
//! else is refused, naming it: in a directory another user can write to,
//! a planted symbolic link would receive a lease's token and holder key
//! (and a later write would overwrite whatever file the link names). The
//! fallback without `HOME` is a directory per user, never one shared name
//! in `/tmp` that whoever comes first owns.

use std::fs::{File, TryLockError};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use bagel_client::Micros;
use bagel_proto::rights::WriteSummary;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest as _, Sha256};

/// What a released lease's lock file says.
const RELEASED: &str = "released\n";

/// Lock files of released leases are removed after this long (a writer
/// that finds none would still be refused by the lease's deadline).
const KEEP_RELEASED: Duration = Duration::from_secs(24 * 3600);

/// Where the CLI keeps its state (written-state files, the S3 lease key,
/// `bagel run`'s lease files), before any check: [`state_subdir`] and
/// [`state_dir_checked`] create and check it.
fn state_dir() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("BAGEL_STATE_DIR")
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("bagel")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/bagel")))
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("bagel-{}", rustix::process::geteuid().as_raw()))
        })
}

/// A directory bagel writes private files in, opened and checked: not a
/// symbolic link, a directory, owned by this user (effective uid) and not
/// writable by group or others. Files are made relative to the open
/// directory, so a path swapped after the check changes nothing.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl PrivateDir {
    /// Opens `path` as a private directory, creating it (and any missing
    /// parent) mode 0700 first; `what` names it in refusals ("the state
    /// directory"). Refused, naming it: a link, not a directory, owned by
    /// another user, or writable by group or others.
    pub fn open(path: &Path, what: &str) -> anyhow::Result<PrivateDir> {
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
        {
            // A link or a file there is refused below, by what it is.
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(e).with_context(|| format!("creating {what} {}", path.display()));
            }
        }
        let fd = rustix::fs::open(path, dir_flags(), Mode::empty()).map_err(|e| refusal(path, what, e))?;
        check(&fd, path, what, FileType::Directory)?;
        Ok(PrivateDir {
            path: path.to_owned(),
            fd,
        })
    }

    /// Its subdirectory `name`, created 0700 when missing and checked
    /// alike.
    pub fn subdir(&self, name: &str, what: &str) -> anyhow::Result<PrivateDir> {
        let path = self.path.join(name);
        match rustix::fs::mkdirat(&self.fd, name, Mode::RWXU) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e).with_context(|| format!("creating {what} {}", path.display())),
        }
        let fd = rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty())
            .map_err(|e| refusal(&path, what, e))?;
        check(&fd, &path, what, FileType::Directory)?;
        Ok(PrivateDir { path, fd })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Opens the file `name` in it, creating it (0600) when missing, for
    /// records that several `bagel` processes share (appended lines, a
    /// lock): never through a link, and only a regular file of this user.
    fn open_shared_file(&self, name: &str, flags: OFlags) -> anyhow::Result<File> {
        let path = self.path.join(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            // NONBLOCK: a FIFO found there fails the check instead of
            // hanging the open.
            flags | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| refusal(&path, "the state file", e))?;
        check(&fd, &path, "the state file", FileType::RegularFile)?;
        Ok(File::from(fd))
    }

    /// Opens the file `name` in it for reading, `None` when there is none;
    /// never through a link.
    fn read_file(&self, name: &str) -> anyhow::Result<Option<String>> {
        let path = self.path.join(name);
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(refusal(&path, "the state file", e)),
        };
        check(&fd, &path, "the state file", FileType::RegularFile)?;
        let mut text = String::new();
        File::from(fd)
            .read_to_string(&mut text)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(Some(text))
    }

    /// Removes the entry `name` (a link itself, never what it names).
    fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Why opening `path` failed, in words: a link is named as one.
fn refusal(path: &Path, what: &str, e: Errno) -> anyhow::Error {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if is_link {
        anyhow::anyhow!(
            "refusing {what} {}: it is a symbolic link, and bagel never writes through one (in a \
             directory others can write to, a planted link would receive lease tokens and keys)",
            path.display()
        )
    } else if e == Errno::NOTDIR {
        anyhow::anyhow!("refusing {what} {}: it is not a directory", path.display())
    } else {
        anyhow::Error::new(std::io::Error::from(e)).context(format!("opening {what} {}", path.display()))
    }
}

/// Refuses `fd` (opened from `path`) unless it is a `kind` owned by this
/// user that neither group nor others can write to.
fn check(fd: &OwnedFd, path: &Path, what: &str, kind: FileType) -> anyhow::Result<()> {
    let st = rustix::fs::fstat(fd).with_context(|| format!("checking {what} {}", path.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if FileType::from_raw_mode(st.st_mode) != kind {
        let want = if kind == FileType::Directory {
            "a directory"
        } else {
            "a regular file"
        };
        bail!("refusing {what} {}: it is not {want}", path.display());
    }
    if st.st_uid != me {
        bail!(
            "refusing {what} {}: it is owned by uid {}, not by this user (uid {me}); bagel keeps lease \
             tokens and keys only where no one else can plant or swap files (remove it, or set \
             BAGEL_STATE_DIR to a directory of yours)",
            path.display(),
            st.st_uid
        );
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        bail!(
            "refusing {what} {}: its mode {mode:04o} lets others write to it; bagel keeps lease tokens \
             and keys only where no one else can plant or swap files (chmod go-w it, or choose another)",
            path.display()
        );
    }
    Ok(())
}

/// The state directory, created and checked (see [`PrivateDir`]).
pub fn state_dir_checked() -> anyhow::Result<PrivateDir> {
    PrivateDir::open(&state_dir(), "the state directory")
}

/// `<state dir>/<name>`, both created and checked.
pub fn state_subdir(name: &str) -> anyhow::Result<PrivateDir> {
    state_dir_checked()?.subdir(name, "the state directory")
}

fn leases_dir() -> anyhow::Result<PrivateDir> {
    state_subdir("leases")
}

/// `<stem>.<ext>`, the name of a lease's state file in `<state dir>/leases/`.
fn file_name(lease_id: &str, ext: &str) -> anyhow::Result<String> {
    if lease_id.is_empty() {
        bail!("an empty lease id names no state file");
    }
    // A server's ids (32 hex digits) name their file as they are; an id
    // that is not a plain file name (a lease over several servers:
    // `KEYID:LEASEID,...`) by its SHA-256.
    let plain = lease_id.len() <= 64
        && !lease_id.starts_with('.')
        && lease_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    let stem = if plain {
        lease_id.to_owned()
    } else {
        let digest = Sha256::digest(lease_id.as_bytes());
        format!("sha256-{}", bagel_proto::hex::encode(&digest[..16]))
    };
    Ok(format!("{stem}.{ext}"))
}

fn open_lock(lease_id: &str) -> anyhow::Result<File> {
    let name = file_name(lease_id, "lock")?;
    leases_dir()?.open_shared_file(&name, OFlags::RDWR)
}

fn says_released(lock: &mut File) -> anyhow::Result<bool> {
    let mut text = String::new();
    lock.rewind()?;
    lock.read_to_string(&mut text)?;
    Ok(text == RELEASED)
}

/// One `bagel write` run's record of what it writes under a lease, holding
/// the lease's lock (shared) for as long as it lives.
#[derive(Debug)]
pub struct WriteRecord {
    lease_id: String,
    run: String,
    file: Mutex<File>,
    sync: bool,
    pending: Mutex<bool>,
    _lock: File,
}

impl WriteRecord {
    /// Takes the lease's lock (shared with other writers); refuses while
    /// the lease is being released or once it has been. `sync: false`
    /// skips the fsync of each record (`bagel write --no-sync`).
    pub fn open(lease_id: &str, sync: bool) -> anyhow::Result<WriteRecord> {
        let mut lock = open_lock(lease_id)?;
        match lock.try_lock_shared() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                bail!("lease {lease_id} is being released: no more writes under it")
            }
            Err(TryLockError::Error(e)) => return Err(e).context("locking the lease's state file"),
        }
        if says_released(&mut lock)? {
            bail!("lease {lease_id} was released: no more writes under it (acquire a new one)");
        }
        let name = file_name(lease_id, "written")?;
        let file = leases_dir()?.open_shared_file(&name, OFlags::WRONLY | OFlags::APPEND)?;
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Ok(WriteRecord {
            lease_id: lease_id.to_owned(),
            run: format!("{}-{nanos:09}", std::process::id()),
            file: Mutex::new(file),
            sync,
            pending: Mutex::new(false),
            _lock: lock,
        })
    }

    fn append(&self, line: &str) -> anyhow::Result<()> {
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        f.write_all(line.as_bytes())
            .and_then(|()| if self.sync { f.sync_data() } else { Ok(()) })
            .with_context(|| format!("recording what was written under lease {}", self.lease_id))
    }

    /// Records, durably, that timestamps up to `up_to` are about to be
    /// handed to the store.
    pub fn before_write(&self, up_to: Micros) -> anyhow::Result<()> {
        self.append(&format!("{} p {}\n", up_to.as_micros(), self.run))?;
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = true;
        Ok(())
    }

    /// Records how the run ended: what it wrote and whether some write may
    /// still land. The lock is let go when the record is dropped.
    pub fn finish(&self, written: WriteSummary) -> anyhow::Result<()> {
        let pending = *self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        match written.max_written {
            Some(up_to) => self.append(&format!(
                "{} {} {}\n",
                up_to.as_micros(),
                u8::from(written.uncertain),
                self.run
            )),
            // Nothing handed to the store, but a `p` line may stand for a
            // batch refused after it: close it.
            None if pending => self.append(&format!("0 0 {}\n", self.run)),
            None => Ok(()),
        }
    }
}

/// Everything recorded in a written-state file's text.
fn summarize(text: &str) -> WriteSummary {
    let mut sum = WriteSummary::default();
    let mut open_runs: Vec<&str> = Vec::new();
    let mut ended_runs: Vec<&str> = Vec::new();
    // A torn last line (a crash mid-append) is ignored; whole lines count.
    for line in text.lines() {
        let mut f = line.split(' ');
        let (Some(Ok(up_to)), Some(flag)) = (f.next().map(str::parse::<u64>), f.next()) else {
            continue;
        };
        let run = f.next();
        if up_to > 0 {
            sum.max_written = sum.max_written.max(Some(Micros::from_micros(up_to)));
        }
        match (flag, run) {
            ("p", Some(run)) => open_runs.push(run),
            ("1", _) => sum.uncertain = true,
            (_, Some(run)) => ended_runs.push(run),
            _ => {}
        }
    }
    // A run cut off after handing a batch to the store: it may land.
    sum.uncertain |= open_runs.iter().any(|r| !ended_runs.contains(r));
    sum
}

/// Everything recorded under `lease_id` (nothing when no file).
pub fn load(lease_id: &str) -> anyhow::Result<WriteSummary> {
    let name = file_name(lease_id, "written")?;
    Ok(leases_dir()?
        .read_file(&name)?
        .map_or_else(WriteSummary::default, |t| summarize(&t)))
}

/// A lease's lock, held exclusively: no `bagel write` of the lease runs
/// while it is held.
#[derive(Debug)]
pub struct ReleaseLock {
    lease_id: String,
    lock: File,
}

/// Takes the lease's lock exclusively, waiting (and saying so) while a
/// `bagel write` of the lease still runs.
pub async fn lock_for_release(lease_id: &str) -> anyhow::Result<ReleaseLock> {
    let lock = open_lock(lease_id)?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            eprintln!(
                "bagel: waiting for the `bagel write` runs of lease {lease_id} to end: the release must \
                 publish what they wrote"
            );
            let lock = lock.try_clone()?;
            tokio::task::spawn_blocking(move || lock.lock())
                .await
                .context("waiting for the lease's lock")?
                .context("locking the lease's state file")?;
        }
        Err(TryLockError::Error(e)) => return Err(e).context("locking the lease's state file"),
    }
    Ok(ReleaseLock {
        lease_id: lease_id.to_owned(),
        lock,
    })
}

impl ReleaseLock {
    /// What the writers of the lease recorded.
    pub fn written(&self) -> anyhow::Result<WriteSummary> {
        load(&self.lease_id)
    }

    /// The lease is released: no `bagel write` may start under it; its
    /// record is no longer needed. Also clears lock files of leases
    /// released long ago.
    pub fn released(mut self) {
        let marked = self
            .lock
            .set_len(0)
            .and_then(|()| self.lock.rewind())
            .and_then(|()| self.lock.write_all(RELEASED.as_bytes()));
        if let Err(e) = marked {
            tracing::warn!(error = %e, lease = %self.lease_id, "could not mark the lease released");
        }
        if let (Ok(name), Ok(dir)) = (file_name(&self.lease_id, "written"), leases_dir()) {
            dir.remove(&name);
            prune_released(&dir);
        }
    }
}

/// Removes the lock files of leases released over [`KEEP_RELEASED`] ago,
/// so the state directory does not grow with every lease ever used.
fn prune_released(dir: &PrivateDir) {
    let Ok(entries) = std::fs::read_dir(dir.path()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.ends_with(".lock")) else {
            continue;
        };
        // Regular files only (`DirEntry::metadata` does not follow links).
        let old = entry
            .metadata()
            .ok()
            .filter(std::fs::Metadata::is_file)
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > KEEP_RELEASED);
        if old && dir.read_file(name).is_ok_and(|t| t.as_deref() == Some(RELEASED)) {
            dir.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_cut_off_after_handing_a_batch_to_the_store_is_unsettled() {
        let s = summarize("100 p a\n120 p a\n120 0 a\n130 p b\n");
        assert_eq!(s.max_written, Some(Micros::from_micros(130)));
        assert!(s.uncertain, "run b never ended");
        let s = summarize("100 p a\n120 0 a\n90 0\n");
        assert_eq!(s.max_written, Some(Micros::from_micros(120)));
        assert!(!s.uncertain);
        let s = summarize("100 p a\n0 0 a\n");
        assert_eq!(
            s.max_written,
            Some(Micros::from_micros(100)),
            "a p line is an upper bound"
        );
        assert!(!s.uncertain);
    }

    #[test]
    fn old_lines_and_torn_tails_still_count() {
        let s = summarize("100 0\n200 1\n30");
        assert_eq!(s.max_written, Some(Micros::from_micros(200)));
        assert!(s.uncertain);
    }
}
