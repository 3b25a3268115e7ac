//! Trusted keys given on the command line (`--key`, 64 hex digits each).

use anyhow::Context as _;
use bagel_proto::KeyRing;

/// The keys given as 64 hex digits each (raw ed25519 public keys).
pub fn key_ring(given: &[String]) -> anyhow::Result<KeyRing> {
    let mut ring = KeyRing::new();
    for k in given {
        let raw: [u8; 32] = bagel_proto::hex::decode_array(k)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("--key {k:?} is not a raw ed25519 public key (64 hex digits)"))?;
        ring.insert_bytes(&raw)?;
    }
    Ok(ring)
}
