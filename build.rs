//! Compiles `proto/` into Rust with protox (a protobuf compiler in Rust), so the build needs no
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "tensorflow/master_service.proto",
        "tensorflow/worker_service.proto",
        "tensorflow/tensor_bundle.proto",
        "tensorflow/checkpoint_state.proto",
        "tensorflow/event.proto",
        "tensorflow/example.proto",
        "tessera/replica.proto",
    ];
    for dir in ["proto/tensorflow", "proto/tessera"] {
        for entry in std::fs::read_dir(dir)? {
            println!("cargo:rerun-if-changed={}", entry?.path().display());
        }
    }
    let fds = protox::compile(files, ["proto"])?;
    // Malformed requests are INVALID_ARGUMENT rather than tonic's INTERNAL (see src/codec.rs).
    tonic_prost_build::configure()
        .bytes(".")
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(fds)?;
    Ok(())
}
