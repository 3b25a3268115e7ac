//! [`LeaseBackend`]: where leases live. The lease handle ([`crate::Lease`]),
//! its renewal, loss and write rights are the same whatever keeps the
//! leases: one bagel server ([`crate::Client`], or a [`crate::Coalescer`]
//! batching over one), or a backend another crate supplies (S3 conditional
//! writes, several servers).
//!
//! A backend answers with checked [`Grant`]s and [`Renewal`]s: each carries
//! the witnesses that state it, verified against the keys the backend
//! trusts. The handle never looks inside a witness; the bag writer and the
//! audit check them again against their own keys.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::Micros;
use bagel_proto::clock::Clock;

use crate::error::Result;
use crate::types::{Grant, LeaseRef, Metadata, Mode, ReleaseOptions, Renewal};

/// One acquire, as the [`crate::AcquireBuilder`] resolved it.
#[derive(Clone, Debug)]
pub struct AcquireSpec {
    /// All or none.
    pub names: Vec<String>,
    /// Absolute (Unix µs): what the caller asked for, or, with `ttl`, the
    /// local clock's estimate of it (for backends that only take absolute
    /// deadlines).
    pub deadline: Micros,
    /// A TTL counted from the grant, on the backend's clock: a lease
    /// server is asked for it as such (`ttl_us`), so time the request
    /// spends on the way or waiting for a busy name is not taken off the
    /// lease, and a client clock behind the server's does not shorten it.
    /// `None`: `deadline` is what was asked for.
    pub ttl: Option<Duration>,
    pub mode: Mode,
    /// Free text for operators.
    pub owner: String,
    /// How long the backend may wait for busy names (zero: refuse at once).
    pub wait: Duration,
    /// The holder's public key for this lease (ed25519, raw), to be stated
    /// in every witness of it: the holder signs its batches with the secret
    /// half, so a copy of a witness cannot vouch for other bytes. `None`:
    /// the witnesses say nothing of the holder (as from an old client).
    pub holder_key: Option<[u8; 32]>,
}

/// The operations a lease handle needs from where leases live.
///
/// Operations name a lease by [`LeaseRef`] (id, token and names) so that
/// another process holding only the lease file can renew or release it.
#[async_trait]
pub trait LeaseBackend: Send + Sync + fmt::Debug {
    /// Where the leases live, for messages and lease files (a server URL,
    /// an S3 prefix).
    fn location(&self) -> String;

    /// The clock TTLs are counted on and local validity is checked against.
    fn clock(&self) -> Arc<dyn Clock>;

    /// The longest lease this backend grants.
    fn max_ttl(&self) -> Duration;

    /// The longest wait one acquire may ask for, when known: longer waits
    /// are made of several ([`crate::long_wait`]). `None`: unknown (a
    /// refusal naming it is then learnt from).
    fn max_wait(&self) -> Option<Duration> {
        None
    }

    /// Takes every name of `spec`, or none.
    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant>;

    /// Extends a lease to `deadline` (a later deadline already held is
    /// kept); a renewal never shortens.
    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal>;

    /// Turns a tentative lease full; fails if a name was taken meanwhile.
    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant>;

    /// Ends a lease, publishing a watermark for the next holder; returns
    /// the watermark stored.
    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros>;
}

#[async_trait]
impl<B: LeaseBackend + ?Sized> LeaseBackend for Arc<B> {
    fn location(&self) -> String {
        (**self).location()
    }
    fn clock(&self) -> Arc<dyn Clock> {
        (**self).clock()
    }
    fn max_ttl(&self) -> Duration {
        (**self).max_ttl()
    }
    fn max_wait(&self) -> Option<Duration> {
        (**self).max_wait()
    }
    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        (**self).acquire_lease(spec).await
    }
    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        (**self).renew_lease(lease, deadline, metadata).await
    }
    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        (**self).upgrade_lease(lease).await
    }
    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        (**self).release_lease(lease, options).await
    }
}
