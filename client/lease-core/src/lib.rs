//! bagel's lease core: what every lease backend shares, with no transport
//! in it. A backend (the gRPC client in `bagel-client`, the S3 lease store
//! in `bagel-s3-lease`, one a user writes) implements [`LeaseBackend`];
//! everything else (the [`Lease`] handle with its background renewal,
//! loss notification and write rights, [`AcquireBuilder`], waits of any
//! length) is written once, here, over the trait.
//!
//! # Layout
//! * [`backend`]: [`LeaseBackend`], where leases live: the operations a
//!   lease handle needs, on a lease by id and token ([`LeaseRef`]), and
//!   those an operator asks (describe, history, trusted keys, info).
//! * [`acquire`]: [`AcquireBuilder`], the options of one acquire on any
//!   backend.
//! * [`lease`]: [`Lease`], a held lease with background renewal, loss
//!   notification, and the rights a writer writes under.
//! * [`long_wait`]: waits of any length (or forever) for busy names, in
//!   rounds of at most the backend's max wait.
//! * [`limits`]: [`LeaseLimits`], the bounds of a lease request and the
//!   rules that check it, for the server and every backend alike.
//! * [`chain`]: the lease-chain rule (who may take a name, what the new
//!   holder inherits, fencing tokens, the restart wait), pure, for the
//!   server's table and the model checker alike.
//! * [`rules`]: what every backend that judges releases itself checks
//!   alike (a watermark ahead of its time).
//! * [`holder_key`]: the key a lease's witnesses name and its batches are
//!   signed with.
//! * [`time_source`]: [`TimeSource`], signed time for writers (Roughtime,
//!   or a [`TimeAuthority`] such as a lease server) and the check that the
//!   local clock is right.
//! * [`types`]: the domain types (no generated type crosses the API).
//! * [`error`]: the one error type, transport-neutral; every variant says
//!   if a retry helps.
//!
//! # A new backend
//! Implement [`LeaseBackend`] (the four lease operations, its clock and
//! max TTL; the operator's calls have defaults), answer with [`Grant`]s
//! whose witnesses it signs or checks, and say failures with [`Error`]'s
//! variants. The lease conformance suite (`tests/tests/lease_conformance.rs`)
//! runs every backend through the same scenarios; `tests/src/memory_lease.rs`
//! is the smallest backend that passes it.

#![warn(missing_docs)]

pub mod acquire;
pub mod backend;
pub mod chain;
pub mod error;
pub mod holder_key;
pub mod lease;
pub mod limits;
pub mod long_wait;
pub mod rules;
pub mod time_source;
mod ttl_check;
pub mod types;

pub use acquire::AcquireBuilder;
pub use backend::{AcquireSpec, BackendInfo, LeaseBackend, StoreInfo};
pub use bagel_proto::Micros;
pub use error::{BoxError, Error, NotHeldReason, Result, RevisionRefusal};
pub use lease::{Lease, LeaseOptions, LeaseState, LossReason};
pub use limits::{LeaseLimits, Refusal};
pub use time_source::{TimeAuthority, TimeOptions, TimeSource};
pub use types::{
    AccessInfo, ClockSource, ClockStatus, Conflict, Ended, Grant, History, HistoryEntry, HistoryEvent,
    Holder, Inherited, LeaseRef, ListPage, ListedName, Metadata, Mode, NameGrant, NameState, Previous,
    ReleaseOptions, Renewal, ServerInfo, ServerPart, WatchEvent, WatchEventKind, WatchTarget, Witness,
};
