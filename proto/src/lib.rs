//! Wire types and the few pieces every side of bagel shares.
//!
//! # Example
//!
//! A witness as a server signs it and anyone checks it: the signature is
//! over the exact bytes that travel, so a verifier checks them before it
//! decodes them, and only against keys it was given. Several witnesses
//! can share one signature over a Merkle root and still verify one by one.
//!
//! ```
//! use std::time::Duration;
//! use bagel_proto::{Error, KeyRing, Micros, Signer, pb, sign_witness, sign_witness_batch, verify_witness};
//!
//! let server = Signer::generate();
//! let now = Micros::now();
//! let body = |lease_id: &str| pb::WitnessBody {
//!     lease_id: lease_id.into(),
//!     deadline_us: now.saturating_add(Duration::from_secs(10)).as_micros(),
//!     issued_at_us: now.as_micros(),
//!     ..Default::default()
//! };
//! let witness = sign_witness(&server, &body("lease-1"));
//!
//! let keys: KeyRing = [server.verifying_key()].into_iter().collect();
//! assert_eq!(verify_witness(&witness, &keys)?.lease_id, "lease-1");
//! // Another server's key does not vouch for it; altered bytes fail.
//! let strangers: KeyRing = [Signer::generate().verifying_key()].into_iter().collect();
//! assert!(matches!(verify_witness(&witness, &strangers), Err(Error::UnknownKey { .. })));
//! let mut altered = witness.clone();
//! let mut bytes = altered.body.to_vec();
//! bytes[0] ^= 1;
//! altered.body = bytes.into();
//! assert!(matches!(verify_witness(&altered, &keys), Err(Error::BadSignature { .. })));
//!
//! // One signature for a batch of grants; each witness verifies alone.
//! use prost::Message as _;
//! let batch = sign_witness_batch(&server, vec![body("a").encode_to_vec(), body("b").encode_to_vec()]);
//! assert_eq!(verify_witness(&batch[1], &keys)?.lease_id, "b");
//! # Ok::<(), Error>(())
//! ```
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

#![warn(missing_docs)]

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
pub mod routing;
#[cfg(feature = "side-port")]
pub mod side_port;
pub mod signed_range;
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
pub use witness::{
    SignedGroup, sign_witness, sign_witness_batch, sign_witness_group, verify_witness, witness_signed_message,
};

/// Generated protobuf and gRPC code for package `bagel.v1`.
///
/// Its documentation is the comments of `proto/bagel/v1/*.proto`, which
/// prost copies onto the items; fields and variants the `.proto` leaves
/// uncommented would only restate their names, so `missing_docs` is off
/// for the generated code alone.
#[allow(missing_debug_implementations, missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/bagel.v1.rs"));
    #[cfg(feature = "grpc")]
    include!(concat!(env!("OUT_DIR"), "/client/bagel.v1.rs"));
    #[cfg(feature = "grpc")]
    include!(concat!(env!("OUT_DIR"), "/server/bagel.v1.rs"));

    /// The encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bagel_descriptor.bin"));
}

/// `bytes` with byte `i` changed by `edit` (a test tampering with a
/// witness: its `Bytes` fields are shared, so edited through a copy).
#[cfg(test)]
pub(crate) fn tampered(
    bytes: &prost::bytes::Bytes,
    i: usize,
    edit: impl FnOnce(&mut u8),
) -> prost::bytes::Bytes {
    let mut copy = bytes.to_vec();
    edit(&mut copy[i]);
    copy.into()
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

/// What can go wrong checking signed bytes (witnesses, signed times,
/// Roughtime proofs, public keys). None of these is transient: the same
/// bytes fail the same way again, so a caller reports rather than retries.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The bytes name a signing key the verifier was not given: a key
    /// from another server (or another incarnation's key file), or a
    /// [`KeyRing`] missing a member's key.
    #[error("no trusted public key with id {key_id}")]
    UnknownKey {
        /// The key id the bytes name (hex, see [`key_id`]).
        key_id: String,
    },
    /// The key is trusted but the signature is not its signature over
    /// these bytes: they were altered, or signed by someone else.
    #[error("signature does not verify with key {key_id}")]
    BadSignature {
        /// The key id the signature was checked with.
        key_id: String,
    },
    /// The bytes do not decode as what they claim to be (a truncated
    /// protobuf, a missing proof, a Merkle path that does not fold).
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being decoded, e.g. `"witness body"`.
        what: &'static str,
        /// The decoder's complaint.
        reason: String,
    },
    /// A public key that is not 32 bytes or not a valid ed25519 point.
    #[error("bad public key: {reason}")]
    BadPublicKey {
        /// Which key and what is wrong with it.
        reason: String,
    },
    /// A proof of a kind this function does not check (a Roughtime proof
    /// given to [`verify_local_time`]; use [`verify_signed_time`]).
    #[error("{proof} proofs are not verified by this function")]
    UnsupportedProof {
        /// The proof kind found, e.g. `"roughtime"`.
        proof: &'static str,
    },
    /// A well-formed Roughtime proof from a server whose long-term key is
    /// not among the trusted ones.
    #[error("roughtime public key {key} is not one of the trusted Roughtime keys")]
    UntrustedRoughtimeKey {
        /// The proof's long-term key, in hex.
        key: String,
    },
    /// A Roughtime proof from a trusted key that fails one of the
    /// protocol's checks (delegation, Merkle path, nonce, midpoint).
    #[error("roughtime proof fails its {check} check: {reason}")]
    RoughtimeInvalid {
        /// The Roughtime tag whose check failed, e.g. `"NONC"` or `"PATH"`.
        check: &'static str,
        /// What the check found.
        reason: String,
    },
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
