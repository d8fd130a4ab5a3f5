use super::*;
use crate::cgroup::CgroupNames;
use crate::model::Owner;
use crate::report::fixtures::*;
use crate::report::meminfo::{Geometry, SourceOutstanding};
use crate::testing::assert_keys;

#[test]
fn accounting_leaves_out_what_meminfo_lines_do_not_count() {
    let row = |source, cache: &str, count, bytes, req, elsewhere| CacheRow {
        source,
        name: cache.to_string(),
        counted_elsewhere: elsewhere,
        retention: Some(Retention {
            outstanding_count: count,
            outstanding_bytes: bytes,
            outstanding_bytes_req: req,
            ..Default::default()
        }),
        ..Default::default()
    };
    let report = Report {
        caches: vec![
            // two vmalloc areas of 3 pages and a guard page each
            row(Source::Vmalloc, "vmalloc", 2, 8 * 4096, 8 * 4096, false),
            row(Source::Vmalloc, "vmap", 1, 5 * 4096, 5 * 4096, false),
            // 100 bytes on 2 CPUs, and 200 bytes of obj_cgroup pointers
            row(Source::Percpu, "percpu", 1, 400, 100, false),
            row(Source::Kmalloc, "kmalloc-64", 3, 192, 150, false),
            // the vmalloc areas' pages: vmalloc's, not the page source's
            row(Source::Page, "pages-order0-vmalloc", 6, 6 * 4096, 0, true),
            row(Source::Page, "pages-order0", 1, 4096, 4096, false),
        ],
        ..Default::default()
    };
    let by = report.outstanding_by_source(Geometry {
        page_size: 4096,
        possible_cpus: 2,
    });
    let held = |bytes, excluded| SourceOutstanding {
        bytes,
        excluded,
        ..Default::default()
    };
    assert_eq!(by[&Source::Vmalloc], held(13 * 4096, 7 * 4096));
    assert_eq!(by[&Source::Percpu], held(400, 200));
    assert_eq!(by[&Source::Kmalloc], held(192, 0));
    // The pages behind the vmalloc areas are apart: the page row adds
    // them back to compare every page with the free pages' drop.
    let page = SourceOutstanding {
        counted_elsewhere: 6 * 4096,
        ..held(4096, 0)
    };
    assert_eq!(by[&Source::Page], page);
}

#[test]
fn stack_rows_split_by_process_and_add_up_when_scaled() {
    let mut r = build(&owned_snapshot(), &fixture_symbols(), opts(10));
    let mut names = CgroupNames::new(None);
    names.insert(42, "/system.slice/msgd.service".into());
    r.name_cgroups(&mut names);
    let msg = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
    // Sampled 1 in 10: the stack is scaled to the site's 1000, and its
    // processes' shares with it, adding up exactly.
    assert_eq!(msg.counts.count, 1000);
    let p = &msg.processes;
    let got: Vec<_> = p
        .iter()
        .map(|p| (p.process.pid, p.count, p.bytes_alloc))
        .collect();
    assert_eq!(
        got,
        [
            (Some(7), 600, 600 * 4096),
            (Some(8), 300, 300 * 4096),
            (None, 100, 100 * 4096)
        ]
    );
    assert_eq!(
        p.iter().map(|p| p.bytes_req).sum::<u64>(),
        msg.counts.bytes_req
    );
    assert_eq!(p[0].process.comm.as_deref(), Some("msgd"));
    assert_eq!(
        p[0].process.cgroup.as_ref().unwrap().path.as_deref(),
        Some("/system.slice/msgd.service")
    );
    // Not walked for: the id, no path.
    assert_eq!(
        p[1].process.cgroup.as_ref().map(|c| (c.id, c.path.clone())),
        Some((43, None))
    );
    assert!(p[2].process.interrupt && p[2].process.comm.is_none() && p[2].process.cgroup.is_none());
    // Stacks without owners (as top's) have none in JSON either.
    let v = serde_json::to_value(&r).unwrap();
    let rows = v["stacks"].as_array().unwrap();
    let json_msg = rows.iter().find(|s| s["function"] == "load_msg").unwrap();
    #[rustfmt::skip]
        assert_keys(&json_msg["processes"][0], "stack processes", &[
            "pid", "comm", "cgroup", "interrupt", "count", "bytes_req", "bytes_alloc",
        ]);
    assert!(json_msg["processes"][0].get("outstanding_count").is_none());
    assert!(rows.iter().any(|s| s.get("processes").is_none()));
    let back: Report = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(serde_json::to_value(&back).unwrap(), v);
}

