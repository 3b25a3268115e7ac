//! Acquires that wait: joining, moving between and leaving a busy name's
//! FIFO queue (see `queue`), under the shard locks of the acquire's
//! check, with the per-name, per-identity (`crate::shares`) and
//! per-server bounds on waiters.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::shard::Locked;
use super::{LeaseTable, Ticket};
use crate::error::Error;

impl LeaseTable {
    /// Puts `ticket` in `name`'s queue (all of the request's shards are
    /// locked, so its previous queue's too).
    pub(super) fn enqueue(
        &self,
        locked: &mut Locked<'_>,
        ticket: &mut Ticket,
        name: &Arc<str>,
        shard: usize,
    ) -> Result<(), Error> {
        if let Some((s, n)) = &ticket.queued
            && *s == shard
            && n == name
        {
            let q = &locked.state(shard).queues[name];
            ticket.first = q.front().is_some_and(|w| Arc::ptr_eq(w, &ticket.waiter));
            return Ok(());
        }
        let queued_here = locked.state(shard).queues.get(name).map_or(0, VecDeque::len);
        if queued_here >= self.cfg.max_waiters_per_name {
            self.unqueue(locked, ticket);
            return Err(Error::limit(
                format!("acquires waiting for name {}", crate::validate::echo(name)),
                self.cfg.max_waiters_per_name,
                "waiting acquires per name",
                "max-waiters-per-name",
            ));
        }
        match ticket.queued.take() {
            // Moving from another of its names: still one waiter.
            Some((s, n)) => locked.state(s).dequeue(&n, &ticket.waiter),
            None => {
                // Its identity's share first: a refusal there names the
                // share, which is what the identity must know.
                let share = match &ticket.tenant {
                    Some((pool, identity)) => Some(pool.take(Some(identity))?),
                    None => None,
                };
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.cfg.max_waiters {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(Error::limit(
                        "acquires waiting on this server",
                        self.cfg.max_waiters,
                        "waiting acquires",
                        "max-waiters",
                    ));
                }
                ticket.share = share;
            }
        }
        let q = locked.state(shard).queues.entry(Arc::clone(name)).or_default();
        q.push_back(Arc::clone(&ticket.waiter));
        ticket.first = q.len() == 1;
        ticket.queued = Some((shard, Arc::clone(name)));
        Ok(())
    }

    /// Takes `ticket` out of its queue, among locked shards.
    pub(super) fn unqueue(&self, locked: &mut Locked<'_>, ticket: &mut Ticket) {
        if let Some((s, n)) = ticket.queued.take() {
            locked.state(s).dequeue(&n, &ticket.waiter);
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        ticket.share = None;
        ticket.first = false;
    }

    /// Takes `ticket` out of its queue (a waiting acquire that gave up, or
    /// went away); the next waiter becomes first.
    pub fn leave_queue(&self, ticket: &mut Ticket) {
        if let Some((s, n)) = ticket.queued.take() {
            self.shards[s].lock().dequeue(&n, &ticket.waiter);
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        ticket.share = None;
        ticket.first = false;
    }

    /// Acquires waiting in all.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}
