//! The holder keys leases are acquired with.
//!
//! Every witness names a holder key, and the writer signs each batch with
//! it over the batch *and a digest of that witness's body* (see
//! `bagel_bags::holder_sig`). The digest covers the lease id, so a batch
//! signed under one lease never verifies under another, whoever holds the
//! key: what ties a batch to its lease is the signed message, not the
//! key's uniqueness.
//!
//! Why leases share a key by default: making an ed25519 key costs a
//! base-point multiplication, and a fresh key per lease was more than half
//! of the client's CPU per acquire+release in the session benchmark (and
//! the server's point check of each new key over a third of its own; see
//! bench/README.md, the CPU rounds). So the leases one process acquires within
//! [`ROTATION`] share a key, and a new one is made on the first acquire
//! after that. The key never leaves the process unless a caller exports
//! it ([`crate::Lease::holder_key`], e.g. `bagel`'s lease files); a lease
//! whose key will be handed to another process should be acquired with
//! [`crate::AcquireBuilder::own_holder_key`], so that what it exports
//! signs for that lease alone.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bagel_proto::Signer;

/// How long leases of one process keep sharing a holder key.
pub const ROTATION: Duration = Duration::from_secs(1);

/// Which holder key an acquire asks the witness to name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum HolderKey {
    /// The process's current key (see the module docs).
    #[default]
    Shared,
    /// A key made for this lease alone.
    Own,
}

impl HolderKey {
    pub(crate) fn get(self) -> Arc<Signer> {
        match self {
            HolderKey::Shared => current(&CURRENT, Instant::now()),
            HolderKey::Own => Arc::new(Signer::generate()),
        }
    }
}

/// A shared key and when it was made.
type Slot = Mutex<Option<(Instant, Arc<Signer>)>>;

static CURRENT: Slot = Mutex::new(None);

/// The key in `slot` as of `now`, made afresh when the last one is older
/// than [`ROTATION`].
fn current(slot: &Slot, now: Instant) -> Arc<Signer> {
    let mut current = slot.lock().unwrap_or_else(PoisonError::into_inner);
    match &*current {
        Some((made, key)) if now.saturating_duration_since(*made) < ROTATION => Arc::clone(key),
        _ => {
            let key = Arc::new(Signer::generate());
            *current = Some((now, Arc::clone(&key)));
            key
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_share_a_key_within_a_rotation_and_not_across() {
        let slot = Slot::default();
        let t0 = Instant::now();
        let a = current(&slot, t0);
        let b = current(&slot, t0 + ROTATION / 2);
        assert_eq!(a.key_id(), b.key_id());
        let c = current(&slot, t0 + ROTATION * 2);
        assert_ne!(
            a.key_id(),
            c.key_id(),
            "a key older than the rotation is replaced"
        );
    }

    #[test]
    fn an_own_key_is_never_the_shared_one() {
        let shared = HolderKey::Shared.get();
        let own = HolderKey::Own.get();
        assert_ne!(shared.key_id(), own.key_id());
        assert_ne!(HolderKey::Own.get().key_id(), own.key_id());
    }
}
