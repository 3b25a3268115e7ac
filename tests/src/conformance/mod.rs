//! The conformance suites, each scenario a public async function that any
//! backend's tests call (as `object_store`'s `integration` module is to its
//! stores).
//!
//! * [`lease`]: the lease handle over any `bagel_client::LeaseBackend`.
//! * [`bags`]: bag writing, closing, sealing, reading, summaries and
//!   retention over any `bagel_bags::BagStore`.
//!
//! Every scenario takes an environment and the backend's declared
//! capabilities (named booleans, each saying what the scenarios may expect
//! of it, never which backend it is), and panics on a failed assertion.
//!
//! # A new lease backend
//!
//! Wrap it in a [`crate::LeaseEnv`] with [`crate::LeaseEnv::of`] (the
//! backend, and how long a waiter needs to take over an expired lease of
//! it), declare its [`lease::Capabilities`], and add a module for it to
//! `tests/tests/lease_conformance.rs` calling each scenario from one
//! `#[tokio::test]`. The `memory` module there, over
//! [`crate::MemoryLeaseBackend`] (`tests/src/memory_lease.rs`, the smallest
//! backend that passes), is the one to copy.
//!
//! # A new bag store
//!
//! Implement [`bags::BagEnv`] for what opens it (fresh handles, one that
//! fails part way, and its raw bytes), as [`crate::Backend`] does for a
//! directory, S3 and NFS, declare its [`bags::Capabilities`], and add a
//! module for it to `tests/tests/bags_conformance.rs` calling each scenario.

pub mod bags;
pub mod lease;