#[test]
fn leaks_stack_processes_hold_their_outstanding_share() {
    let mut snap = leak_snapshot(1);
    let (msg, _) = msg_and_kv();
    let owner = Owner::Process {
        tgid: 7,
        cgroup: 42,
    };
    snap.stack_owners
        .insert((msg, 1), HashMap::from([(owner, stats(100, 2148, 4096))]));
    let r = build(&snap, &fixture_symbols(), opts(10));
    let st = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
    let p = &st.processes;
    assert_eq!(p.len(), 1, "{p:?}");
    // 40 live objects with this stack, scaled to the site's 400, all
    // process 7's (its name read by leaks from /proc).
    assert_eq!(
        (p[0].process.pid, p[0].process.comm.as_deref(), p[0].count),
        (Some(7), Some("msgd"), 1000)
    );
    assert_eq!(
        (p[0].outstanding_count, p[0].outstanding_bytes),
        (Some(400), Some(400 * 4096))
    );
    let ret = st.retention.as_ref().unwrap();
    assert_eq!(ret.outstanding_count, 400);
}

#[test]
fn leaks_rows_carry_outstanding_ages_and_transient_volume() {
    let r = build(&leak_snapshot(1), &fixture_symbols(), opts(10));
    assert_eq!(r.sites[0].function, "load_msg", "largest outstanding first");
    let msg = r.sites[0].retention.as_ref().unwrap();
    assert_eq!(
        (msg.outstanding_count, msg.outstanding_bytes),
        (400, 400 * 4096)
    );
    assert_eq!(msg.outstanding_bytes_req, 400 * 2148);
    assert_eq!((msg.freed_count, msg.freed_bytes), (600, 600 * 4096));
    assert_eq!(msg.oldest_s, 1.5);
    // All 400 allocated 1.5 s before the end of a 2 s run: one step of
    // 400 pages at 0.5 s, whose least-squares slope over [0, T - h] (h =
    // 256 ms, the power of two of ms at or below T/4) is
    // 6·b·(T - a)·(a - h)/(T - h)³ = 6 × 1,638,400 × 0.5 × 1.244 / 1.744³
    // = 1,152,715.50 B/s (Retained::growth_bytes_per_s).
    assert_eq!(msg.growth_bytes_per_s, 1_152_715.5);
    assert_eq!(msg.ages.len(), 1);
    assert_eq!((msg.ages[0].lo_s, msg.ages[0].count), (1.024, 400));
    let kv = r.sites[1].retention.as_ref().unwrap();
    assert_eq!(
        (kv.outstanding_count, kv.freed_unseen, kv.freed_count),
        (20, 5, 275)
    );

    // 40 of the 400 live load_msg objects had a stack: scaled to 400.
    let st = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
    let ret = st.retention.as_ref().unwrap();
    assert_eq!(ret.outstanding_count, 400);
    assert_eq!(ret.freed_count, 1000 - 400);

    let c = r.caches[0].retention.as_ref().unwrap();
    assert_eq!(c.outstanding_count, 420);
    let l = r.leaks.as_ref().unwrap();
    assert_eq!(l.retention.outstanding_count, 420);
    assert_eq!(l.frees_untracked, 123);
    assert_eq!(r.totals.frees, 123 + 600 + 275, "untracked + tracked frees");
    let per_program: u64 = l.recursion_misses_by_program.iter().map(|p| p.misses).sum();
    assert_eq!((r.lost.recursion_misses, per_program), (3, 3));
    assert!(!l.estimated);
    let v = serde_json::to_value(&r).unwrap();
    #[rustfmt::skip]
        let keys = ["outstanding_count", "outstanding_bytes", "ages", "count", "bytes_alloc"];
    for rows in ["sites", "stacks", "caches"] {
        assert_keys(&v[rows][0], rows, &keys);
    }
    let back: Report = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(serde_json::to_value(&back).unwrap(), v);
}

#[test]
fn sampled_stacks_take_their_ages_from_their_site() {
    // The user's case: the site holds objects up to 30 s old, doubling;
    // the few with a sampled stack are all 4-8 s old.
    let mut snap = leak_snapshot(1);
    let leaks = snap.leaks.as_mut().unwrap();
    for (i, o) in leaks.live.iter_mut().take(400).enumerate() {
        o.age_ns = if i < 40 {
            5_000_000_000 + i as u64 * 60_000_000
        } else if i < 200 {
            30_000_000_000
        } else {
            10_000_000_000
        };
    }
    let over_a_minute = BuildOptions {
        duration_s: 60.0,
        ..opts(10)
    };
    let r = build(&snap, &fixture_symbols(), over_a_minute);
    let site = r.sites[0].retention.as_ref().unwrap();
    assert_eq!(r.sites[0].function, "load_msg");
    assert_eq!(site.oldest_s, 30.0);
    let st = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
    let ret = st.retention.as_ref().unwrap();
    assert!(st.estimated);
    // The one stack of the site: its ages are the site's, not its 40
    // samples' (all in [4.1 s, 8.2 s), oldest 7.34 s) scaled by ten.
    assert_eq!(ret.outstanding_count, 400);
    assert_eq!(ret.oldest_s, 30.0);
    assert_eq!(ret.ages, site.ages);
    let counts: Vec<(f64, u64)> = ret.ages.iter().map(|b| (b.lo_s, b.count)).collect();
    assert_eq!(counts, [(4.096, 40), (8.192, 200), (16.384, 160)]);
}

