//! `kheap malloc` against the real kernel: a C workload with known
//! allocations (tests/data/malloc_workload.c), built here with the system
//! compiler, traced through the real binary; exact numbers asserted.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::workload::{line_of, Workload};
use common::*;
use serde_json::Value;

/// Runs `kheap malloc ARGS --format json -o FILE` and parses the report.
fn malloc_json(args: &[&str]) -> Value {
    json_report("malloc", args)
}

/// The rows of one allocator function called from one function, summed:
/// count, bytes, histogram {lo: count}, outstanding (count, bytes).
#[derive(Debug, Default, PartialEq)]
struct Sum {
    count: u64,
    bytes: u64,
    hist: BTreeMap<u64, u64>,
    live: Option<(u64, u64)>,
}

fn sum(report: &Value, list: &str, allocator: &str, function: &str) -> Sum {
    let mut s = Sum::default();
    for r in report[list].as_array().unwrap() {
        if r["allocator"] != allocator || r["function"] != function {
            continue;
        }
        s.count += u(&r["count"]);
        s.bytes += u(&r["bytes_req"]);
        assert!(r.get("bytes_alloc").is_none(), "malloc sees requests only");
        for b in r["hist"].as_array().unwrap() {
            *s.hist.entry(u(&b["lo"])).or_default() += u(&b["count"]);
        }
        if let Some(count) = r.get("outstanding_count") {
            let l = s.live.get_or_insert((0, 0));
            l.0 += u(count);
            l.1 += u(&r["outstanding_bytes"]);
        }
    }
    s
}

fn expect(count: u64, bytes: u64, hist: &[(u64, u64)], live: Option<(u64, u64)>) -> Sum {
    Sum {
        count,
        bytes,
        hist: hist.iter().copied().collect(),
        live,
    }
}

/// Whether the run's command ran with kheap's preload library (`-- CMD`
/// without --no-preload) rather than with the C library's functions probed.
fn preloaded(r: &Value) -> bool {
    r["run"]["attach"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "preload")
}

/// What one run of every do_* function allocates, per (allocator, caller).
fn assert_workload_rows(r: &Value, tracking: bool) {
    let live = |c, b| tracking.then_some((c, b));
    let preload = preloaded(r);
    // One function in glibc 2.36, so one probe; the preload library
    // defines both.
    let (aligned, memalign) = if preload {
        ("aligned_alloc", "memalign")
    } else {
        ("aligned_alloc|memalign", "aligned_alloc|memalign")
    };
    let cases = [
        (
            "malloc",
            "do_malloc",
            expect(10, 1000, &[(64, 10)], live(0, 0)),
        ),
        (
            "malloc",
            "do_leak",
            expect(3, 15000, &[(4096, 3)], live(3, 15000)),
        ),
        (
            "calloc",
            "do_calloc",
            expect(7, 7000, &[(512, 7)], live(0, 0)),
        ),
        (
            "realloc",
            "do_realloc",
            expect(3, 1400, &[(128, 1), (256, 1), (512, 1)], live(1, 800)),
        ),
        (
            "reallocarray",
            "do_reallocarray",
            expect(4, 1200, &[(256, 4)], live(0, 0)),
        ),
        (
            "posix_memalign",
            "do_posix_memalign",
            expect(3, 2560, &[(256, 2), (2048, 1)], live(1, 2048)),
        ),
        (
            aligned,
            "do_aligned_alloc",
            expect(5, 2560, &[(512, 5)], live(0, 0)),
        ),
        (
            memalign,
            "do_memalign",
            expect(6, 384, &[(64, 6)], live(0, 0)),
        ),
        (
            "valloc",
            "do_valloc",
            expect(2, 6000, &[(2048, 2)], live(0, 0)),
        ),
        (
            "pvalloc",
            "do_pvalloc",
            expect(1, 100, &[(64, 1)], live(0, 0)),
        ),
    ];
    for (allocator, function, want) in cases {
        let got = sum(r, "sites", allocator, function);
        assert_eq!(got, want, "{allocator} from {function}: {:#}", r["sites"]);
        assert_eq!(
            sum(r, "stacks", allocator, function),
            want,
            "{allocator} stacks from {function}"
        );
    }
    // The allocator's own calls (reallocarray -> realloc -> malloc) are not
    // counted twice: no other row names a workload function.
    for row in r["sites"].as_array().unwrap() {
        let f = row["function"].as_str().unwrap();
        if f.starts_with("do_") {
            assert!(
                cases_include(row["allocator"].as_str().unwrap(), f),
                "unexpected row {row}"
            );
        }
    }
    // Probed, glibc's functions are seen calling each other; the preload
    // library sees only the calls into the family.
    if !preload {
        assert!(u(&r["totals"]["nested_calls"]) >= 9, "{:#}", r["totals"]);
    }
}

