//! [`LeaseStore`]: the objects of an S3 lease prefix, and nothing else.
//!
//! ```text
//! <prefix>/leases/<name>     one lease object per name (see `object`)
//! <prefix>/keys/<key id>     a client's public key: `{"key_id", "ed25519_hex"}`
//! <prefix>/_bagel_probe/…    the start-up probes' scratch objects
//! ```
//!
//! A name becomes one path segment, percent-encoded by `object_store`
//! (`/`, `%`, `*`, `.` and `..` …), so any name the server accepts has its
//! own object. Every call is bounded by the configured timeout and every
//! failure becomes a [`bagel_lease_core::Error::Store`] naming the operation
//! and the object, retryable or not.
//!
//! Whoever may write the prefix may leave anything there, so reads are
//! bounded too: a lease object over [`LeaseStore::max_object_bytes`] is
//! refused from its announced size (and never read past the limit), a key
//! record over [`MAX_KEY_RECORD_BYTES`] likewise, and at most
//! [`MAX_KEY_RECORDS`] key records are read. A key record that is not one
//! is skipped and reported ([`LeaseStore::keys_report`]), so one bad
//! object does not stop every reader that trusts the store's keys.

use std::sync::Arc;
use std::time::Duration;

use bagel_lease_core::Error;
use bagel_object::{S3Url, s3_from_env};
use bagel_proto::{KeyRing, Signer};
use futures::TryStreamExt as _;
use object_store::path::{Path, PathPart};
use object_store::{GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::object::LeaseObject;

/// An object's ETag, as the store gave it (opaque; passed back in
/// `If-Match`).
pub type ETag = String;

/// The condition a lease object PUT is made under.
#[derive(Clone, Debug)]
pub enum Condition {
    /// `If-None-Match: *`: the object must not exist.
    Create,
    /// `If-Match: <etag>`: the object must be exactly the version read.
    Match(ETag),
}

/// How a conditional PUT ended.
#[derive(Clone, Debug)]
pub enum Put {
    /// Written; the new ETag when the store said it.
    Done(Option<ETag>),
    /// The condition failed: someone else changed the object first.
    Lost,
}

/// The largest lease object read, by default: an honest one holds at most
/// 64 names of 256 bytes, 8 history entries of 4 KiB metadata and a signed
/// time, well under 100 KiB.
pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 1 << 20;

/// The largest public key record read (an honest one is ~130 bytes).
pub const MAX_KEY_RECORD_BYTES: u64 = 4096;

/// The most key records [`LeaseStore::keys`] reads (one GET each).
pub const MAX_KEY_RECORDS: usize = 10_000;

/// The public key record published under `keys/`.
#[derive(Debug, Serialize, Deserialize)]
struct KeyRecord {
    key_id: String,
    ed25519_hex: String,
}

/// The lease objects under one prefix of one bucket.
#[derive(Clone, Debug)]
pub struct LeaseStore {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    location: String,
    op_timeout: Duration,
    max_object_bytes: u64,
}

impl LeaseStore {
    /// Over `store`, keys under `prefix`; `location` names it in messages
    /// (`s3://bucket/prefix`).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, location: String, op_timeout: Duration) -> Self {
        LeaseStore {
            store,
            prefix: prefix.trim_matches('/').to_owned(),
            location,
            op_timeout,
            max_object_bytes: DEFAULT_MAX_OBJECT_BYTES,
        }
    }

    /// Refuses lease objects larger than `max` bytes.
    #[must_use]
    pub fn with_max_object_bytes(mut self, max: u64) -> Self {
        self.max_object_bytes = max;
        self
    }

    /// The largest lease object read or written (bytes); a larger one
    /// is refused as implausible rather than parsed.
    pub fn max_object_bytes(&self) -> u64 {
        self.max_object_bytes
    }

    /// Where `name`'s lease object lives, for messages:
    /// `s3://bucket/prefix/leases/<name>`.
    pub fn object_url(&self, name: &str) -> String {
        let path = self.path("leases", name);
        let rel = path
            .as_ref()
            .strip_prefix(self.prefix.as_str())
            .unwrap_or(path.as_ref());
        format!("{}/{}", self.location, rel.trim_start_matches('/'))
    }

    /// The store at `s3://bucket/prefix`, with the endpoint and
    /// credentials of the `AWS_*` environment (as the bag store reads them).
    pub fn from_url(url: &str, op_timeout: Duration) -> Result<Self, Error> {
        let refuse = |reason: String| Error::Invalid {
            field: Some("lease store URL".to_owned()),
            reason: format!("{url:?}: {reason}"),
        };
        if !url.starts_with("s3://") {
            return Err(refuse(
                "leases without a server live on S3: expected s3://bucket/prefix".into(),
            ));
        }
        let S3Url { bucket, prefix } = S3Url::parse(url).map_err(|e| refuse(e.to_string()))?;
        let store = s3_from_env(&bucket).map_err(|e| refuse(e.to_string()))?;
        Ok(Self::new(
            store,
            &prefix,
            url.trim_end_matches('/').to_owned(),
            op_timeout,
        ))
    }

    /// The store's URL (`s3://bucket/prefix`, or what
    /// [`LeaseStore::new`] was given), for messages and witnesses.
    pub fn location(&self) -> &str {
        &self.location
    }

    fn path(&self, dir: &str, leaf: &str) -> Path {
        let base = Path::from(self.prefix.as_str());
        base.join(dir).join(PathPart::from(leaf))
    }

    /// The store's failure of `op` on `path`, its error kept as the source.
    fn err(&self, op: &str, path: &Path, e: object_store::Error) -> Error {
        use object_store::Error as E;
        let retryable = !matches!(
            &e,
            E::PermissionDenied { .. }
                | E::Unauthenticated { .. }
                | E::NotImplemented { .. }
                | E::NotSupported { .. }
                | E::InvalidPath { .. }
        );
        Error::Store {
            location: self.location.clone(),
            message: format!("{op} {path}: {e}"),
            retryable,
            source: Some(Box::new(e)),
        }
    }

    /// Runs one store call within the timeout.
    async fn bounded<T>(
        &self,
        op: &str,
        path: &Path,
        call: impl Future<Output = object_store::Result<T>>,
    ) -> Result<object_store::Result<T>, Error> {
        tokio::time::timeout(self.op_timeout, call)
            .await
            .map_err(|_| Error::Store {
                location: self.location.clone(),
                message: format!("{op} {path}: no answer within {:?}", self.op_timeout),
                retryable: true,
                source: None,
            })
    }

    /// Reads `path` whole if it is at most `max` bytes: refused from the
    /// size the store announces, and never buffered past `max` whatever
    /// arrives. `None` if it does not exist.
    async fn get_bounded(&self, path: &Path, max: u64) -> Result<Option<(Vec<u8>, Option<ETag>)>, Error> {
        let too_big = |size: u64| Error::Store {
            location: self.location.clone(),
            message: format!("{path}: {size} bytes, over the limit of {max} bytes for this kind of object"),
            retryable: false,
            source: None,
        };
        let read = async {
            let got = self.store.get_opts(path, GetOptions::default()).await?;
            let etag = got.meta.e_tag.clone();
            if got.meta.size > max {
                return Ok(Err(too_big(got.meta.size)));
            }
            let mut body = Vec::new();
            let mut stream = got.into_stream();
            while let Some(chunk) = stream.try_next().await? {
                body.extend_from_slice(&chunk);
                if body.len() as u64 > max {
                    return Ok(Err(too_big(body.len() as u64)));
                }
            }
            Ok(Ok((body, etag)))
        };
        match self.bounded("get", path, read).await? {
            Ok(Ok(r)) => Ok(Some(r)),
            Ok(Err(e)) => Err(e),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err("get", path, e)),
        }
    }

    /// A name's lease object and its ETag; `None` if it was never written.
    pub async fn get(&self, name: &str) -> Result<Option<(LeaseObject, Option<ETag>)>, Error> {
        let path = self.path("leases", name);
        let Some((bytes, etag)) = self.get_bounded(&path, self.max_object_bytes).await? else {
            return Ok(None);
        };
        let obj = LeaseObject::decode(&bytes).map_err(|reason| Error::Store {
            location: self.location.clone(),
            message: format!("{path}: {reason}"),
            retryable: false,
            source: None,
        })?;
        if obj.name != name {
            return Err(Error::Store {
                location: self.location.clone(),
                message: format!(
                    "{path} holds the lease object of name {:?}, not {name:?}",
                    obj.name
                ),
                retryable: false,
                source: None,
            });
        }
        Ok(Some((obj, etag)))
    }

    /// Writes a name's lease object under `cond`.
    pub async fn put(&self, obj: &LeaseObject, cond: Condition) -> Result<Put, Error> {
        let path = self.path("leases", &obj.name);
        let mode = match cond {
            Condition::Create => PutMode::Create,
            Condition::Match(e_tag) => PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            }),
        };
        let call = self
            .store
            .put_opts(&path, PutPayload::from(obj.encode()), PutOptions::from(mode));
        match self.bounded("put", &path, call).await? {
            Ok(r) => Ok(Put::Done(r.e_tag)),
            Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => {
                Ok(Put::Lost)
            }
            Err(e) => Err(self.err("put", &path, e)),
        }
    }

    /// Refuses a store that ignores `If-None-Match: *` or `If-Match`: the
    /// bag store's probes ([`bagel_object::probe`]), on this prefix. Every
    /// lease guarantee rests on the store refusing a stale conditional PUT.
    pub async fn probe(&self) -> Result<(), Error> {
        let probes = async {
            let (store, prefix, location) = (&*self.store, &self.prefix, &self.location);
            bagel_object::probe_conditional_put(store, prefix, location).await?;
            bagel_object::probe_conditional_update(store, prefix, location).await
        };
        tokio::time::timeout(self.op_timeout * 4, probes)
            .await
            .map_err(|_| Error::Store {
                location: self.location.clone(),
                message: format!(
                    "probing for conditional writes: no answer within {:?}",
                    self.op_timeout * 4
                ),
                retryable: true,
                source: None,
            })?
            .map_err(|e| Error::Store {
                location: self.location.clone(),
                retryable: !e.is_permanent(),
                message: e.to_string(),
                source: Some(Box::new(e)),
            })
    }

    /// Publishes `signer`'s public key under `keys/`, so readers and
    /// auditors of this store can check the witnesses it signs. Create-only;
    /// an existing record must hold the same key.
    pub async fn publish_key(&self, signer: &Signer) -> Result<(), Error> {
        let path = self.path("keys", signer.key_id());
        let record = KeyRecord {
            key_id: signer.key_id().to_owned(),
            ed25519_hex: bagel_proto::hex::encode(signer.verifying_key().as_bytes()),
        };
        let body = serde_json::to_vec(&record).expect("a key record serializes");
        let call = self
            .store
            .put_opts(&path, PutPayload::from(body), PutOptions::from(PutMode::Create));
        match self.bounded("put", &path, call).await? {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                let ring = self.read_key(&path).await?;
                if ring.get(signer.key_id()) == Some(&signer.verifying_key()) {
                    Ok(())
                } else {
                    Err(Error::Store {
                        location: self.location.clone(),
                        message: format!("{path} holds another public key than {}", signer.key_id()),
                        retryable: false,
                        source: None,
                    })
                }
            }
            Err(e) => Err(self.err("put", &path, e)),
        }
    }

    async fn read_key(&self, path: &Path) -> Result<KeyRing, Error> {
        let Some((bytes, _)) = self.get_bounded(path, MAX_KEY_RECORD_BYTES).await? else {
            return Err(Error::Store {
                location: self.location.clone(),
                message: format!("{path}: listed but gone when read"),
                retryable: true,
                source: None,
            });
        };
        let bad = |reason: String| Error::Store {
            location: self.location.clone(),
            message: format!("{path} is not a public key record: {reason}"),
            retryable: false,
            source: None,
        };
        let record: KeyRecord = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        let raw: [u8; 32] = bagel_proto::hex::decode_array(&record.ed25519_hex).map_err(bad)?;
        let mut ring = KeyRing::new();
        let id = ring.insert_bytes(&raw).map_err(|e| bad(e.to_string()))?;
        if id != record.key_id || path.filename() != Some(id.as_str()) {
            return Err(bad(format!("it holds key {id}, not {}", record.key_id)));
        }
        Ok(ring)
    }

    /// Every public key published under `keys/`: the keys whose witnesses
    /// readers and auditors of this store trust. Trusting them is trusting
    /// whoever may write the prefix, which is also who may write the leases.
    /// A record that is not a key is skipped (logged); see
    /// [`LeaseStore::keys_report`] to show them.
    pub async fn keys(&self) -> Result<KeyRing, Error> {
        let (ring, skipped) = self.keys_report().await?;
        for why in &skipped {
            tracing::warn!(store = %self.location, "skipped a key record: {why}");
        }
        Ok(ring)
    }

    /// The published keys, and why each record that was not read as a key
    /// was skipped (a garbage object under `keys/`, one too large, records
    /// beyond [`MAX_KEY_RECORDS`]). A witness signed by a skipped key then
    /// fails as signed by an unknown key, naming it; everything else reads
    /// normally. Only failing to list the prefix is an error.
    pub async fn keys_report(&self) -> Result<(KeyRing, Vec<String>), Error> {
        let dir = Path::from(self.prefix.as_str()).join("keys");
        let list = self.store.list(Some(&dir)).try_collect::<Vec<_>>();
        let metas = self
            .bounded("list", &dir, list)
            .await?
            .map_err(|e| self.err("list", &dir, e))?;
        let mut ring = KeyRing::new();
        let mut skipped = Vec::new();
        if metas.len() > MAX_KEY_RECORDS {
            skipped.push(format!(
                "{dir}: {} key records, over the limit of {MAX_KEY_RECORDS}; the rest were not read",
                metas.len()
            ));
        }
        for meta in metas.into_iter().take(MAX_KEY_RECORDS) {
            match self.read_key(&meta.location).await {
                Ok(one) => {
                    for id in one.ids() {
                        ring.insert(*one.get(id).expect("listed"));
                    }
                }
                Err(Error::Store {
                    retryable: false,
                    message,
                    ..
                }) => skipped.push(message),
                Err(e) => return Err(e),
            }
        }
        Ok((ring, skipped))
    }
}
