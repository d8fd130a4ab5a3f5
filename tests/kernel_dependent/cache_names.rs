//! The cache kheap names for a row is the one `/proc/slabinfo` says grew,
//! on every kernel: the kmalloc tracepoint names no cache, so kheap finds
//! it from the object's slab (bpf/slab_cache.bpf.h). Each test first runs
//! its workload untraced and reads which slabinfo row grew while it held
//! its objects, then checks that record, leaks, slab and `serve`'s /metrics
//! name that row, with the workload's exact counts. Nothing here names a
//! kernel's cache: msg_msg lands in msg_msg-4k on 6.11+ (bucket caches),
//! kmalloc-cg-4k or kmalloc-4k before; epoll's epitems live in a cache SLUB
//! merged with others of their size.

use crate::common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// Active objects per `/proc/slabinfo` row.
fn slabinfo() -> HashMap<String, i64> {
    std::fs::read_to_string("/proc/slabinfo")
        .expect("reading /proc/slabinfo")
        .lines()
        .skip(2)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// The slabinfo rows that grew by at least `at_least` objects while
/// kheap-load LOAD_ARGS (which must hold its objects and say "holding")
/// held them, untraced.
fn rows_that_grew(load_args: &[&str], at_least: i64) -> Vec<String> {
    let before = slabinfo();
    let mut load = Background::spawn(LOAD, load_args);
    load.wait_for("holding");
    let during = slabinfo();
    let st = wait_or_kill(&mut load.child, HANG_LIMIT);
    assert!(st.success(), "kheap-load {load_args:?}: {st}");
    let mut grew: Vec<String> = during
        .iter()
        // SLUB counts free objects of per-CPU slabs as active: a row grows
        // by a little less than the objects held.
        .filter(|(name, &n)| (n - before.get(*name).copied().unwrap_or(0)) * 10 >= at_least * 9)
        .map(|(name, _)| name.clone())
        .collect();
    grew.sort();
    assert!(
        !grew.is_empty(),
        "no slabinfo row grew by {at_least} while kheap-load {load_args:?} held its objects"
    );
    grew
}

/// The kernel's own name of a cache kheap shows as `NAME (merged: …)`.
fn unmerged(name: &str) -> &str {
    name.split_once(" (merged: ").map_or(name, |(n, _)| n)
}

/// The one cache of `function`'s site rows in a record or leaks report,
/// and its exact count.
fn site_cache(report: &Value, function: &str) -> (String, u64) {
    let rows = rows_of_fn(report, "sites", function);
    assert_eq!(rows.len(), 1, "{function} sites: {rows:#?}");
    let caches = rows[0]["caches"].as_array().unwrap();
    assert_eq!(caches.len(), 1, "{function}: {caches:?}");
    (
        caches[0].as_str().unwrap().to_string(),
        u(&rows[0]["count"]),
    )
}

/// The cache rows of a record or leaks report named `name`: one, whose
/// count is at least the site's.
fn assert_cache_row(report: &Value, name: &str, site_count: u64) {
    let rows = rows(report, "caches", "name", name);
    assert_eq!(rows.len(), 1, "{name}: {:#}", report["caches"]);
    assert!(u(&rows[0]["count"]) >= site_count, "{:#}", rows[0]);
}

/// `kheap slab`: the slabinfo row holding `function`'s traced objects.
fn slab_row_of(function: &str, load_args: &[&str]) -> (String, u64) {
    let r = report_json("slab", &["-n", "1000"], load_args);
    let with: Vec<(String, u64)> = r["caches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| {
            let site = c["top_sites"]
                .as_array()?
                .iter()
                .find(|s| s["function"].as_str().map(base_name) == Some(function))?;
            Some((c["name"].as_str().unwrap().to_string(), u(&site["count"])))
        })
        .collect();
    assert_eq!(with.len(), 1, "{function} in one row: {:#}", r["caches"]);
    with[0].clone()
}

/// `kheap serve --comm COMM`'s /metrics, polled until the
/// kheap_site_allocations_total series of `site` reaches `count`, while
/// a copy of kheap-load named COMM runs LOAD_ARGS. Returns the series'
/// cache label.
fn metrics_cache_of(site: &str, count: u64, load_args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let comm = format!("kcn{}", std::process::id() % 100_000);
    let load = dir.path().join(&comm);
    std::fs::copy(LOAD, &load).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Background::spawn(
        KHEAP,
        &[
            "serve",
            "--listen",
            &listen,
            "--interval",
            "1",
            "--comm",
            &comm,
        ],
    );
    serve.wait_for("serving on");
    let st = Command::new(&load)
        .args(load_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "{comm} {load_args:?}");
    let prefix = format!("kheap_site_allocations_total{{site=\"{site}\",cache=\"");
    let mut body = String::new();
    let mut series: Vec<(String, u64)> = Vec::new();
    let done = poll_every(Duration::from_secs(30), Duration::from_millis(300), || {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                &format!("http://{listen}/metrics"),
            ])
            .output()
            .expect("curl is needed by this test");
        body = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!body.contains("cache@0x"), "{body}");
        series = body
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&prefix)?;
                let (cache, value) = rest.split_once("\"} ")?;
                Some((cache.to_string(), value.trim().parse().ok()?))
            })
            .collect();
        series.iter().map(|s| s.1).sum::<u64>() >= count
    });
    assert!(
        done,
        "no {prefix}…}} {count} series; last /metrics:\n{body}"
    );
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].1, count, "{series:?}");
    series.swap_remove(0).0
}

