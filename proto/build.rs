//! Compiles `proto/bagel/v1/*.proto` with protox (pure Rust, so no system
//! `protoc` is needed) and writes the generated code and the encoded file
//! descriptor set (served by gRPC reflection) into `OUT_DIR` only.

use std::path::PathBuf;

use prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/bagel/v1/time.proto",
    "proto/bagel/v1/witness.proto",
    "proto/bagel/v1/lease.proto",
    "proto/bagel/v1/bag.proto",
    "proto/bagel/v1/summary.proto",
];

/// The bytes fields held as `Bytes`, handed on by reference, not copied.
/// Summary format 2: its payloads, holder signatures, raw items and
/// signed-time parts, when a summary is read. Witnesses: a group's one
/// signature is shared by every grant of the group, and the siblings of
/// every grant's Merkle path are slices of the group's one tree, where
/// each was an allocation of its own (a server signing groups of 64 made
/// eight allocations a grant for them); a client decodes them without a
/// copy each and keeps a witness in one allocation
/// (`bagel_proto::witness::compact`). The lean answer's bodies and range
/// likewise: a client folds them where they arrived.
const SHARED_BYTES: &[&str] = &[
    ".bagel.v1.Witness.body",
    ".bagel.v1.LeanGrant.body",
    ".bagel.v1.LeanRenewal.body",
    ".bagel.v1.SignedRange.signature",
    ".bagel.v1.SignedRange.nodes",
    ".bagel.v1.Witness.signature",
    ".bagel.v1.Witness.merkle_path",
    ".bagel.v1.SummaryV2.Time.body",
    ".bagel.v1.SummaryV2.Time.signature",
    ".bagel.v1.SummaryV2.Item.raw",
    ".bagel.v1.SummaryV2.Batch.payloads",
    ".bagel.v1.SummaryV2.Batch.holder_signatures",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("bagel_descriptor.bin"), fds.encode_to_vec())?;
    // The messages alone (prost), for every side: a crate that only stores
    // or checks witnesses (the S3 lease backend, the bag engine) needs no
    // gRPC.
    prost_build::Config::new()
        .bytes(SHARED_BYTES)
        .compile_fds(fds.clone())?;
    #[cfg(feature = "grpc")]
    stubs(&fds, &out_dir)?;
    Ok(())
}

/// The lease service's stubs (feature `grpc`), over the messages above:
/// client stubs with tonic-prost's codec; server stubs with ours, because
/// an undecodable request is the caller's fault (INVALID_ARGUMENT), not
/// the server's (tonic-prost says INTERNAL).
#[cfg(feature = "grpc")]
fn stubs(
    fds: &prost_types::FileDescriptorSet,
    out_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    for client in [true, false] {
        let dir = out_dir.join(if client { "client" } else { "server" });
        std::fs::create_dir_all(&dir)?;
        let config = tonic_prost_build::configure()
            .build_client(client)
            .build_server(!client)
            .extern_path(".bagel.v1", "crate::pb")
            .out_dir(&dir);
        let config = if client {
            config
        } else {
            // List pages are sent as encoded where they were read (see
            // `codec::EncodedListResponse`).
            config
                .codec_path("crate::codec::RequestCodec")
                .extern_path(".bagel.v1.ListResponse", "crate::codec::EncodedListResponse")
        };
        config.compile_fds(fds.clone())?;
    }
    Ok(())
}