#[test]
fn leaks_cgroup_rows_hold_what_each_cgroup_allocated_and_name_processes() {
    let mut r = build(&leak_snapshot(1), &fixture_symbols(), opts(10));
    let mut names = CgroupNames::new(None);
    names.insert(42, "/system.slice/msgd.service".into());
    r.name_cgroups(&mut names);
    let svc = r.cgroups.iter().find(|c| !c.interrupt).unwrap();
    assert_eq!(
        svc.cgroup.as_ref().unwrap().path.as_deref(),
        Some("/system.slice/msgd.service")
    );
    let ret = svc.retention.as_ref().unwrap();
    assert_eq!((ret.outstanding_count, ret.freed_count), (400, 600));
    assert_eq!(ret.outstanding_bytes, 400 * 4096);
    let split = svc.outstanding_accounting.unwrap();
    assert_eq!(split.outstanding_accounted_count, 400);
    assert_eq!(split.outstanding_accounted_bytes, 400 * 4096);
    assert_eq!(split.outstanding_unaccounted_count, 0);
    assert_eq!(svc.accounting.accounted_count, 1000);

    let irq = r.cgroups.iter().find(|c| c.interrupt).unwrap();
    assert!(irq.cgroup.is_none());
    let ret = irq.retention.as_ref().unwrap();
    assert_eq!((ret.outstanding_count, ret.freed_count), (20, 280));
    let split = irq.outstanding_accounting.unwrap();
    assert_eq!(split.outstanding_unaccounted_bytes, 20 * 4096);
    assert_eq!(split.outstanding_accounted_count, 0);

    // Process 7's newest object is an interrupt one (no cgroup): its
    // cgroup is that of its newest object that has one.
    let p = &r.leaks.as_ref().unwrap().processes[0];
    assert_eq!(
        p.process
            .cgroup
            .as_ref()
            .and_then(|c| c.container.as_ref())
            .map(|c| c.name.as_str()),
        Some("msgd.service")
    );
    let v = serde_json::to_value(&r).unwrap();
    let keys = [
        "outstanding_count",
        "outstanding_accounted_bytes",
        "accounted_bytes",
    ];
    assert_keys(&v["cgroups"][0], "cgroups", &keys);
    // Ids are carried by the named cgroups in JSON.
    let back: Report = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(serde_json::to_value(&back).unwrap(), v);
}

#[test]
fn address_sampling_scales_everything_and_says_so() {
    let r = build(&leak_snapshot(4), &fixture_symbols(), opts(10));
    let l = r.leaks.as_ref().unwrap();
    assert!(l.estimated);
    assert_eq!(l.retention.outstanding_count, 4 * 420);
    assert_eq!(l.frees_untracked, 4 * 123);
    let msg = r.sites[0].retention.as_ref().unwrap();
    assert_eq!(msg.outstanding_count, 1600);
    assert_eq!(msg.freed_count, 2400);
    assert_eq!(r.sites[0].counts.count, 4000);
}

#[test]
fn min_age_leaves_young_objects_out() {
    let mut snap = leak_snapshot(1);
    snap.leaks.as_mut().unwrap().min_age_ns = 1_000_000_000;
    let r = build(&snap, &fixture_symbols(), opts(10));
    assert_eq!(r.leaks.as_ref().unwrap().retention.outstanding_count, 400);
    assert_eq!(r.leaks.as_ref().unwrap().min_age_s, 1.0);
}

#[test]
fn record_reports_have_no_retention() {
    let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
    assert!(r.leaks.is_none() && r.sites.iter().all(|s| s.retention.is_none()));
    let v = serde_json::to_value(&r).unwrap();
    assert!(v.get("leaks").is_none());
    assert!(v["sites"][0].get("outstanding_count").is_none());
}

fn opts(every: u32) -> BuildOptions {
    BuildOptions {
        stack_sample_every: every,
        duration_s: 2.0,
        run: RunInfo::default(),
    }
}

