//! A watcher's stream ([`Subscription`]): the retained events it resumes
//! from, read out of the shared ring a chunk at a time, then the events
//! dispatched to its queue; progress; and unregistering when dropped.
//! Apart from the hub because it runs on the watcher's task, taking the
//! hub's lock only to read the ring or its progress.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::watcher::{Queue, Shared};
use super::{Event, Filter, Hub, Item, WatchError, lock};

/// Events a resuming watcher reads out of the retained ones per lock of
/// the hub (it scans at most [`BACKLOG_SCAN`] per lock): the backlog is a
/// view of the shared ring, read a little at a time, never a copy.
pub(super) const BACKLOG_CHUNK: usize = 64;
const BACKLOG_SCAN: usize = 4096;

/// A watcher's end: events retained since the revision it resumes from
/// (read from the ring a chunk at a time), then those dispatched to it.
/// Dropping it unregisters the watcher and frees its queue.
#[derive(Debug)]
pub struct Subscription {
    pub(super) hub: Arc<Hub>,
    pub(super) shared: Arc<Shared>,
    pub(super) filter: Filter,
    /// Resumed events read from the ring, not yet taken.
    pub(super) chunk: VecDeque<Arc<Event>>,
    /// The last revision of the ring read for the resume.
    pub(super) backlog_read: u64,
    /// The last revision when it subscribed: the resume reads up to it,
    /// the queue holds what comes after.
    pub(super) start: u64,
    /// Its end was handed out: nothing more comes.
    pub(super) done: bool,
}

impl Subscription {
    /// The next event; `Err` once the watcher was ended (dropped for
    /// falling behind after every event buffered for it, stalled, or
    /// renumbered), `None` after that.
    pub async fn next(&mut self) -> Option<Result<Arc<Event>, WatchError>> {
        loop {
            if let Some(r) = self.poll_ready() {
                return r;
            }
            // A notify between the look and the wait is kept as a permit.
            self.shared.notify.notified().await;
        }
    }

    /// What is ready now: `Some(None)` once ended and handed out, `None`
    /// when nothing is.
    fn poll_ready(&mut self) -> Option<Option<Result<Arc<Event>, WatchError>>> {
        if self.done {
            return Some(None);
        }
        loop {
            {
                let mut q = lock(&self.shared.queue);
                if matches!(q.ended, Some(WatchError::Stalled { .. })) {
                    self.chunk.clear();
                    self.backlog_read = self.start;
                }
                if let Some(e) = self.chunk.pop_front() {
                    q.sent = e.revision;
                    Self::delivered(&mut q, !self.chunk.is_empty() || self.backlog_read < self.start);
                    return Some(Some(Ok(e)));
                }
                if self.backlog_read >= self.start {
                    if q.backlog {
                        q.backlog = false;
                        Self::delivered(&mut q, false);
                    }
                    if let Some(e) = q.items.pop_front() {
                        q.sent = e.revision;
                        Self::delivered(&mut q, false);
                        return Some(Some(Ok(e)));
                    }
                    if let Some(err) = q.ended.take() {
                        self.done = true;
                        return Some(Some(Err(err)));
                    }
                    return None;
                }
            }
            self.read_backlog();
        }
    }

    /// Stamps a delivery: it made progress, and is owed more only if its
    /// queue (or resume) still holds some.
    fn delivered(q: &mut Queue, more: bool) {
        q.owed_since = (more || !q.items.is_empty()).then(std::time::Instant::now);
    }

    /// Reads the next chunk of the resume from the ring; if the ring moved
    /// past it, the watcher is dropped as overflowed, naming the last
    /// revision it was sent.
    fn read_backlog(&mut self) {
        let inner = lock(&self.hub.inner);
        if self.backlog_read < inner.oldest {
            drop(inner);
            let mut q = lock(&self.shared.queue);
            // This end, not one the live queue may have had meanwhile: the
            // resume broke first, and nothing after it is sent.
            q.ended = Some(WatchError::ResumeOverrun {
                retain: self.hub.cfg.retain,
                last: q.sent.max(self.backlog_read),
            });
            q.items = VecDeque::new();
            q.backlog = false;
            drop(q);
            self.hub.stats.overflowed.fetch_add(1, Ordering::Relaxed);
            self.backlog_read = self.start;
            self.hub.unsubscribe(self.shared.id);
            return;
        }
        let skip = inner.ring.partition_point(|e| e.revision <= self.backlog_read);
        let mut scanned = 0;
        for e in inner.ring.iter().skip(skip) {
            if e.revision > self.start || self.chunk.len() >= BACKLOG_CHUNK || scanned >= BACKLOG_SCAN {
                break;
            }
            scanned += 1;
            self.backlog_read = e.revision;
            if self.filter.matches(&e.event.name) {
                self.chunk.push_back(Arc::clone(e));
            }
        }
        if scanned == 0 || inner.ring.back().is_none_or(|e| e.revision <= self.backlog_read) {
            // Nothing more retained up to its start.
            self.backlog_read = self.backlog_read.max(self.start);
        }
    }

    /// The last revision when it subscribed: once the events resumed are
    /// sent (see [`Subscription::has_backlog`]), it has been sent every
    /// event it wants up to this one.
    pub fn start_revision(&self) -> u64 {
        self.start
    }

    /// Whether events resumed from before it subscribed are still to come.
    pub fn has_backlog(&self) -> bool {
        !self.done && (!self.chunk.is_empty() || self.backlog_read < self.start)
    }

    /// The next event if one is ready, else the revision up to which this
    /// watcher has been sent every event it wants: the hub's last revision,
    /// read under its lock with the watcher's queue empty (every event is
    /// numbered and queued under that lock, so none it wants is numbered
    /// up to there and unsent). `Err` once the watcher was ended, as
    /// [`Subscription::next`].
    pub fn progress(&mut self) -> Option<Result<Item, WatchError>> {
        if let Some(r) = self.poll_ready() {
            return r.map(|r| r.map(Item::Event));
        }
        let inner = lock(&self.hub.inner);
        let mut q = lock(&self.shared.queue);
        if let Some(e) = q.items.pop_front() {
            q.sent = e.revision;
            Self::delivered(&mut q, false);
            return Some(Ok(Item::Event(e)));
        }
        if let Some(err) = q.ended.take() {
            self.done = true;
            return Some(Err(err));
        }
        Some(Ok(Item::Progress(inner.last_rev)))
    }

    /// Like [`Subscription::next`] without waiting: `None` when nothing is
    /// ready.
    pub fn try_next(&mut self) -> Option<Result<Arc<Event>, WatchError>> {
        self.poll_ready().flatten()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(self.shared.id);
    }
}
