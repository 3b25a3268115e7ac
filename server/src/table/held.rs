//! What a holder does with its lease: renew, upgrade and release, each
//! after [`LeaseTable::lock_lease`] found the lease by its id, checked the
//! token and locked every name's shard; and the history they record.

use std::sync::Arc;

use bagel_proto::Micros;

use super::history::HistoryEntry;
use super::record::NameRecord;
use super::shard::{HeldLease, Locked, ShardState};
use super::{
    Ended, Grant, HistoryEvent, LeaseId, LeaseTable, Metadata, Mode, NameGrant, Previous, ReleaseSpec,
    Released, Token,
};
use crate::error::Error;
use crate::watch::{EventKind, NewEvent};

impl LeaseTable {
    /// Finds a lease by the slot its id names, checks the token, locks all
    /// its names' shards and checks it still holds every name at `now`.
    ///
    /// Everything the caller decides on (deadline, mode) is read *after*
    /// every shard is locked: a lease whose names span shards is found
    /// under its first shard's lock, which is dropped to take all shards in
    /// order, and a concurrent renew or upgrade may change the lease in
    /// between. Deciding on the first reading let two racing renews both
    /// succeed and leave the earlier deadline in place.
    fn lock_lease(&self, lease: LeaseId, token: &Token, now: Micros) -> Result<HeldLease<'_>, Error> {
        let first_shard = lease.shard();
        if first_shard >= self.shards.len() {
            return Err(Error::UnknownLease { lease });
        }
        let guard = self.shards[first_shard].lock();
        if let Some(t) = guard.broken.get(&lease) {
            return Err(t.error(lease));
        }
        let entry = guard.at(lease.slot()).ok_or(Error::UnknownLease { lease })?;
        let holder = match &entry.rec.holder {
            Some(h) if h.lease == lease => h,
            _ => return Err(Self::gone(lease, &entry.rec)),
        };
        if !self.tokens.token(lease, entry.rec.fencing).matches(token) {
            return Err(Error::WrongToken { lease });
        }
        if !holder.is_live(now) {
            return Err(Error::Expired {
                lease,
                deadline: holder.deadline,
            });
        }
        let names = match &holder.all_names {
            Some(all) => all.to_vec(),
            None => vec![entry.shared_name()],
        };
        let seen_deadline = holder.deadline;
        // The first name's shard and slot are the id's: neither is hashed
        // or looked up again (that was ~8% of a release's CPU).
        let shard_of_name: Vec<usize> = std::iter::once(first_shard)
            .chain(names[1..].iter().map(|n| self.shard_of(n)))
            .collect();

