//! Housekeeping: expired holders stop counting against quotas, and idle
//! records beyond the budget are forgotten, raising the floors that keep
//! watermarks and fencing tokens from going down.

use std::sync::atomic::Ordering;

use bagel_proto::Micros;

use super::LeaseTable;
use super::shard::Shard;

impl LeaseTable {
    /// Housekeeping, run periodically: forgets the oldest idle name records
    /// beyond the record budget. Returns how many records were forgotten.
    pub fn sweep(&self, now: Micros) -> usize {
        let per_shard = self.cfg.max_records.div_ceil(self.shards.len());
        let forgotten = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| self.forget_idle(i, s, per_shard, now))
            .sum();
        self.accounts.sweep();
        forgotten
    }

    /// Housekeeping of one shard: holders whose deadline passed stop
    /// counting against their account's quota, and beyond `cap` records the
    /// idle ones are forgotten, down to 90% of it (so the work is
    /// amortised).
    ///
    /// Which idle records go: those charged to the peer with the most
    /// records first, then to the owner with the most, then the least
    /// recently changed. So a client churning through names loses its own
    /// records, not other clients' (oldest first, whoever's, would let one
    /// client's churn erase every other client's history).
    ///
    /// Before a record goes, the forgotten floor is raised to the watermark
    /// its next holder would have inherited, under the shard lock: whoever
    /// later creates the name afresh (also under this lock) inherits at
    /// least that. Forgetting thus never lets a new holder write below an
    /// old holder's messages; it only loses the lease-id chain.
    fn forget_idle(&self, index: usize, shard: &Shard, cap: usize, now: Micros) -> usize {
        let mut state = shard.lock();
        // A broken tentative lease past its deadline would be refused as
        // expired anyway; after one more max TTL nobody asks.
        let keep_until = now.saturating_sub(self.cfg.max_ttl);
        state.broken.retain(|_, t| t.deadline > keep_until);
        // Lapsed holders also leave the name order, so that `List` pages
        // do not wade through names a crashed client left behind.
        let mut lapsed = Vec::new();
        for (slot, entry) in state.slab.iter_mut().enumerate() {
            let Some(entry) = entry else { continue };
            let Some(h) = entry.rec.holder.as_mut().filter(|h| !h.is_live(now)) else {
                continue;
            };
            if std::mem::take(&mut h.listed) {
                lapsed.push(slot);
            }
            if h.counted {
                self.end_holding(&mut entry.rec);
            }
        }
        for slot in lapsed {
            state.unlist_slot(slot);
        }
        if state.slots.len() <= cap {
            return 0;
        }
        let target = cap - cap / 10;
        let excess = state.slots.len() - target;
        type Key = (std::cmp::Reverse<(usize, usize)>, Micros, usize);
        let mut idle: Vec<Key> = state
            .slab
            .iter()
            .enumerate()
            .filter_map(|(slot, e)| e.as_ref().map(|e| (slot, &e.rec)))
            .filter(|(_, r)| r.is_idle(now))
            .map(|(slot, r)| {
                let weight = r.account.as_ref().map_or((0, 0), |a| a.weight());
                (std::cmp::Reverse(weight), r.last_change(), slot)
            })
            .collect();
        let take = excess.min(idle.len());
        if take == 0 {
            return 0;
        }
        if take < idle.len() {
            idle.select_nth_unstable(take - 1);
        }
        for &(_, _, slot) in &idle[..take] {
            let mut entry = state.remove_slot(slot).expect("listed above");
            (self.stats).forgetting(&shard.counters, index, slot, entry.rec.holder.as_ref());
            self.end_holding(&mut entry.rec);
            if let Some(account) = entry.rec.account.take() {
                account.sub_record();
            }
            let inherited = entry.rec.inherit(now).watermark.as_micros();
            if self.floor.fetch_max(inherited, Ordering::AcqRel) < inherited {
                self.stats.floor_raises.fetch_add(1, Ordering::Relaxed);
            }
            self.fencing_floor.fetch_max(entry.rec.fencing, Ordering::AcqRel);
            if let Some(h) = &entry.rec.history {
                state.history.forget(h);
            }
        }
        take
    }
}
