//! The conditional-write probes: a store that ignores `If-None-Match: *`
//! or `If-Match` is refused before anything is written on it, because
//! some "S3-compatible" servers silently do. Bags rest on create-only
//! PUTs (one lock per bag); leases on S3 also on `If-Match` (one holder
//! per name).
//!
//! Each probe writes one scratch object, `<prefix>/_bagel_probe/<random>`,
//! and deletes it (best effort: it is nobody else's).

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use rand::RngCore as _;

use crate::{Error, Result};

/// Checks that a second create-only PUT (`If-None-Match: *`) of one key
/// under `prefix` is refused; [`Error::ConditionalWritesIgnored`] naming
/// `location` (the store as messages call it, `s3://bucket/prefix`) if it
/// is not.
pub async fn probe_conditional_put(store: &dyn ObjectStore, prefix: &str, location: &str) -> Result<()> {
    let key = probe_key(prefix);
    let ignored = || Error::ConditionalWritesIgnored {
        store: location.to_owned(),
        key: key.to_string(),
        condition: "If-None-Match: *",
    };
    let put = |body: &'static [u8]| {
        store.put_opts(
            &key,
            PutPayload::from_static(body),
            PutOptions::from(PutMode::Create),
        )
    };
    put(b"first").await.map_err(|e| match e {
        object_store::Error::NotImplemented { .. } => ignored(),
        e => probe_err(&key, e),
    })?;
    let second = put(b"second").await;
    delete(store, &key).await;
    match second {
        Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
        Ok(_) => Err(ignored()),
        Err(e) => Err(probe_err(&key, e)),
    }
}

/// Checks that a PUT with `If-Match` on an ETag the object does not have
/// is refused; [`Error::ConditionalWritesIgnored`] if it is not, or if
/// the store has no conditional updates at all.
pub async fn probe_conditional_update(store: &dyn ObjectStore, prefix: &str, location: &str) -> Result<()> {
    let key = probe_key(prefix);
    store
        .put_opts(
            &key,
            PutPayload::from_static(b"first"),
            PutOptions::from(PutMode::Create),
        )
        .await
        .map_err(|e| probe_err(&key, e))?;
    // An ETag the object cannot have: the quoted MD5 of other bytes.
    let stale = UpdateVersion {
        e_tag: Some("\"00000000000000000000000000000000\"".into()),
        version: None,
    };
    let update = store
        .put_opts(
            &key,
            PutPayload::from_static(b"second"),
            PutOptions::from(PutMode::Update(stale)),
        )
        .await;
    delete(store, &key).await;
    match update {
        Err(object_store::Error::Precondition { .. }) => Ok(()),
        // A store without conditional updates says so.
        Err(object_store::Error::NotImplemented { .. }) | Ok(_) => Err(Error::ConditionalWritesIgnored {
            store: location.to_owned(),
            key: key.to_string(),
            condition: "If-Match",
        }),
        Err(e) => Err(probe_err(&key, e)),
    }
}

/// A fresh scratch key under `prefix` (`/`-trimmed; may be empty).
fn probe_key(prefix: &str) -> Path {
    let leaf = format!("_bagel_probe/{:016x}", rand::thread_rng().next_u64());
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        Path::from(leaf)
    } else {
        Path::from(format!("{prefix}/{leaf}"))
    }
}

fn probe_err(key: &Path, source: object_store::Error) -> Error {
    Error::Store {
        op: "probe put",
        path: key.to_string(),
        source,
    }
}

/// Best effort: the probe object is ours alone.
async fn delete(store: &dyn ObjectStore, key: &Path) {
    let _ = store
        .delete_stream(Box::pin(futures::stream::once(futures::future::ready(Ok(
            key.clone()
        )))))
        .try_collect::<Vec<_>>()
        .await;
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;

    async fn left(store: &InMemory) -> usize {
        store.list(None).try_collect::<Vec<_>>().await.unwrap().len()
    }

    #[tokio::test]
    async fn an_honest_store_passes_and_keeps_nothing() {
        let store = InMemory::new();
        for prefix in ["", "p/q", "/p/"] {
            probe_conditional_put(&store, prefix, "mem").await.unwrap();
            probe_conditional_update(&store, prefix, "mem").await.unwrap();
        }
        assert_eq!(left(&store).await, 0);
    }

    #[test]
    fn probe_keys_are_fresh_and_under_the_prefix() {
        let (a, b) = (probe_key("/p/q/"), probe_key("p/q"));
        assert!(a.as_ref().starts_with("p/q/_bagel_probe/"), "{a}");
        assert_ne!(a, b);
        assert!(probe_key("").as_ref().starts_with("_bagel_probe/"));
    }
}