/// Whether /sys/kernel/slab says other caches were merged into `row`.
fn has_merged_names(row: &str) -> bool {
    let Ok(dir) = std::fs::read_link(format!("/sys/kernel/slab/{row}")) else {
        return false;
    };
    std::fs::read_dir("/sys/kernel/slab")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name() != row)
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == dir))
}

#[test]
fn msg_rows_name_the_cache_slabinfo_grew() {
    require_root();
    // 2000 messages of 2100 bytes: 2000 objects of 4096 bytes in one row.
    let grew = rows_that_grew(&["msg", "2000", "2100", "2"], 2000);

    let record = record_json(&[], &["msg", "2000", "2100"]);
    let (cache, count) = site_cache(&record, msg_fn());
    assert_eq!(count, 2000);
    assert!(
        grew.contains(&cache),
        "record names {cache}; grew: {grew:?}"
    );
    assert_cache_row(&record, &cache, 2000);

    let leaks = report_json("leaks", &[], &["msg", "2000", "2100"]);
    assert_eq!(site_cache(&leaks, msg_fn()), (cache.clone(), 2000));
    assert_cache_row(&leaks, &cache, 2000);

    assert_eq!(
        slab_row_of(msg_fn(), &["msg", "2000", "2100", "1"]),
        (cache.clone(), 2000)
    );
    assert_eq!(
        metrics_cache_of(msg_fn(), 2000, &["msg", "2000", "2100"]),
        cache
    );
}

#[test]
fn merged_cache_rows_name_the_cache_slabinfo_grew() {
    require_root();
    // 8000 epoll watches of eventfds: one poll-table entry each
    // (ep_ptable_queue_proc, a callback, so never inlined), from
    // eventpoll_pwq, a cache SLUB merges with others of its size. Many, so
    // that the rest of the system moves its row little in comparison.
    let grew = rows_that_grew(&["epoll", "8000", "2"], 8000);

    let record = record_json(&[], &["epoll", "8000"]);
    let (cache, count) = site_cache(&record, "ep_ptable_queue_proc");
    assert_eq!(count, 8000);
    let row = unmerged(&cache).to_string();
    assert!(grew.contains(&row), "record names {cache}; grew: {grew:?}");
    assert_cache_row(&record, &cache, 8000);
    if has_merged_names(&row) {
        assert!(cache.starts_with(&format!("{row} (merged: ")), "{cache}");
    } else {
        partial_check(&format!(
            "{row} has no merged names on this kernel: merged naming not checked"
        ));
    }
    assert!(
        !record.to_string().contains("cache@0x"),
        "{:#}",
        record["caches"]
    );

    let leaks = report_json("leaks", &[], &["epoll", "8000"]);
    assert_eq!(
        site_cache(&leaks, "ep_ptable_queue_proc"),
        (cache.clone(), 8000)
    );

    // slab rows are /proc/slabinfo's: the kernel's own name.
    assert_eq!(
        slab_row_of("ep_ptable_queue_proc", &["epoll", "8000", "1"]),
        (row, 8000)
    );
    assert_eq!(
        metrics_cache_of("ep_ptable_queue_proc", 8000, &["epoll", "8000"]),
        cache
    );
}

/// `kheap slab` counts the frees of kmalloc'ed objects in the row of the
/// cache they lived in, where the kernel names it (the `bpf_get_kmem_cache`
/// kfunc, 6.13+): 300 messages sent and received are 300 allocations and
/// 300 frees of one cache. Older kernels count kfree() in the total only,
/// and the row shows none.
#[test]
fn kfree_frees_land_in_the_row_of_their_cache() {
    require_root();
    // The kfunc that names a freed object's cache (6.13+) runs in every
    // kind of program: each mechanism gives the same row.
    let modes: &[&str] = if kernel_before(6, 13) {
        &["auto"]
    } else {
        &["auto", "raw", "tracepoint"]
    };
    for mode in modes {
        let r = report_json(
            "slab",
            &["-n", "1000", "--attach", mode],
            &["msg", "300", "2100"],
        );
        check_kfree_row(mode, &r);
    }
}

fn check_kfree_row(mode: &str, r: &Value) {
    let rows: Vec<&Value> = r["caches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["top_sites"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["function"].as_str().map(base_name) == Some(msg_fn()))
            })
        })
        .collect();
    assert_eq!(
        rows.len(),
        1,
        "{mode}: load_msg in one row: {:#}",
        r["caches"]
    );
    let row = rows[0];
    let load_msg = row["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["function"].as_str().map(base_name) == Some(msg_fn()))
        .unwrap();
    assert_eq!(u(&load_msg["count"]), 300, "{mode}: {row:#}");
    if kernel_before(6, 11) {
        // Before the msg_msg buckets (6.11) the row is a kmalloc size class
        // that other sites share, so it counts at least the 300.
        assert!(u(&row["count"]) >= 300, "{row:#}");
    } else {
        assert_eq!(u(&row["count"]), 300, "{mode}: {row:#}");
    }
    let notes = r["notes"].to_string();
    let totals_only = notes.contains("kfree: frees counted in the totals only, not per cache");
    if kernel_before(6, 13) {
        assert_eq!(u(&row["frees"]), 0, "{row:#}");
        // ...and the report says why the row shows none.
        assert!(totals_only, "{notes}");
        partial_check(
            "kfree_frees_land_in_the_row_of_their_cache: no bpf_get_kmem_cache before 6.13, \
             only checked that the row counts no kfree and the notes say why",
        );
    } else {
        assert!(!totals_only, "{mode}: {notes}");
        assert_eq!(u(&row["frees"]), 300, "{mode}: {row:#}");
        assert_eq!(row["net_objs"].as_i64(), Some(0), "{mode}: {row:#}");
    }
}
