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
