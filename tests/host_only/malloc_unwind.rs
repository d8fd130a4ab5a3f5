//! `kheap malloc` stacks through code built without frame pointers, against
//! the real kernel: workloads built here (C with -fomit-frame-pointer, C++
//! against the system's libstdc++) are traced through the real binary;
//! sampled calls are unwound from .eh_frame in user space, and the stacks
//! name every function on the way, with exact counts when every call is
//! sampled.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use serde_json::Value;

/// A workload compiled into a temporary directory (removed on drop).
struct Workload {
    _dir: tempfile::TempDir,
    exe: PathBuf,
}

fn build(compiler: &str, source: &str, file: &str, flags: &[&str]) -> Workload {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(file);
    std::fs::write(&src, source).unwrap();
    let exe = dir.path().join("workload");
    let out = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("{compiler} is needed by the tests: {e}"));
    assert!(
        out.status.success(),
        "building {file} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Workload { _dir: dir, exe }
}

/// The function of a frame (`level3+0x17 (w.c:30)` -> `level3`).
fn function_of(frame: &str) -> &str {
    frame.rsplit_once('+').map_or(frame, |(f, _)| f)
}

/// The stack rows of `allocator` whose frames include `function`.
fn stacks_through<'a>(r: &'a Value, allocator: &str, function: &str) -> Vec<&'a Value> {
    r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["allocator"] == allocator
                && s["frames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| function_of(f.as_str().unwrap()) == function)
        })
        .collect()
}

