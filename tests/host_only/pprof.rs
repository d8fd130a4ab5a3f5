//! `--format pprof` read back by the real Go pprof tool: for a known
//! workload, the counts and bytes `go tool pprof` shows for its site are
//! exactly those of the JSON report of the same run (`--json FILE` writes
//! it beside the profile), and those are the workload's known numbers.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cgroup::{TestCgroup, Workload as Load};
use common::workload::{line_of, Workload};
use common::*;
use serde_json::Value;

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

/// What pprof shows for `function` under one sample type, in the type's
/// base unit (objects, or bytes without scaling), over the samples that
/// `focus` (pprof options such as `-tagfocus=...`) keeps.
fn pprof_value(file: &Path, focus: &[&str], sample_type: &str, function: &str) -> i64 {
    let unit = if sample_type.ends_with("space") {
        "-unit=B"
    } else {
        "-unit=minimum"
    };
    let index = format!("-sample_index={sample_type}");
    let mut args = vec!["-top", "-cum", "-nodecount=100000", unit, &index];
    args.extend(focus);
    let top = go_pprof(&args, file);
    assert!(top.contains(&format!("Type: {sample_type}")), "{top}");
    let v = cum_of(&top, function);
    v.trim_end_matches('B')
        .parse()
        .unwrap_or_else(|_| panic!("{v} is not a number:\n{top}"))
}

/// The kernel heap's pprof focus on the workload's messages: load_msg's
/// own allocations are the 4 KiB ones (slab pages it triggers land in
/// other caches), and the cache label picks them: msg_msg-4k on 6.11+,
/// kmalloc-cg-4k where charged before (docs/design.md).
fn msg_focus() -> String {
    format!("-tagfocus=cache={MSG_CACHE_RE}")
}

/// The cache of the messages, by its name.
fn is_msg_cache_name(name: &Value) -> bool {
    name.as_str().is_some_and(is_msg_cache)
}

