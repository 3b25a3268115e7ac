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
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("bagel_descriptor.bin"), fds.encode_to_vec())?;
    // Messages and client stubs, with tonic-prost's codec.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds.clone())?;
    // Server stubs only (the messages are the ones above), with our codec:
    // an undecodable request is the caller's fault (INVALID_ARGUMENT), not
    // the server's (tonic-prost says INTERNAL).
    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .extern_path(".bagel.v1", "crate::pb")
        .codec_path("crate::codec::RequestCodec")
        .out_dir(&server_dir)
        .compile_fds(fds)?;
    Ok(())
}
