//! Compiles the deviceplugin v1beta1 API into OUT_DIR (protoc from the system, e.g. Debian's
//! protobuf-compiler).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // BTreeMap keeps envs and annotations in a stable order: responses are deterministic.
        .btree_map(".")
        .compile_protos(&["proto/deviceplugin/v1beta1/api.proto"], &["proto"])?;
    Ok(())
}
