//! The bagel client library.
//!
//! ```no_run
//! # async fn demo() -> Result<(), bagel_client::Error> {
//! use std::time::Duration;
//! let client = bagel_client::Client::connect("http://127.0.0.1:7420").await?;
//! let lease = client.acquire(["tenant-7"]).ttl(Duration::from_secs(5)).send().await?;
//! // ... write messages with timestamps in (lease.min_timestamp(), lease.deadline()) ...
//! let written_up_to = lease.min_timestamp().next();
//! lease.release(Some(written_up_to)).await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! * [`client`]: [`Client`], a connection to one lease server, and the
//!   acquire builder.
//! * [`lease`]: [`Lease`], a held lease with background renewal and loss
//!   notification.
//! * [`coalesce`]: [`Coalescer`], client-side coalescing of many tasks'
//!   operations into `Batch` calls (one RPC and one signature per batch).
//! * [`bag`]: closable per-second bags of messages on a directory or S3:
//!   writer, metronome, reader.
//! * [`audit`]: checks stored messages and their witnesses for overlapping
//!   writers, out-of-lease timestamps and bad signatures.
//! * [`error`]: the lease client's error type; every variant says if a
//!   retry helps (the bag module has its own, [`bag::Error`]).
//! * [`clock`]: injectable clocks.
//! * [`time`]: [`TimeSource`], signed time for writers (Roughtime, or the
//!   lease server's `SignedNow`) and the check that the local clock is
//!   right.
//! * [`json`]: the JSON forms the CLI prints and reads (a contract).

pub mod audit;
pub mod bag;
pub mod client;
pub mod clock;
pub mod coalesce;
pub mod error;
pub mod json;
pub mod lease;
pub mod time;

pub use bagel_proto::{Micros, pb};
pub use client::{AcquireBuilder, Client};
pub use coalesce::{CoalesceOptions, Coalescer, Transport};
pub use error::{Error, Result};
pub use lease::{Lease, LeaseOptions, LeaseState};
pub use time::{TimeOptions, TimeSource};
