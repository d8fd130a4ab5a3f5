//! The JSON contract against the real kernel: the output of the options
//! the other suites don't run (top -b with -o and -- CMD, slab's static
//! report, --watch and traced filters, diff of record reports) follows
//! schema/, with the numbers the workload makes. record, leaks, malloc, top
//! and slab's traced report are validated in their own suites, on every
//! JSON they parse.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use serde_json::Value;

/// Each line of a JSON Lines file, validated.
fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .map(parse_valid)
        .collect()
}

fn run_ok(args: &[&str]) -> String {
    let out = kheap(args);
    assert!(
        out.status.success(),
        "kheap {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Allocations counted for load_msg in a list of rows.
fn load_msg_count(report: &Value, list: &str) -> u64 {
    rows_of_fn(report, list, "load_msg")
        .iter()
        .map(|r| u(&r["count"]))
        .sum()
}

#[test]
fn top_batch_json_to_a_file_covers_a_command_to_its_end() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("top.jsonl");
    // No --iterations: top ends when the command does, and its last
    // allocations are in a last interval.
    let stdout = run_ok(&[
        "top",
        "--format",
        "json",
        "-i",
        "0.3",
        "-o",
        path.to_str().unwrap(),
        "--",
        LOAD,
        "msg",
        "300",
        "2100",
        "1",
    ]);
    assert!(stdout.is_empty(), "-o: nothing on stdout: {stdout}");
    let intervals = read_lines(&path);
    assert!(!intervals.is_empty(), "no interval written");
    let msgs: u64 = intervals.iter().map(|iv| load_msg_count(iv, "sites")).sum();
    assert_eq!(msgs, 300, "every message of the command, once");
    assert!(intervals.iter().all(|iv| iv["kind"] == "top"));
}

#[test]
fn slab_static_and_watch_json_follow_the_schema() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slab.json");
    run_ok(&["slab", "--format", "json", "-o", path.to_str().unwrap()]);
    let r = parse_valid(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(r["mode"], "report");
    let caches = r["caches"].as_array().unwrap();
    assert!(!caches.is_empty());
    assert!(caches.iter().all(|c| c["count"].is_null()), "not traced");
    // JSON shows every cache unless -n says otherwise.
    let all = caches.len();
    let cut = parse_valid(&run_ok(&["slab", "--format", "json", "-n", "3"]));
    assert_eq!(cut["caches"].as_array().unwrap().len(), 3.min(all));

    let watch = dir.path().join("watch.jsonl");
    run_ok(&[
        "slab",
        "--watch",
        "0.3",
        "-d",
        "1",
        "--format",
        "json",
        "-n",
        "2",
        "-o",
        watch.to_str().unwrap(),
    ]);
    let frames = read_lines(&watch);
    assert!(!frames.is_empty());
    for f in &frames {
        assert_eq!(f["mode"], "watch");
        let n = f["caches"].as_array().unwrap().len();
        assert!((1..=2).contains(&n), "{n} caches in a frame of -n 2");
    }

    // --watch keeps each cache's merge note (issue 46), the same caches as
    // the static report names: every row of a frame of all caches has the
    // static report's aliases.
    let aliases_of = |rows: &Value| -> HashMap<String, Value> {
        rows.as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["aliases"].clone(),
                )
            })
            .collect()
    };
    let statics = aliases_of(&r["caches"]);
    run_ok(&[
        "slab",
        "--watch",
        "0.3",
        "-d",
        "0.5",
        "--format",
        "json",
        "-o",
        watch.to_str().unwrap(),
    ]);
    let frame = read_lines(&watch).pop().expect("a watch frame");
    let watched = aliases_of(&frame["caches"]);
    let merged: Vec<&String> = statics
        .iter()
        .filter(|(_, a)| !a.as_array().unwrap().is_empty())
        .map(|(n, _)| n)
        .collect();
    assert!(!merged.is_empty(), "no merged cache on this kernel");
    for name in merged {
        if let Some(a) = watched.get(name) {
            assert_eq!(a, &statics[name], "{name}");
        }
    }
    assert!(
        watched.values().any(|a| !a.as_array().unwrap().is_empty()),
        "no frame row names a merged cache"
    );
}

#[test]
fn slab_traced_filters_select_the_allocations() {
    require_root();
    // 300 messages of 2100 bytes: 300 kmallocs of 2148 bytes in load_msg.
    let site_count = |filter: &[&str]| -> u64 {
        let mut args = vec!["slab", "--format", "json"];
        args.extend(filter);
        args.extend(["--", LOAD, "msg", "300", "2100"]);
        let r = parse_valid(&run_ok(&args));
        r["caches"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["top_sites"].as_array().unwrap())
            .filter(|s| s["function"] == "load_msg")
            .map(|s| u(&s["count"]))
            .sum()
    };
    assert_eq!(site_count(&["--min-size", "2000", "--no-stacks"]), 300);
    assert_eq!(site_count(&["--max-size", "2000"]), 0);
    assert_eq!(site_count(&["--comm", "no-such-task"]), 0);
}

#[test]
fn diff_compares_record_reports_and_refuses_mixed_kinds() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let report = |sub: &str, count: &str| {
        let path = dir.path().join(format!("{sub}-{count}.json"));
        run_ok(&[
            sub,
            "--format",
            "json",
            "-o",
            path.to_str().unwrap(),
            "--",
            LOAD,
            "msg",
            count,
            "2100",
        ]);
        parse_valid(&std::fs::read_to_string(&path).unwrap());
        path
    };
    let (small, large) = (report("record", "100"), report("record", "400"));
    let d = parse_valid(&run_ok(&[
        "diff",
        small.to_str().unwrap(),
        large.to_str().unwrap(),
        "--format",
        "json",
    ]));
    assert_eq!(
        (&d["compared"], &d["measure"]),
        (&"record".into(), &"allocated".into())
    );
    let msg = d["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("load_msg+"))
        })
        .unwrap_or_else(|| panic!("no load_msg row: {d:#}"));
    assert_eq!(u(&msg["change_count"]), 300);

    let leaks = report("leaks", "100");
    let out = kheap(&["diff", small.to_str().unwrap(), leaks.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("is a record report and") && err.contains("a leaks report"),
        "{err}"
    );
}
