//! `kheap malloc` on C++ programs against the real kernel: a workload
//! (tests/data/malloc_cxx_workload.cc) built here with g++ -O2 against the
//! system's libstdc++ (no frame pointers), traced through the real binary;
//! every operator new call is counted once, at the function that made it.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use serde_json::Value;

const SOURCE: &str = include_str!("../data/malloc_cxx_workload.cc");

/// The workload, compiled into a temporary directory (removed on drop).
struct Workload {
    _dir: tempfile::TempDir,
    exe: PathBuf,
}

/// `link`: extra linker arguments (another allocator library).
fn build(link: &[&str]) -> Workload {
    build_cxx(SOURCE, link)
}

/// A C++ `source` built with g++ -O2 and `link`.
fn build_cxx(source: &str, link: &[&str]) -> Workload {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("w.cc");
    std::fs::write(&src, source).unwrap();
    let exe = dir.path().join("cxx_workload");
    let mut gxx = Command::new("g++");
    gxx.args(["-O2", "-o"]).arg(&exe).arg(&src).args(link);
    compile(gxx, "building a C++ workload");
    Workload { _dir: dir, exe }
}

/// Runs a compiler; a failure shows its messages.
fn compile(mut cmd: Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "{what}: cannot run {:?} ({e}); scripts/setup installs the compilers",
            cmd.get_program()
        )
    });
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `kheap malloc ARGS --format json -o FILE` and parses the report.
fn malloc_json(args: &[&str]) -> Value {
    json_report("malloc", args)
}

/// (count, bytes, outstanding count) of the site rows of one allocator
/// called from one function.
fn site(r: &Value, allocator: &str, function: &str) -> (u64, u64, Option<u64>) {
    let rows: Vec<&Value> = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["allocator"] == allocator && s["function"] == function)
        .collect();
    assert_eq!(rows.len(), 1, "one {allocator} row for {function}: {r:#}");
    let s = rows[0];
    (
        u(&s["count"]),
        u(&s["bytes_req"]),
        s.get("outstanding_count").map(u),
    )
}

/// The workload's frees: make_arrays' delete[]s, the deletes of
/// make_objects, make_nothrow and make_aligned, plain_malloc's frees.
const WORKLOAD_FREES: u64 = 1000 + 300 + 70 + 40 + 11;

