//! What the hub deals in: lease events before and after numbering, what a
//! watcher is sent, and which names a watcher wants. Plain data, apart
//! from the hub's locking and bookkeeping, so the table and the service
//! can build and read events without the hub's internals.

use std::collections::HashSet;
use std::sync::Arc;

use bagel_proto::Micros;

use crate::table::{LeaseId, Mode};

/// What happened to a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Granted,
    Renewed,
    Upgraded,
    Released,
    /// Taken from its holder by a grant: a full holder whose deadline had
    /// passed, or a live tentative holder preempted by a full acquire.
    Broken,
    /// The holder's deadline passed without a release.
    Expired,
}

/// An event, before the hub numbers it.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub kind: EventKind,
    pub name: Arc<str>,
    pub lease: LeaseId,
    pub owner: Arc<str>,
    pub mode: Mode,
    /// The lease's deadline after the event.
    pub deadline: Micros,
    pub at: Micros,
}

/// A numbered event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub revision: u64,
    pub event: NewEvent,
}

/// What a watcher is sent: an event, or how far it has been sent
/// everything (see [`Subscription::progress`](super::Subscription::progress)).
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Event(Arc<Event>),
    Progress(u64),
}

/// Which names a watcher wants.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    Names(HashSet<Arc<str>>),
    /// Every name starting with this (the empty prefix: every name).
    Prefix(String),
}

impl Filter {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Filter::Names(names) => names.contains(name),
            Filter::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// What one retained event costs the ring's byte budget: the event, the
/// `Arc` around it, and its name and owner (shared with the table, but
/// kept alive by the ring once the table lets go).
pub(super) fn event_bytes(e: &Event) -> usize {
    std::mem::size_of::<Event>() + 16 + e.event.name.len() + e.event.owner.len()
}
