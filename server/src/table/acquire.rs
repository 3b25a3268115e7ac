//! Granting: [`LeaseTable::acquire`] checks every name under its shard's
//! lock, reserves the quota and the records, then grants all names or
//! none, breaking expired holders and live tentative ones; a broken
//! tentative lease's other names are freed afterwards (`free_broken`).
//! The longest rule in the table, so it has a file of its own.

use std::sync::Arc;

use bagel_lease_core::chain::{self, Admission};
use bagel_proto::Micros;

use super::shard::{Broken, TOMBSTONES_PER_SHARD, Tombstone};
use super::{AcquireSpec, Grant, Holder, LeaseId, LeaseTable, Mode, NameGrant, Ticket};
use crate::error::{Conflict, Error};
use crate::watch::{EventKind, NewEvent};

impl LeaseTable {
    /// Grants every name of `spec`, or none.
    ///
    /// A name is refused while a live full lease holds it, or a live
    /// tentative one holds it and `spec` is tentative too; a full request
    /// breaks a tentative holder. An expired holder is broken.
    pub fn acquire(&self, spec: &AcquireSpec, now: Micros) -> Result<Grant, Error> {
        self.acquire_queued(spec, now, None)
    }

    /// [`LeaseTable::acquire`] for an acquire that waits: on a conflict,
    /// `ticket` joins the FIFO queue of the busy name (leaving the queue of
    /// another of its names if it was there), under the lock of the check;
    /// on a grant it leaves its queue. Refuses with a limit error when the
    /// name, or the server, has as many waiters as allowed.
    pub fn acquire_queued(
        &self,
        spec: &AcquireSpec,
        now: Micros,
        ticket: Option<&mut Ticket>,
    ) -> Result<Grant, Error> {
        self.check_ready(now)?;
        self.check_deadline(spec.deadline, now)?;
        let shard_of_name: Vec<usize> = spec.names.iter().map(|n| self.shard_of(n)).collect();
        let mut locked = self.lock_shards(&shard_of_name);

        // 1. Check every name; nothing changes if one is refused. The slots
        //    found are kept for step 2 (a name is hashed and looked up once).
        let mut found = Vec::with_capacity(spec.names.len());
        for (name, &shard) in spec.names.iter().zip(&shard_of_name) {
            let state = locked.state(shard);
            let slot = state.slot_of(name);
            found.push(slot);
            let Some(rec) = slot.and_then(|s| state.at(s)).map(|e| &e.rec) else {
                continue;
            };
            let admission = chain::admit(rec.holder.as_ref().map(Holder::view), spec.mode, now);
            // The chain rule refuses only for a live holder.
            if let (Admission::Refused, Some(h)) = (admission, rec.live_holder(now)) {
                let conflict = Error::Conflict(Box::new(Conflict {
                    name: Arc::clone(name),
                    holder: h.lease,
                    owner: rec.owner(),
                    mode: h.mode,
                    deadline: h.deadline,
                    seen: now,
                }));
                if let Some(ticket) = ticket {
                    self.enqueue(&mut locked, ticket, name, shard)?;
                }
                return Err(conflict);
            }
        }
        if let Some(ticket) = ticket {
            self.unqueue(&mut locked, ticket);
        }

        // 2. Reserve the names in the quotas, then find or create every
        //    record (the only steps that can fail for lack of room, so they
        //    run before anything is granted).
        let account = self.accounts.get(&spec.owner, spec.peer);
        self.accounts.hold(&account, spec.names.len(), &self.cfg.held)?;
        let floor = self.forgotten_floor();
        let fencing_floor = self.fencing_floor();
        let mut slots = Vec::with_capacity(spec.names.len());
        for ((name, &shard), slot) in spec.names.iter().zip(&shard_of_name).zip(found) {
            let slot = match slot {
                Some(slot) => Ok(slot),
                None => locked.state(shard).slot_or_insert(name, floor, fencing_floor),
            };
            match slot {
                Ok(slot) => slots.push(slot),
                Err(e) => {
                    self.accounts.unhold(&account, spec.names.len());
                    return Err(e);
                }
            }
        }

        // 3. Grant.
        let lease = LeaseId::new(now, shard_of_name[0], slots[0]);
        let mut names = Vec::with_capacity(spec.names.len());
        let mut min_timestamp = Micros::ZERO;
        let mut broken: Vec<Broken> = Vec::new();
        for (i, (name, &shard)) in spec.names.iter().zip(&shard_of_name).enumerate() {
            let state = locked.state(shard);
            state.busiest.observe(name);
            let rec = state.rec_mut(slots[i]);
            let counters = &self.shards[shard].counters;
            (self.stats).replacing(counters, shard, slots[i], name, rec, lease, now);
            if self.watch.active()
                && let Some(h) = &rec.holder
            {
                // An expired holder, or a live tentative one we break.
                self.watch.publish(NewEvent {
                    kind: EventKind::Broken,
                    name: Arc::clone(name),
                    lease: h.lease,
                    owner: rec.owner(),
                    mode: h.mode,
                    deadline: h.deadline,
                    at: now,
                });
            }
            if let Some(h) = rec.live_holder(now) {
                // Step 1 let us through: a live tentative holder we break.
                debug_assert_eq!(h.mode, Mode::Tentative);
                if let Some(b) = broken.iter_mut().find(|b| b.lease == h.lease) {
                    b.names = b.names.take().or_else(|| h.all_names.as_deref().cloned());
                } else {
                    broken.push(Broken {
                        lease: h.lease,
                        deadline: h.deadline,
                        name: Arc::clone(name),
                        names: match &h.all_names {
                            Some(all) => Some(all.to_vec()),
                            // A one-name lease: its first name is this one.
                            None if h.lease.shard() == shard && h.lease.slot() == slots[i] => {
                                Some(vec![Arc::clone(name)])
                            }
                            None => None,
                        },
                    });
                }
            }
            let previous = rec.inherit(now);
            let fencing = rec.next_fencing(now);
            // A name stays in the order from one holder to the next.
            let listed = rec.holder.as_ref().is_some_and(|h| h.listed);
            min_timestamp = min_timestamp.max(previous.watermark);
            self.end_holding(rec);
            rec.charge(&account);
            rec.prev = previous.clone();
            rec.fencing = fencing;
            rec.holder = Some(Holder {
                lease,
                deadline: spec.deadline,
                mode: spec.mode,
                counted: true,
                all_names: (i == 0 && spec.names.len() > 1).then(|| Box::new(spec.names.clone())),
                holder_key: spec.holder_key.clone(),
                expired: false,
                listed: true,
            });
            if self.watch.active() {
                self.watch.publish(NewEvent {
                    kind: EventKind::Granted,
                    name: Arc::clone(name),
                    lease,
                    owner: Arc::clone(&spec.owner),
                    mode: spec.mode,
                    deadline: spec.deadline,
                    at: now,
                });
            }
            names.push(NameGrant {
                name: Arc::clone(name),
                fencing,
                previous,
            });
            if !listed {
                locked.state(shard).list_slot(slots[i]);
            }
        }
        self.shards[shard_of_name[0]].counters.granted(spec.mode);
        drop(locked);
        let token = self.tokens.token(lease, names[0].fencing);
        for b in broken {
            self.free_broken(b, lease, now);
        }
        Ok(Grant {
            lease,
            token,
            owner: Arc::clone(&spec.owner),
            mode: spec.mode,
            deadline: spec.deadline,
            min_timestamp,
            names,
            holder_key: spec.holder_key.clone(),
        })
    }

