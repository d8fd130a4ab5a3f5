//! `kheap slab -d` against the real kernel: a known number of requests just
//! above a kmalloc size class shows up in the right cache, with the exact
//! waste and a right-sizing hint naming the site.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::*;

#[test]
fn waste_just_above_a_size_class_is_exact_and_hinted() {
    if !require_root("waste_just_above_a_size_class_is_exact_and_hinted") {
        return;
    }
    let mut slab = Command::new(KHEAP)
        .args(["slab", "-d", "4", "--format", "json", "-n", "500"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(slab.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("tracing"), "kheap slab did not start: {line}");
    // 2000 messages of 2100 bytes: 2000 kmallocs of 2148 bytes in load_msg,
    // rounded up to 4096.
    let load = Command::new(LOAD)
        .args(["msg", "2000", "2100"])
        .output()
        .unwrap();
    assert!(load.status.success());
    let out = slab.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let cache = rows(&r, "caches", "name", "kmalloc-4k");
    assert_eq!(cache.len(), 1, "kmalloc-4k row expected");
    let c = cache[0];
    assert!(u(&c["object_size"]) == 4096 && u(&c["num_objs"]) > 0);
    let site = c["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["function"] == "load_msg")
        .unwrap_or_else(|| panic!("load_msg not among kmalloc-4k's sites: {c:#}"));
    assert_eq!(u(&site["allocs"]), 2000);
    assert_eq!(u(&site["waste_bytes"]), 2000 * (4096 - 2148));

    let hint = r["hints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["kind"] == "boundary" && h["site"] == "load_msg")
        .unwrap_or_else(|| panic!("no right-sizing hint for load_msg: {:#}", r["hints"]));
    assert_eq!(hint["cache"], "kmalloc-4k");
    // A 2152-byte (8-aligned 2148) cache instead of 4096-byte objects.
    assert_eq!(u(&hint["saving_bytes"]), 2000 * (4096 - 2152));
}

#[test]
fn slabinfo_needs_root_and_says_so() {
    if !require_root("slabinfo_needs_root_and_says_so") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let out = Command::new(KHEAP)
        .arg("slab")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("readable only by root"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