fn cases_include(allocator: &str, function: &str) -> bool {
    matches!(
        (allocator, function),
        (
            "malloc",
            "do_malloc" | "do_leak" | "do_child" | "do_exec_child" | "do_before_exec" | "do_thread"
        ) | ("calloc", "do_calloc")
            | ("realloc", "do_realloc")
            | ("reallocarray", "do_reallocarray")
            | ("posix_memalign", "do_posix_memalign")
            | ("aligned_alloc|memalign", "do_aligned_alloc" | "do_memalign")
            | ("aligned_alloc", "do_aligned_alloc")
            | ("memalign", "do_memalign")
            | ("valloc", "do_valloc")
            | ("pvalloc", "do_pvalloc")
    )
}

#[test]
fn command_rows_name_each_direct_caller_exactly() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "command_rows_name_each_direct_caller_exactly",
        &["--outstanding", "--", w.path()],
    ) {
        return;
    }
    let r = malloc_json(&["--outstanding", "--", w.path()]);
    assert_workload_rows(&r, true);
    // The process exited before the report: symbols came from the files.
    let site = &rows(&r, "sites", "function", "do_malloc")[0];
    let line = line_of("sink = malloc(100);");
    assert!(
        site["location"]
            .as_str()
            .unwrap()
            .ends_with(&format!("(malloc_workload.c:{line})")),
        "file:line of the call: {site}"
    );
}

/// The command runs with kheap's preload library by default; with
/// --no-preload the C library's functions are probed, with the same rows.
#[test]
fn command_rows_are_exact_with_either_way_of_probing() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "command_rows_are_exact_with_either_way_of_probing",
        &["--outstanding", "--", w.path()],
    ) {
        return;
    }
    let mut totals = Vec::new();
    for (extra, preload) in [(None, true), (Some("--no-preload"), false)] {
        let args: Vec<&str> = ["--outstanding"]
            .into_iter()
            .chain(extra)
            .chain(["--", w.path()])
            .collect();
        let r = malloc_json(&args);
        assert_eq!(preloaded(&r), preload, "{:#}", r["run"]);
        let attach = attach_lines(&r);
        let probes = r["probes"].to_string();
        if preload {
            // The C library is not probed: its family is seen in front of it.
            assert_eq!(attach, ["preload"], "{probes}");
            assert!(probes.contains("libkheap-preload.so"), "{probes}");
            assert!(!probes.contains("libc.so"), "{probes}");
        } else {
            assert_eq!(attach, ["uprobes"], "{probes}");
            assert!(probes.contains("libc.so"), "{probes}");
        }
        assert_workload_rows(&r, true);
        // do_free_null's five in a row are each counted
        assert!(u(&r["totals"]["frees_null"]) >= 5, "{:#}", r["totals"]);
        totals.push(r["totals"].clone());
    }
    // The same calls, frees and outstanding blocks either way (nested
    // calls differ: probed, glibc's functions are seen calling each other).
    for field in [
        "count",
        "bytes_req",
        "frees",
        "frees_null",
        "frees_untracked",
        "outstanding_count",
        "outstanding_bytes",
    ] {
        assert_eq!(totals[0][field], totals[1][field], "{field}: {totals:#?}");
    }
}

#[test]
fn pid_and_command_sharing_a_library_count_once() {
    require_root();
    // The sleeper's maps name the C library /usr/lib/…, the command's loader
    // may say /lib/…: one file, probed once.
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "pid_and_command_sharing_a_library_count_once",
        &["--", w.path()],
    ) {
        return;
    }
    let mut sleeper = Waiting {
        child: Command::new("sleep").arg("60").spawn().unwrap(),
    };
    let pid = sleeper.child.id().to_string();
    let r = malloc_json(&["-p", &pid, "--", w.path()]);
    assert_workload_rows(&r, false);
    assert_eq!(
        r["probes"].as_array().unwrap().len(),
        1,
        "{:#}",
        r["probes"]
    );
    let _ = sleeper.child.kill();
}

