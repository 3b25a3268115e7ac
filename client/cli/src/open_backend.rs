//! [`open_lease_backend`]: any lease backend from its URL, as
//! `bagel_bags::open_store` opens any bag store from its URL.
//!
//! It lives here, in the crate that sees every backend: each backend
//! crate depends only on the lease core (`bagel-lease-core`), so none of
//! them names another; the CLI (and anything else that takes a URL from a
//! user) opens them all. A new backend crate adds its scheme here.

use std::fmt;
use std::sync::Arc;

use bagel_client::{Client, ClientOptions, Cluster, DnsCluster, Error, LeaseBackend, Result, ServerSpec};
use bagel_proto::{KeyRing, Signer};

use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend, S3LeaseConfig};

/// What opening a lease backend needs besides its URL.
#[derive(Clone, Debug, Default)]
pub struct LeaseBackendOptions {
    /// Lease servers: timeouts and TLS.
    pub client: ClientOptions,
    /// Lease servers, while migrating: the list being moved to (every name
    /// then needs a grant from its owner in both lists).
    pub next_servers: Option<Vec<ServerSpec>>,
    /// An `s3://` lease store: required for one (its key and signed time).
    pub s3: Option<S3Options>,
}

/// What an S3 lease store needs: the key this client signs its witnesses
/// with, whose clock counts, and the limits and margins.
#[derive(Clone)]
pub struct S3Options {
    pub signer: Signer,
    pub time: LeaseTime,
    pub config: S3LeaseConfig,
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Options")
            .field("key_id", &self.signer.key_id())
            .field("time", &self.time)
            .field("config", &self.config)
            .finish()
    }
}

/// Opens the lease backend at `url`:
/// * `s3://bucket/prefix`: leases on S3 conditional writes (probed first;
///   needs [`LeaseBackendOptions::s3`]);
/// * one server, `[ID=]URL[#KEY]` (http:// or https://): a [`Client`],
///   pinned to KEY when given;
/// * several, comma-separated (or any list with
///   [`LeaseBackendOptions::next_servers`]): a [`Cluster`];
/// * `dns+srv://NAME`: the members NAME's SRV records name, routed by the
///   lists they announce: a [`DnsCluster`].
pub async fn open_lease_backend(url: &str, options: &LeaseBackendOptions) -> Result<Arc<dyn LeaseBackend>> {
    if url.starts_with("s3://") {
        let Some(s3) = &options.s3 else {
            return Err(Error::Config {
                message: format!(
                    "lease store {url}: an S3 lease store needs this client's key and signed time \
                     (LeaseBackendOptions::s3)"
                ),
            });
        };
        let store = LeaseStore::from_url(url, s3.config.op_timeout)?;
        let backend =
            S3LeaseBackend::open(store, s3.signer.clone(), s3.time.clone(), s3.config.clone()).await?;
        return Ok(Arc::new(backend));
    }
    if bagel_client::cluster::dns::is_dns_list(url) {
        if options.next_servers.is_some() {
            return Err(Error::Config {
                message: format!(
                    "lease servers {url:?}: a dns+srv:// list takes no next list: its members \
                     announce theirs (--next-members)"
                ),
            });
        }
        return Ok(Arc::new(DnsCluster::open(url, &options.client).await?));
    }
    let current = ServerSpec::parse_list(url).map_err(|e| Error::Config {
        message: format!("lease servers {url:?}: {e}"),
    })?;
    Ok(match (current.as_slice(), &options.next_servers) {
        ([], _) => {
            return Err(Error::Config {
                message: format!("lease servers {url:?}: the list is empty"),
            });
        }
        ([one], None) => Arc::new(match one.key {
            None => Client::connect_with(one.url.clone(), &options.client).await?,
            Some(key) => {
                let mut ring = KeyRing::new();
                ring.insert_bytes(&key).map_err(|e| Error::Config {
                    message: format!("lease server {}: pinned key: {e}", one.url),
                })?;
                Client::connect_pinned_with(one.url.clone(), ring, &options.client).await?
            }
        }),
        (_, None) => Arc::new(Cluster::connect_with(&current, &options.client).await?),
        (_, Some(next)) => Arc::new(Cluster::migrating_with(&current, next, &options.client).await?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn refusal(url: &str) -> String {
        match open_lease_backend(url, &LeaseBackendOptions::default()).await {
            Err(e @ Error::Config { .. }) => e.to_string(),
            other => panic!("expected a configuration error for {url:?}, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn what_cannot_be_opened_is_refused_before_connecting() {
        assert!(
            refusal("s3://bucket/leases")
                .await
                .contains("needs this client's key")
        );
        assert!(refusal("").await.contains("lease servers"));
        assert!(refusal("ftp://host").await.contains("ftp://host"));
    }
}
