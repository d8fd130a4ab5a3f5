use super::*;
use crate::model::KmallocSlab;
use crate::testing::{assert_contains, kmalloc};

fn no_sizes(_: &str) -> Option<u64> {
    None
}

/// A run of `duration_s` over `sites`, without the caches' object sizes.
fn run(duration_s: f64, sites: &[TracedSite]) -> Run<'_> {
    Run::new(duration_s, sites, &no_sizes)
}

/// A bucket cache of `size`-byte objects, e.g. msg_msg-2k.
fn bucket(name: &str, size: u64) -> CacheId {
    CacheId::Kmalloc {
        size,
        accounted: false,
        slab: KmallocSlab::Cache(name.into()),
    }
}

/// `count` requests of `size` bytes each, served from `obj`-byte objects,
/// at `function`'s call site `function+0x10`.
fn uniform(function: &str, cache: CacheId, obj: u64, size: u64, count: u64) -> TracedSite {
    let mut hist = Hist::default();
    hist.0[Hist::bucket_of(size)] = count;
    TracedSite {
        function: function.into(),
        call_site: format!("{function}+0x10"),
        cache,
        stats: AllocStats {
            count,
            bytes_req: size * count,
            bytes_alloc: obj * count,
            hist,
        },
        held: None,
    }
}

#[test]
fn objects_that_do_not_stay_save_nothing() {
    let site = uniform("load_msg", kmalloc(4096), 4096, 2100, 1_000_000);
    let mut cache = TracedCache::new(kmalloc(4096));
    cache.allocs = 1_000_000;
    // Churned: the cache's active objects do not move.
    let flat = CacheSeries {
        cache: "kmalloc-4k".into(),
        object_size: 4096,
        points: vec![(0.0, 900), (1.5, 905), (3.0, 900)],
    };
    let held = held_by_site(&site, &[cache.clone()], &[flat]).unwrap();
    assert!(
        held.avg_objects < 2.0 && held.peak_objects == 5.0,
        "{held:?}"
    );
    let h = boundary_hint(&run(3.0, std::slice::from_ref(&site)), &site, Some(held)).unwrap();
    assert_eq!(h.saving_bytes, 0);
    assert_contains(&h.text, &["1.9K less per object held", "too few to claim"]);
    assert!(!h.text.contains("saved"), "{}", h.text);
    // Half the cache's allocations, and the cache held 2000 more
    // objects at the end: 500 on average, 1000 at peak are the site's.
    let mut half = site.clone();
    half.stats.count = 500_000;
    let rising = CacheSeries {
        cache: "kmalloc-4k".into(),
        object_size: 4096,
        points: vec![(0.0, 900), (1.0, 900), (2.0, 900), (3.0, 2900)],
    };
    let held = held_by_site(&half, &[cache], &[rising]).unwrap();
    assert_eq!((held.avg_objects, held.peak_objects), (250.0, 1000.0));
}

#[test]
fn requests_just_above_2k_get_a_right_sizing_hint() {
    let site = uniform("nvme_setup_cmd", kmalloc(4096), 4096, 2100, 10_000);
    // 100 of its objects live on average, 150 at peak.
    let held = Held {
        avg_objects: 100.0,
        peak_objects: 150.0,
    };
    let h =
        boundary_hint(&run(10.0, std::slice::from_ref(&site)), &site, Some(held)).expect("hint");
    assert_eq!(h.kind, HintKind::Boundary);
    assert_eq!(h.cache, "kmalloc-4k");
    assert_eq!(h.site.as_deref(), Some("nvme_setup_cmd"));
    // Live objects x (4096 - 2104): a 2104-byte (2100 aligned to 8)
    // cache; not the 10000 allocations churned.
    assert_eq!(h.saving_bytes, 100 * (4096 - 2104));
    assert!(
        h.text
            .contains("195K less memory held on average (292K at peak"),
        "{}",
        h.text
    );
    assert!(h.text.contains("wastes 49%"), "{}", h.text);
    assert!(h.text.contains("2104-byte"), "{}", h.text);
    assert!(h.text.contains("kmalloc-2k"), "{}", h.text);
}