#[test]
fn counts_are_the_same_without_return_probes() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "counts_are_the_same_without_return_probes",
        &["--", w.path()],
    ) {
        return;
    }
    let r = malloc_json(&["--", w.path()]);
    assert_workload_rows(&r, false);
    assert!(r["totals"].get("outstanding_count").is_none());
}

#[test]
fn stacks_start_at_the_direct_caller() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "stacks_start_at_the_direct_caller",
        &["--by", "stack", "--", w.path()],
    ) {
        return;
    }
    let r = malloc_json(&["--by", "stack", "--", w.path()]);
    let stacks: Vec<&Value> = r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["allocator"] == "malloc" && s["function"] == "do_malloc")
        .collect();
    assert_eq!(stacks.len(), 1, "{:#}", r["stacks"]);
    let frames: Vec<&str> = stacks[0]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    // A plain frame-pointer walk from malloc's first instruction skips
    // do_malloc and starts at run_all.
    assert!(frames[0].starts_with("do_malloc+0x"), "{frames:?}");
    assert!(
        frames[1].starts_with("run_all+0x")
            && frames[1].ends_with(&format!(":{})", line_of("\tdo_malloc();"))),
        "{frames:?}"
    );
    assert!(frames[2].starts_with("main+0x"), "{frames:?}");
}

#[test]
fn threads_and_forked_and_execed_children_are_traced() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "threads_and_forked_and_execed_children_are_traced",
        &["--outstanding", "--", w.path(), "fork"],
    ) {
        return;
    }
    let r = malloc_json(&["--outstanding", "--", w.path(), "fork"]);
    assert_workload_rows(&r, true);
    assert_eq!(
        sum(&r, "sites", "malloc", "do_child"),
        expect(4, 2800, &[(512, 4)], Some((0, 0)))
    );
    assert_eq!(
        sum(&r, "sites", "malloc", "do_exec_child"),
        expect(6, 240, &[(32, 6)], Some((1, 40)))
    );
    // The same process before its exec: another address space.
    assert_eq!(
        sum(&r, "sites", "malloc", "do_before_exec"),
        expect(2, 100, &[(32, 2)], Some((2, 100)))
    );
    let pids = |f: &str| -> Vec<u64> {
        rows(&r, "sites", "function", f)[0]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| u(&p["pid"]))
            .collect()
    };
    assert_eq!(pids("do_before_exec"), pids("do_exec_child"));
    assert_eq!(
        sum(&r, "sites", "malloc", "do_thread"),
        expect(10, 3000, &[(256, 10)], Some((0, 0)))
    );
    assert_eq!(
        pids("do_thread"),
        pids("do_malloc"),
        "threads of one process"
    );
    assert_ne!(pids("do_child"), pids("do_malloc"), "another process");
    assert_ne!(pids("do_exec_child"), pids("do_child"));
}

