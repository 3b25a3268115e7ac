//! `s3://bucket/prefix` and the S3 client configured from the environment.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};

use crate::{Error, Result};

/// A parsed `s3://bucket/prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Url {
    /// The bucket's name.
    pub bucket: String,
    /// Key prefix without leading or trailing `/`; may be empty.
    pub prefix: String,
}

impl S3Url {
    /// Parses `s3://bucket[/prefix]`; a URL of any other scheme, or with
    /// no bucket, is refused.
    pub fn parse(url: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| invalid("expected s3://bucket/prefix"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("no bucket: s3://bucket/prefix"));
        }
        Ok(S3Url {
            bucket: bucket.to_owned(),
            prefix: prefix.trim_matches('/').to_owned(),
        })
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
        return Err(Error::NoCredentials {
            location: format!("s3://{bucket}"),
        });
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
    let store = b.build().map_err(|source| Error::Configure {
        location: format!("s3://{bucket}"),
        source,
    })?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(bucket: &str, prefix: &str) -> S3Url {
        S3Url {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn parses_bucket_and_prefix() {
        assert_eq!(S3Url::parse("s3://b/p/q/").unwrap(), url("b", "p/q"));
        assert_eq!(S3Url::parse("s3://b/p").unwrap(), url("b", "p"));
        assert_eq!(S3Url::parse("s3://b//p//").unwrap(), url("b", "p"));
        assert_eq!(S3Url::parse("s3://b/").unwrap(), url("b", ""));
        assert_eq!(S3Url::parse("s3://b").unwrap(), url("b", ""));
    }

    #[test]
    fn refuses_other_schemes_and_no_bucket() {
        for (bad, why) in [
            ("s3://", "no bucket"),
            ("s3:///p", "no bucket"),
            ("file:///tmp/x", "expected s3://bucket/prefix"),
            ("S3://b/p", "expected s3://bucket/prefix"),
            ("b/p", "expected s3://bucket/prefix"),
        ] {
            let e = S3Url::parse(bad).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidUrl { url, reason } if url == bad && reason.contains(why)),
                "{bad}: {e:?}"
            );
            assert!(e.is_permanent());
            assert!(
                e.to_string().starts_with(&format!("invalid store URL {bad:?}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn no_credentials_says_what_to_set() {
        let e = Error::NoCredentials {
            location: "s3://b".into(),
        };
        assert_eq!(
            e.to_string(),
            "invalid S3 environment \"s3://b\": AWS_ACCESS_KEY_ID is not set (set AWS_ENDPOINT, \
             AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; or BAGEL_S3_INSTANCE_CREDENTIALS=1 to \
             use instance credentials)"
        );
        assert!(e.is_permanent());
    }
}
