//! Compiles every BPF object in bpf/ (`NAME.bpf.c`) and generates its Rust
//! skeleton into OUT_DIR as `NAME.skel.rs`; builds the preload library of
//! `kheap malloc -- CMD` (preload/) into OUT_DIR, where src/malloc/preload.rs
//! embeds it.

use std::env;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let vmlinux = vmlinux_dir(&manifest);
    let bpf_dir = manifest.join("bpf");

    let mut sources: Vec<PathBuf> = fs::read_dir(&bpf_dir)
        .expect("bpf/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    let clang_args = |extra: &[&str]| {
        let mut args = vec![
            "-I".into(),
            vmlinux.clone().into_os_string(),
            "-I".into(),
            bpf_dir.clone().into_os_string(),
            "-Wall".into(),
        ];
        args.extend(extra.iter().map(|a| a.into()));
        args
    };
    for src in sources {
        let file = src.file_name().and_then(OsStr::to_str).expect("utf-8 name");
        let name = file.trim_end_matches(".bpf.c");
        let skel = out.join(format!("{name}.skel.rs"));
        SkeletonBuilder::new()
            .source(&src)
            .obj(out.join(format!("{name}.bpf.o")))
            .reference_obj(true)
            .clang_args(clang_args(&[]))
            .build_and_generate(&skel)
            .unwrap_or_else(|e| build_failed(file, e));
        if name == "kheap" {
            build_kheap_for_older_kernels(
                &src,
                &out,
                &skel,
                clang_args(&["-DKHEAP_NO_KFUNCS", "-DKHEAP_NO_ATOMICS"]),
            );
        }
    }
    build_preload(&manifest, &out);
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-changed=preload");
    println!("cargo:rerun-if-changed=vmlinux");
}

/// The kernel types the BPF objects are compiled against: those of the
/// target architecture's kernel (vmlinux/README.md). libbpf-cargo defines
/// `__TARGET_ARCH_<arch>` from the same cargo target (bpf/arch.bpf.h).
fn vmlinux_dir(manifest: &Path) -> PathBuf {
    match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") | Err(_) => manifest.join("vmlinux"),
        Ok("aarch64") => manifest.join("vmlinux/aarch64"),
        Ok(other) => {
            panic!("kheap is built for x86_64 and aarch64, not {other} (vmlinux/README.md)")
        }
    }
}

fn build_failed(file: &str, e: impl std::fmt::Display) -> ! {
    panic!(
        "building bpf/{file} failed: {e:#}\n\
         (clang and libelf/zlib headers are needed: run scripts/setup)"
    )
}

/// The kmem object once more without its kfunc (bpf/slab_cache.bpf.h) and
/// without BPF atomics (the object table of bpf/kheap/live_objects.c), for
/// kernels that expose no BTF of their own (libbpf resolves a kfunc extern
/// only through the kernel's BTF and fails the whole load without it) or
/// that predate BPF atomics (5.12: the verifier refuses the whole object,
/// reachable or not). The skeleton keeps one set of types: its object bytes
/// come from `kernel::skel::kheap_object`, which picks one of the two. Both
/// objects must describe the same maps, programs and sections, which the
/// two generated skeletons (equal but for the file they include) prove
/// here.
fn build_kheap_for_older_kernels(src: &Path, out: &Path, skel: &Path, args: Vec<OsString>) {
    let dir = out.join("older-kernels");
    fs::create_dir_all(&dir).expect("creating OUT_DIR/older-kernels");
    let obj = dir.join("kheap.bpf.o");
    let variant_skel = dir.join("kheap.skel.rs");
    SkeletonBuilder::new()
        .source(src)
        .obj(&obj)
        .reference_obj(true)
        .clang_args(args)
        .build_and_generate(&variant_skel)
        .unwrap_or_else(|e| build_failed("kheap.bpf.c (KHEAP_NO_KFUNCS, KHEAP_NO_ATOMICS)", e));
    let text = fs::read_to_string(skel).expect("reading the kheap skeleton");
    let variant = fs::read_to_string(&variant_skel).expect("reading its variant");
    // Everything but the `static DATA … = *include_bytes!(…);` statement
    // (rustfmt may spread it over lines).
    let without_data = |t: &str| -> String {
        let start = t.find("static DATA:").expect("the skeleton embeds DATA");
        let bytes = start + t[start..].find("include_bytes!").expect("DATA is included");
        let end = bytes + t[bytes..].find(';').expect("DATA's statement ends");
        format!("{}{}", &t[..start], &t[end..])
    };
    assert!(
        without_data(&text) == without_data(&variant),
        "bpf/kheap.bpf.c built with and without KHEAP_NO_KFUNCS/KHEAP_NO_ATOMICS differs in more than its code \
         (maps, programs or data sections): the one skeleton cannot load both"
    );
    let config = "ObjectSkeletonConfigBuilder::new(&DATA)";
    assert_eq!(
        text.matches(config).count(),
        1,
        "libbpf-cargo's skeleton no longer builds its config from `{config}`: \
         update build.rs's object choice"
    );
    let chosen = text.replace(
        config,
        "ObjectSkeletonConfigBuilder::new(crate::kernel::skel::kheap_object(&DATA))",
    );
    fs::write(skel, chosen).expect("writing the kheap skeleton");
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
    // -fcf-protection is x86's (endbr64, above); aarch64 has none of it.
    let cf_protection: &[&str] = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => &[],
        _ => &["-fcf-protection=full"],
    };
    let status = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-g", "-Wall", "-Werror"])
        .arg("-fno-omit-frame-pointer")
        .args(cf_protection)
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
