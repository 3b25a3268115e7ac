//! Compiles the subset of etcd's v3 API the benchmark drives, with protox
//! (pure Rust, no system `protoc`), into `OUT_DIR` only.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/etcd/rpc.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let fds = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
