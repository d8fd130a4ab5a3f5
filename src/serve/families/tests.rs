use super::*;
use crate::model::AllocStats;
use crate::serve::exposition::{encode, Format};
use crate::serve::series::{SiteDelta, SiteLabel};
use std::collections::HashMap;

fn state() -> SeriesState {
    let mut s = SeriesState::new(vec![SiteLabel::Site, SiteLabel::Cache], 1);
    let mut hist = Hist::default();
    hist.0[Hist::bucket_of(100)] = 3;
    let stats = AllocStats {
        count: 3,
        bytes_req: 300,
        bytes_alloc: 384,
        hist,
    };
    s.add_interval(
        &[
            SiteDelta {
                site: "load_msg".into(),
                cache: "kmalloc-128".into(),
                source: Source::Kmalloc,
                counted_elsewhere: false,
                stats,
            },
            SiteDelta {
                site: "small".into(),
                cache: "kmalloc-128".into(),
                source: Source::Kmalloc,
                counted_elsewhere: false,
                stats: AllocStats {
                    count: 1,
                    bytes_req: 8,
                    bytes_alloc: 128,
                    hist: Hist::default(),
                },
            },
        ],
        &[("kmalloc-128".into(), 2)],
    );
    s
}

#[test]
fn families_carry_the_counts() {
    let objs = [
        OutstandingSite {
            site: "load_msg".into(),
            cache: "kmalloc-128".into(),
            source: Source::Kmalloc,
            objects: 2,
            bytes: 256,
        },
        OutstandingSite {
            site: "small".into(),
            cache: "kmalloc-128".into(),
            source: Source::Kmalloc,
            objects: 1,
            bytes: 128,
        },
    ];
    let slab = [SlabinfoRow {
        name: "dentry".into(),
        active_objs: 10,
        num_objs: 21,
        objsize: 192,
        objs_per_slab: 21,
        pages_per_slab: 1,
        tunables: [0; 3],
        active_slabs: 1,
        num_slabs: 1,
    }];
    let mut cgroups = Ranked::new(1);
    cgroups.add_interval(HashMap::from([
        (
            vec!["/a".to_string(), String::new(), "true".to_string()],
            AllocStats {
                count: 5,
                bytes_req: 500,
                bytes_alloc: 640,
                hist: Hist::default(),
            },
        ),
        (
            vec!["/b".to_string(), String::new(), "false".to_string()],
            AllocStats {
                count: 1,
                bytes_req: 8,
                bytes_alloc: 8,
                hist: Hist::default(),
            },
        ),
    ]));
    // A process named with a quote, a backslash and a newline (a comm is
    // whatever the process set).
    let mut processes = Ranked::new(1);
    processes.add_interval(HashMap::from([
        (
            vec!["42".to_string(), "a\"b\\c\nd".to_string()],
            AllocStats {
                count: 7,
                bytes_req: 700,
                bytes_alloc: 896,
                hist: Hist::default(),
            },
        ),
        (
            vec!["43".to_string(), "small".to_string()],
            AllocStats {
                count: 2,
                bytes_req: 16,
                bytes_alloc: 16,
                hist: Hist::default(),
            },
        ),
    ]));
    let fams = build(
        &state(),
        Some(&cgroups),
        Some(&processes),
        Some(&[(
            vec!["42".to_string(), "holder".to_string()],
            crate::model::live::Outstanding {
                objects: 3,
                bytes_alloc: 384,
            },
        )]),
        Some(OutstandingInput {
            sites: &objs,
            // Forgotten by the store: two of load_msg, one of a site that
            // is not a series (other).
            aged_out: &[
                OutstandingSite {
                    site: "load_msg".into(),
                    cache: "kmalloc-128".into(),
                    source: Source::Kmalloc,
                    objects: 2,
                    bytes: 256,
                },
                OutstandingSite {
                    site: "small".into(),
                    cache: "kmalloc-128".into(),
                    source: Source::Kmalloc,
                    objects: 1,
                    bytes: 128,
                },
            ],
            tracked_since_s: 1_700_000_000.5,
        }),
        Some(SlabInput {
            rows: &slab,
            page_size: 4096,
            merged: &[("pool_workqueue".into(), "skbuff_fclone_cache".into())],
        }),
        &Health::default(),
    );
    let text = encode(&fams, Format::Prometheus);
    for line in [
            "kheap_cache_allocations_total{cache=\"kmalloc-128\"} 4",
            "kheap_cache_waste_bytes_total{cache=\"kmalloc-128\"} 204",
            "kheap_cache_frees_total{cache=\"kmalloc-128\"} 2",
            "kheap_cache_request_size_bytes_bucket{cache=\"kmalloc-128\",le=\"127\"} 3",
            "kheap_cache_request_size_bytes_count{cache=\"kmalloc-128\"} 3",
            "kheap_site_allocations_total{site=\"load_msg\",cache=\"kmalloc-128\"} 3",
            "kheap_site_allocations_total{site=\"other\",cache=\"other\"} 1",
            "kheap_site_outstanding_bytes{site=\"load_msg\",cache=\"kmalloc-128\"} 256",
            "kheap_site_outstanding_objects{site=\"other\",cache=\"other\"} 1",
            "kheap_cache_outstanding_bytes{cache=\"kmalloc-128\"} 384",
            "kheap_slab_memory_bytes{cache=\"dentry\"} 4096",
            "kheap_slab_loss_bytes{cache=\"dentry\"} 2176",
            "kheap_slab_merged_info{cache=\"pool_workqueue\",merged=\"skbuff_fclone_cache\"} 1",
            "process_resident_memory_bytes 0",
            "kheap_cgroup_allocations_total{cgroup=\"/a\",container=\"\",accounted=\"true\"} 5",
            "kheap_cgroup_allocated_bytes_total{cgroup=\"/a\",container=\"\",accounted=\"true\"} 640",
            "kheap_cgroup_allocations_total{cgroup=\"other\",container=\"other\",accounted=\"other\"} 1",
            "kheap_process_allocations_total{pid=\"42\",comm=\"a\\\"b\\\\c\\nd\"} 7",
            "kheap_process_allocated_bytes_total{pid=\"42\",comm=\"a\\\"b\\\\c\\nd\"} 896",
            "kheap_process_allocations_total{pid=\"other\",comm=\"other\"} 2",
            "kheap_process_outstanding_objects{pid=\"42\",comm=\"holder\"} 3",
            "kheap_process_outstanding_bytes{pid=\"42\",comm=\"holder\"} 384",
            "kheap_site_outstanding_aged_out_objects_total{site=\"load_msg\",cache=\"kmalloc-128\"} 2",
            "kheap_site_outstanding_aged_out_bytes_total{site=\"load_msg\",cache=\"kmalloc-128\"} 256",
            "kheap_site_outstanding_aged_out_objects_total{site=\"other\",cache=\"other\"} 1",
            "kheap_cache_outstanding_aged_out_objects_total{cache=\"kmalloc-128\"} 3",
            "kheap_source_outstanding_aged_out_bytes_total{source=\"kmalloc\"} 384",
            "kheap_outstanding_tracked_since_timestamp_seconds 1700000000.5",
        ] {
            assert!(
                text.contains(&format!("{line}\n")),
                "{line} missing in\n{text}"
            );
        }
    assert!(
        !text.contains("kheap_bpf_runs"),
        "no run-time figures without run-time stats"
    );
}

