//! Acquires waiting server-side for a busy name: one FIFO queue per name.
//!
//! Why per name and first-in-first-out: a release wakes only the first
//! waiter of the released name, so it costs one retry however many wait
//! (waking every waiter of a shard would cost one retry each, and serve
//! them in no order, so early arrivals could time out while late ones were
//! served). Only the first waiter also watches the holder's deadline (a
//! lease that ends without a release); the others sleep until they become
//! first, or give up.
//!
//! The queue lives in the shard state, under the shard lock: a waiter is
//! queued under the same lock as the check that found the name busy, and a
//! release wakes under the lock that freed the name, so no wake-up is lost
//! between the two. A wake-up given while the waiter is not yet awaiting is
//! kept (`Notify::notify_one` stores a permit).

use std::sync::Arc;

use tokio::sync::Notify;

/// One waiting acquire, as its name's queue holds it.
#[derive(Debug, Default)]
pub(super) struct Waiter {
    pub(super) wake: Notify,
}

/// A waiting acquire's place in a queue; see
/// [`super::LeaseTable::acquire_queued`]. Leave the queue with
/// [`super::LeaseTable::leave_queue`] (the service's guard does it on drop).
#[derive(Debug, Default)]
pub struct Ticket {
    pub(super) waiter: Arc<Waiter>,
    /// The name (and its shard) whose queue holds this ticket.
    pub(super) queued: Option<(usize, Arc<str>)>,
    /// Whether it is first in that queue (and so watches the holder's
    /// deadline) when last looked at.
    pub(super) first: bool,
    /// The pool of waiting acquires and the identity this one counts
    /// against (`None`: the anonymous client, no share).
    pub(super) tenant: Option<(Arc<crate::shares::Pool>, Arc<str>)>,
    /// Its slot of that identity's share, held while it is queued.
    pub(super) share: Option<crate::shares::Share>,
}

impl Ticket {
    /// A ticket whose time in a queue counts against `identity`'s share of
    /// `pool` (`--max-waiters-per-identity`); `None`: the anonymous client.
    pub(crate) fn for_tenant(pool: &Arc<crate::shares::Pool>, identity: Option<Arc<str>>) -> Ticket {
        Ticket {
            tenant: identity.map(|id| (Arc::clone(pool), id)),
            ..Ticket::default()
        }
    }

    /// Resolves when this waiter should try again: a release of the name it
    /// waits for (if first), or it became first.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.waiter.wake.notified()
    }

    /// Whether it was first in its queue when the last attempt failed: only
    /// the first waiter retries at the holder's deadline.
    pub fn is_first(&self) -> bool {
        self.first
    }

    pub fn is_queued(&self) -> bool {
        self.queued.is_some()
    }
}
