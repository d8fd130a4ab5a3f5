use super::*;
use crate::model::malloc::UnwoundStack;

/// `count` allocations of `size` bytes (the report fixtures' counts).
fn stats(count: u64, size: u64) -> AllocStats {
    crate::report::fixtures::stats(count, size, size)
}

fn uf(addr: u64, f: &str, off: u64) -> UserFrame {
    UserFrame {
        addr,
        module: Some("w".into()),
        file_offset: addr,
        function: Some(f.into()),
        offset: off,
        source: None,
        file: None,
    }
}

/// Two processes of one program (different load addresses) call malloc
/// from do_malloc, reached from main; one stack had no frames walked.
pub fn sample() -> (Snapshot, HashMap<(u64, u64), UserFrame>) {
    let k1 = Key {
        mm: 0x1000,
        tgid: 10,
        func: 0,
        caller: 0x1010,
        stack_id: 1,
    };
    let k2 = Key {
        mm: 0x1100,
        tgid: 11,
        func: 0,
        caller: 0x2010,
        stack_id: 2,
    };
    let k3 = Key {
        mm: 0x1000,
        tgid: 10,
        func: 1,
        caller: 0x1050,
        stack_id: -14,
    };
    let mut snap = Snapshot::default();
    snap.sites.insert(k1, stats(10, 100));
    snap.sites.insert(k2, stats(5, 100));
    snap.sites.insert(k3, stats(7, 1000));
    snap.stacks.insert(1, vec![0xaaa0, 0x1f00, 0x1f80]);
    snap.stacks.insert(2, vec![0xbbb0, 0x2f00, 0x2f80]);
    snap.live = Some(HashMap::from([(k1, (1, 100)), (k3, (2, 2000))]));
    snap.events.frees = 14;
    snap.events.lost_stacks = 7;
    snap.events.nested = 1;
    // realloc's own call to malloc, from inside the probed library
    let inner = Key {
        mm: 0x1000,
        tgid: 10,
        func: 0,
        caller: 0x7550,
        stack_id: -14,
    };
    snap.sites.insert(inner, stats(4, 100));
    let frames = HashMap::from([
        ((0x1000, 0x1010), uf(0x1010, "do_malloc", 0x10)),
        ((0x1100, 0x2010), uf(0x2010, "do_malloc", 0x10)),
        ((0x1000, 0x1050), uf(0x1050, "do_calloc", 0x8)),
        ((0x1000, 0x1f00), uf(0x1f00, "main", 0x20)),
        ((0x1100, 0x2f00), uf(0x2f00, "main", 0x20)),
        ((0x1000, 0x1f80), uf(0x1f80, "__libc_start_call_main", 0x7a)),
        ((0x1100, 0x2f80), uf(0x2f80, "__libc_start_call_main", 0x7a)),
        (
            (0x1000, 0x7550),
            UserFrame {
                file: Some((1, 2)),
                file_offset: 0x550,
                ..uf(0x7550, "__libc_realloc", 0x50)
            },
        ),
    ]);
    (snap, frames)
}

pub fn opts() -> BuildOptions {
    BuildOptions {
        duration_s: 1.0,
        run: RunInfo::default(),
        probes: vec!["libc.so.6: malloc, calloc".into()],
        func_names: vec!["malloc".into(), "calloc".into()],
        allocator_code: vec![AllocatorCode {
            file: (1, 2),
            start: 0x500,
            end: 0x600,
        }],
        comms: HashMap::from([(10, "w10".to_string())]),
        cgroups: HashMap::new(),
    }
}

#[test]
fn processes_of_one_program_merge_by_symbol() {
    let (snap, frames) = sample();
    let r = build(&snap, &frames, opts());
    assert_eq!(r.totals.allocs, 22);
    assert_eq!(
        r.totals.nested_calls,
        1 + 4,
        "kernel-seen + from allocator code"
    );
    assert!(r.sites.iter().all(|s| s.function != "__libc_realloc"));
    assert_eq!(r.totals.bytes, 1500 + 7000);
    let m: Vec<&MallocRow> = r.sites.iter().filter(|s| s.allocator == "malloc").collect();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].function, "do_malloc");
    assert_eq!(m[0].location, "do_malloc+0x10");
    assert_eq!(m[0].counts.count, 15);
    let pids: Vec<u32> = m[0].processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![10, 11]);
    assert_eq!(m[0].processes[0].comm, "w10");
    assert_eq!(m[0].processes[1].comm, "", "never seen alive");
    assert_eq!(
        m[0].outstanding,
        Some(Outstanding {
            count: 1,
            bytes: 100
        })
    );
    let c = &r.sites[0];
    assert_eq!(
        (c.allocator.as_str(), c.function.as_str()),
        ("calloc", "do_calloc")
    );
    assert_eq!(c.counts.hist[0].lo, 512);
    assert_eq!(
        r.totals.outstanding,
        Some(Outstanding {
            count: 3,
            bytes: 2100
        })
    );
}

#[test]
fn stacks_start_at_the_direct_caller() {
    let (snap, frames) = sample();
    let r = build(&snap, &frames, opts());
    let s = r.stacks.iter().find(|s| s.allocator == "malloc").unwrap();
    assert_eq!(
        s.frames,
        vec!["do_malloc+0x10", "main+0x20", "__libc_start_call_main+0x7a"]
    );
    assert_eq!(s.counts.count, 15);
    let lost = r.stacks.iter().find(|s| s.allocator == "calloc").unwrap();
    assert_eq!(
        lost.frames,
        vec!["do_calloc+0x8"],
        "caller kept without a stack"
    );
    assert_eq!(r.lost.stacks, 7);
    assert_eq!(
        r.stack_depth,
        StackDepth {
            stacks: 2,
            shallow: 0,
            frame_pointer: UnwindDepth {
                stacks: 2,
                max_depth: 3,
                mean_depth: 3.0
            },
            ..Default::default()
        }
    );
}

