//! What the server remembers about one name.

use std::sync::Arc;

use bagel_proto::{Micros, pb};

use super::accounts::Account;
use super::history::NameHistory;
use super::ids::LeaseId;

use bagel_lease_core::chain::{self, HolderView};
/// A lease's mode and how a name's previous lease ended: the lease core's
/// domain types, the ones every backend and client speaks.
pub use bagel_lease_core::types::{Ended, Mode};

/// The previous lease of a name, as handed to the next holder.
#[derive(Clone, Debug, PartialEq)]
pub struct Previous {
    pub lease: Option<LeaseId>,
    /// Every message of the previous holders is strictly below this.
    pub watermark: Micros,
    pub watermark_signed_time: Option<Arc<pb::SignedTime>>,
    pub ended: Ended,
    /// Some earlier holder of the name (not only the last one) may still
    /// get writes into bags below `watermark`: it was broken, is unknown,
    /// or released with writes of unknown outcome, and no later holder has
    /// closed those bags since. Every next holder is told to close through
    /// the watermark before reading. A flag rather than a time, because
    /// the bound is always the watermark (which covers every such write),
    /// and a flag fits in the record's padding.
    pub unsettled: bool,
    pub ended_at: Micros,
}

impl Previous {
    /// What a name with no record inherits: the forgotten floor. Anything
    /// below it may have been written by holders we know nothing of, so it
    /// is unsettled.
    pub fn unknown(floor: Micros) -> Self {
        let known_empty = floor == Micros::ZERO;
        Previous {
            lease: None,
            watermark: floor,
            watermark_signed_time: None,
            ended: if known_empty { Ended::None } else { Ended::Unknown },
            unsettled: !known_empty,
            ended_at: Micros::ZERO,
        }
    }

    /// The exclusive bound of the unsettled bags: every write of an earlier
    /// holder is at or below the watermark.
    pub fn unsettled_until(&self) -> Option<Micros> {
        self.unsettled
            .then(|| Micros::from_micros(self.watermark.as_micros().saturating_add(1)))
    }

    pub fn to_pb(&self) -> pb::PreviousLease {
        pb::PreviousLease {
            lease_id: self.lease.map(|l| l.to_string()).unwrap_or_default(),
            watermark_us: self.watermark.as_micros(),
            watermark_signed_time: self.watermark_signed_time.as_deref().cloned(),
            ended: pb::Ended::from(self.ended).into(),
            ended_at_us: self.ended_at.as_micros(),
            unsettled_until_us: self.unsettled_until().map_or(0, Micros::as_micros),
            granted_at_us: self.lease.map_or(0, |l| l.granted_at().as_micros()),
        }
    }
}

/// The current holder of a name.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub lease: LeaseId,
    /// The holder's rights end at this instant (exclusive).
    pub deadline: Micros,
    pub mode: Mode,
    /// Whether the name counts as held by the record's account (until it
    /// is released, broken, or the sweep finds its deadline passed). The
    /// owner is the record's account's.
    pub counted: bool,
    /// Every name of the lease, sorted, when it has more than one. Only
    /// the lease's first name needs it (renew/release start there); kept
    /// out of line because most leases have one name.
    pub all_names: Option<Box<Vec<Arc<str>>>>,
    /// The holder's public key from its acquire: renewals and upgrades
    /// state the same key (a thief of the token cannot swap in its own).
    pub holder_key: Option<Arc<[u8; 32]>>,
    /// Watchers were told it expired (`LeaseTable::watch_tick`): it is no
    /// longer live whatever `now` a request brings. A renewal whose `now`
    /// was read just before the deadline would otherwise revive a lease
    /// already reported expired (Expired, then Renewed).
    pub expired: bool,
    /// The name is in its shard's name order (`order`), where `List`
    /// finds it. Set at the grant; cleared when the sweep takes a lapsed
    /// holder out of the order (so pages skip no pile of dead names), and
    /// set again by a renewal or upgrade that raced the sweep (its `now`
    /// read before the deadline). Fits in the struct's padding.
    pub listed: bool,
}