#[test]
fn no_boundary_hint_when_requests_fit_well_or_are_few() {
    // 4000 bytes in kmalloc-4k: barely any waste.
    let none = |site: TracedSite| boundary_hint(&run(1.0, &[]), &site, None).is_none();
    assert!(none(uniform("f", kmalloc(4096), 4096, 4000, 10_000)));
    // 3000 bytes: 46% into the gap, not "just above".
    assert!(none(uniform("f", kmalloc(4096), 4096, 3000, 10_000)));
    // Too few to matter.
    assert!(none(uniform("f", kmalloc(4096), 4096, 2100, 10)));
    // Named caches are already dedicated, and so are bucket caches.
    assert!(none(uniform(
        "f",
        CacheId::Named("x".into()),
        4096,
        2100,
        10_000
    )));
    assert!(none(uniform(
        "f",
        bucket("msg_msg-4k", 4096),
        4096,
        2100,
        10_000
    )));
}

#[test]
fn spread_out_sizes_are_not_a_cluster() {
    let mut site = uniform("f", kmalloc(4096), 4096, 2100, 10_000);
    // Half the requests far from the boundary, same mean-ish bucket spread.
    site.stats.hist = Hist::default();
    site.stats.hist.0[Hist::bucket_of(2100)] = 5_000;
    site.stats.hist.0[Hist::bucket_of(500)] = 5_000;
    assert!(boundary_hint(&run(1.0, std::slice::from_ref(&site)), &site, None).is_none());
}

#[test]
fn bimodal_sizes_padded_into_one_cache() {
    // A dedicated 2048-byte cache serving 64-byte and 2000-byte requests.
    let mut hist = Hist::default();
    hist.0[Hist::bucket_of(64)] = 600; // [64, 128)
    hist.0[Hist::bucket_of(2000)] = 400; // [1024, 2048)
    let site = TracedSite {
        function: "mixed_alloc".into(),
        call_site: "mixed_alloc+0x10".into(),
        cache: CacheId::Named("mixed_cache".into()),
        stats: AllocStats {
            count: 1000,
            bytes_req: 600 * 64 + 400 * 2000,
            bytes_alloc: 1000 * 2048,
            hist,
        },
        held: None,
    };
    let sizes = |n: &str| (n == "mixed_cache").then_some(2048);
    let hints = bimodal_hints(&Run::new(1.0, std::slice::from_ref(&site), &sizes));
    assert_eq!(hints.len(), 1);
    let h = &hints[0];
    assert_eq!(h.kind, HintKind::Bimodal);
    assert_eq!(h.cache, "mixed_cache");
    assert_eq!(h.saving_bytes, 600 * (2048 - 128));
    assert!(
        h.text.contains("60% in 64-127 B and 40% in 1024-2047 B"),
        "{}",
        h.text
    );
}

#[test]
fn bimodal_across_kmalloc_caches_has_no_padding_saving() {
    let sites = [
        uniform("split", kmalloc(128), 128, 100, 500),
        uniform("split", kmalloc(4096), 4096, 3000, 500),
    ];
    let hints = bimodal_hints(&run(1.0, &sites));
    assert_eq!(hints.len(), 1);
    assert_eq!(hints[0].saving_bytes, 0);
    assert!(hints[0].text.contains("different caches"));
    // Adjacent buckets are one spread-out mode, not two.
    let near = [
        uniform("near", kmalloc(128), 128, 100, 500),
        uniform("near", kmalloc(192), 192, 130, 500),
    ];
    assert!(bimodal_hints(&run(1.0, &near)).is_empty());
}