/// Runs `kheap SUBCOMMAND --format pprof -o P --json J ARGS` and returns
/// the profile's path and the JSON report of the same run.
fn profile_and_json(dir: &Path, subcommand: &str, args: &[&str]) -> (PathBuf, Value) {
    let profile = dir.join("heap.pb.gz");
    let json = dir.join("report.json");
    let mut all = vec![
        subcommand,
        "--format",
        "pprof",
        "-o",
        profile.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    all.extend(args);
    assert_ok(&kheap(&all));
    let report = parse_valid(&std::fs::read_to_string(&json).expect("no --json report"));
    (profile, report)
}

/// The one JSON site row of load_msg in the messages' cache.
fn msg_site(report: &Value) -> &Value {
    let sites: Vec<_> = rows_of_fn(report, "sites", "load_msg")
        .into_iter()
        .filter(|r| {
            r["caches"]
                .as_array()
                .unwrap()
                .iter()
                .any(is_msg_cache_name)
        })
        .collect();
    assert_eq!(sites.len(), 1, "one load_msg site: {:#}", report["sites"]);
    sites[0]
}

fn n(v: &Value) -> i64 {
    u(v) as i64
}

/// For `kheap record` with these stack options and 1000 messages of 2100
/// bytes (one kmalloc-4k object each): pprof's load_msg totals are the JSON
/// site's, which are the workload's.
fn check_record_profile(stack_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = stack_args.to_vec();
    args.extend(["--", LOAD, "msg", "1000", "2100"]);
    let (file, r) = profile_and_json(dir.path(), "record", &args);
    let site = msg_site(&r);
    assert_eq!(
        (u(&site["count"]), u(&site["bytes_alloc"])),
        (1000, 4096000)
    );
    let objects = pprof_value(&file, &[&msg_focus()], "alloc_objects", "load_msg");
    let space = pprof_value(&file, &[&msg_focus()], "alloc_space", "load_msg");
    assert_eq!(
        (objects, space),
        (n(&site["count"]), n(&site["bytes_alloc"])),
        "pprof vs the JSON site of the same run"
    );
    // And the profile is the JSON's stacks: the sum of load_msg's stack
    // rows (scaled estimates when sampled) is what pprof showed.
    let stacks = rows_of_fn(&r, "stacks", "load_msg");
    let sampled = stack_args.is_empty();
    assert!(
        stacks.iter().all(|s| s["estimated"] == sampled),
        "estimated stacks exactly when sampled: {stacks:#?}"
    );
    let sum = |field: &str| stacks.iter().map(|s| n(&s[field])).sum::<i64>();
    assert_eq!((sum("count"), sum("bytes_alloc")), (objects, space));
}

#[test]
fn go_pprof_shows_the_json_site_totals_with_exact_stacks() {
    require_root();
    // Every stack captured: per-stack numbers are exact.
    check_record_profile(&["--exact-stacks"]);
    // The raw dump shows the kernel mapping and the sample types.
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = profile_and_json(dir.path(), "record", &["--", LOAD, "msg", "10", "2100"]);
    let raw = go_pprof(&["-raw"], &file);
    assert!(raw.contains("[kernel.kallsyms]"), "{raw}");
    assert!(
        raw.contains("alloc_objects/count alloc_space/bytes"),
        "{raw}"
    );
}

#[test]
fn go_pprof_shows_the_json_site_totals_with_sampled_stacks() {
    require_root();
    // Stacks sampled 1 in 1024 (the default): the few sampled load_msg
    // stacks are scaled so that they add up to the site's exact totals.
    check_record_profile(&[]);
}

/// `pprof -top` rows (flat, function), heaviest flat first.
fn flat_rows(top: &str) -> Vec<(i64, String)> {
    top.lines()
        .skip_while(|l| !l.contains("flat%"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let flat = cols.first()?.trim_end_matches('B').parse().ok()?;
            Some((flat, cols.get(5..)?.join(" ")))
        })
        .collect()
}

#[test]
fn go_pprof_flat_names_the_callers_unless_allocator_frames_are_kept() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let run = ["--exact-stacks", "--", LOAD, "msg", "1000", "2100"];
    let (file, r) = profile_and_json(dir.path(), "record", &run);
    let bytes = n(&msg_site(&r)["bytes_alloc"]);
    assert_eq!(bytes, 4096000);
    let mut args = vec![
        "-top",
        "-nodecount=100000",
        "-unit=B",
        "-sample_index=alloc_space",
    ];
    let focus = msg_focus();
    args.push(&focus);
    let top = go_pprof(&args, &file);
    let rows = flat_rows(&top);
    // The messages' flat bytes are on load_msg itself, the caller.
    assert_eq!(
        rows.first(),
        Some(&(bytes, "load_msg".to_string())),
        "{top}"
    );
    let allocator = |f: &str| f.starts_with("__kmalloc") || f.contains("_noprof");
    assert!(!rows.iter().any(|(_, f)| allocator(f)), "{top}");
    // The JSON keeps every frame.
    let frames = frames(rows_of_fn(&r, "stacks", "load_msg")[0]);
    assert!(allocator(frames[0]), "{frames:?}");

    // --keep-allocator-frames: the allocator's entry frame is the leaf.
    let mut kept = vec!["--keep-allocator-frames"];
    kept.extend(run);
    let kept_dir = tempfile::tempdir().unwrap();
    let (file, _) = profile_and_json(kept_dir.path(), "record", &kept);
    let top = go_pprof(&args, &file);
    let rows = flat_rows(&top);
    let (flat, leaf) = rows.first().unwrap_or_else(|| panic!("{top}"));
    assert!(allocator(leaf) && *flat == bytes, "{top}");
    assert!(
        rows.iter().any(|(flat, f)| f == "load_msg" && *flat == 0),
        "{top}"
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

#[test]
fn go_pprof_shows_user_functions_lines_and_outstanding_blocks() {
    require_root();
    let w = Workload::build(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (file, r) = profile_and_json(dir.path(), "malloc", &["--outstanding", "--", w.path()]);
    // The JSON rows of one calling function, summed over allocators:
    // count, bytes, outstanding count and bytes.
    let json = |function: &str| {
        let rows: Vec<_> = r["sites"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["function"] == function)
            .collect();
        assert!(!rows.is_empty(), "no {function} row: {:#}", r["sites"]);
        let sum = |f: &str| rows.iter().map(|s| n(&s[f])).sum::<i64>();
        [
            sum("count"),
            sum("bytes_req"),
            sum("outstanding_count"),
            sum("outstanding_bytes"),
        ]
    };
    let shown = |function: &str, types: &[&str]| {
        types
            .iter()
            .map(|t| pprof_value(&file, &[], t, function))
            .collect::<Vec<_>>()
    };
    let all = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ];
    // do_leak: 3 x malloc(5000), never freed; do_malloc: 10 x 100, freed
    // (pprof lists no function whose value is 0: its in-use is not shown).
    assert_eq!(json("do_leak"), [3, 15000, 3, 15000]);
    assert_eq!(shown("do_leak", &all), json("do_leak"));
    assert_eq!(json("do_malloc"), [10, 1000, 0, 0]);
    assert_eq!(shown("do_malloc", &all[..2]), json("do_malloc")[..2]);
    // File and line of the call, from the binary's debug information.
    let lines = go_pprof(&["-top", "-lines", "-sample_index=inuse_space"], &file);
    let want = format!(
        "do_leak malloc_workload.c:{}",
        line_of("leaks[nleaks++] = malloc(5000)")
    );
    assert!(lines.contains(&want), "{want} not in:\n{lines}");
}

#[test]
fn go_pprof_shows_the_json_outstanding_messages_of_leaks() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // kheap-load holds 500 messages (kmalloc-4k, 4096 bytes each) for 4 s;
    // the report is taken after 2 s, while they are all held.
    let (file, r) = profile_and_json(
        dir.path(),
        "leaks",
        &[
            "--exact-stacks",
            "-d",
            "2",
            "--",
            LOAD,
            "msg",
            "500",
            "2100",
            "4",
        ],
    );
    let site = msg_site(&r);
    let json = [
        n(&site["outstanding_count"]),
        n(&site["outstanding_bytes"]),
        n(&site["count"]),
    ];
    assert_eq!(json, [500, 2048000, 500]);
    let shown = ["inuse_objects", "inuse_space", "alloc_objects"]
        .map(|t| pprof_value(&file, &[&msg_focus()], t, "load_msg"));
    assert_eq!(shown, json, "pprof vs the JSON site of the same run");
    // inuse_space is what pprof shows first for a leaks profile.
    let default = go_pprof(&["-top"], &file);
    assert!(default.contains("Type: inuse_space"), "{default}");
}

/// The total `go tool pprof -top` gives for one sample type, in its base
/// unit.
fn pprof_total(file: &Path, sample_type: &str) -> i64 {
    let unit = if sample_type.ends_with("space") {
        "-unit=B"
    } else {
        "-unit=minimum"
    };
    let index = format!("-sample_index={sample_type}");
    let top = go_pprof(&["-top", "-nodecount=1", unit, &index], file);
    let head = top
        .lines()
        .find(|l| l.starts_with("Showing nodes accounting for"))
        .unwrap_or_else(|| panic!("no total in pprof output:\n{top}"));
    let total = head
        .split(" total")
        .next()
        .unwrap()
        .split_whitespace()
        .last()
        .unwrap();
    total
        .trim_end_matches('B')
        .parse()
        .unwrap_or_else(|_| panic!("{total} is not a number:\n{top}"))
}

#[test]
fn go_pprof_totals_are_the_json_exact_totals_of_a_short_leaks_run() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // Stacks sampled (leaks' default, 1 in 256) in a short run: sites
    // with no sampled stack, or whose sampled objects were freed while
    // others stay, are in the profile all the same.
    let (file, r) = profile_and_json(
        dir.path(),
        "leaks",
        &["-d", "2", "--", LOAD, "msg", "500", "2100", "4"],
    );
    let sites = r["sites"].as_array().unwrap();
    let sum = |field: &str| sites.iter().map(|s| n(&s[field])).sum::<i64>();
    let json = [
        sum("count"),
        sum("bytes_alloc"),
        sum("outstanding_count"),
        sum("outstanding_bytes"),
    ];
    assert_eq!(
        json[2..],
        [
            n(&r["leaks"]["outstanding_count"]),
            n(&r["leaks"]["outstanding_bytes"])
        ],
        "the site rows add up to the run's outstanding totals"
    );
    let shown = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ]
    .map(|t| pprof_total(&file, t));
    let stacks = r["stacks"].as_array().unwrap();
    let in_stacks: i64 = stacks.iter().map(|s| n(&s["outstanding_bytes"])).sum();
    assert_eq!(
        shown, json,
        "pprof's totals vs the JSON's exact site rows (the JSON's stacks alone hold {in_stacks} of {} outstanding bytes)",
        json[3]
    );
    assert!(json[2] >= 500, "the 500 held messages: {json:?}");
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
    let objects = pprof_value(&file, &[&msg_focus()], "alloc_objects", "load_msg");
    let space = pprof_value(&file, &[&msg_focus()], "alloc_space", "load_msg");
    let change = |f: &str| n(&msg_site(&after)[f]) - n(&msg_site(&before)[f]);
    assert_eq!((objects, space), (change("count"), change("bytes_alloc")));
    assert_eq!((objects, space), (-600, -2457600));
}

