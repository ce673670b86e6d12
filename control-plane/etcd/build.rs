//! Generates the etcd client's gRPC code from this crate's own subset of
//! etcd's v3 API (`proto/`) with protox (a pure-Rust protobuf compiler),
//! exactly as `proto/build.rs` does: a fresh machine needs nothing outside
//! crates.io (no `protoc`). Only the client side is generated.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["etcdserverpb/rpc.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