    /// Frees every name a broken tentative lease still holds, and leaves a
    /// tombstone so that every later call on it (upgrade, renew, release)
    /// answers the same FAILED_PRECONDITION "lost name", whichever of its
    /// names was broken. Its other names would otherwise stay reserved until
    /// its deadline although the lease can never be upgraded.
    ///
    /// Runs after the breaking grant released its locks (the broken lease's
    /// names may lie in shards it did not lock); until then the lease only
    /// keeps names it can no longer use.
    pub(super) fn free_broken(&self, b: Broken, by: LeaseId, now: Micros) {
        let first = b.lease.shard();
        let names = {
            let mut state = self.shards[first].lock();
            if state.broken.len() >= TOMBSTONES_PER_SHARD {
                let oldest = state
                    .broken
                    .iter()
                    .min_by_key(|(_, t)| t.deadline)
                    .map(|(id, _)| *id);
                if let Some(id) = oldest {
                    state.broken.remove(&id);
                }
            }
            state.broken.insert(
                b.lease,
                Tombstone {
                    name: Arc::clone(&b.name),
                    by,
                    deadline: b.deadline,
                },
            );
            match b.names {
                Some(names) => names,
                None => match state.at(b.lease.slot()) {
                    Some(e) => match &e.rec.holder {
                        Some(h) if h.lease == b.lease => match &h.all_names {
                            Some(all) => all.to_vec(),
                            None => vec![e.shared_name()],
                        },
                        _ => return,
                    },
                    None => return,
                },
            }
        };
        let shard_of_name: Vec<usize> = names.iter().map(|n| self.shard_of(n)).collect();
        let mut locked = self.lock_shards(&shard_of_name);
        for (name, &shard) in names.iter().zip(&shard_of_name) {
            let state = locked.state(shard);
            let Some(slot) = state.slot_of(name) else { continue };
            let rec = state.rec_mut(slot);
            if rec.holder.as_ref().is_some_and(|h| h.lease == b.lease) {
                if self.watch.active() {
                    self.watch.publish(NewEvent {
                        kind: EventKind::Broken,
                        name: Arc::clone(name),
                        lease: b.lease,
                        owner: rec.owner(),
                        mode: Mode::Tentative,
                        deadline: b.deadline,
                        at: now,
                    });
                }
                // A tentative holder leaves no trace in the chain.
                self.end_holding(rec);
                let listed = rec.holder.take().is_some_and(|h| h.listed);
                if listed {
                    state.unlist_slot(slot);
                }
                state.wake_first(name);
            }
        }
    }
}