#[test]
fn dropped_events_make_the_report_say_what_is_incomplete() {
    let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
    assert!(r.sampling.sites_exact && r.sampling.processes_exact);
    assert!(r.sampling.incomplete.is_empty());
    assert!(!crate::render::header(&r).contains("INCOMPLETE"));

    let mut snap = sample_snapshot();
    snap.events.map_full_sites = 1249;
    snap.events.map_full_procs = 3;
    let r = build(&snap, &fixture_symbols(), opts(10));
    assert!(!r.sampling.sites_exact);
    assert!(!r.sampling.processes_exact);
    assert_eq!(
        r.sampling.incomplete.len(),
        2,
        "{:?}",
        r.sampling.incomplete
    );
    assert!(r.sampling.incomplete[0].starts_with("1249 allocations not counted"));
    let h = crate::render::header(&r);
    assert!(h.starts_with("INCOMPLETE: 1249 allocations"), "{h}");
    assert!(h.contains("are NOT exact"), "{h}");
    assert!(!h.contains("are exact"), "{h}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["sampling"]["sites_exact"], false);
    assert_eq!(json["sampling"]["incomplete"].as_array().unwrap().len(), 2);
}

#[test]
fn sites_are_exact_and_labelled_by_caller() {
    let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
    assert_eq!(r.totals.allocs, 1300);
    assert_eq!(r.totals.bytes_alloc, 1300 * 4096);
    assert_eq!(r.sites[0].function, "load_msg");
    assert_eq!(r.sites[0].location, "load_msg+0x10");
    assert_eq!(r.sites[0].counts.count, 1000);
    assert_eq!(r.sites[0].counts.waste_bytes, 1000 * (4096 - 2148));
    assert_eq!(r.sites[0].caches, vec!["kmalloc-cg-4k"]);
    // The kvmalloc call site is named after its heaviest caller.
    assert_eq!(r.sites[1].function, "simple_xattr_alloc");
    assert_eq!(r.sites[1].call_site, "__kvmalloc_node_noprof+0x10");
    assert_eq!(r.lost.stacks, 2);
}

#[test]
fn sampled_stacks_scale_to_site_totals() {
    let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
    assert!(r.sampling.stacks_estimated);
    let kv: Vec<&StackRow> = r
        .stacks
        .iter()
        .filter(|s| s.cache == "kmalloc-cg-4k")
        .collect();
    assert_eq!(kv.len(), 3);
    let msg = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
    assert_eq!(msg.counts.count, 1000);
    assert!(msg.estimated);
    assert_eq!(
        msg.frames[0], "__kmalloc_noprof+0x10",
        "tracing frames dropped"
    );
    let xattr = r
        .stacks
        .iter()
        .find(|s| s.function == "simple_xattr_alloc")
        .unwrap();
    let copy = r
        .stacks
        .iter()
        .find(|s| s.function == "setxattr_copy")
        .unwrap();
    assert_eq!(xattr.counts.count + copy.counts.count, 300);
    assert_eq!(xattr.counts.count, 200);
}

#[test]
fn exact_mode_does_not_scale() {
    let r = build(&sample_snapshot(), &fixture_symbols(), opts(1));
    let msg = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
    assert_eq!(msg.counts.count, 100);
    assert!(!msg.estimated);
}

#[test]
fn caches_fold_sites_and_frees() {
    let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
    assert_eq!(r.caches.len(), 1);
    assert_eq!(r.caches[0].name, "kmalloc-cg-4k");
    assert_eq!(r.caches[0].counts.count, 1300);
    assert_eq!(r.caches[0].frees, 700);
}

#[test]
fn json_has_the_documented_fields() {
    let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
    let v = serde_json::to_value(&r).unwrap();
    #[rustfmt::skip]
        assert_keys(&v, "the report", &[
            "duration_s", "totals", "lost", "sampling", "sites", "stacks", "caches",
        ]);
    let totals = ["count", "frees", "bytes_req", "bytes_alloc", "waste_bytes"];
    assert_keys(&v["totals"], "totals", &totals);
    assert!(v["lost"]["stacks"].is_u64() && v["lost"]["map_full"].is_u64());
    let site = &v["sites"][0];
    let counts = ["count", "bytes_req", "bytes_alloc"];
    assert_keys(site, "sites[]", &["function", "hist"]);
    assert_keys(site, "sites[]", &counts);
    assert_eq!(site["hist"][0]["lo"], 2048);
    assert_eq!(site["hist"][0]["hi"], 4096);
    assert_eq!(site["hist"][0]["count"], 1000);
    let stack = &v["stacks"][0];
    assert_keys(stack, "stacks[]", &["frames", "estimated", "hist"]);
    assert_keys(stack, "stacks[]", &counts);
    assert_keys(&v["caches"][0], "caches[]", &["name"]);
    assert_keys(&v["caches"][0], "caches[]", &counts);
    let back: Report = serde_json::from_value(v).unwrap();
    assert_eq!(back.sites[0].counts.count, 1000);
}
