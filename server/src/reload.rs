//! Files the server reads again while it runs (the access policy, the
//! member lists): on SIGHUP, and whenever the file changes, looked at
//! every [`POLL`].
//!
//! What "changes" means is [`Stamp`]: the file's identity and times, not
//! its modified time alone, which a file put in place with the old one's
//! time and length would not move. A changed file is read once its stamp
//! has stayed the same for a whole poll: a file rewritten in place is
//! empty (truncated) or half written for a moment, and read then it put a
//! policy granting nothing in effect until the next poll (`bagel-chaos`
//! saw a known token refused as unknown).

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

/// What a look at a reloadable file found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// The file is as it was last read.
    Unchanged,
    /// It is another, or changed, since it was last read: its stamp now
    /// (`None`: it cannot be looked at).
    Changed(Option<Stamp>),
}

impl Look {
    /// `path` now, against `seen`, the stamp it was last read at.
    pub fn at(path: &Path, seen: Option<Stamp>) -> Look {
        let now = Stamp::of(path);
        if now == seen {
            Look::Unchanged
        } else {
            Look::Changed(now)
        }
    }
}

/// `read` of `path`, if the file stayed the same while it ran: what it
/// read and the stamp it was read at. `None` when the file was written
/// meanwhile: what was read may be half of it (a truncated file reads as
/// empty), so it is not put in effect, and the file is not marked read,
/// so the looks read it again once it settles. `what` and `why` are for
/// the log line.
pub fn read_whole<T>(
    path: &Path,
    what: &str,
    why: &str,
    read: impl FnOnce(&Path) -> T,
) -> Option<(T, Option<Stamp>)> {
    let before = Stamp::of(path);
    let read = read(path);
    if Stamp::of(path) != before {
        tracing::info!(path = %path.display(), why, "{what} changed while read: read again once the file settles");
        return None;
    }
    Some((read, before))
}

/// A file the server reads again while it runs.
pub trait Reloadable: Send + Sync + 'static {
    /// Whether the file is another, or changed, since it was last read.
    fn look(&self) -> Look;
    /// Reads the file again and puts it in effect if it is usable (else
    /// the log says why, and what is in effect stays); `why` is what
    /// prompted it ([`SIGHUP`] or [`CHANGED`]).
    fn reload(&self, why: &str);
}

/// Reloads `file` on SIGHUP (at once: whoever sends it has written the
/// file), and when it changed and then stayed the same for one look
/// (looked at every `every`), until `cancel`.
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
    // The stamp of a change seen at the last look, not yet read.
    let mut settling = None;
    loop {
        let hup = async {
            match hangup.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = hup => {
                file.reload(SIGHUP);
                settling = None;
            }
            _ = tick.tick() => match file.look() {
                Look::Unchanged => settling = None,
                Look::Changed(now) if settling == Some(now) => {
                    file.reload(CHANGED);
                    settling = None;
                }
                Look::Changed(now) => settling = Some(now),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use tokio_util::sync::CancellationToken;

    use super::*;

    /// A file whose looks follow a script; the watch is cancelled when
    /// the script is over. Records after which look each reload came.
    struct Scripted {
        looks: Mutex<VecDeque<Look>>,
        seen: Mutex<usize>,
        reloads: Mutex<Vec<usize>>,
        done: CancellationToken,
    }

    impl Reloadable for Scripted {
        fn look(&self) -> Look {
            *self.seen.lock().unwrap() += 1;
            self.looks.lock().unwrap().pop_front().unwrap_or_else(|| {
                self.done.cancel();
                Look::Unchanged
            })
        }
        fn reload(&self, why: &str) {
            assert_eq!(why, CHANGED);
            self.reloads.lock().unwrap().push(*self.seen.lock().unwrap());
        }
    }

    fn stamp(len: u64) -> Option<Stamp> {
        Some(Stamp {
            dev: 1,
            ino: 2,
            len,
            modified: (3, len as i64),
            changed: (3, len as i64),
        })
    }

    /// The looks after which `looks` makes the watch reload.
    async fn reloads_after(looks: &[Look]) -> Vec<usize> {
        let file = Arc::new(Scripted {
            looks: Mutex::new(looks.iter().copied().collect()),
            seen: Mutex::new(0),
            reloads: Mutex::new(Vec::new()),
            done: CancellationToken::new(),
        });
        // The script, not the clock, decides: a short poll only keeps it quick.
        watch(
            Arc::clone(&file),
            "test file",
            Duration::from_millis(1),
            file.done.clone(),
        )
        .await;
        file.reloads.lock().unwrap().clone()
    }

    /// A file rewritten in place is seen truncated (empty) at one look and
    /// written at the next: it is read only when a look finds it as the
    /// one before did, never while it was changing. Before, the empty
    /// file was read at once and its policy (granting nothing) was in
    /// effect until the next poll.
    #[tokio::test]
    async fn a_changed_file_is_read_once_it_stayed_the_same_for_a_look() {
        use Look::{Changed, Unchanged};
        let (empty, written) = (Changed(stamp(0)), Changed(stamp(900)));
        assert_eq!(reloads_after(&[empty, written, written, Unchanged]).await, [3]);
        // Changed and back (or read by SIGHUP meanwhile): nothing to read.
        assert!(reloads_after(&[empty, Unchanged, Unchanged]).await.is_empty());
        // A file that cannot be looked at is tried once it stays so (the
        // reload fails and keeps what is in effect).
        assert_eq!(reloads_after(&[Changed(None), Changed(None)]).await, [2]);
    }

    /// A read during which the file was written (here by the read itself,
    /// as a writer between its system calls would) gives nothing to put in
    /// effect; a read of a file that stayed the same gives what it read
    /// and the stamp it was read at.
    #[test]
    fn a_file_written_while_it_was_read_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy");
        std::fs::write(&path, "whole").unwrap();
        let read = read_whole(&path, "test file", CHANGED, |p| {
            let text = std::fs::read_to_string(p).unwrap();
            std::fs::write(p, "").unwrap();
            text
        });
        assert_eq!(read, None);
        std::fs::write(&path, "whole again").unwrap();
        let read = read_whole(&path, "test file", CHANGED, |p| {
            std::fs::read_to_string(p).unwrap()
        });
        assert_eq!(read, Some(("whole again".to_owned(), Stamp::of(&path))));
    }
}
