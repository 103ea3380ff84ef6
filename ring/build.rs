//! Generates the gRPC code from `../proto` with protox (pure Rust), so no system `protoc` is needed.
//!
//! It also writes the Admin API's encoded `FileDescriptorSet` to `$OUT_DIR/admin_descriptor.bin`,
//! which the server reflection service on the Admin port serves (`grpcurl ... list`).

use protox::prost::Message as _;

/// This package's directory, read when the script runs: `env!` would bake in the directory
/// the script was compiled in, and a target directory shared by two checkouts (CI's cache of
/// the bench build) would then read the other checkout's files, or none.
fn manifest_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    commit_id();
    let root = manifest_dir().join("../proto");
    let files = ["gardenring/v1/admin.proto", "gardenring/v1/raft.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        .type_attribute(".gardenring.v1", "#[derive(serde::Serialize)]")
        .btree_map(".")
        .compile_fds(fds)?;

    // What reflection describes on the Admin port: admin.proto only (the peer protocol is not
    // served there).
    let admin = protox::compile([files[0]], [&root])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("admin_descriptor.bin"), admin.encode_to_vec())?;

    // The subset of etcd's v3 API the backups use: a client only (garden-ring never serves it).
    let etcd = "etcd/v3/etcd_subset.proto";
    println!("cargo:rerun-if-changed={}", root.join(etcd).display());
    let fds = protox::compile([etcd], [&root])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}

/// Sets `GARDEN_RING_COMMIT` for `--version`: the environment's `GARDEN_RING_COMMIT` if set (a
/// build from a source archive), else `git rev-parse --short=12 HEAD`, else "unknown". Reruns
/// when HEAD moves (a commit, a checkout), not on every build.
fn commit_id() {
    println!("cargo:rerun-if-env-changed=GARDEN_RING_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(manifest_dir())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = std::env::var("GARDEN_RING_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GARDEN_RING_COMMIT={commit}");
    // HEAD names a branch whose ref file (or packed-refs) moves on a commit.
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
        git(&["rev-parse", "--git-path", "packed-refs"]),
    ]
    .into_iter()
    .flatten()
    {
        let path = manifest_dir().join(path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
