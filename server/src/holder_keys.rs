//! Holder keys already checked, so a client's key is checked once, not
//! on every acquire.
//!
//! An acquire's holder key must be an ed25519 point (a key nobody can
//! verify with would make every batch of the lease unreadable), and
//! checking that means decompressing it: a square root in the field,
//! which was over a third of the server's CPU per session cycle when
//! every lease had a fresh key. Clients now share a key among the leases
//! of a second (see `bagel_client::holder_key`), so a small table of the
//! keys seen last answers almost every check with a 32-byte comparison,
//! and hands out one shared allocation per key rather than one per lease.
//!
//! Bounded: a fixed number of slots, each holding the last key that
//! landed in it. A client sending many keys only evicts others, which are
//! then checked again: never wrong, at worst as slow as no table.

use std::sync::{Arc, Mutex, PoisonError};

/// Slots in the table.
const SLOTS: usize = 1024;

/// A key that passed the check, shared by every lease that names it.
type Key = Arc<[u8; 32]>;

/// Recently checked holder keys (see the module docs).
#[derive(Debug)]
pub struct HolderKeys {
    slots: Box<[Mutex<Option<Key>>]>,
}

impl Default for HolderKeys {
    fn default() -> Self {
        HolderKeys {
            slots: (0..SLOTS).map(|_| Mutex::new(None)).collect(),
        }
    }
}

impl HolderKeys {
    /// `key`, shared, if it is an ed25519 point; `None` if it is not.
    pub fn check(&self, key: &[u8; 32]) -> Option<Key> {
        // The low bytes of a compressed point are uniform for honest keys;
        // a chosen key can only pick its own slot.
        let slot = &self.slots[usize::from(u16::from_le_bytes([key[0], key[1]])) % SLOTS];
        if let Some(known) = slot.lock().unwrap_or_else(PoisonError::into_inner).as_ref()
            && **known == *key
        {
            return Some(Arc::clone(known));
        }
        ed25519_dalek::VerifyingKey::from_bytes(key).ok()?;
        let key = Arc::new(*key);
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&key));
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point() -> [u8; 32] {
        bagel_proto::Signer::generate().verifying_key().to_bytes()
    }

    /// 32 bytes that do not decompress: y = 2 is not on the curve.
    fn not_a_point() -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0] = 2;
        assert!(ed25519_dalek::VerifyingKey::from_bytes(&b).is_err());
        b
    }

    #[test]
    fn a_point_is_accepted_and_shared_the_second_time() {
        let keys = HolderKeys::default();
        let k = point();
        let first = keys.check(&k).expect("a point");
        let second = keys.check(&k).expect("a point");
        assert!(
            Arc::ptr_eq(&first, &second),
            "the second check is answered from the table"
        );
    }

    #[test]
    fn a_non_point_is_refused_every_time() {
        let keys = HolderKeys::default();
        assert!(keys.check(&not_a_point()).is_none());
        assert!(keys.check(&not_a_point()).is_none());
    }

    #[test]
    fn a_non_point_in_a_known_keys_slot_is_refused_and_evicts_nothing() {
        let keys = HolderKeys::default();
        let k = point();
        let first = keys.check(&k).expect("a point");
        // Same slot as `k` (same two low bytes), not a point: about half
        // of all y values are not on the curve.
        let other = (0..=255u8)
            .map(|b| {
                let mut o = k;
                o[2] ^= b;
                o[3] ^= 0x55;
                o
            })
            .find(|o| ed25519_dalek::VerifyingKey::from_bytes(o).is_err())
            .expect("some y in 256 is not on the curve");
        assert!(keys.check(&other).is_none());
        let again = keys.check(&k).expect("a point");
        assert!(Arc::ptr_eq(&first, &again), "the known key is still in its slot");
    }
}