fn frame_names(row: &Value) -> Vec<&str> {
    row["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| function_of(f.as_str().unwrap()))
        .collect()
}

/// Count and bytes summed over rows.
fn totals(rows: &[&Value]) -> (u64, u64) {
    rows.iter().fold((0, 0), |(c, b), r| {
        (c + u(&r["count"]), b + u(&r["bytes_req"]))
    })
}

/// Nothing sampled was lost on the way: the copies all arrived and were
/// all unwound.
fn assert_no_unwind_losses(r: &Value) {
    let l = &r["lost"];
    for k in ["unwind_dropped", "unwind_copy_failed", "unwind_no_mappings"] {
        assert_eq!(u(&l[k]), 0, "{k}: {l:#}");
    }
}

fn deep_c() -> Workload {
    build(
        "cc",
        include_str!("../data/malloc_unwind_deep.c"),
        "w.c",
        &[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fasynchronous-unwind-tables",
        ],
    )
}

const LEVELS: [&str; 6] = ["level6", "level5", "level4", "level3", "level2", "level1"];

/// The six functions in calling order, innermost first, then main.
fn assert_all_levels(row: &Value) {
    let names = frame_names(row);
    let want: Vec<&str> = LEVELS.iter().copied().chain(["main"]).collect();
    assert_eq!(&names[..7], &want[..], "{row:#}");
}

#[test]
fn stacks_without_frame_pointers_show_every_function_exactly() {
    require_root();
    let w = deep_c();
    let r = json_report(
        "malloc",
        &[
            "--by",
            "stack",
            "--exact-stacks",
            "--",
            w.exe.to_str().unwrap(),
        ],
    );
    assert_no_unwind_losses(&r);
    let rows = stacks_through(&r, "malloc", "level6");
    assert_eq!(rows.len(), 1, "one stack: {rows:#?}");
    assert_all_levels(rows[0]);
    assert_eq!(totals(&rows), (100, 100 * 48));
    assert!(rows[0].get("estimated").is_none(), "every call unwound");
    let d = &r["stack_depth"];
    assert!(u(&d["dwarf"]["stacks"]) >= 1, "{d:#}");
    assert!(u(&d["dwarf"]["max_depth"]) >= 7, "{d:#}");
    assert!(
        u(&d["unwind_samples"]) >= 100,
        "every call was copied: {d:#}"
    );
}

/// By default only some calls are copied (each row's first, then about one
/// in N): the row's calls are still all counted, along the stack sampled.
#[test]
fn sampled_stacks_without_frame_pointers_show_every_function() {
    require_root();
    let w = deep_c();
    let r = json_report("malloc", &["--", w.exe.to_str().unwrap()]);
    assert_no_unwind_losses(&r);
    let rows = stacks_through(&r, "malloc", "level6");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_all_levels(rows[0]);
    assert_eq!(totals(&rows), (100, 100 * 48), "scaled to the exact counts");
    assert_eq!(
        rows[0]["estimated"], true,
        "attributed from samples: {:#}",
        rows[0]
    );
    let d = &r["stack_depth"];
    let samples = u(&d["unwind_samples"]);
    assert!(
        (1..100).contains(&samples),
        "sampled, not every call: {d:#}"
    );
}

fn split_c() -> Workload {
    build(
        "cc",
        include_str!("../data/malloc_unwind_split.c"),
        "w.c",
        &[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fasynchronous-unwind-tables",
        ],
    )
}

/// One call site reached along two stacks that only unwinding tells apart:
/// by default the site's 5000 calls are shared out between the stacks in
/// proportion to the calls sampled along each, and those rows say they are
/// estimates (the site row is exact); with --exact-stacks every call is
/// unwound and each stack has its exact count.
#[test]
fn stacks_shared_out_from_samples_are_marked_estimated() {
    require_root();
    let w = split_c();
    let exe = w.exe.to_str().unwrap();
    let site_calls = |r: &Value| -> u64 {
        r["sites"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["allocator"] == "malloc" && s["function"] == "make_block")
            .map(|s| u(&s["count"]))
            .sum()
    };

    let r = json_report("malloc", &["--", exe]);
    assert_no_unwind_losses(&r);
    assert_eq!(site_calls(&r), 5000);
    let (a, b) = (
        stacks_through(&r, "malloc", "from_a"),
        stacks_through(&r, "malloc", "from_b"),
    );
    let shared: Vec<&Value> = a.iter().chain(&b).copied().collect();
    assert!(!shared.is_empty(), "{:#}", r["stacks"]);
    assert!(shared.iter().all(|s| s["estimated"] == true), "{shared:#?}");
    assert_eq!(totals(&shared), (5000, 5000 * 64), "{shared:#?}");
    assert!(
        (1..5000).contains(&u(&r["stack_depth"]["unwind_samples"])),
        "{:#}",
        r["stack_depth"]
    );

    let r = json_report("malloc", &["--exact-stacks", "--", exe]);
    assert_no_unwind_losses(&r);
    assert_eq!(site_calls(&r), 5000);
    let (a, b) = (
        stacks_through(&r, "malloc", "from_a"),
        stacks_through(&r, "malloc", "from_b"),
    );
    assert_eq!(totals(&a), (3000, 3000 * 64), "{a:#?}");
    assert_eq!(totals(&b), (2000, 2000 * 64), "{b:#?}");
    assert!(
        a.iter().chain(&b).all(|s| s.get("estimated").is_none()),
        "{a:#?} {b:#?}"
    );
}

/// With --no-stacks nothing is copied: the frame-pointer walk alone stops
/// at the first function without a frame pointer.
#[test]
fn no_stacks_copies_nothing() {
    require_root();
    let w = deep_c();
    let r = json_report(
        "malloc",
        &[
            "--by",
            "stack",
            "--no-stacks",
            "--",
            w.exe.to_str().unwrap(),
        ],
    );
    let d = &r["stack_depth"];
    assert_eq!(u(&d["unwind_samples"]), 0, "{d:#}");
    assert_eq!(u(&d["dwarf"]["stacks"]), 0, "{d:#}");
    let rows = stacks_through(&r, "malloc", "level6");
    assert!(
        rows.iter().all(|row| !frame_names(row).contains(&"level1")),
        "a frame-pointer walk cannot reach level1 here: {rows:#?}"
    );
    assert_eq!(totals(&rows), (100, 100 * 48));
}

/// std::vector and std::string grow through template code and libstdc++,
/// neither with frame pointers: their allocations are attributed to the
/// functions that grow them.
#[test]
fn cxx_container_growth_is_attributed_to_the_growing_function() {
    require_root();
    let w = build(
        "g++",
        include_str!("../data/malloc_unwind_cxx.cc"),
        "w.cc",
        &["-O2", "-g"],
    );
    let r = json_report(
        "malloc",
        &[
            "--by",
            "stack",
            "--exact-stacks",
            "--",
            w.exe.to_str().unwrap(),
        ],
    );
    assert_no_unwind_losses(&r);
    // 10 vectors, each reallocated at capacities 1, 2, 4, ..., 1024
    let vectors = stacks_through(&r, "new", "grow_vectors()");
    assert_eq!(
        totals(&vectors),
        (10 * 11, 10 * 4 * (2048 - 1)),
        "{vectors:#?}"
    );
    // 500 strings of 40 characters, one 41-byte block each
    let strings = stacks_through(&r, "new", "build_strings()");
    assert_eq!(totals(&strings), (500, 500 * 41), "{strings:#?}");
    for row in strings.iter().chain(&vectors) {
        assert!(frame_names(row).contains(&"main"), "{row:#}");
        assert!(row.get("estimated").is_none(), "{row:#}");
    }
    // The string's allocation is made inside libstdc++: its caller there
    // is the site, the user's function only in the stack.
    assert!(
        strings.iter().all(|s| s["function"] != "build_strings()"),
        "{strings:#?}"
    );
}