/// `allocator`: the library the workload is linked against, whose operator
/// new and delete replace libstdc++'s (None: libstdc++'s, which end in the
/// C library's malloc and free).
/// The functions probed in one file (the `probes` lines read
/// `path: malloc, free@+3 (not exported: …)`), without their offsets.
fn probed_in(r: &Value, file: &str) -> Vec<String> {
    let line = r["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .find(|p| p.split(": ").next().unwrap().ends_with(file))
        .unwrap_or_else(|| panic!("{file} is probed: {:#}", r["probes"]));
    let names = line.split_once(": ").unwrap().1;
    let names = names.split(" (not exported").next().unwrap();
    names
        .split(", ")
        .map(|n| n.split('@').next().unwrap().to_string())
        .collect()
}

fn check(tracking: bool, allocator: Option<(&str, &str)>) {
    let w = build(allocator.map(|(link, _)| link).as_slice());
    let mut args = vec![];
    if tracking {
        args.push("--outstanding");
    }
    args.extend(["--", w.exe.to_str().unwrap()]);
    let r = malloc_json(&args);
    let runtime = allocator.map_or("libstdc++.so.6", |(_, lib)| lib);
    let probed = probed_in(&r, runtime);
    assert!(
        ["new", "new[]", "new(align)"]
            .iter()
            .all(|f| probed.contains(&f.to_string())),
        "{runtime}'s operator new probed without --lib: {probed:?}"
    );
    // operator delete, in every variant, only to follow blocks
    let deletes = ["delete", "delete[]", "delete(sized)", "delete[](sized)"]
        .iter()
        .filter(|f| probed.contains(&f.to_string()))
        .count();
    assert_eq!(deletes, if tracking { 4 } else { 0 }, "{probed:?}");
    if tracking {
        // Each free counted once: libstdc++'s delete calls free, and
        // delete[] calls delete; jemalloc's sized delete frees without
        // free(), which only its own probe sees.
        let totals = &r["totals"];
        assert_eq!(u(&totals["frees"]), WORKLOAD_FREES, "{totals:#}");
        assert_eq!(u(&totals["frees_untracked"]), 0, "{totals:#}");
    }
    let live = |n| tracking.then_some(n);
    // sizes: int[50] = 200 bytes, Big = 200, Al = 128 (100 rounded up to
    // its 64-byte alignment), int[10] = 40, malloc(33)
    assert_eq!(site(&r, "new[]", "make_arrays()"), (1000, 200_000, live(0)));
    assert_eq!(site(&r, "new", "make_objects()"), (300, 60_000, live(0)));
    assert_eq!(
        site(&r, "new(nothrow)", "make_nothrow()"),
        (70, 14_000, live(0))
    );
    assert_eq!(
        site(&r, "new(align)", "make_aligned()"),
        (40, 5_120, live(0))
    );
    assert_eq!(site(&r, "new[]", "leak_some()"), (25, 1_000, live(25)));
    assert_eq!(site(&r, "malloc", "plain_malloc()"), (11, 363, live(0)));
    // Each new is counted once: the malloc (or aligned_alloc) that operator
    // new makes, and new[]'s call to new, are nested calls, not rows.
    for s in r["sites"].as_array().unwrap() {
        let f = s["function"].as_str().unwrap();
        assert!(
            !f.starts_with("operator new"),
            "an allocation inside operator new was counted again: {s:#}"
        );
    }
    let workload_calls = 1000 + 300 + 70 + 40 + 25 + 11;
    let others: u64 = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["function"].as_str().unwrap().ends_with("()"))
        .map(|s| u(&s["count"]))
        .sum();
    assert_eq!(
        u(&r["totals"]["count"]),
        workload_calls + others,
        "totals are the rows' sum"
    );
    // (jemalloc's operators allocate without calling its malloc)
    assert!(
        allocator.is_some() || u(&r["totals"]["nested_calls"]) >= 1000 + 1000 + 300 + 70 + 40 + 25,
        "new[] -> new -> malloc counted as nested: {:#}\nrows not of the workload: {:#?}",
        r["totals"],
        r["sites"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| !s["function"].as_str().unwrap().ends_with("()"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn cxx_new_is_counted_once_at_the_calling_function() {
    check(false, None);
}

/// Another tracer's uretprobe on operator new[] (another kheap's with
/// --outstanding here; bpftrace's or BCC memleak's do the same) replaces
/// the return address of each new[] call with the kernel's trampoline, and
/// new[] jumps to new without a call of its own: new's caller must still be
/// the real one, and the call nested (bpf/malloc.bpf.c,
/// past_uretprobe_trampoline). Without that, the 1025 calls of new[] came
/// back as a row of their own at `[anon]+0x7fffffffe000`, the trampoline,
/// whenever this test ran beside the --outstanding one.
#[test]
fn cxx_new_is_counted_once_beside_another_tracers_uretprobes() {
    // A C++ program that maps libstdc++ and waits to be ended.
    let waits = build_cxx(
        "#include <unistd.h>\nint main() { int *volatile p = new int[4]; delete[] p; pause(); }\n",
        &[],
    );
    let mut other = Background::spawn(
        KHEAP,
        &["malloc", "--outstanding", "--", waits.exe.to_str().unwrap()],
    );
    other.wait_for("tracing");
    check(false, None);
    drop(other);
}

#[test]
fn cxx_leaks_through_new_are_exact() {
    check(true, None);
}

/// jemalloc's operator delete (sized, as g++ calls it) frees without
/// free(): only a probe on delete sees those blocks go.
#[test]
fn cxx_leaks_with_jemalloc_operators_are_exact() {
    check(true, Some(("-ljemalloc", "libjemalloc.so.2")));
}

const ALLOC_LIB_SOURCE: &str = include_str!("../data/malloc_alloc_lib_workload.c");

/// A C program linked against another allocator library is traced without
/// --lib: that library's malloc family is found and probed, and its
/// blocks are followed to their frees.
fn check_linked_allocator(link: &str, library: &str) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("w.c");
    std::fs::write(&src, ALLOC_LIB_SOURCE).unwrap();
    let exe = dir.path().join("alloc_lib_workload");
    let mut cc = Command::new("cc");
    cc.args(["-O1", "-o"]).arg(&exe).arg(&src).arg(link);
    compile(
        cc,
        &format!("building against {link} (scripts/setup installs the allocator packages)"),
    );
    // By default the preload library's malloc family stands in front of
    // the linked allocator's (which the workload checks still serves), and
    // that library is probed only for its C++ operators. With --no-preload
    // its malloc family is probed.
    for preload in [true, false] {
        let mut args = vec!["--outstanding"];
        if !preload {
            args.push("--no-preload");
        }
        args.extend(["--", exe.to_str().unwrap()]);
        let r = malloc_json(&args);
        let probes = r["probes"].as_array().unwrap();
        let listed = |p: &&Value| p.as_str().unwrap().contains(library);
        let lib_probes = probes.iter().find(listed).map(|p| p.as_str().unwrap());
        if preload {
            assert!(
                probes[0].as_str().unwrap().contains("libkheap-preload.so"),
                "{probes:?}"
            );
            let lib_probes = lib_probes.unwrap_or_else(|| panic!("{library} found: {probes:?}"));
            let (_, functions) = lib_probes.split_once(": ").unwrap();
            assert!(functions.starts_with("new"), "{lib_probes}");
            assert!(!functions.contains("malloc"), "{lib_probes}");
        } else {
            assert!(
                lib_probes.is_some_and(|p| p.contains(": malloc, calloc, realloc")),
                "{library} probed without --lib: {probes:?}"
            );
        }
        // 123 calls; i % 3 == 0 (41 of them) never freed
        assert_eq!(site(&r, "malloc", "je_work"), (123, 123 * 77, Some(41)));
        // Every block freed was seen allocated. Not so with the preload
        // library in front of tcmalloc: tcmalloc's start-up calls its own
        // malloc directly, unseen there, and frees one such block.
        if !preload {
            assert_eq!(u(&r["totals"]["frees_untracked"]), 0, "{:#}", r["totals"]);
        }
    }
}

#[test]
fn jemalloc_linked_is_found_without_lib() {
    check_linked_allocator("-ljemalloc", "libjemalloc.so.2");
}

#[test]
fn tcmalloc_linked_is_found_without_lib() {
    check_linked_allocator(
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "libtcmalloc_minimal.so.4",
    );
}

const RUST_SOURCE: &str = include_str!("../data/malloc_rust_workload.rs");

/// The rustc of the toolchain that built these tests: the one beside the
/// cargo running the build, so the test needs no rustc on PATH (scripts/
/// vm-test's guests have another HOME, where rustup's proxies find no
/// toolchain).
fn rustc() -> std::path::PathBuf {
    let beside_cargo = std::path::Path::new(env!("CARGO")).with_file_name("rustc");
    if beside_cargo.exists() {
        beside_cargo
    } else {
        "rustc".into()
    }
}

/// A Rust program built without frame pointers: its global allocator's
/// entry points (`__rust_alloc`…, mangled with a crate hash) are found in
/// the program and probed; each allocation is counted once, at the
/// function that made it, though the default allocator ends in malloc.
fn check_rust(tracking: bool) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("w.rs");
    std::fs::write(&src, RUST_SOURCE).unwrap();
    let exe = dir.path().join("rust_workload");
    let mut rustc = Command::new(rustc());
    rustc
        .args(["-C", "opt-level=2", "-C", "force-frame-pointers=no", "-o"])
        .arg(&exe)
        .arg(&src);
    compile(rustc, "building the Rust workload");
    let mut args = vec![];
    if tracking {
        args.push("--outstanding");
    }
    args.extend(["--", exe.to_str().unwrap()]);
    let r = malloc_json(&args);
    let probes = r["probes"].as_array().unwrap();
    let entry_points = if tracking {
        "rust_workload: rust, rust_zeroed, rust_realloc, rust_dealloc"
    } else {
        "rust_workload: rust, rust_zeroed, rust_realloc"
    };
    assert!(
        probes
            .iter()
            .any(|p| p.as_str().unwrap().ends_with(entry_points)),
        "the program's entry points probed: {probes:?}"
    );
    if tracking {
        // __rust_dealloc ends in free(): one free, not two
        assert_eq!(u(&r["totals"]["frees_untracked"]), 0, "{:#}", r["totals"]);
    }
    let live = |n| tracking.then_some(n);
    // Vec<u64> of 10 or 11 elements, alternately
    assert_eq!(
        site(&r, "rust", "w::make_vecs"),
        (1000, 500 * 80 + 500 * 88, live(0))
    );
    // 300 boxes of 48 bytes (never freed), and the Vec that collects them
    let boxes: Vec<(u64, u64, Option<u64>)> = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["allocator"] == "rust" && s["function"] == "w::make_boxes")
        .map(|s| {
            (
                u(&s["count"]),
                u(&s["bytes_req"]),
                s.get("outstanding_count").map(u),
            )
        })
        .collect();
    assert!(
        boxes.contains(&(300, 300 * 48, live(300))),
        "make_boxes' Box::new calls: {boxes:?}"
    );
    // Stacks through code without frame pointers: each row's first call is
    // unwound from .eh_frame, so main shows above the allocating function.
    let vec_stacks: Vec<&Value> = r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["allocator"] == "rust" && s["function"] == "w::make_vecs")
        .collect();
    assert_eq!(
        vec_stacks.iter().map(|s| u(&s["count"])).sum::<u64>(),
        1000,
        "{vec_stacks:#?}"
    );
    for s in &vec_stacks {
        let frames = frames(s);
        assert!(
            frames.iter().any(|f| f.starts_with("w::main+")),
            "main unwound past make_vecs: {frames:?}"
        );
    }
    // The default allocator's malloc is not counted again.
    for s in r["sites"].as_array().unwrap() {
        let f = s["function"].as_str().unwrap();
        assert!(
            !f.contains("__rdl_") && !f.contains("__rust_"),
            "an allocation inside the Rust allocator was counted again: {s:#}"
        );
        if s["allocator"] == "malloc" {
            assert!(!f.starts_with("w::"), "counted as malloc too: {s:#}");
        }
    }
}

