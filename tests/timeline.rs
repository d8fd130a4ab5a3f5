//! `kheap leaks`' timeline against the real kernel: kheap-load msg-steps
//! holds N, 2N, then 3N SysV messages (one kmalloc in load_msg each), a
//! step each STEP_SECS, then frees them; the timeline must show the three
//! levels exactly, for as long as they last, with /proc/meminfo's Slab
//! line rising with them.

mod common;

use common::*;
use serde_json::Value;

const STEP_N: u64 = 2000;
const MSG_SIZE: &str = "2100";
const STEP_SECS: f64 = 1.5;
const INTERVAL: f64 = 0.25;

/// load_msg's (objects, bytes) at each point (0 when not among the top).
fn load_msg_levels(report: &Value) -> Vec<(f64, u64, u64, &Value)> {
    let t = &report["leaks"]["timeline"];
    let series = t["series"].as_array().unwrap();
    t["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let (objects, bytes) = p["sites"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| series[u(&s["series"]) as usize]["function"] == "load_msg")
                .fold((0, 0), |(o, b), s| {
                    (o + u(&s["objects"]), b + u(&s["bytes"]))
                });
            (p["t_s"].as_f64().unwrap(), objects, bytes, p)
        })
        .collect()
}

/// The allocated size of one message, from the report's own totals.
fn msg_object_size(report: &Value) -> u64 {
    let sites = rows_of_fn(report, "sites", "load_msg");
    assert_eq!(sites.len(), 1, "{:#}", report["sites"]);
    let count = u(&sites[0]["count"]);
    assert_eq!(count, 3 * STEP_N, "every message allocated once");
    let bytes = u(&sites[0]["bytes_alloc"]);
    assert_eq!(bytes % count, 0, "messages of one size: {bytes} / {count}");
    bytes / count
}

fn steps_report(extra: &[&str]) -> Value {
    let n = STEP_N.to_string();
    let step = STEP_SECS.to_string();
    let interval = INTERVAL.to_string();
    let mut args = vec!["--interval", interval.as_str()];
    args.extend(extra);
    report_json("leaks", &args, &["msg-steps", &n, MSG_SIZE, &step])
}

#[test]
fn the_timeline_shows_three_steps_of_exact_sizes_and_slab_rises_with_them() {
    require_root();
    let report = steps_report(&[]);
    let objsize = msg_object_size(&report);
    let t = &report["leaks"]["timeline"];
    assert_eq!(t["interval_s"].as_f64(), Some(INTERVAL));
    assert_eq!(t["estimated"], false);
    let levels = load_msg_levels(&report);
    let per_step = STEP_SECS / INTERVAL;
    for &(_, objects, bytes, p) in &levels {
        assert_eq!(bytes, objects * objsize, "{p}");
    }
    // Every reading is one of the levels, except at most one caught while
    // a step's messages were being sent (then between two levels).
    let expected = [0, STEP_N, 2 * STEP_N, 3 * STEP_N];
    let between: Vec<_> = levels.iter().filter(|l| !expected.contains(&l.1)).collect();
    assert!(between.len() <= 3, "{between:?}");
    // Up to the third step, never down; then back to nothing at the end.
    let peak = levels.iter().position(|l| l.1 == 3 * STEP_N).unwrap();
    for w in levels[..=peak].windows(2) {
        assert!(w[0].1 <= w[1].1, "{} then {}", w[0].1, w[1].1);
    }
    assert_eq!(levels.last().unwrap().1, 0, "freed at the end");
    // Each level lasts a step: as many readings as fit in STEP_SECS.
    let mut firsts = Vec::new();
    for k in 1..=3 {
        let at: Vec<_> = levels.iter().filter(|l| l.1 == k * STEP_N).collect();
        let n = at.len() as f64;
        assert!(
            n >= per_step - 2.0 && n <= per_step + 2.0,
            "step {k}: {n} readings of {per_step}"
        );
        firsts.push(at[0].0);
    }
    for w in firsts.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap >= STEP_SECS - 2.0 * INTERVAL && gap <= STEP_SECS + 4.0 * INTERVAL,
            "steps {gap}s apart"
        );
    }
    // /proc/meminfo's Slab line rises with the two later steps (other
    // processes allocate and free too: half the messages' bytes at least).
    let slab = |p: &Value| u(&p["meminfo"]["slab_bytes"]);
    let first = levels.iter().find(|l| l.1 == STEP_N).unwrap().3;
    let third = levels.iter().rfind(|l| l.1 == 3 * STEP_N).unwrap().3;
    let rise = slab(third).saturating_sub(slab(first));
    assert!(
        rise >= STEP_N * objsize,
        "Slab rose {rise} bytes for {} bytes of messages",
        2 * STEP_N * objsize
    );
    assert!(
        u(&t["readings"]) >= (3.0 * per_step) as u64,
        "{}",
        t["readings"]
    );
    assert!(u(&t["read_us_max"]) >= u(&t["read_us_mean"]));
}
