//! Exhaustive exploration of the lease and routing protocols with the
//! `stateright` model checker, over the project's own decision functions.
//!
//! Why stateright: it is a model checker made for distributed protocols in
//! Rust (breadth-first search over every interleaving, `always` and
//! `sometimes` properties, a shortest counterexample as a path of
//! actions), so the transitions can call our functions directly rather
//! than a second description of them in TLA+ or Promela that could drift.
//! What the model abstracts (the network, the clocks, the bytes) is
//! listed at the top of each model.
//!
//! * [`routing`]: servers with IDs that crash and restart, clients with
//!   server lists (right, wrong, pinned, migrating), acquires, writes,
//!   releases and expiry on true time; the properties of docs/concepts.md
//!   (one holder, rising fencing tokens, watermarks above every write).

pub mod routing;
