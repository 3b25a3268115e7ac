//! ed25519 keys and their ids.
//!
//! A key id is the first 8 bytes of SHA-256 over the raw public key, in hex.
//! It is short enough to print and lets a verifier holding several keys (a
//! key rotation, several shards) pick the right one without trying them all.

use std::collections::HashMap;
use std::fmt;

use ed25519_dalek::{SigningKey, VerifyingKey};
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

use crate::Error;

/// `domain` then `bytes`: what a signature covers. One key signs witnesses,
/// local times and batch roots; a distinct prefix per kind of statement
/// keeps a signature made for one from ever verifying as another.
pub(crate) fn in_domain(domain: &[u8], bytes: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(domain.len() + bytes.len());
    m.extend_from_slice(domain);
    m.extend_from_slice(bytes);
    m
}

/// The id of an ed25519 public key: 16 lowercase hex digits.
pub fn key_id(key: &VerifyingKey) -> String {
    let digest = Sha256::digest(key.as_bytes());
    crate::hex::encode(&digest[..8])
}

/// A signing key together with its id, so callers never recompute the id on
/// the hot path.
#[derive(Clone)]
pub struct Signer {
    key: SigningKey,
    id: String,
}

impl Signer {
    /// Wraps `key`, computing its id once.
    pub fn new(key: SigningKey) -> Self {
        let id = key_id(&key.verifying_key());
        Signer { key, id }
    }

    /// The key of a 32-byte ed25519 secret (a holder key read back from a
    /// lease file).
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        Self::new(SigningKey::from_bytes(secret))
    }

    /// A fresh random key from the OS-seeded thread RNG.
    pub fn generate() -> Self {
        let mut secret = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut secret);
        Self::new(SigningKey::from_bytes(&secret))
    }

    /// The id every signature of this key is stamped with ([`key_id`]).
    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// The public half, to publish or give to a [`KeyRing`].
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The secret, for signatures outside this crate's domains (a bag
    /// writer's holder signatures) and for writing a key file. Signing
    /// with it directly skips the domain prefixes [`crate::witness`] adds:
    /// use it only for messages carrying a domain of their own.
    pub fn signing_key(&self) -> &SigningKey {
        &self.key
    }

    pub(crate) fn sign(&self, bytes: &[u8]) -> Vec<u8> {
        use ed25519_dalek::Signer as _;
        self.key.sign(bytes).to_bytes().to_vec()
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.debug_struct("Signer").field("key_id", &self.id).finish()
    }
}

/// The public keys a verifier trusts, by key id.
#[derive(Clone, Debug, Default)]
pub struct KeyRing {
    keys: HashMap<String, VerifyingKey>,
}

impl KeyRing {
    /// An empty ring: it verifies nothing until keys are added.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a key and returns its id.
    pub fn insert(&mut self, key: VerifyingKey) -> String {
        let id = key_id(&key);
        self.keys.insert(id.clone(), key);
        id
    }

    /// Adds a raw 32-byte public key.
    pub fn insert_bytes(&mut self, raw: &[u8]) -> Result<String, Error> {
        let arr: [u8; 32] = raw.try_into().map_err(|_| Error::BadPublicKey {
            reason: format!("expected 32 bytes, got {}", raw.len()),
        })?;
        let key = VerifyingKey::from_bytes(&arr).map_err(|e| Error::BadPublicKey {
            reason: e.to_string(),
        })?;
        Ok(self.insert(key))
    }

    /// Adds every key of `other` (a verifier trusting several servers).
    pub fn merge(&mut self, other: &KeyRing) {
        for (id, key) in &other.keys {
            self.keys.insert(id.clone(), *key);
        }
    }

    /// The key with id `key_id`, if trusted.
    pub fn get(&self, key_id: &str) -> Option<&VerifyingKey> {
        self.keys.get(key_id)
    }

    /// Whether no key is trusted (every verification would fail with
    /// [`Error::UnknownKey`]).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The ids of the trusted keys, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Verifies `signature` over `bytes` with the key named `key_id`.
    pub(crate) fn verify(&self, key_id: &str, bytes: &[u8], signature: &[u8]) -> Result<(), Error> {
        let key = self.get(key_id).ok_or_else(|| Error::UnknownKey {
            key_id: key_id.to_owned(),
        })?;
        let sig = ed25519_dalek::Signature::from_slice(signature).map_err(|_| Error::BadSignature {
            key_id: key_id.to_owned(),
        })?;
        key.verify_strict(bytes, &sig).map_err(|_| Error::BadSignature {
            key_id: key_id.to_owned(),
        })
    }
}

impl FromIterator<VerifyingKey> for KeyRing {
    fn from_iter<I: IntoIterator<Item = VerifyingKey>>(iter: I) -> Self {
        let mut ring = KeyRing::new();
        for key in iter {
            ring.insert(key);
        }
        ring
    }
}
