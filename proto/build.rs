//! Generates the gRPC code from `router.proto` with protox (a pure-Rust
//! protobuf compiler): a fresh machine needs nothing outside crates.io.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=router.proto");
    let fds = protox::compile(["router.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