#[test]
fn many_small_fast_allocations_suggest_pooling() {
    // 50k/s of 50-byte requests in kmalloc-64.
    let site = uniform("skb_ext_add", kmalloc(64), 64, 50, 500_000);
    let held = Held {
        avg_objects: 10_000.0,
        peak_objects: 20_000.0,
    };
    let h = pooling_hint(&run(10.0, &[]), &site, Some(held), false).expect("hint");
    assert_eq!(h.kind, HintKind::Pooling);
    assert_eq!(h.saving_bytes, 10_000 * (64 - 56));
    assert!(
        h.text.contains("78.1K less memory held on average"),
        "{}",
        h.text
    );
    // A few hundred bytes held are not worth a word.
    let few = Held {
        avg_objects: 10.0,
        peak_objects: 20.0,
    };
    let h = pooling_hint(&run(10.0, &[]), &site, Some(few), false).unwrap();
    assert_eq!(h.saving_bytes, 0);
    assert!(!h.text.contains("less memory"), "{}", h.text);
    assert!(h.text.contains("50.0k/s"), "{}", h.text);
    // Without samples of the cache, no saving is claimed.
    assert_eq!(
        pooling_hint(&run(10.0, &[]), &site, None, false)
            .unwrap()
            .saving_bytes,
        0
    );
    // Same volume spread over 100 s is 5k/s: no hint.
    assert!(pooling_hint(&run(100.0, &[]), &site, None, false).is_none());
    // Unknown duration: no rate, no hint.
    assert!(pooling_hint(&run(0.0, &[]), &site, None, false).is_none());
}

#[test]
fn large_allocations_in_a_hot_path() {
    let site = uniform("big_buf", kmalloc(8192), 8192, 6000, 20_000);
    let held = Held {
        avg_objects: 10.0,
        peak_objects: 20.0,
    };
    let h = large_hot_hint(&run(10.0, &[]), &site, Some(held), false).expect("hint");
    assert_eq!(h.kind, HintKind::LargeHot);
    assert_eq!(h.saving_bytes, 10 * (8192 - 6000));
    assert!(large_hot_hint(
        &run(10.0, &[]),
        &uniform("s", kmalloc(64), 64, 40, 20_000),
        None,
        false
    )
    .is_none());
}

#[test]
fn steady_growth_across_samples() {
    let series = CacheSeries {
        cache: "dentry".into(),
        object_size: 192,
        points: vec![(0.0, 10_000), (1.0, 15_000), (2.0, 15_000), (3.0, 20_000)],
    };
    let h = series_growth_hint(&series).expect("hint");
    assert_eq!(h.kind, HintKind::Growth);
    assert_eq!(h.saving_bytes, 10_000 * 192);
    assert!(h.text.contains("every one of 3 intervals"), "{}", h.text);

    let mut dipped = series.clone();
    dipped.points[2].1 = 14_000;
    assert!(series_growth_hint(&dipped).is_none(), "a dip is not steady");
    let mut short = series.clone();
    short.points.truncate(2);
    assert!(series_growth_hint(&short).is_none());
}

#[test]
fn traced_net_growth() {
    let mut c = TracedCache::new(kmalloc(1024));
    c.allocs = 10_000;
    c.frees = 8_000;
    c.bytes_alloc = 10_000 * 1024;
    let h = traced_growth_hint(&c, 5.0).expect("hint");
    assert_eq!(h.saving_bytes, 2_000 * 1024);
    assert_eq!(h.cache, "kmalloc-1k");
    c.frees = 9_500;
    assert!(
        traced_growth_hint(&c, 5.0).is_none(),
        "512K is below the threshold"
    );
}

#[test]
fn all_hints_sorted_by_saving_and_series_wins_over_traced_growth() {
    let sites = [
        uniform("nvme_setup_cmd", kmalloc(4096), 4096, 2100, 10_000),
        uniform("skb_ext_add", kmalloc(64), 64, 40, 500_000),
    ];
    let mut c = TracedCache::new(CacheId::Named("dentry".into()));
    c.allocs = 100_000;
    c.bytes_alloc = 100_000 * 192;
    // Grows by `step` objects a second: `step` held on average.
    let growing = |cache: &str, size, step: u64| CacheSeries {
        cache: cache.into(),
        object_size: size,
        points: vec![(0.0, 7), (1.0, 7 + step), (2.0, 7 + 2 * step)],
    };
    let series = [
        CacheSeries {
            cache: "dentry".into(),
            object_size: 192,
            points: vec![(0.0, 0), (1.0, 50_000), (2.0, 100_000)],
        },
        growing("kmalloc-4k", 4096, 100),
        growing("kmalloc-64", 64, 5000),
    ];
    let traced = |size, allocs| {
        let mut t = TracedCache::new(kmalloc(size));
        t.allocs = allocs;
        t
    };
    let caches = [c, traced(4096, 10_000), traced(64, 500_000)];
    let hints = all_hints(10.0, &sites, &caches, &series, &no_sizes);
    let kinds: Vec<HintKind> = hints.iter().map(|h| h.kind).collect();
    // Savings are memory held: the dentry growth (19.2M) beats the
    // rounding of 100 live 4k objects. 40 bytes into kmalloc-64 is also
    // just above kmalloc-32: the boundary hint takes the saving, the
    // pooling hint keeps 0.
    assert_eq!(
        kinds,
        vec![
            HintKind::Growth,
            HintKind::Boundary,
            HintKind::Boundary,
            HintKind::Pooling
        ]
    );
    assert_eq!(hints[1].saving_bytes, 100 * (4096 - 2104));
    assert_eq!(hints[2].saving_bytes, 5000 * (64 - 40));
    assert_eq!(hints[3].saving_bytes, 0);
    assert!(hints
        .windows(2)
        .all(|w| w[0].saving_bytes >= w[1].saving_bytes));
    assert!(hints[0].text.contains("every one of 2 intervals"));
}

