//! Files the server reads again while it runs (the access policy, the
//! member lists): on SIGHUP, and whenever the file changes, looked at
//! every [`POLL`].
//!
//! What "changes" means is [`Stamp`]: the file's identity and times, not
//! its modified time alone, which a file put in place with the old one's
//! time and length would not move.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How often a reloadable file's [`Stamp`] is looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// What prompted a reload when it was SIGHUP (the log line's `why`).
pub const SIGHUP: &str = "SIGHUP";

/// What prompted a reload when the poll saw the file change.
pub const CHANGED: &str = "the file changed";

/// What identifies one version of a file without reading it: the file
/// (device and inode: a file renamed over it is another), its length, and
/// its modified and changed times to the nanosecond. The modified time
/// alone misses a file put in place with the old one's time (`touch -r`,
/// `cp -p`, `rsync -t`) and the same length; the changed time cannot be
/// set back by anyone but the kernel, so an edit in place is seen too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Stamp {
    /// The file's stamp now; `None` when it cannot be looked at.
    pub fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// A file the server reads again while it runs.
pub trait Reloadable: Send + Sync + 'static {
    /// Whether the file is another, or changed, since it was last read.
    fn changed(&self) -> bool;
    /// Reads the file again and puts it in effect if it is usable (else
    /// the log says why, and what is in effect stays); `why` is what
    /// prompted it ([`SIGHUP`] or [`CHANGED`]).
    fn reload(&self, why: &str);
}

/// Reloads `file` on SIGHUP, and when it changes (looked at every
/// `every`), until `cancel`.
pub async fn watch<R: Reloadable>(
    file: Arc<R>,
    what: &'static str,
    every: Duration,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP: the {what} reloads only when its file changes");
            None
        }
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let hup = async {
            match hangup.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = hup => file.reload(SIGHUP),
            _ = tick.tick() => {
                if file.changed() {
                    file.reload(CHANGED);
                }
            }
        }
    }
}
