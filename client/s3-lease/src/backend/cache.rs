//! The per-name cache of the version last read or written, and the reads
//! that fall back to the store when it misses.
//!
//! Separate because it is what makes renew, upgrade and release one PUT per
//! name on the happy path, and keeping every insert and removal in one
//! place shows that an entry is only ever used for the lease it names.

use bagel_lease_core::{Error, NotHeldReason, Result};

use super::S3LeaseBackend;
use crate::object::LeaseObject;
use crate::store::ETag;

/// The last version of a name's object this process read or wrote, for the
/// lease it names.
#[derive(Clone, Debug)]
pub(super) struct Cached {
    lease_id: String,
    etag: ETag,
    object: LeaseObject,
}

impl S3LeaseBackend {
    pub(super) fn remember(&self, lease_id: &str, etag: Option<ETag>, object: LeaseObject) {
        match etag {
            Some(etag) => {
                self.cache.insert(
                    object.name.clone(),
                    Cached {
                        lease_id: lease_id.to_owned(),
                        etag,
                        object,
                    },
                );
            }
            None => {
                self.cache.remove(&object.name);
            }
        }
    }

    pub(super) fn forget(&self, name: &str, lease_id: &str) {
        self.cache.remove_if(name, |_, c| c.lease_id == lease_id);
    }

    /// A name's object for an operation of `lease_id`: the cached version
    /// unless `fresh`, else read. Says whether it came from the cache.
    pub(super) async fn current(
        &self,
        name: &str,
        lease_id: &str,
        fresh: bool,
    ) -> Result<(LeaseObject, ETag, bool)> {
        if !fresh
            && let Some(c) = self
                .cache
                .get(name)
                .filter(|c| c.lease_id == lease_id)
                .map(|c| c.clone())
        {
            return Ok((c.object, c.etag, true));
        }
        match self.store.get(name).await? {
            Some((obj, Some(etag))) => Ok((obj, etag, false)),
            Some((_, None)) => Err(self.no_etag(name)),
            None => Err(Error::not_held(
                NotHeldReason::Gone,
                format!("lease_id: unknown lease {lease_id}: name {name:?} has no lease object"),
            )),
        }
    }

    pub(super) fn no_etag(&self, name: &str) -> Error {
        Error::Store {
            location: self.store.location().to_owned(),
            message: format!(
                "the store gave no ETag for the lease object of {name:?}: conditional writes impossible"
            ),
            retryable: false,
            source: None,
        }
    }
}
