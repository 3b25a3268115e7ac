//! Recording an event: numbering it, appending it to the retained ring
//! (within its count and byte bounds), and queueing it for the watchers
//! the index names, all under the hub's lock and bounded; and starting a
//! new incarnation when the count runs out.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::event::event_bytes;
use super::index::Index;
use super::revision::{COUNT_BITS, COUNT_MASK, INCARNATION_MASK};
use super::{Event, Hub, Inner, NewEvent, WatchError, lock};

impl Hub {
    /// Records an event (call only when [`Hub::active`]; a late call after
    /// the hub went idle is ignored). The table calls it under the name's
    /// shard lock; what it does under the hub's lock is bounded: number
    /// the event, append it to the ring, and queue it for the watchers
    /// the index says want it (none is asked about a name it does not
    /// watch).
    pub fn publish(&self, event: NewEvent) {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return;
        }
        Self::track_locked(&mut inner, &event);
        self.emit(&mut inner, event);
    }

    fn emit(&self, inner: &mut Inner, event: NewEvent) {
        if inner.last_rev & COUNT_MASK == COUNT_MASK {
            self.renumber(inner);
        }
        inner.last_rev += 1;
        let event = Arc::new(Event {
            revision: inner.last_rev,
            event,
        });
        inner.ring_bytes += event_bytes(&event);
        inner.ring.push_back(Arc::clone(&event));
        while inner.ring.len() > self.cfg.retain || inner.ring_bytes > self.cfg.retain_bytes {
            let Some(old) = inner.ring.pop_front() else { break };
            inner.ring_bytes -= event_bytes(&old);
            inner.oldest = old.revision;
        }
        let buffer = self.cfg.buffer;
        let mut overflowed = Vec::new();
        let mut offered = 0;
        inner.index.for_each_match(&event.event.name, |w| {
            offered += 1;
            let mut q = lock(&w.queue);
            if q.ended.is_some() {
                return;
            }
            if q.items.len() >= buffer {
                q.ended = Some(WatchError::Overflow { buffer, last: q.last });
                drop(q);
                w.notify.notify_one();
                overflowed.push(w.id);
                return;
            }
            if q.owed_since.is_none() {
                q.owed_since = Some(std::time::Instant::now());
            }
            q.items.push_back(Arc::clone(&event));
            q.last = event.revision;
            drop(q);
            w.notify.notify_one();
        });
        self.stats.dispatched.fetch_add(offered, Ordering::Relaxed);
        if !overflowed.is_empty() {
            self.stats
                .overflowed
                .fetch_add(overflowed.len() as u64, Ordering::Relaxed);
            for id in overflowed {
                Self::unregister(inner, id);
            }
        }
    }

    /// The count ran out: a new incarnation (the next one), the watchers
    /// ended with [`WatchError::Renumbered`] (their revisions would no
    /// longer resume), nothing retained.
    fn renumber(&self, inner: &mut Inner) {
        let last = inner.last_rev;
        inner.incarnation = (inner.incarnation + 1) & INCARNATION_MASK;
        inner.last_rev = u64::from(inner.incarnation) << COUNT_BITS;
        inner.oldest = inner.last_rev;
        inner.ring.clear();
        inner.ring_bytes = 0;
        inner.index = Index::default();
        for (_, w) in inner.watchers.drain() {
            w.shared.end(WatchError::Renumbered { last }, false);
        }
    }
}
