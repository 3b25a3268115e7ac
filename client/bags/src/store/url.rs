//! Store addresses: `file:///abs/dir` (POSIX), `s3://bucket/prefix`
//! (S3; endpoint and credentials from the usual `AWS_*` environment, as
//! `object_store` reads them) and `nfs://host[:port]/export/dir[?version=3|4]`
//! (the POSIX bag over a userspace NFS client, see [`crate::store::nfs`]).

use std::sync::Arc;

pub use bagel_object::{S3Url, s3_from_env};

use crate::store::directory::DirectoryStore;
use crate::store::nfs::{NfsFs, NfsTarget};
use crate::store::object::ObjectBagStore;
use crate::{BagConfig, BagStore, Error, Result, TimeoutStore};

/// A parsed store address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `file:///abs/dir`: a local or kernel-mounted directory.
    File {
        /// The absolute directory the logs are in.
        root: std::path::PathBuf,
    },
    /// `s3://bucket/prefix`: a prefix of an S3 bucket.
    S3 {
        /// The bucket's name.
        bucket: String,
        /// Key prefix without leading or trailing `/`; may be empty.
        prefix: String,
    },
    /// `nfs://host[:port]/export/dir`: a directory through the userspace NFS client.
    Nfs(NfsTarget),
}

impl StoreUrl {
    /// Parse a store URL; anything else is [`Error::Invalid`] saying which
    /// forms are accepted.
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
        if url.starts_with("s3://") {
            let S3Url { bucket, prefix } = S3Url::parse(url)?;
            return Ok(StoreUrl::S3 { bucket, prefix });
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

/// The shared object-store setup's errors, as the bag store has always
/// named them (same kinds, texts and retryability).
impl From<bagel_object::Error> for Error {
    fn from(e: bagel_object::Error) -> Self {
        use bagel_object::Error as E;
        match e {
            E::InvalidUrl { url, reason } => Error::invalid("store URL", url, reason),
            E::NoCredentials { location } => {
                Error::invalid("S3 environment", location, bagel_object::error::NO_CREDENTIALS)
            }
            E::Configure { location, source } => Error::Store {
                op: "configure",
                path: location,
                source,
            },
            E::Store { op, path, source } => Error::Store { op, path, source },
            E::ConditionalWritesIgnored {
                store,
                key,
                condition,
            } => Error::ConditionalWritesIgnored {
                store,
                key,
                condition,
            },
        }
    }
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
            let s3 = ObjectBagStore::new(s3_from_env(&bucket)?, &prefix, url.to_owned());
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
        // The S3 part is bagel_object's, with the bag store's error.
        let e = StoreUrl::parse("s3:///p").unwrap_err();
        assert!(
            matches!(
                e,
                Error::Invalid {
                    what: "store URL",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            r#"invalid store URL "s3:///p": no bucket: s3://bucket/prefix"#
        );
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
