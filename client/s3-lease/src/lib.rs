//! bagel leases with no server at all: the same [`bagel_lease_core::Lease`]
//! handle (renewal, `lost()`, `is_valid()`, `rights()` for the bag writer,
//! release with a watermark) over S3 conditional writes.
//!
//! # Example
//!
//! Two clients of one store: the first holds `tenant-7`, the second is
//! refused until the first releases, then inherits its watermark. The
//! store here is `object_store`'s in-memory one (it honours conditional
//! writes, as S3 does) and the clock is this host's, unchecked, so the
//! example runs alone; in production, `LeaseStore::from_url("s3://bucket/leases",
//! cfg.op_timeout)?` (endpoint and credentials from the `AWS_*` variables)
//! and `LeaseTime::Signed(time_source)`, a clock checked against Roughtime.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use bagel_lease_core::{AcquireBuilder, Error, LeaseBackend};
//! use bagel_proto::clock::SystemClock;
//! use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend, S3LeaseConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let bucket = Arc::new(object_store::memory::InMemory::new());
//! let client = || async {
//!     let cfg = S3LeaseConfig::default();
//!     let store = LeaseStore::new(bucket.clone(), "leases", "memory://leases".into(), cfg.op_timeout);
//!     // Probes the store (refused if it ignores conditional writes) and
//!     // publishes this client's witness key under the prefix.
//!     let time = LeaseTime::UnsafeLocalClock(Arc::new(SystemClock));
//!     let backend = S3LeaseBackend::open(store, bagel_proto::Signer::generate(), time, cfg).await?;
//!     Ok::<Arc<dyn LeaseBackend>, Error>(Arc::new(backend))
//! };
//! let (alice, bob) = (client().await?, client().await?);
//!
//! let lease = AcquireBuilder::new(alice, ["tenant-7"]).ttl(Duration::from_secs(10)).send().await?;
//! assert!(lease.is_valid()); // renewed in the background, as on a server
//! let refused = AcquireBuilder::new(bob.clone(), ["tenant-7"]).ttl(Duration::from_secs(10)).send().await;
//! assert!(matches!(refused, Err(Error::Busy { .. })));
//!
//! let watermark = lease.release(None).await?;
//! let next = AcquireBuilder::new(bob, ["tenant-7"]).ttl(Duration::from_secs(10)).send().await?;
//! assert!(next.names()[0].previous.watermark >= watermark);
//! assert!(next.min_timestamp() >= watermark); // bob writes strictly later
//! next.release(None).await?;
//! # Ok(()) }
//! ```
//!
//! What S3 gives and what it cannot (see `docs/leases-without-a-server.md`): absolute
//! deadlines, watermarks and the previous holder's record handed on,
//! fencing tokens strictly increasing per name, all-or-nothing multi-name
//! acquires in name order, metadata on renew and release, tentative leases
//! and upgrades, polling waits. No third party signs grants: the client
//! signs its own witnesses with a key it publishes in the store, so the
//! audit still chains them. Trusting those keys is trusting whoever may
//! write the prefix, which is also who may write the leases. Every holder's
//! clock counts, so each one checks it against signed time ([`LeaseTime`]),
//! stores its clock's error bound in the lease object, and others break a
//! lease only after its deadline plus the holder's bound plus their own
//! (at least the clock margin). Objects are untrusted input: each is
//! size-capped and checked against the lease rules before it counts.
//!
//! # Layout
//! * [`backend`]: [`S3LeaseBackend`], the [`bagel_lease_core::LeaseBackend`]
//!   (reads, decisions, conditional writes, the per-name ETag cache,
//!   polling waits), plus `describe` and `history` for operators.
//! * `rules`: every lease rule as a pure function of (object, request,
//!   `now`, clock bounds), tested with exact times.
//! * `plausible`: whether an object read is one an honest client could
//!   have written (times, watermarks, bounds), naming the field if not.
//! * [`object`]: the JSON lease object kept per name.
//! * [`store`]: [`LeaseStore`], the layout of a prefix, bounded store calls,
//!   the conditional-write probes, published keys.
//! * [`time`]: [`LeaseTime`], whose clock counts and what vouches for it.
//! * `witness`: client-signed witnesses.
//! * `validate`: request checks with the server's limits and wording.
//! * [`config`]: the limits and margins, [`S3LeaseConfig`].

#![warn(missing_docs)]

pub mod backend;
pub mod config;
pub mod object;
mod plausible;
mod rules;
pub mod store;
pub mod time;
mod validate;
mod witness;

pub use backend::S3LeaseBackend;
pub use config::S3LeaseConfig;
pub use store::LeaseStore;
pub use time::{LeaseTime, SelfSignedClock};

/// Loads the client's witness key from `path` (64 hex digits of an
/// ed25519 secret), creating it (mode 0600) if missing. A key per client
/// machine, kept across runs, so the store does not fill with keys.
pub fn load_or_create_key(path: &std::path::Path) -> std::io::Result<bagel_proto::Signer> {
    bagel_proto::key_file::load_or_create(path).map(|(signer, _)| signer)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_file_is_created_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key");
        let a = super::load_or_create_key(&path).unwrap();
        let b = super::load_or_create_key(&path).unwrap();
        assert_eq!(a.key_id(), b.key_id());
        std::fs::write(&path, "nope").unwrap();
        let err = super::load_or_create_key(&path).unwrap_err();
        assert!(err.to_string().contains("64 hex digits"), "{err}");
    }
}
