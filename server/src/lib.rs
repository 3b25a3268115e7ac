//! bagel's lease server: a sharded, in-RAM gRPC lease service that grants
//! leases on named domains with absolute deadlines, hands each new holder
//! the previous holder's watermark, and signs a witness for every grant.
//!
//! # Layout
//! * [`table`]: the pure lease table (all lease rules; takes `now` as an
//!   argument, no gRPC, no clock).
//! * [`error`]: the one error type and its mapping to gRPC statuses.

pub mod error;
pub mod table;

pub use error::Error;
