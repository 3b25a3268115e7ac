//! What can go wrong setting up or probing an object store.

/// Why no store could be set up, or why one is refused. The texts are the
/// bag store's (`bagel_bags::Error` takes these over unchanged).
///
/// Not `#[non_exhaustive]`: the crates above convert it variant by variant,
/// and a new variant should make them decide what it means.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not an `s3://bucket/prefix` URL.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No credentials in the environment, and instance credentials not
    /// asked for.
    #[error("invalid S3 environment {location:?}: {}", NO_CREDENTIALS)]
    NoCredentials {
        /// `s3://bucket`.
        location: String,
    },
    /// `object_store` refused the configuration.
    #[error("object store configure {location}: {source}")]
    Configure {
        /// `s3://bucket`.
        location: String,
        /// What `object_store` said.
        #[source]
        source: object_store::Error,
    },
    /// A call to the store failed.
    #[error("object store {op} {path}: {source}")]
    Store {
        /// The call: `get`, `put`, `list`, ...
        op: &'static str,
        /// The object's key (or the prefix listed).
        path: String,
        /// What the store answered.
        #[source]
        source: object_store::Error,
    },
    /// The store accepted a conditional PUT it must refuse.
    #[error(
        "the object store {store} ignores conditional writes (a PUT of {key} with {condition}, which must be refused, succeeded); bags cannot be closed, nor leases held, safely on it: refusing to run"
    )]
    ConditionalWritesIgnored {
        /// The store (its URL).
        store: String,
        /// The probe object the PUT wrote.
        key: String,
        /// The header the store ignored: `If-None-Match: *` or `If-Match`.
        condition: &'static str,
    },
}

/// Why [`Error::NoCredentials`]: what to set.
pub const NO_CREDENTIALS: &str = "AWS_ACCESS_KEY_ID is not set (set AWS_ENDPOINT, AWS_ACCESS_KEY_ID, \
                                  AWS_SECRET_ACCESS_KEY, AWS_REGION; or BAGEL_S3_INSTANCE_CREDENTIALS=1 \
                                  to use instance credentials)";

impl Error {
    /// Whether trying again may succeed: only a store call that failed
    /// for no stated reason (a connection, a 5xx) may.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Configure { source, .. } | Error::Store { source, .. } => {
                matches!(source, object_store::Error::Generic { .. })
            }
            Error::InvalidUrl { .. }
            | Error::NoCredentials { .. }
            | Error::ConditionalWritesIgnored { .. } => false,
        }
    }

    /// The opposite of [`Error::is_retryable`].
    pub fn is_permanent(&self) -> bool {
        !self.is_retryable()
    }
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
