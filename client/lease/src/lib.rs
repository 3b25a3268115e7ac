//! bagel's lease client: leases on named domains with absolute deadlines,
//! renewed in the background, each grant's witness verified.
//!
//! # Example
//!
//! Acquire, check, renew and release a lease on one server (start one
//! with `target/release/bagel-server`; see the README), then the same over
//! a cluster of servers:
//!
//! ```no_run
//! use std::time::Duration;
//! use bagel_client::{Client, Cluster, ServerSpec};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect("http://127.0.0.1:7420").await?;
//! let lease = client
//!     .acquire(["tenant-7"])
//!     .ttl(Duration::from_secs(5))
//!     .owner("worker-1")
//!     .wait(Duration::from_secs(30)) // a busy name: wait for its holder
//!     .send()
//!     .await?;
//! let token = lease.fencing_token("tenant-7"); // give it to your storage
//! // Valid means: the lease surely has not ended, on this host's clocks
//! // (measured from when the request was sent, never past the deadline).
//! assert!(lease.is_valid());
//! println!("{token:?}, {:?} left", lease.time_left());
//! // The handle renews every third of the TTL by itself; renew() asks now.
//! let deadline = lease.renew().await?;
//! assert!(deadline >= lease.min_timestamp());
//! // Write through a bag writer given lease.rights() (crate bagel-bags):
//! // every batch cites the witness it was checked against, and the lease
//! // learns what was written. lease.lost() resolves if renewal fails.
//! lease.release(None).await?; // publishes at least what its writers wrote
//!
//! // Several servers: names routed by rendezvous hashing over the members'
//! // identities (`ID=URL`, as `bagel --servers` takes them).
//! let servers = ServerSpec::parse_list("bagel-1=http://10.0.0.1:7420,bagel-2=http://10.0.0.2:7420")?;
//! let cluster = Cluster::connect(&servers).await?;
//! let lease = cluster.acquire(["tenant-7", "tenant-9"]).ttl(Duration::from_secs(5)).send().await?;
//! lease.release(None).await?;
//! # Ok(()) }
//! ```
//!
//! Under load, batch many tasks' operations into one RPC and one signature:
//!
//! ```no_run
//! # async fn demo(client: bagel_client::Client) -> Result<(), bagel_client::Error> {
//! use bagel_client::{CoalesceOptions, Coalescer};
//! let batcher = Coalescer::new(client.clone(), CoalesceOptions::default());
//! let lease = client.acquire(["tenant-7"]).via(&batcher).send().await?;
//! assert!(lease.is_valid()); // the same handle: renewal, rights, loss
//! lease.release(None).await?; // released through the batcher too
//! # Ok(()) }
//! ```
//!
//! This crate knows nothing of bags or storage: a writer (crate
//! `bagel-bags`) sees a lease only through [`bagel_proto::rights`].
//!
//! # Layout
//! The lease core (crate `bagel-lease-core`, re-exported here under the
//! same paths): [`backend`] ([`LeaseBackend`]), [`acquire`]
//! ([`AcquireBuilder`]), [`lease`] ([`Lease`]), [`long_wait`],
//! [`holder_key`], [`time_source`] ([`TimeSource`]: signed time for
//! writers and the check that the local clock is right), [`types`] and
//! [`error`] (transport-neutral). This
//! crate is the gRPC side of it:
//! * [`client`]: [`Client`], a connection to one lease server (a backend),
//!   and what else the server answers (describe, history, server info,
//!   list, watch).
//! * [`options`]: [`ClientOptions`], how to connect: [`TlsConfig`] for
//!   `https://` servers (a CA, and a client certificate for mutual TLS),
//!   bounds on connecting and on each call.
//! * [`cluster`]: [`Cluster`], leases over several servers: names routed by
//!   rendezvous hashing over the configured members, multi-server grants
//!   taken tentatively in member-id order then upgraded, migration from
//!   one server list to another.
//! * [`coalesce`]: [`Coalescer`], batching of many tasks' operations over
//!   `Batch` calls or `Session` streams (a backend too).
//! * `verify`: the one place a grant's or renewal's witness is checked.
//! * `grpc_error`: the edge where a gRPC status becomes the core's
//!   [`Error`] (the only place a gRPC code is read).
//! * `server_time`: the lease server as a time authority for a
//!   [`TimeSource`] (its `SignedNow`), for writers without Roughtime.

#![warn(missing_docs)]

pub mod client;
pub mod cluster;
pub mod coalesce;
mod grpc_error;
pub mod options;
mod server_keys;
mod server_time;
mod verify;

// The lease core's modules, reachable from this crate too: a program that
// takes leases from a server needs only `bagel-client`.
pub use bagel_lease_core::{acquire, backend, error, holder_key, lease, long_wait, time_source, types};

pub use acquire::AcquireBuilder;
pub use backend::{AcquireSpec, BackendInfo, LeaseBackend, StoreInfo};
pub use bagel_proto::Micros;
pub use client::{Client, Watch, WatchMessage, WatchOptions};
pub use cluster::{Cluster, Route, ServerSpec};
pub use coalesce::{CoalesceOptions, Coalescer, Transport};
pub use error::{BoxError, Error, NotHeldReason, Result, RevisionRefusal};
pub use lease::{Lease, LeaseOptions, LeaseState, LossReason};
pub use options::{BearerToken, ClientOptions, TlsConfig};
pub use time_source::{TimeAuthority, TimeOptions, TimeSource};
pub use types::{
    ClockSource, ClockStatus, Conflict, Ended, Grant, History, HistoryEntry, HistoryEvent, Holder, Inherited,
    LeaseRef, ListPage, ListedName, Metadata, Mode, NameGrant, NameState, Previous, ReleaseOptions, Renewal,
    ServerInfo, ServerPart, WatchEvent, WatchEventKind, WatchTarget, Witness,
};