#[test]
fn two_call_sites_of_one_function_are_two_buffers() {
    // Issue 46: two calls in do_epoll_ctl, one asking 100 bytes, one 3000,
    // were merged into "one buffer with two sizes".
    let mut small = uniform("do_epoll_ctl", kmalloc(128), 128, 100, 500);
    small.call_site = "do_epoll_ctl+0x1a3".into();
    let mut large = uniform("do_epoll_ctl", kmalloc(4096), 4096, 3000, 500);
    large.call_site = "do_epoll_ctl+0x2b7".into();
    let sites = [small.clone(), large];
    assert_eq!(bimodal_hints(&run(1.0, &sites)), vec![]);
    // One call site that asks for both sizes is one buffer with two.
    let mut same = small.clone();
    same.cache = kmalloc(4096);
    same.stats = uniform("do_epoll_ctl", kmalloc(4096), 4096, 3000, 500).stats;
    let one = [small, same];
    let hints = bimodal_hints(&run(1.0, &one));
    assert_eq!(hints.len(), 1, "{hints:#?}");
    let h = &hints[0];
    assert_eq!(h.call_site.as_deref(), Some("do_epoll_ctl+0x1a3"));
    assert_eq!(h.site.as_deref(), Some("do_epoll_ctl"));
    assert!(
        h.text
            .starts_with("do_epoll_ctl+0x1a3 requests two distinct sizes"),
        "{}",
        h.text
    );
    let ev = h.evidence.as_ref().unwrap();
    assert_eq!((ev.sizes, ev.sized_by), (Sizes::Varying, SizedBy::Caller));
    assert_eq!((ev.size_lo, ev.size_hi, ev.count), (64, 4095, 1000));
}

/// The bucket cache: 1048-byte requests in msg_msg-2k, 49% of each
/// object lost, 1.5M allocations a second.
fn msg_site(count: u64) -> TracedSite {
    let mut s = uniform("load_msg", bucket("msg_msg-2k", 2048), 2048, 1048, count);
    s.call_site = "load_msg+0x41".into();
    s
}