/// One kheap-load process of [`two_processes`]: its PID, its cgroup and
/// the messages it sent.
struct Sender {
    pid: u32,
    cgroup: String,
    messages: u64,
}

/// Two kheap-load processes at once, each in a test cgroup of its own,
/// sending 300 and 700 messages of 2100 bytes (one kmalloc-4k object
/// each), traced by `kheap SUBCOMMAND --exact-stacks --cgroup A --cgroup B`
/// until SIGINT, which writes the profile and the JSON of the same run.
/// With `hold`, each still holds its messages when kheap stops (leaks).
fn two_processes(dir: &Path, subcommand: &str, hold: bool) -> (PathBuf, Value, [Sender; 2]) {
    // Named after the subcommand: the tests that share this run at once.
    let cgroups = [
        TestCgroup::top(&format!("pprof-{subcommand}-a")),
        TestCgroup::top(&format!("pprof-{subcommand}-b")),
    ];
    let counts = ["300", "700"];
    let mut loads: Vec<Load> = cgroups
        .iter()
        .zip(counts)
        .map(|(cg, n)| {
            let mut load_args = vec!["msg", n, "2100"];
            if hold {
                load_args.push("60"); // seconds, or until dropped
            }
            Load::spawn_in(cg, &load_args)
        })
        .collect();
    let senders = [0, 1].map(|i| Sender {
        pid: loads[i].child.id(),
        cgroup: cgroups[i].rel(),
        messages: counts[i].parse().unwrap(),
    });
    let (profile, json) = (dir.join("heap.pb.gz"), dir.join("report.json"));
    #[rustfmt::skip]
    let args = [
        subcommand, "--exact-stacks", "--cgroup", cgroups[0].path(), "--cgroup", cgroups[1].path(),
        "--format", "pprof", "-o", profile.to_str().unwrap(), "--json", json.to_str().unwrap(),
    ];
    let mut kheap = Background::spawn(KHEAP, &args);
    kheap.wait_for("tracing");
    for l in &mut loads {
        l.go();
    }
    if hold {
        loads.iter_mut().for_each(Load::wait_holding);
    } else {
        loads.into_iter().for_each(Load::finish);
    }
    kheap.signal(libc::SIGINT);
    assert!(kheap.wait(), "kheap {args:?} failed: {:#?}", kheap.seen);
    let report = parse_valid(&std::fs::read_to_string(&json).expect("no --json report"));
    (profile, report, senders)
}

