//! bagel's lease client: leases on named domains with absolute deadlines,
//! renewed in the background, each grant's witness verified.
//!
//! # Example
//!
//! Acquire, check, renew and release a lease on one server, see a second
//! client refused while it is held and inherit its watermark after, then
//! the same over a cluster of servers. `url` is a running
//! `bagel-server`'s address (`http://127.0.0.1:7420` for one started as
//! the README shows); here the example starts servers in its own process.
//!
//! ```
//! use std::time::Duration;
//! use bagel_client::{Client, Cluster, Error, ServerSpec};
//!
//! # /// A lease server in this process on a free port, as `bagel-server
//! # /// --server-id ID --unsafe-skip-restart-wait` would be.
//! # async fn serve(id: &str) -> Result<String, Box<dyn std::error::Error>> {
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! #     let url = format!("http://{}", listener.local_addr()?);
//! #     let cfg = bagel_server::Config::default().with_server_id(id).with_unsafe_skip_restart_wait(true);
//! #     let clock = std::sync::Arc::new(bagel_proto::clock::SystemClock);
//! #     let server = bagel_server::Server::new(cfg, bagel_proto::Signer::generate(), clock)?;
//! #     tokio::spawn(server.serve(listener, std::future::pending()));
//! #     Ok(url)
//! # }
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = serve("bagel-1").await?;
//! let client = Client::connect(url.as_str()).await?;
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
//! // Check it before each write: once it is false, another holder may be
//! // writing.
//! assert!(lease.is_valid());
//! println!("{token:?}, {:?} left", lease.time_left());
//! // The handle renews every third of the TTL by itself; renew() asks now
//! // and returns the new deadline (µs since the epoch, server's clock).
//! let deadline = lease.renew().await?;
//! assert!(deadline >= lease.min_timestamp());
//!
//! // Held: another client that asks for no wait is refused at once; the
//! // error says who holds the name and until when.
//! let other = Client::connect(url.as_str()).await?;
//! let refused = other.acquire(["tenant-7"]).ttl(Duration::from_secs(5)).send().await;
//! let Err(Error::Busy { conflict: Some(conflict), .. }) = refused else { panic!("{refused:?}") };
//! assert_eq!(conflict.holder_owner, "worker-1");
//!
//! // Write through a bag writer given lease.rights() (crate bagel-bags):
//! // every batch cites the witness it was checked against, and the lease
//! // learns what was written. lease.lost() resolves if renewal fails.
//! let watermark = lease.release(None).await?; // at least what its writers wrote
//! let next = other.acquire(["tenant-7"]).ttl(Duration::from_secs(5)).send().await?;
//! // The next holder inherits the watermark: it writes strictly after
//! // min_timestamp(), so after everything written under the lease before.
//! assert!(next.min_timestamp() >= watermark);
//! next.release(None).await?;
//!
//! // Several servers: names routed by rendezvous hashing over the members'
//! // identities (`ID=URL`, as `bagel --servers` takes them; each server
//! // started with its `--server-id`).
//! # let (url_1, url_2) = (url, serve("bagel-2").await?);
//! let servers = ServerSpec::parse_list(&format!("bagel-1={url_1},bagel-2={url_2}"))?;
//! let cluster = Cluster::connect(&servers).await?;
//! let lease = cluster.acquire(["tenant-7", "tenant-9"]).ttl(Duration::from_secs(5)).send().await?;
//! assert!(lease.is_valid()); // one handle, whichever servers hold its names
//! lease.release(None).await?;
//! # Ok(()) }
//! ```
//!
//! Under load, batch many tasks' operations into one RPC and one signature:
//!
//! ```
//! # async fn serve() -> Result<String, Box<dyn std::error::Error>> {
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! #     let url = format!("http://{}", listener.local_addr()?);
//! #     let cfg = bagel_server::Config::default().with_unsafe_skip_restart_wait(true);
//! #     let clock = std::sync::Arc::new(bagel_proto::clock::SystemClock);
//! #     let server = bagel_server::Server::new(cfg, bagel_proto::Signer::generate(), clock)?;
//! #     tokio::spawn(server.serve(listener, std::future::pending()));
//! #     Ok(url)
//! # }
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let client = bagel_client::Client::connect(serve().await?).await?;
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
pub use cluster::{Cluster, DnsCluster, Route, ServerSpec};
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