/// A running workload waiting on stdin for its go.
struct Waiting {
    child: std::process::Child,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn running_process_by_pid_until_it_exits() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "running_process_by_pid_until_it_exits",
        &["--outstanding", "-p", &std::process::id().to_string()],
    ) {
        return;
    }
    let mut waiting = Waiting {
        child: Command::new(&w.exe)
            .arg("wait")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    };
    let mut out = BufReader::new(waiting.child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");

    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    let pid = waiting.child.id().to_string();
    let mut kheap = Command::new(KHEAP)
        .args(["malloc", "--outstanding", "--format", "json", "-o"])
        .arg(&report)
        .args(["-p", &pid])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(kheap.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(
        first.contains("tracing malloc"),
        "kheap did not start: {first}"
    );

    // Attached: let the workload allocate, then exit.
    let mut stdin = waiting.child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let status = kheap.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(status.success(), "{rest}");
    assert!(
        rest.contains("exited; reporting what was recorded"),
        "{rest}"
    );
    let r = parse_valid(&std::fs::read_to_string(&report).unwrap());
    assert_workload_rows(&r, true);
}

#[test]
fn ctrl_c_prints_the_report_and_detaches() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "ctrl_c_prints_the_report_and_detaches",
        &["--outstanding", "-p", &std::process::id().to_string()],
    ) {
        return;
    }
    let mut target = Waiting {
        child: Command::new(&w.exe)
            .arg("wait")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    };
    let mut out = BufReader::new(target.child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = target.child.id().to_string();
    let mut kheap = Command::new(KHEAP)
        .args(["malloc", "--outstanding", "-p", &pid])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(kheap.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(
        first.contains("tracing malloc"),
        "kheap did not start: {first}"
    );
    let progs = bpf_prog_ids(kheap.id());
    assert!(
        progs.len() >= 5,
        "kheap should hold its programs: {progs:?}"
    );
    unsafe { libc::kill(kheap.id() as i32, libc::SIGINT) };
    let done = kheap.wait_with_output().unwrap();
    assert!(done.status.success(), "exit status {:?}", done.status);
    let report = String::from_utf8_lossy(&done.stdout);
    assert!(
        report.contains("kheap malloc:"),
        "report after the signal: {report}"
    );
    assert_unloaded(&progs, "after kheap exited");
    // The target was only observed: it still runs and finishes normally.
    let mut stdin = target.child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert!(target.child.wait().unwrap().success());
}

/// A bad invocation: one line on stderr, non-zero exit, no report.
fn assert_one_line_error(out: &std::process::Output, expect: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {err}");
    assert!(err.contains(expect), "expected '{expect}' in: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(out.stdout.is_empty(), "no report on error");
}

fn executable(dir: &Path, name: &str, content: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn bad_input_gives_one_line_errors() {
    require_root();
    assert_one_line_error(&kheap(&["malloc"]), "give -p PID or -- COMMAND");
    assert_one_line_error(
        &kheap(&["malloc", "-p", "3999999"]),
        "no process with PID 3999999",
    );
    assert_one_line_error(
        &kheap(&["malloc", "--", "kheap-no-such-command"]),
        "command not found",
    );
    let w = Workload::build(&[]);
    let text = executable(w.dir.path(), "text", b"just words\n");
    assert_one_line_error(&kheap(&["malloc", "--", &text]), "is not an ELF executable");
    assert_one_line_error(
        &kheap(&["malloc", "--lib", &text, "--", w.path()]),
        "is not an ELF file",
    );
    assert_one_line_error(
        &kheap(&[
            "malloc",
            "--lib",
            "/nonexistent/libjemalloc.so",
            "--",
            w.path(),
        ]),
        "no such file",
    );
    // A library that is not an allocator.
    let libm = Command::new("sh")
        .args(["-c", "ldd /bin/sh | awk '/libc.so/ {print $3}'"])
        .output()
        .unwrap();
    let libc_dir = Path::new(String::from_utf8_lossy(&libm.stdout).trim())
        .parent()
        .unwrap()
        .to_path_buf();
    let libm = libc_dir.join("libm.so.6");
    assert_one_line_error(
        &kheap(&["malloc", "--lib", libm.to_str().unwrap(), "--", w.path()]),
        "does not export malloc",
    );
    // A static program maps no C library.
    let st = Workload::build(&["-static"]);
    assert_one_line_error(&kheap(&["malloc", "--", st.path()]), "statically linked");
    assert_one_line_error(
        &kheap(&["malloc", "--sort", "outstanding", "--", w.path()]),
        "needs --outstanding",
    );
}

/// Linux 6.18 optimizes the preload library's sites by rewriting them into
/// calls to a trampoline it maps into the process; a forked child inherits
/// the rewritten code but not the trampoline. The library sends forked
/// children through other sites: the child lives and is counted.
#[test]
fn a_child_forked_after_allocating_is_counted_and_lives() {
    require_root();
    let w = Workload::build_from(include_str!("../data/malloc_fork_after_use.c"), &[]);
    if malloc_refused_here(
        "a_child_forked_after_allocating_is_counted_and_lives",
        &["--outstanding", "--", w.path()],
    ) {
        return;
    }
    let r = malloc_json(&["--outstanding", "--", w.path()]);
    assert!(preloaded(&r), "{:#}", r["run"]);
    assert_eq!(
        sum(&r, "sites", "malloc", "parent_work"),
        expect(10, 320, &[(32, 10)], Some((10, 320)))
    );
    assert_eq!(
        sum(&r, "sites", "malloc", "child_work"),
        expect(20, 960, &[(32, 20)], Some((20, 960)))
    );
    // The child's stacks, walked by frame pointers from its own sites,
    // start at the direct caller once.
    let r = malloc_json(&["--no-stacks", "--", w.path()]);
    for (function, caller) in [("parent_work", "main+"), ("child_work", "main+")] {
        let stack = rows(&r, "stacks", "function", function);
        assert_eq!(stack.len(), 1, "{:#}", r["stacks"]);
        let frames = frames(stack[0]);
        assert!(frames[0].starts_with(&format!("{function}+")), "{frames:?}");
        assert!(frames[1].starts_with(caller), "{frames:?}");
    }
}

/// A tmpfs mounted noexec, unmounted on drop.
struct NoexecMount(tempfile::TempDir);

impl NoexecMount {
    fn new() -> NoexecMount {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                "noexec,size=4m",
                "kheap-test",
                dir.path().to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert_ok(&out);
        NoexecMount(dir)
    }
}

impl Drop for NoexecMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// The loader cannot map a library from a noexec mount: with $TMPDIR on
/// one, the library goes elsewhere and the counts are the same.
#[test]
fn a_noexec_temporary_directory_is_passed_over() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "a_noexec_temporary_directory_is_passed_over",
        &["--outstanding", "--", w.path()],
    ) {
        return;
    }
    let noexec = NoexecMount::new();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    let out = Command::new(KHEAP)
        .env("TMPDIR", noexec.0.path())
        .args(["malloc", "--format", "json", "-o", report.to_str().unwrap()])
        .args(["--outstanding", "--", w.path()])
        .output()
        .unwrap();
    assert_ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("preloaded "), "{stderr}");
    assert!(
        !stderr.contains(noexec.0.path().to_str().unwrap()),
        "{stderr}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    let r = parse_valid(&std::fs::read_to_string(&report).unwrap());
    assert!(preloaded(&r));
    assert_workload_rows(&r, true);
}

/// A traced process that runs without the preload library is named, with
/// why: its program is static, or its environment lost LD_PRELOAD (the
/// loader then maps the C library without the preload library).
#[test]
fn processes_without_the_preload_library_are_named() {
    require_root();
    let w = Workload::build(&[]);
    let st = Workload::build(&["-static"]);
    if malloc_refused_here(
        "processes_without_the_preload_library_are_named",
        &["-o", "/dev/null", "--", "sh", "-c", "true"],
    ) {
        return;
    }
    // `wait` holds each program until its input ends (a second): long
    // enough for kheap's scans to see it.
    let script = format!(
        "(sleep 1; echo) | env -i {} wait >/dev/null; (sleep 1; echo) | {} wait >/dev/null; true",
        w.path(),
        st.path()
    );
    let out = kheap(&["malloc", "-o", "/dev/null", "--", "sh", "-c", &script]);
    assert_ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("preloaded "), "{stderr}");
    let named = |program: &str, why: &str| {
        stderr
            .lines()
            .any(|l| l.starts_with("kheap: warning: ") && l.contains(program) && l.contains(why))
    };
    assert!(named(st.path(), "which is statically linked"), "{stderr}");
    assert!(
        named(w.path(), "did not load kheap's preload library"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("kheap: warning: ").count(), 2, "{stderr}");
}

#[test]
fn static_program_with_lib_pointing_at_itself() {
    require_root();
    // --lib names the file that holds the allocator: here the program.
    let st = Workload::build(&["-static"]);
    if malloc_refused_here(
        "static_program_with_lib_pointing_at_itself",
        &["--lib", st.path(), "--", st.path()],
    ) {
        return;
    }
    let r = malloc_json(&["--lib", st.path(), "--", st.path()]);
    assert_eq!(
        sum(&r, "sites", "malloc", "do_malloc"),
        expect(10, 1000, &[(64, 10)], None)
    );
}

#[test]
fn lib_points_the_probes_at_another_allocator() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "lib_points_the_probes_at_another_allocator",
        &["--", w.path()],
    ) {
        return;
    }
    let src = w.dir.path().join("bump_alloc.c");
    std::fs::write(&src, include_str!("../data/bump_alloc.c")).unwrap();
    let lib = w.dir.path().join("libbump.so");
    let out = Command::new("cc")
        .args(["-O1", "-g", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap();
    assert_ok(&out);
    let lib = lib.to_str().unwrap();
    let preload = format!("LD_PRELOAD={lib}");
    let r = malloc_json(&[
        "--outstanding",
        "--lib",
        lib,
        "--",
        "env",
        &preload,
        w.path(),
    ]);
    let probes = r["probes"][0].as_str().unwrap();
    assert!(
        probes.starts_with(lib) && probes.contains("(not exported: reallocarray, posix_memalign"),
        "{probes}"
    );
    let live = |c, b| Some((c, b));
    assert_eq!(
        sum(&r, "sites", "malloc", "do_malloc"),
        expect(10, 1000, &[(64, 10)], live(0, 0))
    );
    assert_eq!(
        sum(&r, "sites", "malloc", "do_leak"),
        expect(3, 15000, &[(4096, 3)], live(3, 15000))
    );
    assert_eq!(
        sum(&r, "sites", "calloc", "do_calloc"),
        expect(7, 7000, &[(512, 7)], live(0, 0))
    );
    assert_eq!(
        sum(&r, "sites", "realloc", "do_realloc"),
        expect(3, 1400, &[(128, 1), (256, 1), (512, 1)], live(1, 800))
    );
    // glibc's reallocarray, not probed, calls realloc through the PLT: the
    // preloaded one, which sees do_reallocarray as its caller.
    assert_eq!(
        sum(&r, "sites", "realloc", "do_reallocarray"),
        expect(4, 1200, &[(256, 4)], live(0, 0))
    );
    // The bump allocator's own calls (calloc and realloc call malloc) are
    // not counted again.
    assert!(rows(&r, "sites", "function", "calloc").is_empty());
    assert!(rows(&r, "sites", "function", "realloc").is_empty());
}

#[test]
fn table_and_folded_output() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "table_and_folded_output",
        &["--outstanding", "--no-preload", "--", w.path()],
    ) {
        return;
    }
    // --no-preload: the header lists the C library's probes.
    let out = kheap(&["malloc", "--outstanding", "--no-preload", "--", w.path()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("do_leak+0x"), "{text}");
    assert!(text.contains("live bytes"), "{text}");
    // free's probe sits past `test %rdi,%rdi` when a branch follows it.
    let libc = kheap::allocators::libc_of_program(&w.exe).unwrap();
    let syms = kheap::allocators::lookup_symbols(&libc).unwrap();
    let free_index = kheap::allocators::FUNCTIONS
        .iter()
        .position(|f| f.name == "free")
        .unwrap();
    let free = syms[free_index].as_ref().expect("libc exports free");
    let expected = match free.code.as_slice() {
        [0x48, 0x85, 0xff, 0x74, ..] | [0x48, 0x85, 0xff, 0x0f, 0x84, ..] => "free@+3\n",
        _ => "free\n",
    };
    assert!(text.contains(expected), "{expected:?} in {text}");
    let out = kheap(&["malloc", "--format", "folded", "--", w.path()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.ends_with(";main;run_all;do_calloc;calloc 7")),
        "{text}"
    );
}

