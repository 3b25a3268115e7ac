//! Talking to a time authority and judging the local clock by it: the
//! Roughtime [`querier`] (UDP, retries, chained nonces) and the clock
//! [`monitor`] (how far off is this host's clock, from recent answers).
//! Shared by the lease server and the writers; not wire types.

pub mod monitor;
pub mod querier;
