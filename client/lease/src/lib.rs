//! bagel's lease client: leases on named domains with absolute deadlines,
//! renewed in the background, each grant's witness verified.
//!
//! ```no_run
//! # async fn demo() -> Result<(), bagel_client::Error> {
//! use std::time::Duration;
//! let client = bagel_client::Client::connect("http://127.0.0.1:7420").await?;
//! let lease = client.acquire(["tenant-7"]).ttl(Duration::from_secs(5)).send().await?;
//! // ... write messages with timestamps in (lease.min_timestamp(), lease.deadline()),
//! // through a bag writer given lease.rights() ...
//! lease.release(None).await?; // publishes at least what its writers wrote
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
//! * [`backend`]: [`LeaseBackend`], where leases live: the operations a
//!   lease handle needs, on a lease by id and token ([`LeaseRef`]).
//! * [`acquire`]: [`AcquireBuilder`], the options of one acquire on any
//!   backend.
//! * [`client`]: [`Client`], a connection to one lease server (a backend),
//!   and what else the server answers (describe, history, server info).
//! * [`options`]: [`ClientOptions`], how to connect: [`TlsConfig`] for
//!   `https://` servers (a CA, and a client certificate for mutual TLS),
//!   bounds on connecting and on each call.
//! * [`long_wait`]: waits of any length (or forever) for busy names, in
//!   rounds of at most the backend's max wait, riding through restart
//!   waits and reconnects.
//! * [`holder_key`]: the key a lease's witnesses name and its batches are
//!   signed with, shared by the leases of one second unless asked otherwise.
//! * [`lease`]: [`Lease`], a held lease with background renewal, loss
//!   notification, and the rights a writer writes under.
//! * [`cluster`]: [`Cluster`], leases over several servers: names routed by
//!   rendezvous hashing over the configured members, multi-server grants taken tentatively in member-id
//!   order then upgraded, migration from one server list to another.
//! * [`coalesce`]: [`Coalescer`], batching of many tasks' operations over
//!   `Batch` calls or `Session` streams (a backend too).
//! * `verify`: the one place a grant's or renewal's witness is checked.
//! * [`types`]: the domain types of the API (no protobuf type crosses it).
//! * [`time_source`]: [`TimeSource`], signed time for writers (Roughtime, or
//!   the lease server's) and the check that the local clock is right.
//! * [`error`]: the one error type; every variant says if a retry helps.

pub mod acquire;
pub mod backend;
pub mod client;
pub mod cluster;
pub mod coalesce;
pub mod error;
pub mod holder_key;
pub mod lease;
pub mod long_wait;
pub mod options;
mod server_keys;
pub mod time_source;
mod ttl_check;
pub mod types;
mod verify;

pub use acquire::AcquireBuilder;
pub use backend::{AcquireSpec, BackendInfo, LeaseBackend, StoreInfo};
pub use bagel_proto::Micros;
pub use client::{Client, Watch};
pub use cluster::{Cluster, Route, ServerSpec};
pub use coalesce::{CoalesceOptions, Coalescer, Transport};
pub use error::{Error, Result};
pub use lease::{Lease, LeaseOptions, LeaseState, LossReason};
pub use options::{ClientOptions, TlsConfig};
pub use time_source::{TimeOptions, TimeSource};
pub use types::{
    ClockSource, ClockStatus, Conflict, Ended, Grant, History, HistoryEntry, HistoryEvent, Holder, Inherited,
    LeaseRef, ListPage, ListedName, Metadata, Mode, NameGrant, NameState, Previous, ReleaseOptions, Renewal,
    ServerInfo, ServerPart, WatchEvent, WatchEventKind, WatchTarget, Witness,
};
