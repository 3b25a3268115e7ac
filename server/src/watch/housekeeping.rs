//! The hub's periodic housekeeping ([`Hub::tick`]), off the request
//! path: going idle after the linger, ending stalled watchers (their
//! queues freed), and handing the table the first chunk of due expiries.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bagel_proto::Micros;

use super::expiry::EXPIRY_CHUNK;
use super::{Hub, Inner, WatchError, lock};
use crate::table::LeaseId;

impl Hub {
    /// Housekeeping, run periodically (off the request path): goes idle
    /// once nobody has watched (or listed) for the linger time, ends the
    /// watchers that took nothing they were owed for
    /// [`WatchConfig::stall`](super::WatchConfig::stall) (their queues freed), and hands out up to
    /// [`EXPIRY_CHUNK`] leases whose deadline passed by `now`, each with
    /// its names, no longer tracked (more with [`Hub::due`]). The table
    /// reports them (see `LeaseTable::watch_tick`): whether a lease
    /// expired is the table's to say, under its names' locks.
    pub fn tick(&self, now: Micros) -> Vec<(LeaseId, Vec<Arc<str>>)> {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return Vec::new();
        }
        if inner.watchers.is_empty() {
            match inner.idle_since {
                None | Some(Micros::ZERO) => inner.idle_since = Some(now),
                Some(since) if now >= since.saturating_add(self.cfg.linger) => {
                    self.deactivate(&mut inner);
                    return Vec::new();
                }
                Some(_) => {}
            }
        }
        self.end_stalled(&mut inner, std::time::Instant::now());
        Self::due_locked(&mut inner, now, EXPIRY_CHUNK)
    }

    /// Ends the watchers owed something that took nothing for the stall
    /// bound: their client reads nothing (an HTTP/2 window left at 0), so
    /// what is queued for them is freed now and their stream ends with
    /// [`WatchError::Stalled`] when the client reads again.
    pub(super) fn end_stalled(&self, inner: &mut Inner, now: std::time::Instant) {
        let stall = self.cfg.stall;
        if stall.is_zero() {
            return;
        }
        let stalled: Vec<u64> = inner
            .watchers
            .iter()
            .filter(|(_, w)| {
                let q = lock(&w.shared.queue);
                q.ended.is_none() && q.owed_since.is_some_and(|t| now.duration_since(t) >= stall)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in stalled {
            if let Some(w) = inner.watchers.get(&id) {
                let sent = lock(&w.shared.queue).sent;
                w.shared.end(
                    WatchError::Stalled {
                        after: stall,
                        last: sent,
                    },
                    true,
                );
            }
            Self::unregister(inner, id);
            self.stats.stalled.fetch_add(1, Ordering::Relaxed);
        }
    }
}
