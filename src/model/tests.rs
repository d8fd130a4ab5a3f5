use super::*;

#[test]
fn buckets_follow_powers_of_two() {
    assert_eq!(Hist::bucket_of(0), 0);
    assert_eq!(Hist::bucket_of(1), 1);
    assert_eq!(Hist::bucket_of(2), 2);
    assert_eq!(Hist::bucket_of(3), 2);
    assert_eq!(Hist::bucket_of(4), 3);
    assert_eq!(Hist::bucket_of(2148), 12);
    assert_eq!(Hist::bounds(12), (2048, 4096));
    assert_eq!(Hist::bucket_of(u64::MAX), HIST_BUCKETS - 1);
    for size in [1u64, 7, 8, 100, 4095, 4096, 1 << 29] {
        let (lo, hi) = Hist::bounds(Hist::bucket_of(size));
        assert!(lo <= size && size < hi, "{size} not in [{lo},{hi})");
    }
}

#[test]
fn hist_round_trips_through_buckets() {
    let mut h = Hist::default();
    for s in [0, 5, 6, 7, 2148, 2148, 70000] {
        h.record(s);
    }
    let b = h.buckets();
    assert_eq!(b.len(), 4);
    assert_eq!(
        b[1],
        Bucket {
            lo: 4,
            hi: 8,
            count: 3
        }
    );
    assert_eq!(Hist::from_buckets(&b), h);
    assert_eq!(h.total(), 7);
}

#[test]
fn waste_is_allocated_minus_requested() {
    let s = AllocStats {
        count: 10,
        bytes_req: 10 * 2148,
        bytes_alloc: 10 * 4096,
        hist: Hist::default(),
    };
    assert_eq!(s.waste(), 10 * 1948);
    assert!((s.waste_pct() - 47.5585).abs() < 0.001);
    assert_eq!(s.avg_req(), 2148.0);
    assert_eq!(AllocStats::default().waste_pct(), 0.0);
}

#[test]
fn add_and_saturating_sub() {
    let mut a = AllocStats {
        count: 1,
        bytes_req: 10,
        bytes_alloc: 16,
        ..Default::default()
    };
    a.hist.record(10);
    let mut b = a;
    b += a;
    assert_eq!(b.count, 2);
    assert_eq!(b.hist.0[4], 2);
    assert_eq!((b - a).count, 1);
    assert_eq!((a - b).count, 0, "a reset counter must not wrap");
}

#[test]
fn apportion_keeps_proportions_and_the_total() {
    assert_eq!(apportion(10, &[1, 1]), vec![5, 5]);
    assert_eq!(apportion(10, &[2, 3]), vec![4, 6]);
    // 1000 over three equal parts: 333.33 each, one unit left over.
    assert_eq!(apportion(1000, &[1, 1, 1]), vec![334, 333, 333]);
    // 7 * 2/3 = 4.67 and 7 * 1/3 = 2.33: the larger remainder wins.
    assert_eq!(apportion(7, &[2, 1]), vec![5, 2]);
    assert_eq!(apportion(5, &[0, 0]), vec![0, 0]);
    assert_eq!(apportion(0, &[3, 4]), vec![0, 0]);
    // Exact when the weights already add up to the total.
    assert_eq!(apportion(9, &[4, 5]), vec![4, 5]);
    assert_eq!(apportion(u64::MAX, &[u64::MAX, 0]), vec![u64::MAX, 0]);
    assert_eq!(apportion(100, &[3, 1]), vec![75, 25]);
    let v = apportion(1_000_003, &[7, 13, 1, 999]);
    assert_eq!(v.iter().sum::<u64>(), 1_000_003);
}

#[test]
fn kmalloc_size_classes_are_told_from_bucket_caches() {
    for shared in [
        "kmalloc-96",
        "kmalloc-4k",
        "kmalloc-cg-4k",
        "kmalloc-rcl-64",
        "kmalloc-rnd-05-2k",
        "dma-kmalloc-8k",
    ] {
        assert!(is_kmalloc_size_class(shared), "{shared}");
    }
    for dedicated in [
        "msg_msg-4k",
        "memdup_user-64",
        "kmalloc-rnd--4k",
        "kmalloc-",
        "dentry",
    ] {
        assert!(!is_kmalloc_size_class(dedicated), "{dedicated}");
    }
    let in_slab = |name: &str| CacheId::Kmalloc {
        size: 4096,
        accounted: false,
        slab: KmallocSlab::Cache(name.into()),
    };
    assert_eq!(
        in_slab("kmalloc-rnd-05-4k").kmalloc_size_class(),
        Some(4096)
    );
    assert_eq!(in_slab("msg_msg-4k").kmalloc_size_class(), None);
    assert_eq!(in_slab("msg_msg-4k").name(), "msg_msg-4k");
    // A bucket cache is the other half: never both, never for a cache
    // kheap could not name.
    assert_eq!(in_slab("msg_msg-4k").kmalloc_bucket(), Some(4096));
    assert_eq!(in_slab("kmalloc-cg-4k").kmalloc_bucket(), None);
    assert_eq!(in_slab("kmalloc-rnd-05-4k").kmalloc_bucket(), None);
    let unknown = |slab| CacheId::Kmalloc {
        size: 4096,
        accounted: false,
        slab,
    };
    assert_eq!(unknown(KmallocSlab::SizeClass).kmalloc_bucket(), None);
    assert_eq!(unknown(KmallocSlab::Unresolved).kmalloc_bucket(), None);
    assert_eq!(CacheId::Named("dentry".into()).kmalloc_bucket(), None);
}

#[test]
fn merged_caches_name_the_others() {
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(merged_cache_name("dentry", &[]), "dentry");
    let two = merged_cache_name("cred", &names(&["pid"]));
    assert_eq!(two, "cred (merged: pid)");
    let many = merged_cache_name(
        "ftrace_event_field",
        &names(&["Acpi-Parse", "damon_region", "file_lock_ctx", "x", "y"]),
    );
    assert_eq!(
        many,
        "ftrace_event_field (merged: Acpi-Parse, damon_region, file_lock_ctx, +2)"
    );
    assert_eq!(unmerged_cache_name(&many), "ftrace_event_field");
    assert_eq!(unmerged_cache_name("dentry"), "dentry");
}

#[test]
fn cache_names_match_slabinfo() {
    let k = |size, accounted| {
        CacheId::Kmalloc {
            size,
            accounted,
            slab: KmallocSlab::SizeClass,
        }
        .name()
    };
    assert_eq!(k(96, false), "kmalloc-96");
    assert_eq!(k(4096, true), "kmalloc-cg-4k");
    assert_eq!(k(8192, false), "kmalloc-8k");
    assert_eq!(k(16384, false), "kmalloc-large-16.0K");
    assert_eq!(CacheId::Named("dentry".into()).name(), "dentry");
}

#[test]
fn human_units() {
    assert_eq!(human_size(512), "512");
    assert_eq!(human_size(1536), "1.5K");
    assert_eq!(human_size(300 << 20), "300M");
    assert_eq!(human_count(1234), "1.2k");
    assert_eq!(human_count(12), "12");
}

#[test]
fn signed_units() {
    assert_eq!(signed_size(1536), "+1.5K");
    assert_eq!(signed_size(-300 * 1024), "-300K");
    assert_eq!(signed_size(0), "0");
    assert_eq!(signed_size(i64::MIN), "-8388608T", "no overflow");
    assert_eq!(signed_count(-1234), "-1.2k");
    assert_eq!(signed_count(7), "+7");
}