#[test]
fn rust_allocations_are_counted_once_at_the_calling_function() {
    check_rust(false);
}

#[test]
fn rust_leaks_are_exact() {
    check_rust(true);
}

const PREFIXED_ALLOCATOR: &str = include_str!("../data/malloc_prefixed_allocator.c");
const PREFIXED_WORKLOAD: &str = include_str!("../data/malloc_prefixed_workload.c");

fn cc(dir: &std::path::Path, args: &[&str]) {
    let mut cc = Command::new("cc");
    cc.current_dir(dir).args(args);
    compile(cc, &format!("cc {args:?}"));
}

/// An allocator exporting je_-prefixed names (see the allocator's source
/// for what it stands for), in a shared library or linked into the
/// program, is found by its symbols and probed without --lib; its calls are
/// rows of their own (`je_malloc`), and the C library calls it makes inside
/// are not counted again.
fn check_prefixed(shared: bool, tracking: bool) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("je.c"), PREFIXED_ALLOCATOR).unwrap();
    std::fs::write(dir.path().join("w.c"), PREFIXED_WORKLOAD).unwrap();
    let file = if shared {
        cc(
            dir.path(),
            &["-O2", "-fPIC", "-shared", "-o", "libje_shim.so", "je.c"],
        );
        cc(
            dir.path(),
            &[
                "-O1",
                "-o",
                "prefixed_workload",
                "w.c",
                "-L.",
                "-lje_shim",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
        "libje_shim.so"
    } else {
        cc(dir.path(), &["-O2", "-c", "-o", "je.o", "je.c"]);
        cc(
            dir.path(),
            &["-O1", "-o", "prefixed_workload", "w.c", "je.o"],
        );
        "prefixed_workload"
    };
    let exe = dir.path().join("prefixed_workload");
    let mut args = vec![];
    if tracking {
        args.push("--outstanding");
    }
    args.extend(["--", exe.to_str().unwrap()]);
    let r = malloc_json(&args);
    let expect: &[&str] = if tracking {
        &["je_malloc", "je_calloc", "je_free"]
    } else {
        &["je_malloc", "je_calloc"]
    };
    assert_eq!(probed_in(&r, file), expect);
    // 123 calls; i % 3 == 0 (41 of them) never freed
    let live = tracking.then_some(41);
    assert_eq!(site(&r, "je_malloc", "je_work"), (123, 123 * 77, live));
    for s in r["sites"].as_array().unwrap() {
        let f = s["function"].as_str().unwrap();
        assert!(
            !f.starts_with("je_malloc") && !f.starts_with("je_calloc"),
            "the C library's malloc inside je_malloc was counted again: {s:#}"
        );
    }
    if tracking {
        let totals = &r["totals"];
        assert_eq!(u(&totals["frees"]), 82, "{totals:#}");
        assert_eq!(u(&totals["frees_untracked"]), 0, "{totals:#}");
    }
}

#[test]
fn prefixed_allocator_library_is_found_without_lib() {
    check_prefixed(true, false);
    check_prefixed(true, true);
}

#[test]
fn prefixed_allocator_linked_into_the_program_is_found_without_lib() {
    check_prefixed(false, false);
    check_prefixed(false, true);
}
