//! Rendezvous (highest random weight) hashing: which server owns a name.
//! The rule lives in [`bagel_proto::routing`], where the servers' own
//! membership check (and the model checker) run the same function; this
//! module keeps its path for the client's users.

pub use bagel_proto::routing::{owner, weight};