/// The JSON's load_msg kmalloc-4k stacks summed for one process: count,
/// bytes_alloc, outstanding count and bytes, and the comm and cgroup path
/// its entries name.
fn json_share(report: &Value, pid: u32) -> ([i64; 4], Vec<(String, String)>) {
    let mut sums = [0; 4];
    let mut names = Vec::new();
    let stacks = rows_of_fn(report, "stacks", "load_msg");
    let msg_stacks = stacks.iter().filter(|s| is_msg_cache_name(&s["cache"]));
    for p in msg_stacks.flat_map(|s| s["processes"].as_array().expect("stack processes")) {
        if p["pid"] != pid {
            continue;
        }
        let fields = [
            "count",
            "bytes_alloc",
            "outstanding_count",
            "outstanding_bytes",
        ];
        for (sum, f) in sums.iter_mut().zip(fields) {
            *sum += p.get(f).map_or(0, n);
        }
        let comm = p["comm"].as_str().unwrap().to_string();
        names.push((comm, p["cgroup"]["path"].as_str().unwrap().to_string()));
    }
    names.dedup();
    (sums, names)
}

/// What pprof shows for load_msg's 4 KiB samples with a label that
/// matches, under each sample type.
fn labelled(file: &Path, label: &str, types: &[&str]) -> Vec<i64> {
    let focus = format!(
        "-tagfocus=cache:{},{label}",
        MSG_CACHE_RE.trim_start_matches('^')
    );
    types
        .iter()
        .map(|t| pprof_value(file, &[&focus], t, "load_msg"))
        .collect()
}

