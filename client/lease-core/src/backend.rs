//! [`LeaseBackend`]: where leases live. The lease handle ([`crate::Lease`]),
//! its renewal, loss and write rights are the same whatever keeps the
//! leases: one bagel server (`bagel_client::Client`, or a `Coalescer`
//! batching over one), or a backend another crate supplies (S3 conditional
//! writes, several servers).
//!
//! A backend answers with checked [`Grant`]s and [`Renewal`]s: each carries
//! the witnesses that state it, verified against the keys the backend
//! trusts; the bag writer and the audit check them again against their own
//! keys. The handle reads one thing in them: each witness's `issued_at_us`
//! and deadline bound the lease's validity on the monotonic clock (the TTL
//! left when it was issued), so a backend states when it made each grant
//! or renewal, never zero.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, Micros};

use crate::error::{Error, Result};
use crate::types::{
    Grant, History, LeaseRef, Metadata, Mode, NameState, ReleaseOptions, Renewal, ServerInfo,
};

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

/// What a backend says of itself, for operators (`bagel lease
/// server-info`): a server's info, each server's, or a lease store's
/// settings (there is no server to ask).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum BackendInfo {
    /// One lease server, at `url`.
    Server { url: String, info: ServerInfo },
    /// Several lease servers: (URL, info) of each, in the order a
    /// multi-server acquire visits them (by member id).
    Servers(Vec<(String, ServerInfo)>),
    /// A lease store without a server (S3 conditional writes).
    Store(StoreInfo),
}

/// The settings of a lease store without a server, and the keys its
/// witnesses are signed with.
#[derive(Clone, Debug)]
pub struct StoreInfo {
    /// The store's URL.
    pub location: String,
    /// The key this client signs its witnesses with.
    pub key_id: String,
    /// Leases are longer than this...
    pub min_ttl: Duration,
    /// ...and at most this long.
    pub max_ttl: Duration,
    /// The longest one acquire waits for a busy name.
    pub max_wait: Duration,
    /// How long after its deadline others take over a lease, at least.
    pub clock_margin: Duration,
    /// Every key published in the store.
    pub keys: KeyRing,
}

/// The refusal of an operation a backend cannot answer (the trait's
/// default for the operator's calls): not retryable.
pub fn not_supported(what: &str, location: &str) -> Error {
    Error::Unsupported {
        what: what.to_owned(),
        location: location.to_owned(),
    }
}

/// The operations a lease handle needs from where leases live, and those
/// an operator asks of it (describe, history, trusted keys, info), which
/// have defaults refusing them for a backend that cannot answer.
///
/// Operations name a lease by [`LeaseRef`] (id, token and names) so that
/// another process holding only the lease file can renew or release it.
///
/// `Any` is a supertrait so that what only one backend has (a cluster's
/// routing, a server's watch) is reached by downcasting an
/// `Arc<dyn LeaseBackend>` (`Arc<dyn Any + Send + Sync>` by upcasting);
/// everything else goes through the trait.
#[async_trait]
pub trait LeaseBackend: std::any::Any + Send + Sync + fmt::Debug {
    /// Where the leases live, for messages and lease files (a server URL,
    /// an S3 prefix).
    fn location(&self) -> String;

    /// Where a grant came from when that is one place, as lease files
    /// name it (a server URL, a lease store URL): [`Self::location`] by
    /// default; `None` for several servers (each part of a grant names
    /// its own).
    fn single_location(&self) -> Option<String> {
        Some(self.location())
    }

    /// What the next holder of each name would find now, in the order
    /// asked.
    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        let _ = names;
        Err(not_supported("describe", &self.location()))
    }

    /// A name's recent renewals (with metadata) and releases.
    async fn history(&self, name: &str) -> Result<History> {
        let _ = name;
        Err(not_supported("history", &self.location()))
    }

    /// Every key a witness of this backend may be signed with (as known
    /// now): what a reader or an audit of its bags trusts.
    async fn trusted_keys(&self) -> Result<KeyRing> {
        Err(not_supported("listing the trusted keys", &self.location()))
    }

    /// What the backend says of itself (see [`BackendInfo`]).
    async fn info(&self) -> Result<BackendInfo> {
        Err(not_supported("server info", &self.location()))
    }

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
    fn single_location(&self) -> Option<String> {
        (**self).single_location()
    }
    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        (**self).describe(names).await
    }
    async fn history(&self, name: &str) -> Result<History> {
        (**self).history(name).await
    }
    async fn trusted_keys(&self) -> Result<KeyRing> {
        (**self).trusted_keys().await
    }
    async fn info(&self) -> Result<BackendInfo> {
        (**self).info().await
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
