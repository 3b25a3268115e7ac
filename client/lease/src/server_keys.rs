//! [`ServerKeys`]: the keys one server's witnesses are checked against,
//! and when they may change.
//!
//! Pinned keys never change: a witness under any other key fails. Keys
//! learned from the server's `ServerInfo` (trust on first use) are learned
//! again when a witness names a key not seen yet: a server restarted
//! without its key file signs with a new one, and a long-running client
//! (a `Cluster` member, a `Coalescer`) must not fail that server's names
//! until it restarts. Learning again trusts the same server over the same
//! channel as learning at connect did, so it trusts no one new; keys
//! learned before are kept, so witnesses already held still verify.

use std::sync::{Arc, PoisonError, RwLock};

use bagel_proto::KeyRing;

/// The keys of one server; shared by the clones of a [`crate::Client`].
#[derive(Debug)]
pub(crate) struct ServerKeys {
    /// Read on every verification, replaced whole when keys are learned
    /// (a witness verification holds a snapshot, never the lock).
    ring: RwLock<Snapshot>,
    pinned: bool,
}

#[derive(Clone, Debug, Default)]
struct Snapshot {
    ring: Arc<KeyRing>,
    /// The id of the key the server signs with now (the first it
    /// published at the latest learning), when learned.
    signing: Option<String>,
}

impl ServerKeys {
    /// Keys given by the caller: only these are ever trusted.
    pub(crate) fn pinned(ring: KeyRing) -> Self {
        ServerKeys {
            ring: RwLock::new(Snapshot {
                ring: Arc::new(ring),
                signing: None,
            }),
            pinned: true,
        }
    }

    /// Keys the server published (`signing` first).
    pub(crate) fn learned(ring: KeyRing, signing: Option<String>) -> Self {
        ServerKeys {
            ring: RwLock::new(Snapshot {
                ring: Arc::new(ring),
                signing,
            }),
            pinned: false,
        }
    }

    fn read(&self) -> Snapshot {
        self.ring.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The keys trusted now.
    pub(crate) fn ring(&self) -> Arc<KeyRing> {
        self.read().ring
    }

    /// The id of the key the server was last seen signing with.
    pub(crate) fn signing(&self) -> Option<String> {
        let s = self.read();
        s.signing.or_else(|| s.ring.ids().next().map(str::to_owned))
    }

    /// Whether only the caller's keys are trusted (never learned).
    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Whether a witness under `key_id` calls for learning the server's
    /// keys again: it is not trusted yet, and these keys were learned.
    pub(crate) fn should_learn(&self, key_id: &str) -> bool {
        !self.pinned && self.read().ring.get(key_id).is_none()
    }

    /// Adds the keys the server publishes now to those learned before.
    pub(crate) fn learn(&self, published: &KeyRing, signing: Option<String>) {
        debug_assert!(!self.pinned, "pinned keys are never learned");
        let mut current = self.ring.write().unwrap_or_else(PoisonError::into_inner);
        let mut ring = (*current.ring).clone();
        ring.merge(published);
        *current = Snapshot {
            ring: Arc::new(ring),
            signing: signing.or_else(|| current.signing.clone()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bagel_proto::Signer;

    #[test]
    fn learned_keys_grow_and_pinned_keys_never_ask_to() {
        let (old, new) = (Signer::generate(), Signer::generate());
        let ring = |s: &Signer| [s.verifying_key()].into_iter().collect::<KeyRing>();
        let old_id = ring(&old).ids().next().unwrap().to_owned();
        let new_id = ring(&new).ids().next().unwrap().to_owned();

        let learned = ServerKeys::learned(ring(&old), Some(old_id.clone()));
        assert!(!learned.should_learn(&old_id));
        assert!(learned.should_learn(&new_id));
        learned.learn(&ring(&new), Some(new_id.clone()));
        assert!(!learned.should_learn(&new_id));
        assert!(
            learned.ring().get(&old_id).is_some(),
            "old witnesses still verify"
        );
        assert_eq!(learned.signing(), Some(new_id.clone()));

        let pinned = ServerKeys::pinned(ring(&old));
        assert!(
            !pinned.should_learn(&new_id),
            "a pinned server is never asked again"
        );
    }
}