/// --fail-if: the workload's do_leak leaves 3 blocks (15000 bytes) and
/// do_malloc frees its 10: a budget on do_leak fails the run (status 3,
/// the row named), one on do_malloc, or above do_leak's, passes.
#[test]
fn fail_if_fails_a_command_that_leaves_blocks_and_passes_one_that_frees_them() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "fail_if_fails_a_command_that_leaves_blocks_and_passes_one_that_frees_them",
        &[
            "--outstanding",
            "--fail-if",
            "outstanding > 0",
            "--",
            w.path(),
        ],
    ) {
        return;
    }
    let run = |budget: &str| {
        kheap(&[
            "malloc",
            "--outstanding",
            "--fail-if",
            budget,
            "-o",
            "/dev/null",
            "--",
            w.path(),
        ])
    };
    let over = run("outstanding{site=do_leak} > 14999");
    assert_eq!(over.status.code(), Some(3), "{over:?}");
    let stderr = String::from_utf8_lossy(&over.stderr);
    assert!(
        stderr.contains(
            "kheap: over budget: outstanding{site=do_leak} > 14999 (15000 bytes > 14999 bytes)"
        ) && stderr.contains("  do_leak: 15000 bytes"),
        "{stderr}"
    );
    for within in [
        "outstanding{site=do_leak} > 15000",
        "outstanding{site=do_malloc} > 0",
        "allocated{site=do_malloc} > 1000",
    ] {
        let out = run(within);
        assert_eq!(out.status.code(), Some(0), "{within}: {out:?}");
    }
    let over = run("allocated{site=do_malloc} > 999");
    assert_eq!(over.status.code(), Some(3), "{over:?}");
    // Outstanding blocks are known with --outstanding only.
    let out = kheap(&["malloc", "--fail-if", "outstanding > 0", "--", w.path()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --outstanding"));
}

/// Before 5.17 malloc runs on its legacy path (src/kernel/features.rs,
/// `malloc_legacy`): one line of the text header and doctor's malloc row
/// say so and name what the kernel lacks; from 5.17 neither does. The rows
/// are the same either way (the other tests of this file run on both).
#[test]
fn the_legacy_path_is_said_in_one_line_where_it_is_taken() {
    require_root();
    let w = Workload::build(&[]);
    if malloc_refused_here(
        "the_legacy_path_is_said_in_one_line_where_it_is_taken",
        &["--", w.path()],
    ) {
        return;
    }
    let out = kheap(&["malloc", "--", w.path()]);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("malloc uses its path for older kernels"))
        .collect();
    let doctor = doctor_row("kheap malloc");
    if kernel_before(5, 17) {
        assert_eq!(lines.len(), 1, "{text}");
        assert!(
            lines[0].starts_with("kernel: this kernel (") && lines[0].contains("bpf_loop (5.17)"),
            "{text}"
        );
        assert!(
            doctor.contains("yes: this kernel (") && doctor.contains("with the same counts"),
            "{doctor}"
        );
    } else {
        assert!(lines.is_empty(), "{text}");
        assert!(!doctor.contains("older kernels"), "{doctor}");
    }
    // From 6.10 (bpf_preempt_disable) the uprobe programs run with
    // preemption off, and doctor says so; the 6.12 guest's malloc tests
    // are those of a load that would fail if its verifier refused that.
    assert_eq!(
        doctor.contains("run with preemption off"),
        !kernel_before(6, 10),
        "{doctor}"
    );
    // Where the programs run with preemption off, no word of preemption;
    // where they do not, a kernel whose build string says it preempts
    // (PREEMPT, PREEMPT_RT) gets the one line, in the header and in doctor.
    // (A PREEMPT_DYNAMIC kernel's mode is read by kheap's unit-tested
    // parsers from debugfs, the command line or the config.)
    let said = |t: &str| t.contains("preempts kernel code") || t.contains("preemption mode");
    let header: Vec<&str> = text.lines().filter(|l| l.starts_with("kernel: ")).collect();
    if !kernel_before(6, 10) {
        assert!(!said(&text) && !said(&doctor), "{text}\n{doctor}");
    } else {
        let uname =
            String::from_utf8_lossy(&Command::new("uname").arg("-v").output().unwrap().stdout)
                .to_string();
        let words: Vec<&str> = uname.split_whitespace().collect();
        if words.contains(&"PREEMPT") || words.contains(&"PREEMPT_RT") {
            assert!(header.len() == 1 && said(header[0]), "{text}");
            assert!(said(&doctor), "{doctor}");
        } else if !words.contains(&"PREEMPT_DYNAMIC") {
            assert!(!said(&text) && !said(&doctor), "{uname}: {text}\n{doctor}");
        } else {
            // The mode read, or its being unreadable, is said alike in both.
            assert_eq!(said(&text), said(&doctor), "{text}\n{doctor}");
        }
    }
    // Either way the workload's rows are there.
    assert!(text.contains("do_malloc"), "{text}");
}
