use super::*;
use crate::testing::{assert_contains, kmalloc};

fn no_sizes(_: &str) -> Option<u64> {
    None
}

/// `count` requests of `size` bytes each, served from `obj`-byte objects.
fn uniform(function: &str, cache: CacheId, obj: u64, size: u64, count: u64) -> TracedSite {
    let mut hist = Hist::default();
    hist.0[Hist::bucket_of(size)] = count;
    TracedSite {
        function: function.into(),
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
    let h = boundary_hint(&site, 3.0, Some(held)).unwrap();
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
    let h = boundary_hint(&site, 10.0, Some(held)).expect("hint");
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
    assert!(boundary_hint(&uniform("f", kmalloc(4096), 4096, 4000, 10_000), 1.0, None).is_none());
    // 3000 bytes: 46% into the gap, not "just above".
    assert!(boundary_hint(&uniform("f", kmalloc(4096), 4096, 3000, 10_000), 1.0, None).is_none());
    // Too few to matter.
    assert!(boundary_hint(&uniform("f", kmalloc(4096), 4096, 2100, 10), 1.0, None).is_none());
    // Named caches are already dedicated.
    assert!(boundary_hint(
        &uniform("f", CacheId::Named("x".into()), 4096, 2100, 10_000),
        1.0,
        None
    )
    .is_none());
}

#[test]
fn spread_out_sizes_are_not_a_cluster() {
    let mut site = uniform("f", kmalloc(4096), 4096, 2100, 10_000);
    // Half the requests far from the boundary, same mean-ish bucket spread.
    site.stats.hist = Hist::default();
    site.stats.hist.0[Hist::bucket_of(2100)] = 5_000;
    site.stats.hist.0[Hist::bucket_of(500)] = 5_000;
    assert!(boundary_hint(&site, 1.0, None).is_none());
}

#[test]
fn bimodal_sizes_padded_into_one_cache() {
    // A dedicated 2048-byte cache serving 64-byte and 2000-byte requests.
    let mut hist = Hist::default();
    hist.0[Hist::bucket_of(64)] = 600; // [64, 128)
    hist.0[Hist::bucket_of(2000)] = 400; // [1024, 2048)
    let site = TracedSite {
        function: "mixed_alloc".into(),
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
    let hints = bimodal_hints(std::slice::from_ref(&site), &sizes);
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
    let hints = bimodal_hints(&sites, &no_sizes);
    assert_eq!(hints.len(), 1);
    assert_eq!(hints[0].saving_bytes, 0);
    assert!(hints[0].text.contains("different caches"));
    // Adjacent buckets are one spread-out mode, not two.
    let near = [
        uniform("near", kmalloc(128), 128, 100, 500),
        uniform("near", kmalloc(192), 192, 130, 500),
    ];
    assert!(bimodal_hints(&near, &no_sizes).is_empty());
}

#[test]
fn many_small_fast_allocations_suggest_pooling() {
    // 50k/s of 50-byte requests in kmalloc-64.
    let site = uniform("skb_ext_add", kmalloc(64), 64, 50, 500_000);
    let held = Held {
        avg_objects: 10_000.0,
        peak_objects: 20_000.0,
    };
    let h = pooling_hint(&site, 10.0, Some(held)).expect("hint");
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
    let h = pooling_hint(&site, 10.0, Some(few)).unwrap();
    assert_eq!(h.saving_bytes, 0);
    assert!(!h.text.contains("less memory"), "{}", h.text);
    assert!(h.text.contains("50.0k/s"), "{}", h.text);
    // Without samples of the cache, no saving is claimed.
    assert_eq!(pooling_hint(&site, 10.0, None).unwrap().saving_bytes, 0);
    // Same volume spread over 100 s is 5k/s: no hint.
    assert!(pooling_hint(&site, 100.0, None).is_none());
    // Unknown duration: no rate, no hint.
    assert!(pooling_hint(&site, 0.0, None).is_none());
}

#[test]
fn large_allocations_in_a_hot_path() {
    let site = uniform("big_buf", kmalloc(8192), 8192, 6000, 20_000);
    let held = Held {
        avg_objects: 10.0,
        peak_objects: 20.0,
    };
    let h = large_hot_hint(&site, 10.0, Some(held)).expect("hint");
    assert_eq!(h.kind, HintKind::LargeHot);
    assert_eq!(h.saving_bytes, 10 * (8192 - 6000));
    assert!(large_hot_hint(&uniform("s", kmalloc(64), 64, 40, 20_000), 10.0, None).is_none());
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
