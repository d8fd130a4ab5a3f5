use super::*;
use crate::model::snapshot::Snapshot;
use crate::report::fixtures::{report_of, sample_snapshot, sources_snapshot};
use crate::testing::assert_contains;

fn report() -> Report {
    report_of(&sample_snapshot(), 10, 2.0)
}

fn row(name: &str, count: u64, bytes: u64, net: Option<i64>) -> TopRow {
    TopRow {
        name: name.into(),
        counts: Counts {
            count,
            bytes_alloc: bytes,
            ..Default::default()
        },
        net_bytes: net,
        ..Default::default()
    }
}

#[test]
fn rows_sort_by_the_chosen_column_with_stable_ties() {
    let mut r = vec![
        row("b", 10, 100, Some(-5)),
        row("a", 10, 300, None),
        row("c", 20, 100, Some(7)),
    ];
    sort_rows(&mut r, TopSort::Bytes);
    assert_eq!(r[0].name, "a");
    assert_eq!((r[1].name.as_str(), r[2].name.as_str()), ("b", "c"));
    sort_rows(&mut r, TopSort::Count);
    assert_eq!(r[0].name, "c");
    assert_eq!(r[1].name, "a", "tie on count broken by name");
    sort_rows(&mut r, TopSort::Net);
    let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["c", "b", "a"], "unknown net sorts last");
}

#[test]
fn sort_and_view_keys_cycle() {
    let mut s = TopSort::Bytes;
    for _ in 0..7 {
        s = s.next(GroupBy::Cache);
    }
    assert_eq!(s, TopSort::Bytes);
    assert_eq!(TopSort::Bytes.next(GroupBy::Site), TopSort::Count);
    assert_eq!(next_group(GroupBy::Cache, None), GroupBy::Site);
    let procs = counted_view(GroupBy::Process);
    assert_eq!(next_group(GroupBy::Cache, procs), GroupBy::Process);
    assert_eq!(next_group(GroupBy::Process, procs), GroupBy::Site);
    let cgroups = counted_view(GroupBy::Cgroup);
    assert_eq!(next_group(GroupBy::Cache, cgroups), GroupBy::Cgroup);
    assert_eq!(next_group(GroupBy::Cgroup, cgroups), GroupBy::Site);
    assert_eq!(counted_view(GroupBy::Stack), None);
}

