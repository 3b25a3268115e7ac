//! The object-store setup both S3 sides of bagel need, and nothing more:
//! the bag store (`bagel-bags`) and the lease store (`bagel-s3-lease`)
//! each keep their own layout of objects, but read the same `s3://` URLs,
//! build the same client from the `AWS_*` environment and refuse the same
//! stores that ignore conditional writes.
//!
//! # Layout
//! * [`s3`]: [`S3Url`] (`s3://bucket/prefix`) and [`s3_from_env`].
//! * [`probe`]: the conditional-write probes, over any `ObjectStore`.
//! * [`error`]: the one error type.
#![warn(missing_docs)]

pub mod error;
pub mod probe;
pub mod s3;

pub use error::{Error, Result};
pub use probe::{probe_conditional_put, probe_conditional_update};
pub use s3::{S3Url, s3_from_env};
