//! Wire types and the few pieces every side of bagel shares.
//!
//! # Layout
//! * [`pb`]: the protobuf types generated from `proto/bagel/v1/*.proto`
//!   (lease service, witnesses, signed times, bag records); with the
//!   `grpc` feature, the lease service's client and server stubs too.
//! * [`Micros`]: the one time type (Unix microseconds, UTC).
//! * [`clock`]: injectable clocks (system, manual, offset).
//! * `codec` (feature `grpc`): the server stubs' codec (undecodable
//!   requests are INVALID_ARGUMENT).
//! * [`keys`]: ed25519 signers, key ids and key rings.
//! * [`merkle`]: Merkle trees that let one signature cover a batch of
//!   witnesses.
//! * [`witness`]: sign and verify witnesses, always over the exact bytes
//!   that travel.
//! * [`signed_time`]: time readings with their proofs (the lease server's
//!   own, or Roughtime's, verified offline), and where writers get them.
//! * `acl` (feature `acl`): the access policy (`bagel-server --acl`): who
//!   may lease or read which names, for the server and `bagel acl check`.
//! * [`authority`]: asking a time authority ([`authority::querier`]) and
//!   judging the local clock by it ([`authority::monitor`]).
//! * [`rights`]: what a bag writer needs from the leases it writes under,
//!   and the ledger of what it wrote (the one interface between the lease
//!   client and the bag engine).
//! * `details` (feature `grpc`): a refused acquire's status details (`google.rpc.Status`
//!   with the conflict and a `RetryInfo`), for the server and every client.
//! * [`exposition`]: `/metrics` in the format a scraper asks for (classic
//!   Prometheus text or OpenMetrics), for both side ports.
//! * [`hex`]: the hex forms of keys and ids.
//! * [`names`]: characters a lease name may not contain (control,
//!   bidirectional and zero-width characters), for every side alike.

#[cfg(feature = "acl")]
pub mod acl;
pub mod authority;
pub mod clock;
#[cfg(feature = "grpc")]
pub mod codec;
#[cfg(feature = "grpc")]
pub mod details;
pub mod exposition;
pub mod hex;
pub mod key_file;
pub mod keys;
pub mod merkle;
pub mod names;
pub mod rights;
#[cfg(feature = "side-port")]
pub mod side_port;
pub mod signed_time;
mod time;
mod verified_batch;
pub mod witness;

pub use keys::{KeyRing, Signer, key_id};
pub use signed_time::{
    SignedClock, SignedReading, TimeProofKind, TimeReading, sign_local_time, verify_local_time,
    verify_signed_time,
};
pub use time::{Micros, duration_micros, human_duration};
pub use verified_batch::VerifiedBatch;
pub use witness::{sign_witness, sign_witness_batch, verify_witness, witness_signed_message};

/// Generated protobuf and gRPC code for package `bagel.v1`.
#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/bagel.v1.rs"));
    #[cfg(feature = "grpc")]
    include!(concat!(env!("OUT_DIR"), "/client/bagel.v1.rs"));
    #[cfg(feature = "grpc")]
    include!(concat!(env!("OUT_DIR"), "/server/bagel.v1.rs"));

    /// The encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bagel_descriptor.bin"));
}

/// Cases per property in the fuzz tests: a few hundred in the suite,
/// more with `BAGEL_FUZZ_CASES=100000` (for a longer run).
#[cfg(test)]
pub(crate) fn fuzz_cases() -> u32 {
    std::env::var("BAGEL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// What can go wrong checking signed bytes.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    #[error("no trusted public key with id {key_id}")]
    UnknownKey { key_id: String },
    #[error("signature does not verify with key {key_id}")]
    BadSignature { key_id: String },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("bad public key: {reason}")]
    BadPublicKey { reason: String },
    #[error("{proof} proofs are not verified by this function")]
    UnsupportedProof { proof: &'static str },
    #[error("roughtime public key {key} is not one of the trusted Roughtime keys")]
    UntrustedRoughtimeKey { key: String },
    #[error("roughtime proof fails its {check} check: {reason}")]
    RoughtimeInvalid { check: &'static str, reason: String },
}

impl pb::Mode {
    /// Unspecified means full: the default a caller gets by setting nothing.
    pub fn normalized(self) -> pb::Mode {
        match self {
            pb::Mode::Unspecified => pb::Mode::Full,
            m => m,
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
