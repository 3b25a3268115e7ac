//! Closable per-second bags of timestamped messages, on a directory (local,
//! NFS through the kernel or a userspace client) or on S3, with the writer
//! that fills them, the metronome that closes them, the reader that orders
//! them and the audit that checks them.
//!
//! This crate knows nothing of lease servers: a writer sees the leases it
//! writes under only through [`bagel_proto::rights::WriteRights`], and gets
//! its signed time through [`bagel_proto::SignedClock`].
//!
//! # Example
//!
//! Open a store, write under a lease, let a metronome close the bag, read
//! it back with every message checked, and audit it. The store is a
//! directory (`s3://bucket/prefix` and `nfs://host/export/dir` open the
//! same way). With a lease server the rights come from
//! `bagel_client::Lease::rights()` and signed time from a
//! `bagel_client::TimeSource`; here both come from this crate's `testing`
//! feature (a throwaway signing key), and a manual clock stands in for the
//! seconds a bag waits before it closes, so the example runs alone and at
//! once (with the feature on, as in `cargo test --workspace`).
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use bagel_bags::audit::{AuditConfig, AuditMessage, audit};
//! use bagel_bags::testing::TestLeases;
//! use bagel_bags::{BagConfig, Metronome, ReadOptions, Writer, open_store, read};
//! use bagel_proto::Micros;
//! use bagel_proto::clock::{AssumedExact, Clock as _, ManualClock};
//! # use bagel_bags::testing::TestLease;
//! # /// What a lease server grants: a witness with a signed time (TestLeases'
//! # /// own witnesses carry none, and the audit asks for one).
//! # fn granted(leases: &TestLeases, now: Micros) -> TestLease {
//! #     use prost::Message as _;
//! #     let (min, deadline) = (now.saturating_sub(Duration::from_secs(1)), now.saturating_add(Duration::from_secs(3600)));
//! #     let mut lease = leases.lease("lease-1", min, deadline);
//! #     let mut body = bagel_proto::pb::WitnessBody::decode(&lease.witness.body[..]).expect("a body");
//! #     body.signed_time = Some(bagel_proto::sign_local_time(&leases.signer, "test-server", min, 0));
//! #     body.self_timed = true;
//! #     lease.witness = bagel_proto::sign_witness(&leases.signer, &body);
//! #     lease
//! # }
//!
//! let dir = tempfile::tempdir()?;
//! let cfg = BagConfig::default(); // every writer, closer and reader agrees on it
//! let store = open_store(&format!("file://{}", dir.path().display()), &cfg).await?;
//!
//! let leases = TestLeases::default(); // stands in for a lease server
//! let clock = ManualClock::new(Micros::now());
//! let lease = granted(&leases, clock.now()); // a lease, its witness as a server signs it
//! let writer = Writer::new(
//!     Arc::clone(&store),
//!     "ledger",
//!     "writer-1",
//!     Arc::new(lease),
//!     Arc::new(clock.clone()),
//!     leases.time(Arc::new(clock.clone())),
//!     cfg.clone(),
//! )?;
//! // Acknowledged once its batch is in the store; the timestamp is inside
//! // the lease and above every earlier holder's watermark.
//! let at = writer.write("deposit 10".into()).await?;
//!
//! // A bag closes 1 s + grace after its second. Closers act on a checked
//! // clock (Roughtime or the lease server's signed time in production).
//! clock.advance(Duration::from_secs(5));
//! let closer = Arc::new(AssumedExact(clock.clone()));
//! let mut metronome = Metronome::new(Arc::clone(&store), vec!["ledger".into()], cfg.clone(), closer.clone())?;
//! metronome.tick().await?;
//!
//! let mut options = ReadOptions::default(); // the whole log
//! options.keys = Some(leases.keys()); // the lease servers' keys: check every signature
//! let report = read(store.as_ref(), "ledger", &options, &cfg, closer.as_ref()).await?;
//! assert_eq!(report.messages.len(), 1);
//! assert_eq!(report.messages[0].timestamp, at);
//! assert!(report.rejected.is_empty() && report.problems.is_empty());
//!
//! // From the stored messages and witnesses alone: signatures, leases,
//! // chains of grants, watermarks.
//! let audited = audit(&AuditMessage::from_report(&report, "ledger"), &AuditConfig::new(leases.keys()));
//! assert!(audited.is_clean(), "{:?}", audited.violations);
//! # Ok(()) }
//! # #[cfg(not(feature = "testing"))]
//! # fn main() {}
//! ```
//!
//! # The model
//! A message goes to the bag of its timestamp's [`Bucket`] (one per UTC
//! second). A bag is *closed* at `bucket_end + grace` (2 s by default): any
//! process (a [`metronome`], a reader, a late writer) may close it, and all
//! of them, concurrently, arrive at the same first-written lock listing.
//! After the close, the bag is exactly what its lock lists; a write that
//! landed after the lock is not in the bag for any reader, and its writer is
//! told so ([`Error::LateRejected`]) instead of being acknowledged.
//!
//! # Who closes what (and why the metronome only looks back a little)
//! * A [`Writer`] only ever writes timestamps `>= now`, so it never starts
//!   a write into a bag whose close time has passed. A write that
//!   *finishes* past the safe point (`close_time - clock_tolerance`) checks
//!   for a close in progress, and a write that finishes past the close time
//!   closes the bag itself; either way it is acknowledged only if the lock
//!   lists it.
//! * A [`reader`] closes every past-due bag it reads before reading it, and
//!   seals (closes empty) the missing ones from the log's start mark on.
//! * So the [`metronome`] only has to be timely, not exhaustive: it closes
//!   from `now - lookback` on, and a bag older than that which nobody closed
//!   is closed by whoever touches it first, with the same result.
//!
//! # Layout
//! * [`bucket`]: a bag's second and its `YYYY/MM/DD/hh/mm/ss` path.
//! * [`config`]: [`BagConfig`], the timing every process must agree on.
//! * [`listing`]: what a closed bag holds, and the lock's text form.
//! * [`store`]: the [`BagStore`] trait, the tree walk, start marks, and
//!   the stores (directory, object, NFS, their URLs, timeouts, faults).
//! * [`names`]: log names and writer ids.
//! * [`error`]: the one error type.
//! * [`pace`]: time, sleeping and entropy behind one seam (a simulation
//!   pauses tokio's clock and seeds the entropy).
//! * [`frame`]: record framing (length + CRC-32C) in files and objects.
//! * [`holder_sig`]: the holder's signature binding a batch to its leases,
//!   log, bag, writer and sequence numbers.
//! * [`store::fsops`]: the small trait of NFS-safe file operations, and `std::fs`.
//! * [`store::nfs`]: the same trait over a userspace NFSv3/NFSv4.2 client
//!   (`nfs://host[:port]/export/dir`); see `store/NFS.md`.
//! * [`store::counting`]: an `FsOps` wrapper counting calls, to measure the cost
//!   of writes and closes per backend.
//! * [`store::directory`]: the bag of single-writer logs on a directory, over any
//!   `FsOps`: prelock, read-only data files, a private listing linked to
//!   `lock` (only operations that are safe on NFS).
//! * [`store::object`]: the maildir-style bag on an S3 prefix, via `object_store`.
//! * [`store::timeout`]: [`TimeoutStore`], every call of any store bounded in time.
//! * [`store::url`]: `file:///dir`, `s3://bucket/prefix` and `nfs://host/dir`.
//! * [`writer`]: timestamps, batches, commit protocol.
//! * [`commit`]: the writer's commit verdict as a pure step over what it
//!   looked up (seal, lock, tombstone, summary); the writer drives it.
//! * [`seal`]: one object closes a minute's empty seconds.
//! * [`summary`]: a closed stretch of a log as one deterministic object.
//! * [`retain`]: removing old bags a checked summary holds.
//! * [`tombstone`]: a minute retention removed stays closed forever.
//! * [`metronome`]: closes past bags; [`close_through`].
//! * [`vouched`]: the time closers act on: a checked clock less its bound.
//! * [`reader`]: ordered, checked reads of a time range.
//! * [`audit`]: from stored messages and witnesses alone, no two writers
//!   of a name overlapped.
//! * `store::memory` (feature `testing`): the directory and S3 stores' own
//!   code over memory, and a store whose every call a script may stall or fail.
//! * `store::faults`, `testing` (feature `testing`): fault-injecting wrappers, and
//!   leases and signed time from a throwaway key, for tests and benches.

#![warn(missing_docs)]

pub mod audit;
pub mod bucket;
pub mod commit;
pub mod config;
pub mod error;
pub mod frame;
pub mod holder_sig;
pub mod layout;
pub mod listing;
pub mod metronome;
pub mod names;
pub mod pace;
pub mod reader;
pub mod retain;
#[cfg(test)]
mod retention_races;
pub mod seal;
pub mod store;
pub mod summary;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tombstone;
pub mod vouched;
pub mod writer;

pub use bucket::Bucket;
pub use config::BagConfig;
pub use error::{Error, Result};
pub use listing::{ListedItem, Listing, Receipt};
pub use metronome::{CloseObserver, CloseReport, Metronome, close_logs_through, close_through};
pub use names::{validate_log, validate_writer_id};
pub use reader::{Problem, ProblemKind, Progress, ReadOptions, ReadReport, Vouched, read};
pub use store::timeout::TimeoutStore;
pub use store::url::open_store;
pub use store::{BagState, BagStore, list_buckets};
pub use vouched::closer_now;
pub use writer::Writer;
