//! `--format pprof` read back by the real Go pprof tool: the numbers
//! `go tool pprof` shows for a known kheap-load workload are the exact
//! counts and bytes of that workload.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// `go tool pprof ARGS FILE`, with the environment Go needs (a writable
/// HOME and cache, no toolchain download).
fn pprof(args: &[&str], file: &Path) -> String {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", home.path())
        .env("GOCACHE", home.path().join("cache"))
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("running go tool pprof (scripts/setup installs golang-go)");
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The cumulative value of `function` in `pprof -top -cum` output.
fn cum_of(top: &str, function: &str) -> String {
    top.lines()
        .find(|l| l.split_whitespace().last() == Some(function))
        .unwrap_or_else(|| panic!("{function} not in pprof output:\n{top}"))
        .split_whitespace()
        .nth(3)
        .unwrap()
        .to_string()
}

fn record_pprof(dir: &Path, args: &[&str], load_args: &[&str]) -> std::path::PathBuf {
    let path = dir.join("heap.pb.gz");
    let mut all = vec!["record", "--format", "pprof", "-o", path.to_str().unwrap()];
    all.extend(args);
    all.push("--");
    all.push(LOAD);
    all.extend(load_args);
    assert_ok(&kheap(&all));
    path
}

#[test]
fn go_pprof_shows_the_exact_msgsnd_site() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // Every stack captured: per-stack numbers are exact. Each msgsnd of
    // 2100 bytes is one kmalloc-4k allocation in load_msg (see record.rs).
    let file = record_pprof(dir.path(), &["--exact-stacks"], &["msg", "1000", "2100"]);
    // load_msg's own allocations are the kmalloc-4k ones (slab pages it
    // triggers land in other caches): the cache label picks them.
    let focus = [
        "-top",
        "-cum",
        "-nodecount=100000",
        "-tagfocus=cache=kmalloc-4k",
    ];
    let objects = pprof(
        &[&focus[..], &["-sample_index=alloc_objects"]].concat(),
        &file,
    );
    assert_eq!(cum_of(&objects, "load_msg"), "1000", "{objects}");
    let space = pprof(
        &[&focus[..], &["-sample_index=alloc_space", "-unit=B"]].concat(),
        &file,
    );
    assert_eq!(cum_of(&space, "load_msg"), "4096000B", "{space}");
    // The raw dump shows the kernel mapping and the comment.
    let raw = pprof(&["-raw"], &file);
    assert!(raw.contains("[kernel.kallsyms]"), "{raw}");
    assert!(
        raw.contains("alloc_objects/count alloc_space/bytes"),
        "{raw}"
    );
}

#[test]
fn binary_output_to_a_terminal_is_refused() {
    // A pipe is not a terminal: kheap writes it there. With no -o and a
    // terminal, one line says what to do; `script` gives it a terminal.
    let out = Command::new("script")
        .args([
            "-qec",
            &format!("{KHEAP} record --format pprof -d 1"),
            "/dev/null",
        ])
        .output()
        .expect("running script (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--format pprof is binary: write it to a file with -o FILE"),
        "{text}"
    );
}

const MALLOC_SOURCE: &str = include_str!("data/malloc_workload.c");

/// The line of the C workload that contains `text` (1-based).
fn line_of(text: &str) -> usize {
    MALLOC_SOURCE
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("'{text}' not in the workload source"))
        + 1
}

