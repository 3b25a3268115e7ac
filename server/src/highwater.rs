//! The granted-until high-water mark: the one thing a lease server keeps
//! across restarts (a few bytes beside its key file, never lease state).
//!
//! Why: a restarted server cannot know what its previous incarnation
//! granted, so it waits before granting. Waiting `max_ttl` is enough only
//! if the settings and the clock did not change: killed with `--max-ttl
//! 60s` and restarted with 10 s, it granted after 10.5 s while the old 60 s
//! leases were valid; with the clock stepped back, its fencing tokens
//! (grant times) came out lower than before. So before answering any grant
//! whose deadline would pass the mark, the server raises the mark in the
//! file (written and fsynced, then renamed over the old one), and on start
//! it waits until `max(mark, start + max_ttl) + clock tolerance` and starts
//! watermarks and fencing tokens there.
//!
//! The mark moves in coarse steps (`now + max_ttl + step`), so it is
//! written about once per `step` under load rather than per grant, and a
//! background task raises it ahead of need so grants rarely wait for the
//! disk. The price is that a restart right after a crash may wait up to
//! `step` longer than `max_ttl`.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bagel_proto::Micros;

use crate::error::Error;

/// What a start found in the file.
#[derive(Debug)]
pub enum Found {
    /// No file to keep the mark in (no key file given).
    NoFile,
    /// The file does not exist (first start, or deleted).
    Missing(PathBuf),
    /// The file exists but does not hold a mark.
    Unreadable(PathBuf, String),
    Mark(Micros),
}

/// The file name of the mark for a key file: `<key file>.granted-until`.
pub fn path_for_key(key: &Path) -> PathBuf {
    let mut name = key.as_os_str().to_owned();
    name.push(".granted-until");
    PathBuf::from(name)
}

/// Reads the mark a previous incarnation left.
pub fn load(path: Option<&Path>) -> Found {
    let Some(path) = path else { return Found::NoFile };
    match std::fs::read_to_string(path) {
        Ok(text) => match parse(&text) {
            Some(mark) => Found::Mark(mark),
            None => Found::Unreadable(
                path.to_owned(),
                format!(
                    "expected Unix microseconds, found {:?}",
                    text.chars().take(40).collect::<String>()
                ),
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Missing(path.to_owned()),
        Err(e) => Found::Unreadable(path.to_owned(), e.to_string()),
    }
}

fn parse(text: &str) -> Option<Micros> {
    text.split_whitespace()
        .next()?
        .parse()
        .ok()
        .map(Micros::from_micros)
}

/// The mark as this incarnation keeps it.
#[derive(Debug)]
pub struct HighWater {
    path: Option<PathBuf>,
    /// What the file durably says (or, without a file, what we would have
    /// written): no grant's deadline passes it.
    durable: AtomicU64,
    /// One writer at a time; the others wait for it and re-check.
    write: tokio::sync::Mutex<()>,
    max_ttl: Duration,
    step: Duration,
}

impl HighWater {
    /// Starts from `initial` (what the file said, or zero).
    pub fn new(path: Option<PathBuf>, initial: Micros, max_ttl: Duration, step: Duration) -> Self {
        HighWater {
            path,
            durable: AtomicU64::new(initial.as_micros()),
            write: tokio::sync::Mutex::new(()),
            max_ttl,
            step,
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The mark the file holds (0 before the first write).
    pub fn get(&self) -> Micros {
        Micros::from_micros(self.durable.load(Ordering::Acquire))
    }

    /// Returns once the file says at least `deadline`: call it before
    /// answering any grant with that deadline. Usually an atomic load; when
    /// the deadline passes the mark, raises it to `now + max_ttl + step`
    /// (covering every deadline grantable for a while) and waits for the
    /// disk. A failed write refuses the grant: granting past a mark the
    /// next incarnation cannot read would undo the guarantee.
    pub async fn cover(&self, deadline: Micros, now: Micros) -> Result<(), Error> {
        if deadline <= self.get() {
            return Ok(());
        }
        let _writer = self.write.lock().await;
        if deadline <= self.get() {
            return Ok(());
        }
        let mark = deadline.max(now.saturating_add(self.max_ttl + self.step));
        if let Some(path) = self.path.clone() {
            tokio::task::spawn_blocking(move || write(&path, mark))
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r)
                .map_err(|e| Error::Capacity {
                    detail: format!(
                        "cannot record the granted-until mark in {}: {e}; refusing to grant \
                         (a restart could not know how long to wait)",
                        self.path.as_deref().unwrap_or(Path::new("?")).display()
                    ),
                })?;
        }
        self.durable.fetch_max(mark.as_micros(), Ordering::AcqRel);
        Ok(())
    }

    /// Raises the mark ahead of need, so that grants in the next `step`
    /// find it already written.
    pub async fn keep_ahead(&self, now: Micros) -> Result<(), Error> {
        self.cover(now.saturating_add(self.max_ttl + self.step / 2), now)
            .await
    }
}

/// Writes `mark` to a temporary file, fsyncs it, renames it over `path`
/// and fsyncs the directory: a crash leaves the old mark or the new one,
/// never a torn one.
///
/// The temporary file is created exclusively (`O_EXCL`, which never
/// follows a link), after removing whatever a crash left at its name: a
/// link planted there (the key's directory writable by someone else) is
/// removed, never written through, so the mark cannot overwrite the file
/// it names.
fn write(path: &Path, mark: Micros) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        writeln!(f, "{} {}", mark.as_micros(), mark)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_mark_is_written_ahead_in_steps_and_read_back() {
        let dir = std::env::temp_dir().join(format!("bagel-hw-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = path_for_key(&dir.join("server.key"));
        assert!(matches!(load(Some(&path)), Found::Missing(_)));
        let sec = Duration::from_secs(1);
        let hw = HighWater::new(Some(path.clone()), Micros::ZERO, 10 * sec, sec);
        let now = Micros::from_micros(1_000_000_000);
        hw.cover(now.saturating_add(5 * sec), now).await.unwrap();
        let mark = now.saturating_add(11 * sec);
        assert_eq!(hw.get(), mark);
        assert!(matches!(load(Some(&path)), Found::Mark(m) if m == mark));
        // Deadlines under the mark write nothing.
        std::fs::remove_file(&path).unwrap();
        hw.cover(mark, now).await.unwrap();
        assert!(matches!(load(Some(&path)), Found::Missing(_)));
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(load(Some(&path)), Found::Unreadable(..)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A link planted at the temporary name is removed, not written
    /// through: the file it names keeps its bytes, and the mark lands in
    /// a regular file of its own.
    #[tokio::test]
    async fn a_planted_link_at_the_temporary_name_is_not_followed() {
        let dir = std::env::temp_dir().join(format!("bagel-hw-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = path_for_key(&dir.join("server.key"));
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let sec = Duration::from_secs(1);
        let hw = HighWater::new(Some(path.clone()), Micros::ZERO, 10 * sec, sec);
        let now = Micros::from_micros(1_000_000_000);
        hw.cover(now.saturating_add(5 * sec), now).await.unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file(), "{meta:?}");
        assert!(matches!(load(Some(&path)), Found::Mark(m) if m == now.saturating_add(11 * sec)));
        assert!(
            std::fs::symlink_metadata(&tmp).is_err(),
            "the temporary name is gone"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