/// The walk of do_calloc's key was lost; two sampled calls were
/// unwound, along two different stacks: the key's 7 calls are shared
/// out along them, and counted as unwound from .eh_frame.
#[test]
fn unwound_stacks_replace_shallow_walks() {
    let (mut snap, mut frames) = sample();
    let calloc = *snap.sites.keys().find(|k| k.func == 1).unwrap();
    frames.insert((0x1000, 0x1e00), uf(0x1e00, "parse", 0x9));
    frames.insert((0x1000, 0x1e40), uf(0x1e40, "load", 0x4));
    snap.unwound.insert(
        calloc,
        vec![
            UnwoundStack {
                frames: vec![0x1050, 0x1e00, 0x1f00],
                samples: 1,
                bytes: 1000,
            },
            UnwoundStack {
                frames: vec![0x1050, 0x1e40, 0x1f00],
                samples: 1,
                bytes: 1000,
            },
        ],
    );
    snap.unwind.sampled = 2;
    let r = build(&snap, &frames, opts());
    let rows: Vec<&MallocRow> = r
        .stacks
        .iter()
        .filter(|s| s.allocator == "calloc")
        .collect();
    assert_eq!(rows.len(), 2);
    let mut shown: Vec<(Vec<String>, u64)> = rows
        .iter()
        .map(|s| (s.frames.clone(), s.counts.count))
        .collect();
    shown.sort();
    assert_eq!(
        shown,
        vec![
            (
                vec![
                    "do_calloc+0x8".into(),
                    "load+0x4".into(),
                    "main+0x20".into()
                ],
                3
            ),
            (
                vec![
                    "do_calloc+0x8".into(),
                    "parse+0x9".into(),
                    "main+0x20".into()
                ],
                4
            ),
        ]
    );
    assert_eq!(rows.iter().map(|s| s.counts.bytes_req).sum::<u64>(), 7000);
    assert!(rows.iter().all(|s| s.estimated), "2 of 7 calls unwound");
    assert!(r.sites.iter().all(|s| !s.estimated));
    assert!(r
        .stacks
        .iter()
        .filter(|s| s.allocator != "calloc")
        .all(|s| !s.estimated));
    assert_eq!(
        r.sites
            .iter()
            .find(|s| s.allocator == "calloc")
            .unwrap()
            .counts
            .count,
        7,
        "sites are unchanged"
    );
    let d = &r.stack_depth;
    assert_eq!((d.stacks, d.unwind_samples), (4, 2));
    assert_eq!(
        d.dwarf,
        UnwindDepth {
            stacks: 2,
            max_depth: 3,
            mean_depth: 3.0
        }
    );
    assert_eq!(d.frame_pointer.stacks, 2);
}

#[test]
fn walks_into_data_are_cut() {
    let anon = |a| UserFrame {
        addr: a,
        ..Default::default()
    };
    let f = walked_frames(vec![anon(1), uf(2, "f", 0), anon(3), uf(4, "g", 0)]);
    assert_eq!(f.len(), 2, "the caller is kept even outside any file");
    assert_eq!(f[1].display(), "f+0x0");
}

#[test]
fn without_tracking_there_is_no_outstanding_field() {
    let (mut snap, frames) = sample();
    snap.live = None;
    let r = build(&snap, &frames, opts());
    assert!(r.sites.iter().all(|s| s.outstanding.is_none()));
    let v = serde_json::to_value(&r).unwrap();
    assert!(v["sites"][0].get("outstanding_count").is_none());
    assert!(v["totals"].get("outstanding_count").is_none());
    for k in [
        "count",
        "bytes_req",
        "avg_size",
        "hist",
        "allocator",
        "function",
        "processes",
    ] {
        assert!(v["sites"][0].get(k).is_some(), "missing {k}");
    }
    for k in ["bytes_alloc", "waste_bytes", "waste_pct", "pids"] {
        assert!(v["sites"][0].get(k).is_none(), "malloc has no {k}");
    }
    let back: MallocReport = serde_json::from_value(v).unwrap();
    assert_eq!(back.sites.len(), r.sites.len());
}

#[test]
fn json_uses_the_names_of_every_kind() {
    let (snap, frames) = sample();
    let r = build(&snap, &frames, opts());
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["totals"]["count"], 22);
    assert_eq!(v["totals"]["bytes_req"], 1500 + 7000);
    assert_eq!(v["totals"]["outstanding_count"], 3);
    assert_eq!(v["totals"]["outstanding_bytes"], 2100);
    let m = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["allocator"] == "malloc")
        .unwrap();
    assert_eq!(
        (&m["outstanding_count"], &m["outstanding_bytes"]),
        (&1.into(), &100.into())
    );
    assert_eq!(
        m["processes"][0],
        serde_json::json!({"pid": 10, "comm": "w10", "cgroup": null})
    );
    let back: MallocReport = serde_json::from_value(v).unwrap();
    assert_eq!(back.totals, r.totals);
    assert_eq!(back.sites[0].outstanding, r.sites[0].outstanding);
}
