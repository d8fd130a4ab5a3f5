//! Compiles the BPF object and generates its Rust skeleton into OUT_DIR.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "bpf/kheap.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let vmlinux = manifest.join("vmlinux");
    let bpf_dir = manifest.join("bpf");

    SkeletonBuilder::new()
        .source(SRC)
        .clang_args([
            "-I".as_ref(),
            vmlinux.as_os_str(),
            "-I".as_ref(),
            bpf_dir.as_os_str(),
            "-Wall".as_ref(),
        ])
        .build_and_generate(out.join("kheap.skel.rs"))
        .unwrap_or_else(|e| {
            panic!(
                "building {SRC} failed: {e:#}\n\
                 (clang and libelf/zlib headers are needed: run scripts/setup)"
            )
        });

    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-changed=vmlinux");
}
