//! Compiles every BPF object in bpf/ (`NAME.bpf.c`) and generates its Rust
//! skeleton into OUT_DIR as `NAME.skel.rs`; builds the preload library of
//! `kheap malloc -- CMD` (preload/) into OUT_DIR, where src/malloc/preload.rs
//! embeds it.

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
    build_preload(&manifest, &out);
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-changed=preload");
    println!("cargo:rerun-if-changed=vmlinux");
}

/// libkheap-preload.so: optimised, with frame pointers (its probe sites find
/// the caller's stack through them), its own symbols bound locally, built
/// with `-fcf-protection=full`. (Debian's start files carry no CET marks,
/// so the library built here has none either; whether it is marked where
/// the toolchain's are was not checked.)
///
/// Its functions then start with `endbr64`, which matters here: a
/// program that keeps malloc's address in its frame-pointer register (a
/// Rust loop built without frame pointers, scripts/bench-malloc's workload)
/// makes every frame-pointer walk read malloc's first bytes as the next
/// frame. `endbr64; push %rbp` reads as a non-canonical address and ends
/// the walk; `push %rbp; mov …` read as an unmapped user address, and the
/// walks cost ~700 ns more (a fault each, we infer: docs/benchmarks.md).
fn build_preload(manifest: &std::path::Path, out: &std::path::Path) {
    let cc = target_c_compiler();
    let status = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-g", "-Wall", "-Werror"])
        .args(["-fno-omit-frame-pointer", "-fcf-protection=full"])
        .args(["-Wl,-Bsymbolic", "-Wl,-z,now"])
        .arg("-o")
        .arg(out.join("libkheap-preload.so"))
        .arg(manifest.join("preload/kheap_preload.c"))
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running {cc:?}: {e} (run scripts/setup)"));
    assert!(status.success(), "building preload/kheap_preload.c failed");
}

/// The C compiler for the target, looked up the way the cc crate does
/// (`CC_<target>`, `CC_<target_with_underscores>`, `TARGET_CC`, `CC`): the
/// preload library is loaded into traced programs on the target machine, so
/// a cross or old-glibc build (cargo-zigbuild, scripts/release) must build it
/// with the same compiler as the rest of the binary.
fn target_c_compiler() -> std::ffi::OsString {
    let target = env::var("TARGET").unwrap_or_default();
    let names = [
        format!("CC_{target}"),
        format!("CC_{}", target.replace('-', "_")),
        "TARGET_CC".to_string(),
        "CC".to_string(),
    ];
    for name in &names {
        println!("cargo:rerun-if-env-changed={name}");
    }
    names
        .iter()
        .find_map(|name| env::var_os(name).filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "cc".into())
}
