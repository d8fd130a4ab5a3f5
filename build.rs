//! Compiles every BPF object in bpf/ (`NAME.bpf.c`) and generates its Rust
//! skeleton into OUT_DIR as `NAME.skel.rs`.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let vmlinux = manifest.join("vmlinux");
    let bpf_dir = manifest.join("bpf");

    let mut sources: Vec<PathBuf> = fs::read_dir(&bpf_dir)
        .expect("bpf/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    for src in sources {
        let file = src.file_name().and_then(OsStr::to_str).expect("utf-8 name");
        let name = file.trim_end_matches(".bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                "-I".as_ref(),
                vmlinux.as_os_str(),
                "-I".as_ref(),
                bpf_dir.as_os_str(),
                OsStr::new("-Wall"),
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| {
                panic!(
                    "building bpf/{file} failed: {e:#}\n\
                     (clang and libelf/zlib headers are needed: run scripts/setup)"
                )
            });
    }
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-changed=vmlinux");
}
