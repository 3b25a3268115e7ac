//! The live leases the hub tracks for expiries: seeded from the table
//! when the hub wakes ([`Hub::track`]), kept up to date from the events
//! it records, and handed back to the table, earliest deadline first and
//! a chunk at a time, once their deadline passed (the table decides and
//! reports each expiry under its names' shard locks).

use std::sync::Arc;

use bagel_proto::Micros;

use super::{EventKind, Hub, Inner, NewEvent, lock};
use crate::table::LeaseId;

/// Expiries handed out by one [`Hub::tick`] or [`Hub::due`] call: the table
/// reports each under its names' shard locks, a chunk at a time, so neither
/// the hub's lock nor a shard's is held across a mass expiry.
pub const EXPIRY_CHUNK: usize = 1024;

/// A live lease, for expiries: when, and which names the table is to
/// check (the event itself is built from the table's record).
#[derive(Debug)]
pub(super) struct Live {
    pub(super) deadline: Micros,
    pub(super) names: Vec<Arc<str>>,
}

impl Hub {
    /// Seeds a live lease's name (idempotent), when the hub wakes up.
    pub fn track(&self, lease: LeaseId, name: &Arc<str>, deadline: Micros) {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return;
        }
        let live = inner.live.entry(lease).or_insert_with(|| Live {
            deadline,
            names: Vec::new(),
        });
        if !live.names.contains(name) {
            live.names.push(Arc::clone(name));
        }
        let deadline = live.deadline;
        inner.by_deadline.insert((deadline, lease));
    }

    pub(super) fn track_locked(inner: &mut Inner, e: &NewEvent) {
        match e.kind {
            EventKind::Granted | EventKind::Renewed | EventKind::Upgraded => {
                let live = inner.live.entry(e.lease).or_insert_with(|| Live {
                    deadline: e.deadline,
                    names: Vec::new(),
                });
                let old = live.deadline;
                live.deadline = e.deadline;
                if !live.names.contains(&e.name) {
                    live.names.push(Arc::clone(&e.name));
                }
                inner.by_deadline.remove(&(old, e.lease));
                inner.by_deadline.insert((e.deadline, e.lease));
            }
            EventKind::Released | EventKind::Broken => {
                if let Some(live) = inner.live.get_mut(&e.lease) {
                    live.names.retain(|n| *n != e.name);
                    if live.names.is_empty() {
                        let deadline = live.deadline;
                        inner.live.remove(&e.lease);
                        inner.by_deadline.remove(&(deadline, e.lease));
                    }
                }
            }
            EventKind::Expired => {}
        }
    }

    /// Up to `max` more leases whose deadline passed by `now` (see
    /// [`Hub::tick`]).
    pub fn due(&self, now: Micros, max: usize) -> Vec<(LeaseId, Vec<Arc<str>>)> {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return Vec::new();
        }
        Self::due_locked(&mut inner, now, max)
    }

    pub(super) fn due_locked(inner: &mut Inner, now: Micros, max: usize) -> Vec<(LeaseId, Vec<Arc<str>>)> {
        let mut due = Vec::new();
        while due.len() < max
            && let Some(&(deadline, lease)) = inner.by_deadline.first()
        {
            if deadline > now {
                break;
            }
            inner.by_deadline.pop_first();
            if let Some(live) = inner.live.remove(&lease) {
                due.push((lease, live.names));
            }
        }
        due
    }
}
