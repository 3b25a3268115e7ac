//! Why a watch cannot start or goes on no longer ([`WatchError`]): one
//! variant per way a stream ends, each message naming the flag or the
//! revision that lets the client resume.

use std::time::Duration;

use super::COUNT_BITS;

/// Why a watch cannot start or goes on no longer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error(
        "watcher fell behind: more than {buffer} events buffered for it (the server's \
         --watch-buffer); last revision sent {last}: watch again with from_revision {last}"
    )]
    Overflow { buffer: usize, last: u64 },
    #[error(
        "watcher fell behind: the events it was resuming from left the ones the server retains \
         (its last {retain} events, --watch-retain, within --watch-retain-bytes) before it read \
         them; last revision sent {last}: watch again with from_revision {last}"
    )]
    ResumeOverrun { retain: usize, last: u64 },
    #[error(
        "from_revision {from} is no longer retained: the oldest revision to resume from is \
         {oldest} (the server keeps the last {retain} events, --watch-retain, within \
         --watch-retain-bytes, and none from \
         before it last had a watcher or from an earlier incarnation); list the names again and \
         watch from now"
    )]
    TooOld { from: u64, oldest: u64, retain: usize },
    #[error(
        "from_revision {from} is of another incarnation ({theirs:06x}) than this server's \
         ({ours:06x}): it was given out before the server restarted, or by another server; list \
         the names again and watch from the List's revision"
    )]
    OtherIncarnation { from: u64, theirs: u32, ours: u32 },
    #[error("from_revision {from} is ahead of this server's last revision {last}")]
    Ahead { from: u64, last: u64 },
    #[error(
        "this server's watch revisions ran out of their {COUNT_BITS} bits after revision {last} \
         and start again in a new incarnation; list the names again and watch from the List's \
         revision"
    )]
    Renumbered { last: u64 },
    #[error(
        "watcher stalled: its client read nothing it was owed for {after:?} (the server's \
         --watch-stall-timeout); last revision sent {last}: watch again with from_revision {last}"
    )]
    Stalled { after: Duration, last: u64 },
    #[error("watchers on this server: limit {max} reached (the server's --max-watchers)")]
    TooMany { max: usize },
}
