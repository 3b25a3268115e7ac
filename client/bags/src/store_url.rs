//! Store addresses: `file:///abs/dir` (POSIX), `s3://bucket/prefix`
//! (S3; endpoint and credentials from the usual `AWS_*` environment, as
//! `object_store` reads them) and `nfs://host[:port]/export/dir[?version=3|4]`
//! (the POSIX bag over a userspace NFS client, see [`crate::nfs`]).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};

use crate::directory::DirectoryStore;
use crate::nfs::{NfsFs, NfsTarget};
use crate::s3::S3Store;
use crate::{BagConfig, BagStore, Error, Result, TimeoutStore};

/// A parsed store address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    File { root: std::path::PathBuf },
    S3 { bucket: String, prefix: String },
    Nfs(NfsTarget),
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<Self> {
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(Error::invalid(
                    "store URL",
                    url,
                    "a file URL needs an absolute path: file:///abs/dir",
                ));
            }
            return Ok(StoreUrl::File { root: path.into() });
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::invalid("store URL", url, "no bucket: s3://bucket/prefix"));
            }
            return Ok(StoreUrl::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            });
        }
        if url.starts_with("nfs://") {
            return NfsTarget::parse(url)
                .map(StoreUrl::Nfs)
                .map_err(|reason| Error::invalid("store URL", url, reason));
        }
        Err(Error::invalid(
            "store URL",
            url,
            "expected file:///abs/dir, s3://bucket/prefix or nfs://host[:port]/export/dir",
        ))
    }
}

/// An S3 client for `bucket` configured from the `AWS_*` environment, with
/// path-style requests, conditional PUTs, and plain HTTP allowed when the
/// endpoint is `http://`.
///
/// Without `AWS_ACCESS_KEY_ID`, `object_store` would ask the instance
/// metadata service for credentials; that is only done when
/// `BAGEL_S3_INSTANCE_CREDENTIALS=1` says so, so that a shell that merely
/// forgot the S3 environment fails at once with a clear message instead of
/// reaching out to the network.
pub fn s3_from_env(bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    let has_keys = std::env::var_os("AWS_ACCESS_KEY_ID").is_some_and(|v| !v.is_empty());
    let instance = std::env::var("BAGEL_S3_INSTANCE_CREDENTIALS").is_ok_and(|v| v == "1");
    if !has_keys && !instance {
        return Err(Error::invalid(
            "S3 environment",
            format!("s3://{bucket}"),
            "AWS_ACCESS_KEY_ID is not set (set AWS_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, \
             AWS_REGION; or BAGEL_S3_INSTANCE_CREDENTIALS=1 to use instance credentials)",
        ));
    }
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_virtual_hosted_style_request(false)
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    let endpoint = std::env::var("AWS_ENDPOINT")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .unwrap_or_default();
    if endpoint.starts_with("http://") {
        b = b.with_allow_http(true).with_endpoint(endpoint);
    }
    let store = b.build().map_err(|e| Error::Store {
        op: "configure",
        path: format!("s3://{bucket}"),
        source: e,
    })?;
    Ok(Arc::new(store))
}

/// Opens the store at `url`, every call bounded by `cfg.op_timeout` (see
/// [`TimeoutStore`]). An S3 store is probed first and refused if it
/// ignores conditional writes.
pub async fn open_store(url: &str, cfg: &BagConfig) -> Result<Arc<dyn BagStore>> {
    let store: Arc<dyn BagStore> = match StoreUrl::parse(url)? {
        StoreUrl::File { root } => {
            // On the blocking pool and bounded like every later call: a
            // hung mount must fail the command, not hang it.
            let (u, r) = (url.to_owned(), root.clone());
            match tokio::time::timeout(
                cfg.op_timeout,
                tokio::task::spawn_blocking(move || check_root(&u, &r)),
            )
            .await
            {
                Ok(Ok(checked)) => checked?,
                Ok(Err(e)) => return Err(Error::io("stat", url, std::io::Error::other(e))),
                Err(_) => {
                    return Err(Error::Timeout {
                        op: format!("look for the store root of {url}"),
                        after: cfg.op_timeout,
                    });
                }
            }
            Arc::new(DirectoryStore::local(root, cfg.sync))
        }
        StoreUrl::S3 { bucket, prefix } => {
            let s3 = S3Store::new(s3_from_env(&bucket)?, &prefix, url.to_owned());
            tokio::time::timeout(cfg.op_timeout, s3.probe_conditional_put())
                .await
                .map_err(|_| Error::Timeout {
                    op: format!("probe {url} for conditional writes"),
                    after: cfg.op_timeout,
                })??;
            Arc::new(s3)
        }
        StoreUrl::Nfs(target) => {
            let fs = NfsFs::connect(target, cfg.op_timeout)
                .await
                .map_err(|e| Error::io("connect", url, e))?;
            Arc::new(DirectoryStore::new(Arc::new(fs), cfg.sync))
        }
    };
    Ok(Arc::new(TimeoutStore::new(store, cfg.op_timeout)))
}

/// A directory store's root must exist: a mistyped path would otherwise
/// grow a whole tree somewhere no reader or metronome looks. Logs and
/// bags inside it are created as they are written.
fn check_root(url: &str, root: &std::path::Path) -> Result<()> {
    match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::invalid(
            "store URL",
            url,
            format!("{} is not a directory", root.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::invalid(
            "store URL",
            url,
            format!(
                "the directory {} does not exist; create it first (only the logs inside a store are \
                 created as they are written)",
                root.display()
            ),
        )),
        Err(e) => Err(Error::io("stat", root.display().to_string(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(
            StoreUrl::parse("file:///tmp/x").unwrap(),
            StoreUrl::File {
                root: "/tmp/x".into()
            }
        );
        assert_eq!(
            StoreUrl::parse("s3://b/p/q/").unwrap(),
            StoreUrl::S3 {
                bucket: "b".into(),
                prefix: "p/q".into()
            }
        );
        assert_eq!(
            StoreUrl::parse("s3://b").unwrap(),
            StoreUrl::S3 {
                bucket: "b".into(),
                prefix: String::new()
            }
        );
        assert!(StoreUrl::parse("file://rel").is_err());
        assert!(matches!(
            StoreUrl::parse("nfs://h:2050/e/d?version=4").unwrap(),
            StoreUrl::Nfs(t) if t.host == "h" && t.port == Some(2050) && t.path == "/e/d"
        ));
        assert!(StoreUrl::parse("nfs://h/x?version=9").is_err());
        assert!(StoreUrl::parse("ftp://h/x").is_err());
    }

    #[tokio::test]
    async fn a_directory_store_root_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir");
        let url = format!("file://{}", missing.display());
        let e = open_store(&url, &BagConfig::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("does not exist") && e.contains(&missing.display().to_string()),
            "{e}"
        );
        assert!(!dir.path().join("no").exists(), "the tree was created");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = open_store(&format!("file://{}", file.display()), &BagConfig::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        open_store(&format!("file://{}", dir.path().display()), &BagConfig::default())
            .await
            .unwrap();
    }
}
