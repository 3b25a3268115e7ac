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
//! else `~/.local/state/bagel`. A release on another machine than the
//! writes must pass `--watermark`.

use std::fs::{File, TryLockError};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use bagel_client::Micros;
use bagel_proto::rights::WriteSummary;
use sha2::{Digest as _, Sha256};

/// What a released lease's lock file says.
const RELEASED: &str = "released\n";

/// Lock files of released leases are removed after this long (a writer
/// that finds none would still be refused by the lease's deadline).
const KEEP_RELEASED: Duration = Duration::from_secs(24 * 3600);

/// Where the CLI keeps its state (written-state files, the S3 lease key,
/// `bagel run`'s lease files).
pub fn state_dir() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("BAGEL_STATE_DIR")
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("bagel")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/bagel")))
        .unwrap_or_else(|| std::env::temp_dir().join("bagel-state"))
}

fn leases_dir() -> PathBuf {
    state_dir().join("leases")
}

/// `<state dir>/leases/<stem>.<ext>` for a lease id.
fn path(lease_id: &str, ext: &str) -> anyhow::Result<PathBuf> {
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
    Ok(leases_dir().join(format!("{stem}.{ext}")))
}

fn open_lock(lease_id: &str) -> anyhow::Result<File> {
    let path = path(lease_id, "lock")?;
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
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
        let path = path(lease_id, "written")?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
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
    let path = path(lease_id, "written")?;
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(summarize(&t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(WriteSummary::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
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
        if let Ok(path) = path(&self.lease_id, "written") {
            let _ = std::fs::remove_file(path);
        }
        prune_released();
    }
}

/// Removes the lock files of leases released over [`KEEP_RELEASED`] ago,
/// so the state directory does not grow with every lease ever used.
fn prune_released() {
    let Ok(dir) = std::fs::read_dir(leases_dir()) else {
        return;
    };
    for entry in dir.filter_map(Result::ok) {
        let path = entry.path();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > KEEP_RELEASED);
        if old
            && path.extension().is_some_and(|e| e == "lock")
            && std::fs::read_to_string(&path).is_ok_and(|t| t == RELEASED)
        {
            let _ = std::fs::remove_file(&path);
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
