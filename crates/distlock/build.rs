//! Generates the etcd backend's gRPC client (feature `etcd`) from the trimmed copies of etcd's
//! API definitions in `proto/`. The protobuf compiler is `protox`, written in Rust: building
//! distlock never needs `protoc`. Without the `etcd` feature this does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "etcd")]
    if std::env::var_os("CARGO_FEATURE_ETCD").is_some() {
        etcd_grpc();
    }
}

#[cfg(feature = "etcd")]
fn etcd_grpc() {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["etcd/api/etcdserverpb/rpc.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("etcd protobuf definitions in proto/: {e}"));
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .disable_comments(["."])
        .compile_fds(files)
        .unwrap_or_else(|e| panic!("generating etcd's gRPC client: {e}"));
}