#[test]
fn go_pprof_shows_user_functions_lines_and_outstanding_blocks() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("malloc_workload.c");
    std::fs::write(&src, MALLOC_SOURCE).unwrap();
    let exe = dir.path().join("workload");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc is needed by the tests (scripts/setup installs it)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let file = dir.path().join("malloc.pb.gz");
    assert_ok(&kheap(&[
        "malloc",
        "--outstanding",
        "--format",
        "pprof",
        "-o",
        file.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]));
    // -unit=B: bytes without scaling (counts are never scaled).
    let top = |index: &str| {
        let unit = if index.ends_with("space") {
            "-unit=B"
        } else {
            "-unit=minimum"
        };
        pprof(&["-top", "-cum", "-nodecount=100000", unit, index], &file)
    };
    // do_leak: 3 x malloc(5000), never freed; do_malloc: 10 x 100, freed.
    let inuse = top("-sample_index=inuse_objects");
    assert_eq!(cum_of(&inuse, "do_leak"), "3", "{inuse}");
    let inuse_space = top("-sample_index=inuse_space");
    assert_eq!(cum_of(&inuse_space, "do_leak"), "15000B", "{inuse_space}");
    let alloc = top("-sample_index=alloc_objects");
    assert_eq!(cum_of(&alloc, "do_malloc"), "10", "{alloc}");
    let alloc_space = top("-sample_index=alloc_space");
    assert_eq!(cum_of(&alloc_space, "do_malloc"), "1000B", "{alloc_space}");
    // File and line of the call, from the binary's debug information.
    let lines = pprof(&["-top", "-lines", "-sample_index=inuse_space"], &file);
    let want = format!(
        "do_leak malloc_workload.c:{}",
        line_of("leaks[nleaks++] = malloc(5000)")
    );
    assert!(lines.contains(&want), "{want} not in:\n{lines}");
}

#[test]
fn go_pprof_shows_the_exact_outstanding_messages_of_leaks() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("leaks.pb.gz");
    // kheap-load holds 500 messages (kmalloc-4k, 4096 bytes each) for 4 s;
    // the report is taken after 2 s, while they are all held.
    assert_ok(&kheap(&[
        "leaks",
        "--exact-stacks",
        "-d",
        "2",
        "--format",
        "pprof",
        "-o",
        file.to_str().unwrap(),
        "--",
        LOAD,
        "msg",
        "500",
        "2100",
        "4",
    ]));
    let top = |index: &str, unit: &str| {
        pprof(
            &[
                "-top",
                "-cum",
                "-nodecount=100000",
                "-tagfocus=cache=kmalloc-4k",
                unit,
                index,
            ],
            &file,
        )
    };
    let objects = top("-sample_index=inuse_objects", "-unit=minimum");
    assert!(objects.contains("Type: inuse_objects"), "{objects}");
    assert_eq!(cum_of(&objects, "load_msg"), "500", "{objects}");
    let space = top("-sample_index=inuse_space", "-unit=B");
    assert_eq!(cum_of(&space, "load_msg"), "2048000B", "{space}");
    let allocated = top("-sample_index=alloc_objects", "-unit=minimum");
    assert_eq!(cum_of(&allocated, "load_msg"), "500", "{allocated}");
    // inuse_space is what pprof shows first for a leaks profile.
    let default = pprof(&["-top"], &file);
    assert!(default.contains("Type: inuse_space"), "{default}");
}

#[test]
fn go_pprof_reads_a_diff_with_negative_changes() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // Two runs of the same workload, 1000 then 400 messages: load_msg's
    // site (exact in every run) shrank by 600 allocations of 4096 bytes.
    let before = record_json(&[], &["msg", "1000", "2100"]);
    let after = record_json(&[], &["msg", "400", "2100"]);
    let (b, a) = (
        dir.path().join("before.json"),
        dir.path().join("after.json"),
    );
    std::fs::write(&b, before.to_string()).unwrap();
    std::fs::write(&a, after.to_string()).unwrap();
    let file = dir.path().join("diff.pb.gz");
    assert_ok(&kheap(&[
        "diff",
        b.to_str().unwrap(),
        a.to_str().unwrap(),
        "--format",
        "pprof",
        "-o",
        file.to_str().unwrap(),
    ]));
    let focus = [
        "-top",
        "-cum",
        "-nodecount=100000",
        "-tagfocus=cache=kmalloc-4k",
    ];
    let objects = pprof(
        &[&focus[..], &["-sample_index=alloc_objects"]].concat(),
        &file,
    );
    assert_eq!(cum_of(&objects, "load_msg"), "-600", "{objects}");
    let space = pprof(
        &[&focus[..], &["-sample_index=alloc_space", "-unit=B"]].concat(),
        &file,
    );
    assert_eq!(cum_of(&space, "load_msg"), "-2457600B", "{space}");
}
