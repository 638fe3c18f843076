//! Compiles `seckill/v1/*.proto` with protox (pure Rust, no system `protoc`) and
//! generates the tonic code plus the encoded descriptor set used by server reflection.

use prost::Message;
use std::{env, fs, path::PathBuf};

const PROTOS: &[&str] = &[
    "seckill/v1/common.proto",
    "seckill/v1/stock.proto",
    "seckill/v1/admin.proto",
    "seckill/v1/order.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("seckill_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
