//! Generates the gRPC code from `../proto` with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = ["gardenring/v1/admin.proto", "gardenring/v1/raft.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        .type_attribute(".gardenring.v1", "#[derive(serde::Serialize)]")
        .btree_map(".")
        .compile_fds(fds)?;

    // The subset of etcd's v3 API the backups use: a client only (garden-ring never serves it).
    let etcd = "etcd/v3/etcd_subset.proto";
    println!("cargo:rerun-if-changed={}", root.join(etcd).display());
    let fds = protox::compile([etcd], [&root])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
