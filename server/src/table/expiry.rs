//! Expiries for watchers: the hub names the leases whose deadline passed,
//! and the table decides and reports each under its names' shard locks,
//! in order with the lease's other events.

use std::sync::Arc;

use bagel_proto::Micros;

use super::{LeaseId, LeaseTable};
use crate::watch::{EventKind, NewEvent};

/// Expiries [`LeaseTable::watch_tick`] reports per call (one tick, every
/// 50 ms): 10^5 leases expiring together are reported over about a
/// second, the hub's lock and each shard's taken per lease, not held.
pub const EXPIRY_PER_TICK: usize = 8192;

impl LeaseTable {
    /// Reports to watchers the leases whose deadline passed by `now` (the
    /// hub's candidates, see `crate::watch::Hub::tick`). Each is decided
    /// here, with all its names' shards locked: a name still held by the
    /// lease past its deadline is reported Expired and its holder marked
    /// so that no later request revives it; a lease renewed meanwhile (the
    /// hub tracks it again from its Renewed event) or whose name was
    /// released or taken is left alone. So one lease's events reach
    /// watchers in the order they happened in the table.
    ///
    /// First, after the hub woke, the next chunk of live leases is read
    /// into it (`LeaseTable::seed_watch`).
    ///
    /// At most [`EXPIRY_PER_TICK`] leases per call, taken from the hub a
    /// chunk at a time (`crate::watch::EXPIRY_CHUNK`); the rest wait for
    /// the next tick. Run it off the async workers: a mass expiry is work
    /// proportional to the leases, not a request's.
    pub fn watch_tick(&self, now: Micros) {
        self.seed_watch();
        let mut left = EXPIRY_PER_TICK;
        let mut due = self.watch.tick(now);
        while !due.is_empty() {
            left = left.saturating_sub(due.len());
            self.report_expiries(due, now);
            if left == 0 {
                break;
            }
            due = self.watch.due(now, left.min(crate::watch::EXPIRY_CHUNK));
        }
    }

    fn report_expiries(&self, due: Vec<(LeaseId, Vec<Arc<str>>)>, now: Micros) {
        for (lease, names) in due {
            let shard_of_name: Vec<usize> = names.iter().map(|n| self.shard_of(n)).collect();
            let mut locked = self.lock_shards(&shard_of_name);
            for (name, &shard) in names.iter().zip(&shard_of_name) {
                let state = locked.state(shard);
                let Some(slot) = state.slot_of(name) else { continue };
                let rec = state.rec_mut(slot);
                let owner = rec.owner();
                let Some(h) = rec.holder.as_mut() else { continue };
                if h.lease != lease || h.expired || now < h.deadline {
                    continue;
                }
                h.expired = true;
                let event = NewEvent {
                    kind: EventKind::Expired,
                    name: Arc::clone(name),
                    lease,
                    owner,
                    mode: h.mode,
                    deadline: h.deadline,
                    at: now,
                };
                self.watch.publish(event);
            }
        }
    }
}