        let locked = if shard_of_name.iter().all(|&s| s == first_shard) {
            Locked {
                order: vec![first_shard],
                guards: vec![guard],
            }
        } else {
            // Take every shard in ascending order; the lease may have
            // changed while no lock was held, so everything is read again
            // below.
            drop(guard);
            self.lock_shards(&shard_of_name)
        };
        let mut held = HeldLease {
            locked,
            slots: Vec::with_capacity(names.len()),
            names,
            shard_of_name,
            deadline: seen_deadline,
            mode: Mode::Full,
        };
        if let Some(t) = held.locked.state(first_shard).broken.get(&lease) {
            return Err(t.error(lease));
        }
        for i in 0..held.names.len() {
            let shard = held.shard_of_name[i];
            let state = held.locked.state(shard);
            let slot = if i == 0 {
                Some(lease.slot())
            } else {
                state.slot_of(&held.names[i])
            };
            let holder = slot.and_then(|s| state.at(s)).and_then(|e| e.rec.holder.as_ref());
            match holder {
                Some(h) if h.lease == lease => {
                    if !h.is_live(now) {
                        return Err(Error::Expired {
                            lease,
                            deadline: h.deadline,
                        });
                    }
                    // Every name of a lease carries the same deadline and
                    // mode (both change only with all shards locked).
                    held.deadline = h.deadline;
                    held.mode = h.mode;
                    held.slots.extend(slot);
                }
                Some(h) if now < held.deadline => {
                    return Err(Error::LostName {
                        lease,
                        name: Arc::clone(&held.names[i]),
                        by: h.lease,
                    });
                }
                _ => {
                    return Err(Error::Expired {
                        lease,
                        deadline: held.deadline,
                    });
                }
            }
        }
        Ok(held)
    }

    /// Why a lease no longer holds its first name, from the name's record.
    fn gone(lease: LeaseId, rec: &NameRecord) -> Error {
        match (rec.prev.lease, rec.prev.ended) {
            (Some(l), Ended::Released) if l == lease => Error::Released {
                lease,
                at: rec.prev.ended_at,
            },
            (Some(l), Ended::Broken) if l == lease => Error::Expired {
                lease,
                deadline: rec.prev.watermark,
            },
            _ => Error::UnknownLease { lease },
        }
    }

    /// Describes a held lease for a witness.
    fn describe_held(held: &mut HeldLease<'_>, lease: LeaseId, token: Token) -> Grant {
        let mut grants = Vec::with_capacity(held.names.len());
        let mut min_timestamp = Micros::ZERO;
        let mut owner = None;
        let mut holder_key = None;
        for i in 0..held.names.len() {
            let name = Arc::clone(&held.names[i]);
            let rec = held.rec(i);
            min_timestamp = min_timestamp.max(rec.prev.watermark);
            owner.get_or_insert_with(|| rec.owner());
            if i == 0 {
                holder_key = rec.holder.as_ref().and_then(|h| h.holder_key.clone());
            }
            grants.push(NameGrant {
                name,
                fencing: rec.fencing,
                previous: rec.prev.clone(),
            });
        }
        Grant {
            lease,
            token,
            owner: owner.expect("a lease has at least one name"),
            mode: held.mode,
            deadline: held.deadline,
            min_timestamp,
            names: grants,
            holder_key,
        }
    }

    /// Moves a live lease's deadline to `max(current, new_deadline)`. A
    /// deadline never moves earlier: the holder may already have written up
    /// to the current one, and a break after an earlier deadline would hand
    /// the next holder a watermark below those writes. A renewal that asks
    /// for less than a renewal already granted (two renewals racing) is
    /// answered with the current deadline, not refused: the lease is held,
    /// and refusing would look like a loss to the holder.
    ///
    /// `counted_from` is the instant `new_deadline`'s TTL range is judged
    /// at (taken as `now` if later): for a relative TTL, the instant it was
    /// counted from, the one the granted-until mark's cover was computed
    /// from, so that the deadline covered is the deadline granted; for an
    /// absolute deadline, `now`. A TTL counted from an earlier instant
    /// gives a deadline a little nearer than `now + TTL`: judged at `now`,
    /// a TTL just over the min TTL would be refused as out of range
    /// although the request asked for a valid one; judged where it was
    /// counted from, the range check is the TTL's own. Whether the lease is
    /// still held is judged at `now`, the latest reading: an earlier one
    /// would renew a lease whose deadline passed while its renewal was on
    /// its way.
    pub fn renew(
        &self,
        lease: LeaseId,
        token: &Token,
        new_deadline: Micros,
        counted_from: Micros,
        metadata: Option<Metadata>,
        now: Micros,
    ) -> Result<Grant, Error> {
        let mut held = self.lock_lease(lease, token, now)?;
        // A renewal asks for now + its TTL on the client's clock; a client
        // ahead of this server by any amount would have every renewal of a
        // lease at the max TTL refused (its first renewal fenced it). It is
        // granted as far as may be: the witness states the deadline given.
        let new_deadline = new_deadline.min(now.saturating_add(self.cfg.max_ttl));
        self.check_deadline(new_deadline, counted_from.min(now))?;
        let new_deadline = new_deadline.max(held.deadline);
        for i in 0..held.names.len() {
            let watched = self.watch.active().then(|| Arc::clone(&held.names[i]));
            let rec = held.rec(i);
            let holder = rec.holder.as_mut().expect("checked by lock_lease");
            holder.deadline = new_deadline;
            let mode = holder.mode;
            if let Some(name) = watched {
                self.watch.publish(NewEvent {
                    kind: EventKind::Renewed,
                    name,
                    lease,
                    owner: rec.owner(),
                    mode,
                    deadline: new_deadline,
                    at: now,
                });
            }
            if let Some(metadata) = &metadata {
                let entry = HistoryEntry {
                    lease,
                    owner: rec.owner(),
                    event: HistoryEvent::Renewed,
                    at: now,
                    watermark: rec.prev.watermark,
                    metadata: Some(metadata.clone()),
                };
                self.record_history(&mut held, i, entry);
            }
            held.relist(i);
        }
        held.deadline = new_deadline;
        self.shards[lease.shard()].counters.renewed();
        Ok(Self::describe_held(&mut held, lease, *token))
    }

    /// Turns a tentative lease into a full one. Fails if any of its names
    /// was broken by a full acquire meanwhile. Upgrading a full lease
    /// changes nothing and succeeds.
    pub fn upgrade(&self, lease: LeaseId, token: &Token, now: Micros) -> Result<Grant, Error> {
        let mut held = self.lock_lease(lease, token, now)?;
        let deadline = held.deadline;
        for i in 0..held.names.len() {
            let watched = self.watch.active().then(|| Arc::clone(&held.names[i]));
            let rec = held.rec(i);
            rec.holder.as_mut().expect("checked by lock_lease").mode = Mode::Full;
            if let Some(name) = watched {
                self.watch.publish(NewEvent {
                    kind: EventKind::Upgraded,
                    name,
                    lease,
                    owner: rec.owner(),
                    mode: Mode::Full,
                    deadline,
                    at: now,
                });
            }
            held.relist(i);
        }
        held.mode = Mode::Full;
        self.shards[lease.shard()].counters.upgraded();
        Ok(Self::describe_held(&mut held, lease, *token))
    }

    /// Ends a live lease, storing its watermark for the next holder.
    ///
    /// The watermark must be below the deadline. Stored watermarks never
    /// decrease: a holder that wrote nothing (watermark 0, or one below what
    /// it inherited) carries the inherited one forward. A tentative lease
    /// could not write, so it must say 0 and leaves no trace in the chain.
    ///
    /// What is unsettled travels on: the next holder is told to close the
    /// bags through the watermark if this holder had writes of unknown
    /// outcome, or if it inherited unsettled bags and did not close them
    /// (`settled_through` below what it inherited).
    pub fn release(
        &self,
        lease: LeaseId,
        token: &Token,
        spec: ReleaseSpec,
        now: Micros,
    ) -> Result<Released, Error> {
        let mut held = self.lock_lease(lease, token, now)?;
        if spec.watermark >= held.deadline {
            return Err(Error::out_of_range(
                "watermark_us",
                format!(
                    "{} must be below the lease deadline {} ({})",
                    spec.watermark.as_micros(),
                    held.deadline.as_micros(),
                    held.deadline
                ),
            ));
        }
        if held.mode == Mode::Tentative && spec.watermark != Micros::ZERO {
            return Err(Error::invalid(
                "watermark_us",
                "must be 0 when releasing a tentative lease: it had no right to write",
            ));
        }
        let mut stored = Micros::ZERO;
        for i in 0..held.names.len() {
            let watched = self.watch.active().then(|| Arc::clone(&held.names[i]));
            let rec = held.rec(i);
            self.end_holding(rec);
            let owner = rec.owner();
            let holder = rec.holder.take().expect("checked by lock_lease");
            if let Some(name) = watched {
                self.watch.publish(NewEvent {
                    kind: EventKind::Released,
                    name,
                    lease,
                    owner: Arc::clone(&owner),
                    mode: holder.mode,
                    deadline: holder.deadline,
                    at: now,
                });
            }
            if holder.mode == Mode::Full {
                let inherited_open = rec
                    .prev
                    .unsettled_until()
                    .is_some_and(|until| spec.settled_through < until);
                rec.prev = Previous {
                    lease: Some(lease),
                    watermark: rec.prev.watermark.max(spec.watermark),
                    watermark_signed_time: spec.signed_time.clone(),
                    ended: Ended::Released,
                    unsettled: spec.unsettled || inherited_open,
                    ended_at: now,
                };
            }
            stored = stored.max(rec.prev.watermark);
            let entry = HistoryEntry {
                lease,
                owner,
                event: HistoryEvent::Released,
                at: now,
                watermark: rec.prev.watermark,
                metadata: spec.metadata.clone(),
            };
            self.record_history(&mut held, i, entry);
            let shard = held.shard_of_name[i];
            if holder.listed {
                held.locked.state(shard).unlist_slot(held.slots[i]);
            }
            held.locked.state(shard).wake_first(&held.names[i]);
        }
        self.shards[lease.shard()].counters.released(held.mode);
        Ok(Released { watermark: stored })
    }

    /// Appends to name `i`'s history and keeps its shard within budget.
    fn record_history(&self, held: &mut HeldLease<'_>, i: usize, entry: HistoryEntry) {
        if self.cfg.history_per_name == 0 {
            return;
        }
        let slot = held.slots[i];
        let ShardState { slab, history, .. } = held.locked.state(held.shard_of_name[i]);
        let rec = &mut slab[slot].as_mut().expect("occupied").rec;
        history.push(&mut rec.history, entry, self.cfg.history_per_name);
        history.fit(self.cfg.history_budget_bytes / self.shards.len());
    }
}