#[test]
fn a_bucket_cache_losing_half_of_each_object_gets_a_hint() {
    let site = msg_site(15_000_000);
    let sites = [site.clone()];
    // The family's smaller classes, as /proc/slabinfo lists them (no
    // msg_msg-96 or -192 on this kernel).
    let sizes = |n: &str| match n {
        "msg_msg-1k" => Some(1024),
        "msg_msg-64" => Some(64),
        _ => None,
    };
    let r = Run::new(10.0, &sites, &sizes);
    // No dedicated cache to propose: the bucket cache is already its own.
    assert_eq!(boundary_hint(&r, &site, None), None);
    let held = Held {
        avg_objects: 100.0,
        peak_objects: 200.0,
    };
    let h = rounding_hint(&r, &site, Some(held)).expect("a hint for the bucket cache");
    assert_eq!(h.kind, HintKind::Rounding);
    assert_eq!(h.cache, "msg_msg-2k");
    assert_eq!(h.call_site.as_deref(), Some("load_msg+0x41"));
    // The rounding of the objects held: 100 x (2048 - 1048).
    assert_eq!(h.saving_bytes, 100 * 1000);
    let ev = h.evidence.clone().unwrap();
    assert_eq!(
        ev,
        Evidence {
            cache_kind: CacheKind::Bucket,
            sizes: Sizes::OneRange,
            size_lo: 1024,
            size_hi: 2047,
            sized_by: SizedBy::Caller,
            count: 15_000_000,
            alloc_rate: 1_500_000.0,
            waste_bytes: 15_000_000 * 1000,
            waste_pct: 1000.0 * 100.0 / 2048.0,
        }
    );
    assert_contains(
        &h.text,
        &[
            "load_msg+0x41 loses 49% of each object to rounding in msg_msg-2k: 15.0M requests of \
             ~1048 B in 2048-byte objects over the 10.0 s run, 1.5M/s;",
            "the caller sets the size: msg_msg-2k is a bucket cache (kmem_buckets",
            "whose size user space controls",
            "though every request of this run fell in 1024-2047 B",
            "Whoever chooses the sizes can fit the class: a 2048-byte object costs the same for \
             any request up to 2048 B, and requests of at most 1024 B would take msg_msg-1k's \
             1024-byte objects;",
            "sizes that fit would mean 97.7K less memory held on average (195K at peak",
        ],
    );
    assert!(!h.text.contains("dedicated"), "{}", h.text);
    // A bucket whose next class down is missing names the one that exists.
    let small = uniform("load_msg", bucket("msg_msg-128", 128), 128, 70, 500_000);
    let h = rounding_hint(&r, &small, None).unwrap();
    assert_contains(
        &h.text,
        &["requests of at most 64 B would take msg_msg-64's 64-byte objects"],
    );
    // Without the static read, the class is not named.
    let h = rounding_hint(&run(10.0, &sites), &site, None).unwrap();
    assert_contains(
        &h.text,
        &[
            "requests of at most 1024 B would take 1024-byte objects;",
            "1000 less per object held",
        ],
    );
    assert_eq!(h.saving_bytes, 0);
}

#[test]
fn rounding_hints_need_a_caller_set_size_waste_and_rate() {
    let site = msg_site(15_000);
    let sites = [site.clone()];
    // 1.5k/s: enough.
    assert!(rounding_hint(&run(10.0, &sites), &site, None).is_some());
    // 150/s, and nothing held: not worth a word.
    assert!(rounding_hint(&run(100.0, &sites), &site, None).is_none());
    // ...unless the objects held make the rounding matter.
    let held = Held {
        avg_objects: 100.0,
        peak_objects: 100.0,
    };
    let h = rounding_hint(&run(100.0, &sites), &site, Some(held)).unwrap();
    assert_eq!(h.saving_bytes, 100 * 1000);
    // A run under a second says how long it was beside its rate.
    let h = rounding_hint(&run(0.08, &sites), &site, None).unwrap();
    assert_contains(&h.text, &["over the 0.08 s run, 187.5k/s;"]);
    // Too few, or too little lost (1900 of 2048 bytes used: 7%).
    assert!(rounding_hint(&run(0.01, &sites), &msg_site(99), None).is_none());
    let full = uniform("load_msg", bucket("msg_msg-2k", 2048), 2048, 1900, 15_000);
    assert!(rounding_hint(&run(10.0, &[]), &full, None).is_none());
    // One size in a shared size class, not just above the class below: the
    // code sets it, and a dedicated cache is a boundary hint's business.
    let fixed = uniform("f", kmalloc(2048), 2048, 1048, 15_000);
    assert!(rounding_hint(&run(10.0, &[]), &fixed, None).is_none());
    // Dedicated caches and pages: no size class to fit.
    let named = uniform("f", CacheId::Named("x".into()), 2048, 1048, 15_000);
    assert!(rounding_hint(&run(10.0, &[]), &named, None).is_none());
}

