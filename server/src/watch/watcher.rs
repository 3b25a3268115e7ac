//! One watcher as the hub and its stream share it: its bounded queue of
//! shared events and how it ended ([`Queue`]), behind the lock and the
//! wake-up of [`Shared`]. The hub's side (dispatch, stall and overflow)
//! and the stream's side ([`super::Subscription`]) both work on it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::{Event, Filter, WatchError, lock};

/// A watcher's queue: the events dispatched to it and not yet taken (each
/// an `Arc` of the ring's event, never a copy), and how it ended.
#[derive(Debug)]
pub(super) struct Queue {
    pub(super) items: VecDeque<Arc<Event>>,
    /// The last revision queued (or, before any, the one it started at).
    pub(super) last: u64,
    /// The last revision taken by its stream.
    pub(super) sent: u64,
    pub(super) ended: Option<WatchError>,
    /// Since when it has been owed something (a queued event or retained
    /// ones it resumes from) without taking any: what the stall bound
    /// ([`WatchConfig::stall`](super::WatchConfig::stall)) is measured against.
    pub(super) owed_since: Option<std::time::Instant>,
    /// Retained events it resumes from are still to be read.
    pub(super) backlog: bool,
}

/// A watcher as the hub and its subscription share it.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) id: u64,
    pub(super) queue: Mutex<Queue>,
    pub(super) notify: tokio::sync::Notify,
}

impl Shared {
    /// Ends the watcher (unless it ended already); `clear` drops what was
    /// queued for it (a stalled watcher: its memory is returned now, not
    /// when its client comes back).
    pub(super) fn end(&self, error: WatchError, clear: bool) {
        let mut q = lock(&self.queue);
        if q.ended.is_none() {
            q.ended = Some(error);
        }
        if clear {
            q.items = VecDeque::new();
            q.backlog = false;
        }
        drop(q);
        self.notify.notify_one();
    }
}

#[derive(Debug)]
pub(super) struct Registered {
    pub(super) filter: Filter,
    pub(super) shared: Arc<Shared>,
}