/// Each sender's samples, picked by its `process` label and by its
/// `cgroup` label, have exactly its messages, as the JSON's stack rows
/// have them for its PID.
fn check_labels(file: &Path, r: &Value, senders: &[Sender; 2], types: &[&str]) {
    for s in senders {
        let (json, names) = json_share(r, s.pid);
        let want = [s.messages as i64, s.messages as i64 * 4096];
        assert_eq!(json[..2], want, "JSON stacks of pid {}: {r:#}", s.pid);
        assert_eq!(names, [("kheap-load".to_string(), s.cgroup.clone())]);
        let json = &json[..types.len()];
        let process = format!("process:kheap-load \\[{}\\]$", s.pid);
        assert_eq!(labelled(file, &process, types), json, "{process}");
        let cgroup = format!("cgroup:{}$", s.cgroup);
        assert_eq!(labelled(file, &cgroup, types), json, "{cgroup}");
    }
    // The numeric pid label: pprof's tag view counts each PID's samples.
    let tags = go_pprof(
        &[
            "-tags",
            "-focus=^load_msg$",
            &msg_focus(),
            "-sample_index=alloc_objects",
        ],
        file,
    );
    // Lines such as "700.0 (70.00%): 32540" under "pid: Total 1000.0".
    for s in senders {
        let shown = tags
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("pid:"))
            .find(|l| l.trim_end().ends_with(&format!(": {}", s.pid)))
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok());
        assert_eq!(shown, Some(s.messages as f64), "pid {} in:\n{tags}", s.pid);
    }
}

#[test]
fn go_pprof_labels_kernel_samples_with_their_process_and_cgroup() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (file, r, senders) = two_processes(dir.path(), "record", false);
    check_labels(&file, &r, &senders, &["alloc_objects", "alloc_space"]);
}

#[test]
fn go_pprof_labels_what_each_process_holds_in_leaks() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (file, r, senders) = two_processes(dir.path(), "leaks", true);
    // Every message is still held: in use is what each process sent.
    for s in &senders {
        let (json, _) = json_share(&r, s.pid);
        let n = s.messages as i64;
        assert_eq!(json, [n, n * 4096, n, n * 4096], "pid {}", s.pid);
    }
    let all = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ];
    check_labels(&file, &r, &senders, &all);
}