#[test]
fn sizes_that_vary_in_a_shared_class_are_set_by_the_caller() {
    // One call site: 15k requests of ~1048 B in kmalloc-2k, 15k of 600 B
    // in kmalloc-1k.
    let mut big = uniform("vfs_write_buf", kmalloc(2048), 2048, 1048, 15_000);
    let mut small = uniform("vfs_write_buf", kmalloc(1024), 1024, 600, 15_000);
    big.call_site = "vfs_write_buf+0x30".into();
    small.call_site = big.call_site.clone();
    let sites = [big.clone(), small];
    let h = rounding_hint(&run(10.0, &sites), &big, None).unwrap();
    let ev = h.evidence.as_ref().unwrap();
    assert_eq!(
        (ev.cache_kind, ev.sizes, ev.sized_by, ev.size_lo, ev.size_hi),
        (
            CacheKind::SizeClass,
            Sizes::Varying,
            SizedBy::Caller,
            512,
            2047
        )
    );
    assert_contains(
        &h.text,
        &[
            "the caller sets the size at run time: this call site's requests vary (512-2047 B)",
            "would take kmalloc-1k's 1024-byte objects (a dedicated cache fits no one size when \
             sizes vary)",
        ],
    );
    // Two size classes within one power-of-two range still vary: 80 B in
    // kmalloc-96, 120 B in kmalloc-128.
    let mut a = uniform("g", kmalloc(96), 96, 80, 500);
    let b = uniform("g", kmalloc(128), 128, 120, 500);
    a.call_site = b.call_site.clone();
    let ev = Evidence::of_site(&a, &[a.clone(), b], 1.0);
    assert_eq!(
        (ev.sizes, ev.size_lo, ev.size_hi),
        (Sizes::Varying, 64, 127)
    );
    // Alone, it is one range: the code's fixed size, as far as kheap sees.
    let alone = Evidence::of_site(&a, std::slice::from_ref(&a), 1.0);
    assert_eq!(
        (alone.sizes, alone.sized_by),
        (Sizes::OneRange, SizedBy::Code)
    );
    assert_contains(
        &alone.who_sets_the_size("kmalloc-96"),
        &["the kernel code sets the size, as far as this run shows: every request fell in 64-127 B"],
    );
}

#[test]
fn a_boundary_hint_says_who_sets_the_size() {
    let site = uniform("nvme_setup_cmd", kmalloc(4096), 4096, 2100, 10_000);
    let h = boundary_hint(&run(10.0, std::slice::from_ref(&site)), &site, None).unwrap();
    assert_eq!(h.call_site.as_deref(), Some("nvme_setup_cmd+0x10"));
    assert_contains(
        &h.text,
        &[
            "nvme_setup_cmd+0x10 requests ~2100 B",
            "the kernel code sets the size, as far as this run shows: every request fell in \
             2048-4095 B",
            "The code that sets it could trim it to at most 2048 B to fit kmalloc-2k, or give it \
             a dedicated 2104-byte cache",
        ],
    );
    // The accounted copy's class below is the accounted one.
    let cg = CacheId::Kmalloc {
        size: 4096,
        accounted: true,
        slab: KmallocSlab::Cache("kmalloc-cg-4k".into()),
    };
    let site = uniform("f", cg, 4096, 2100, 10_000);
    let h = boundary_hint(&run(10.0, &[]), &site, None).unwrap();
    assert_contains(
        &h.text,
        &["just above kmalloc-cg-2k", "to fit kmalloc-cg-2k"],
    );
}

#[test]
fn one_site_claims_its_rounding_once() {
    // 60-byte requests in msg_msg-128 at 50k/s: a rounding hint (bucket)
    // and a pooling hint; only the first claims the objects held.
    let mut site = uniform("load_msg", bucket("msg_msg-128", 128), 128, 60, 500_000);
    site.call_site = "load_msg+0x41".into();
    let mut cache = TracedCache::new(site.cache.clone());
    cache.allocs = 500_000;
    let series = CacheSeries {
        cache: "msg_msg-128".into(),
        object_size: 128,
        points: vec![(0.0, 0), (5.0, 2000), (10.0, 4000)],
    };
    let hints = all_hints(10.0, &[site], &[cache], &[series], &no_sizes);
    let kinds: Vec<HintKind> = hints.iter().map(|h| h.kind).collect();
    assert_eq!(kinds, vec![HintKind::Rounding, HintKind::Pooling]);
    // 2000 objects held on average, each 128 - 64 bytes smaller.
    assert_eq!(hints[0].saving_bytes, 2000 * (128 - 64));
    assert_eq!(hints[1].saving_bytes, 0);
}