impl Holder {
    /// The holder as the lease-chain rule sees it.
    pub fn view(&self) -> HolderView {
        HolderView {
            mode: self.mode,
            deadline: self.deadline,
            expired: self.expired,
        }
    }

    pub fn is_live(&self, now: Micros) -> bool {
        self.view().is_live(now)
    }
}

/// One name's state. Kept small (120 bytes): a million held names must
/// fit in 300 MiB.
#[derive(Debug)]
pub struct NameRecord {
    /// Who the record is charged to: its last holder's owner and peer (the
    /// holder's owner, while held). `None` only for a record made for a
    /// grant that did not happen.
    pub account: Option<Arc<Account>>,
    /// The holder, possibly with a passed deadline (a broken lease is only
    /// turned into a `Previous` when the next grant comes).
    pub holder: Option<Holder>,
    /// The lease before `holder` (or the last one, if nobody holds it).
    pub prev: Previous,
    /// The last fencing token issued for this name.
    pub fencing: u64,
    pub history: Option<Box<NameHistory>>,
}

impl NameRecord {
    /// A record for a name the table knows nothing of: it inherits the
    /// forgotten floor as its watermark and the fencing floor as its last
    /// token.
    pub fn new(floor: Micros, fencing_floor: u64) -> Self {
        NameRecord {
            account: None,
            holder: None,
            prev: Previous::unknown(floor),
            fencing: fencing_floor,
            history: None,
        }
    }

    /// The owner of the record's account: its holder's while held.
    pub fn owner(&self) -> Arc<str> {
        self.account
            .as_ref()
            .map_or_else(|| Arc::from(""), |a| Arc::clone(&a.owner))
    }

    /// Charges the record to `account` (its new holder's).
    pub fn charge(&mut self, account: &Arc<Account>) {
        if self.account.as_ref().is_some_and(|a| Arc::ptr_eq(a, account)) {
            return;
        }
        if let Some(old) = self.account.replace(Arc::clone(account)) {
            old.sub_record();
        }
        account.add_record();
    }

    /// About when the record last changed, for forgetting the oldest idle
    /// records first: the later of its holder's grant and lapse and its
    /// previous lease's end. Derived rather than stored (8 bytes a name); a
    /// released tentative lease, which leaves no trace, is not counted, so
    /// such a record looks as old as its last full lease.
    pub fn last_change(&self) -> Micros {
        let held = self
            .holder
            .as_ref()
            .map_or(Micros::ZERO, |h| h.lease.granted_at().max(h.deadline));
        held.max(self.prev.ended_at)
    }

    pub fn live_holder(&self, now: Micros) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.is_live(now))
    }

    /// What a grant at `now` inherits, replacing the current holder (which
    /// must be expired, or tentative).
    ///
    /// A full holder whose deadline passed is *broken*: its deadline becomes
    /// the watermark, since it may have written anything below it, and its
    /// bags are unsettled (writes may still be in flight). A tentative
    /// holder could not write, so it leaves no trace in the chain.
    pub fn inherit(&self, now: Micros) -> Previous {
        let handoff = chain::handoff(self.prev.watermark, self.holder.as_ref().map(Holder::view));
        match &self.holder {
            Some(h) if handoff.broken => Previous {
                lease: Some(h.lease),
                watermark: handoff.watermark,
                watermark_signed_time: None,
                ended: Ended::Broken,
                unsettled: true,
                ended_at: now,
            },
            _ => self.prev.clone(),
        }
    }

    /// True when forgetting the record loses nothing but the lease-id chain:
    /// nobody holds the name.
    pub fn is_idle(&self, now: Micros) -> bool {
        self.live_holder(now).is_none()
    }

    /// The next fencing token: strictly above the last one, and at least the
    /// grant time in microseconds. The second part keeps tokens increasing
    /// across restarts without storing anything: a restarted server grants
    /// only after waiting out the max TTL, so its clock is past every token
    /// the previous incarnation issued (one grant per microsecond per name
    /// is far beyond any real rate). A forgotten record's last token lives
    /// on in the table's fencing floor, which a new record starts from, so
    /// a clock stepped back cannot lower a name's tokens either.
    pub fn next_fencing(&self, now: Micros) -> u64 {
        chain::next_fencing(self.fencing, now)
    }
}
