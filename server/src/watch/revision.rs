//! How a revision is made: an incarnation in the high bits, a count in
//! the low ones. Separate from the hub because the service reads
//! revisions too (to name the incarnation a refused resume came from),
//! and the arithmetic is easier to check on its own.

use bagel_proto::Micros;

/// Bits of a revision that count events; the bits above them are the
/// incarnation. 2^40 events is 12 days at a million a second, every one
/// of them watched; past it the hub starts a new incarnation (see
/// [`WatchError::Renumbered`](super::WatchError::Renumbered)).
pub const COUNT_BITS: u32 = 40;
/// Bits of a revision that name the incarnation.
pub const INCARNATION_BITS: u32 = 64 - COUNT_BITS;
pub(super) const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
pub(super) const INCARNATION_MASK: u32 = (1 << INCARNATION_BITS) - 1;

/// The incarnation part of a revision.
pub fn incarnation_of(revision: u64) -> u32 {
    (revision >> COUNT_BITS) as u32
}

/// The incarnation of a server with id `server_id` started at `started`:
/// its start in milliseconds (so two starts of one server less than 4.6
/// hours apart, 2^24 ms, always differ: a restart within a millisecond of
/// the last is not possible), mixed with a hash of the id (so two servers
/// started together differ too, but for a 2^-24 chance).
pub fn incarnation(server_id: &str, started: Micros) -> u32 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    server_id.hash(&mut h);
    ((started.as_micros() / 1000) ^ h.finish()) as u32 & INCARNATION_MASK
}