/// `--sort net` outside the cache view is refused with one line (issue
/// 46: net/s is `-` in every other view); every other sort is taken in
/// every view.
#[test]
fn net_is_a_sort_of_the_cache_view_only() {
    assert_eq!(TopSort::Net.check_offered(GroupBy::Cache), Ok(()));
    for by in [
        GroupBy::Site,
        GroupBy::Stack,
        GroupBy::Process,
        GroupBy::Cgroup,
    ] {
        let e = TopSort::Net.check_offered(by).unwrap_err();
        assert!(e.starts_with("--sort net needs --by cache: "), "{e}");
        assert!(
            e.contains(&format!("not the {} that", group_name(by))),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        for sort in TopSort::ALL.into_iter().filter(|&s| s != TopSort::Net) {
            assert_eq!(sort.check_offered(by), Ok(()), "{sort:?} {by:?}");
        }
    }
}

#[test]
fn cells_are_per_second_rates() {
    let mut r = row("load_msg+0x41", 2000, 2000 * 4096, None);
    r.counts.bytes_req = 2000 * 2148;
    r.counts.waste_bytes = 2000 * (4096 - 2148);
    r.counts.waste_pct = 47.56;
    r.counts.avg_size = 2148.0;
    r.detail = "kmalloc-4k".into();
    let c = cells(&r, GroupBy::Site, 2.0);
    assert_eq!(c.len(), headers(GroupBy::Site, SourceColumn(false)).len());
    assert_eq!(
        c,
        [
            "load_msg+0x41",
            "kmalloc-4k",
            "1.0k",
            "2.0M",
            "3.9M",
            "1.9M",
            "47.6%",
            "2148",
            "-"
        ]
    );
    r.estimated = true;
    assert_eq!(cells(&r, GroupBy::Stack, 2.0)[2], "~1.0k");
}

#[test]
fn cache_rows_have_frees_and_net_where_attributable() {
    let mut rep = report();
    rep.caches.push(crate::report::CacheRow {
        source: Default::default(),
        counted_elsewhere: false,
        name: "dentry".into(),
        frees: 30,
        frees_untraced: false,
        counts: Counts {
            count: 10,
            bytes_req: 10 * 192,
            bytes_alloc: 10 * 192,
            ..Default::default()
        },
        retention: None,
    });
    let mut sizes = ObjectSizes::default();
    sizes.learn(&rep);
    let rows = rows(&rep, GroupBy::Cache, &sizes);
    let dentry = rows.iter().find(|r| r.name == "dentry").unwrap();
    assert_eq!(dentry.net_bytes, Some(-20 * 192));
    let c = cells(dentry, GroupBy::Cache, 2.0);
    assert_eq!(c[1], "15", "frees per second");
    assert_eq!(c[8], "-1.9K");
    let km = rows.iter().find(|r| r.name == "kmalloc-cg-4k").unwrap();
    assert_eq!(km.net_bytes, None, "kfree names no cache");
    assert_eq!(cells(km, GroupBy::Cache, 2.0)[1], "-");
}

#[test]
fn site_rows_carry_their_sampled_stacks() {
    let rep = report();
    let rows = rows(&rep, GroupBy::Site, &ObjectSizes::default());
    let msg = rows.iter().find(|r| r.name == "load_msg+0x10").unwrap();
    assert_eq!(msg.stacks.len(), 1);
    assert_eq!(msg.stacks[0][0], "__kmalloc_noprof+0x10");
    let kv = rows
        .iter()
        .find(|r| r.name == "simple_xattr_alloc+0x10")
        .unwrap();
    assert_eq!(kv.stacks.len(), 2);
}

#[test]
fn rows_beyond_the_slab_carry_their_source_in_a_column() {
    let rows_of =
        |snap: Snapshot, by| rows(&report_of(&snap, 10, 2.0), by, &ObjectSizes::default());
    for by in [GroupBy::Site, GroupBy::Stack, GroupBy::Cache] {
        let plain = rows_of(sample_snapshot(), by);
        assert!(plain.iter().all(|r| r.source.is_none()));
        assert!(!source_column(&plain).0);
        let mixed = rows_of(sources_snapshot(), by);
        assert!(source_column(&mixed).0);
        let hs = headers(by, source_column(&mixed));
        assert_eq!(hs[1], "source", "{hs:?}");
        for r in &mixed {
            let c = cells(r, by, 2.0);
            assert_eq!(c.len(), hs.len());
            assert_eq!(c[1], r.source.unwrap().name());
        }
        let pages = mixed.iter().filter(|r| r.source == Some(Source::Page));
        assert_eq!(
            pages.clone().map(|r| r.counts.count).sum::<u64>(),
            52,
            "{by:?}"
        );
        if by == GroupBy::Cache {
            // Page frees are counted per source, not per cache: no
            // frees/s and no net for page caches.
            for r in pages {
                assert_eq!((r.detail.as_str(), r.net_bytes), ("-", None));
            }
        }
    }
    // Process rows sum every source: no column.
    let procs = rows_of(sources_snapshot(), GroupBy::Process);
    assert!(!source_column(&procs).0);
}

/// The sample report as one interval ending at a fixed time, with BPF
/// statistics: (share of a CPU, ns per run, runs) and kheap's own
/// (CPU %, max RSS).
fn interval_with_stats(
    interval_s: f64,
    aged_out: u64,
    (bpf_cpu_pct, bpf_ns_per_run, bpf_runs): (f64, f64, u64),
    (self_cpu_pct, self_max_rss_bytes): (f64, u64),
) -> Interval {
    Interval {
        time: "2026-11-29T17:30:01.000Z".into(),
        interval_s,
        aged_out,
        overhead: Overhead {
            bpf_stats: true,
            bpf_cpu_pct,
            bpf_ns_per_run,
            bpf_runs,
            self_cpu_pct,
            self_max_rss_bytes,
            ..Default::default()
        },
        report: report(),
    }
}

#[test]
fn header_says_rates_losses_sampling_and_overhead() {
    let mut iv = interval_with_stats(2.0, 3, (1.5, 40.0, 2000), (0.3, 12 << 20));
    iv.report.lost.recursion_misses = 7;
    let v = ViewOptions {
        by: GroupBy::Site,
        sort: TopSort::Bytes,
        paused: true,
    };
    let h = header_lines(&iv, &v, 1, 2, 200).join("\n");
    assert_contains(
        &h,
        &[
            "2026-11-29T17:30:01.000Z",
            "[PAUSED]",
            "650 allocs/s, 450 frees/s",
            "sampled 1 in 10",
            "lost: 2 stacks, 0 map-full drops, 7 skipped by the kernel (recursion); aged out: 3 idle keys",
            "BPF 1.5% of a CPU (40 ns x 1.0k runs/s)",
            "kheap 0.3% CPU, 12.0M RSS",
            "rows: 1 of 2 (1 hidden)",
        ],
    );
}

#[test]
fn header_lines_fit_eighty_columns_with_their_numbers() {
    let mut iv = interval_with_stats(0.5, 12345, (12.5, 4321.0, 123_456_789), (10.3, 123 << 20));
    iv.report.lost.recursion_misses = 99_999;
    let v = ViewOptions {
        by: GroupBy::Process,
        sort: TopSort::Bytes,
        paused: true,
    };
    let full = header_lines(&iv, &v, 1, 2, 1000);
    let narrow = header_lines(&iv, &v, 1, 2, 80);
    assert!(full.iter().any(|l| l.chars().count() > 80), "{full:#?}");
    assert!(
        narrow.iter().all(|l| l.chars().count() <= 80),
        "{narrow:#?}"
    );
    assert_contains(
        &narrow.join("\n"),
        &[
            "[PAUSED]",
            "2.6k allocs/s 1.8k frees/s",
            "lost: 2 stacks, 0 drops, 99999 skipped; aged out 12345",
            "4321 ns",
            "kheap 10.3% CPU, 123M RSS",
            "view process, sort alloc/s",
            "rows: 1 of 2 (1 hidden)",
        ],
    );
}

#[test]
fn header_says_what_the_run_skipped_in_one_line() {
    let mut iv = interval_with_stats(2.0, 3, (1.5, 40.0, 2000), (0.3, 12 << 20));
    let v = ViewOptions {
        by: GroupBy::Cache,
        sort: TopSort::Bytes,
        paused: false,
    };
    assert_eq!(header_lines(&iv, &v, 1, 2, 200).len(), 5);
    let why = "kfree: frees counted in the totals only, not per cache (no kfunc)";
    iv.report.run.skipped = vec![why.into()];
    let lines = header_lines(&iv, &v, 1, 2, 200);
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[5], format!("notes: {why}"));
    let narrow = header_lines(&iv, &v, 1, 2, 60);
    assert!(narrow[5].starts_with("notes: kfree: frees"), "{narrow:#?}");
    assert_eq!(narrow[5].chars().count(), 60, "{narrow:#?}");
}

#[test]
fn the_sort_key_offers_net_bytes_in_the_cache_view_only() {
    let cycle = |by| {
        let mut seen = vec![TopSort::Bytes];
        while seen.len() < 10 {
            let next = seen.last().unwrap().next(by);
            if next == TopSort::Bytes {
                break;
            }
            seen.push(next);
        }
        seen
    };
    assert_eq!(cycle(GroupBy::Cache).len(), 7);
    assert_eq!(cycle(GroupBy::Cache).last(), Some(&TopSort::Net));
    for by in [
        GroupBy::Site,
        GroupBy::Stack,
        GroupBy::Process,
        GroupBy::Cgroup,
    ] {
        let c = cycle(by);
        assert_eq!(c.len(), 6, "{by:?}: {c:?}");
        assert!(!c.contains(&TopSort::Net), "{by:?}: {c:?}");
    }
}