#[test]
fn every_traced_source_has_its_own_series() {
    let mut s = state();
    let page = |cache: &str, n: u64, counted_elsewhere| SiteDelta {
        site: "[page]".into(),
        cache: cache.into(),
        source: Source::Page,
        counted_elsewhere,
        stats: AllocStats {
            count: n,
            bytes_req: n * 4096,
            bytes_alloc: n * 4096,
            hist: Hist::default(),
        },
    };
    s.add_interval(
        &[
            page("pages-order0", 5, false),
            page("pages-order0-slab", 2, true),
        ],
        &[],
    );
    s.add_source_frees(&[(Source::Page, 3), (Source::Vmalloc, 0)]);
    let objs = [OutstandingSite {
        site: "[page]".into(),
        cache: "pages-order0".into(),
        source: Source::Page,
        objects: 2,
        bytes: 8192,
    }];
    let text = encode(
        &build(
            &s,
            None,
            None,
            None,
            Some(OutstandingInput {
                sites: &objs,
                aged_out: &[],
                tracked_since_s: 0.0,
            }),
            None,
            &Health::default(),
        ),
        Format::Prometheus,
    );
    for line in [
        "kheap_source_allocations_total{source=\"kmalloc\"} 4",
        "kheap_source_allocations_total{source=\"page\"} 7",
        "kheap_source_allocated_bytes_total{source=\"page\"} 28672",
        "kheap_source_counted_elsewhere_bytes_total{source=\"page\"} 8192",
        "kheap_source_frees_total{source=\"page\"} 3",
        // Traced, nothing seen yet: a series at 0.
        "kheap_source_allocations_total{source=\"vmalloc\"} 0",
        "kheap_source_outstanding_bytes{source=\"page\"} 8192",
        "kheap_source_outstanding_objects{source=\"kmalloc\"} 0",
        "kheap_cache_allocations_total{cache=\"pages-order0-slab\"} 2",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "{line} missing in\n{text}"
        );
    }
}
