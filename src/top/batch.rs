//! Batch mode: one plain-text table (no escape codes) or one JSON object per
//! interval, for logs and CI. Pure string building.

use crate::contract::{self, Kind};
use crate::model::Counts;
use crate::render::table::{self, new_table};
use crate::render::GroupBy;
use crate::report::top_n;
use crate::report::Report;
use crate::top::view::{self, cells, headers, Interval, ObjectSizes, TopSort, ViewOptions};

/// One interval as text: the header, then the table of the top `limit`
/// rows, fitted to `width` columns.
pub fn text(
    iv: &Interval,
    v: &ViewOptions,
    sizes: &ObjectSizes,
    limit: usize,
    width: Option<u16>,
) -> String {
    let mut rows = view::rows(&iv.report, v.by, sizes);
    view::sort_rows(&mut rows, v.sort);
    let total = rows.len();
    top_n::keep(&mut rows, Some(limit));
    let fit = width.map_or(usize::MAX, usize::from);
    let mut out = view::header_lines(iv, v, rows.len(), total, fit).join("\n");
    out.push('\n');
    // Cache lists and command names are text; the cache view's second
    // column is a number (frees/s).
    let text: &[usize] = if v.by == GroupBy::Cache { &[] } else { &[1] };
    let source = view::source_column(&rows);
    let mut t = new_table(&headers(v.by, source), &source.text(text), width);
    for r in &rows {
        t.add_row(cells(r, v.by, iv.interval_s));
    }
    if rows.is_empty() {
        out.push_str("(no allocations in this interval)\n");
    } else {
        out.push_str(&table::render(t));
        out.push('\n');
    }
    out
}

/// One interval as a single line of JSON (kind "top"): the fields of
/// `kheap record`'s report (counts over the interval) plus time,
/// interval_s, aged_out and overhead. Lists are sorted by `sort` and cut to
/// `limit` if given.
pub fn json(iv: &Interval, sort: TopSort, sizes: &ObjectSizes, limit: Option<usize>) -> String {
    let mut iv = iv.clone();
    sort_report(&mut iv.report, sort, sizes, limit);
    contract::line(Kind::Top, &iv)
}

fn counts_value(c: &Counts, sort: TopSort) -> f64 {
    match sort {
        TopSort::Count => c.count as f64,
        TopSort::Req => c.bytes_req as f64,
        TopSort::Waste => c.waste_bytes as f64,
        TopSort::WastePct => c.waste_pct,
        TopSort::Avg => c.avg_size,
        // Net is known per cache only (`--sort net` needs `--by cache`):
        // the caches sort by it (sort_report), the other lists by bytes.
        TopSort::Bytes | TopSort::Net => c.bytes_alloc as f64,
    }
}

fn sort_cut<T>(
    rows: &mut Vec<T>,
    counts: impl Fn(&T) -> &Counts,
    sort: TopSort,
    limit: Option<usize>,
) {
    rows.sort_by(|a, b| counts_value(counts(b), sort).total_cmp(&counts_value(counts(a), sort)));
    top_n::keep(rows, limit);
}

/// Sorts and cuts every list of `r` by `sort`; with net, the caches by
/// their net bytes as the cache view shows them (unknown last, then by
/// name), the other lists, which have no net, by bytes.
pub fn sort_report(r: &mut Report, sort: TopSort, sizes: &ObjectSizes, limit: Option<usize>) {
    sort_cut(&mut r.sites, |r| &r.counts, sort, limit);
    sort_cut(&mut r.stacks, |r| &r.counts, sort, limit);
    if sort == TopSort::Net {
        let net = |c: &crate::report::CacheRow| {
            view::cache_net_bytes(c, sizes).map_or(f64::NEG_INFINITY, |n| n as f64)
        };
        r.caches
            .sort_by(|a, b| net(b).total_cmp(&net(a)).then_with(|| a.name.cmp(&b.name)));
        top_n::keep(&mut r.caches, limit);
    } else {
        sort_cut(&mut r.caches, |r| &r.counts, sort, limit);
    }
    sort_cut(&mut r.processes, |r| &r.counts, sort, limit);
}

/// Whether a view can be shown with the data being collected.
pub fn by_supported(by: GroupBy, with_processes: bool) -> bool {
    by != GroupBy::Process || with_processes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{report_of, sample_snapshot};

    fn interval() -> Interval {
        Interval {
            time: "2026-11-29T17:30:01.000Z".into(),
            interval_s: 1.0,
            aged_out: 0,
            overhead: Default::default(),
            report: report_of(&sample_snapshot(), 10, 1.0),
        }
    }

    fn opts(by: GroupBy, sort: TopSort) -> ViewOptions {
        ViewOptions {
            by,
            sort,
            paused: false,
        }
    }

    #[test]
    fn text_is_plain_with_a_timestamped_header() {
        let t = text(
            &interval(),
            &opts(GroupBy::Site, TopSort::Bytes),
            &ObjectSizes::default(),
            1,
            None,
        );
        assert!(!t.contains('\x1b'), "no escape codes: {t:?}");
        assert!(t.starts_with("kheap top  2026-11-29T17:30:01.000Z"), "{t}");
        assert!(t.contains("load_msg+0x10"), "{t}");
        assert!(!t.contains("simple_xattr_alloc"), "cut to one row: {t}");
        assert!(t.contains("rows: 1 of 2 (1 hidden)"), "{t}");
        assert!(t.contains("allocs/s") && t.contains("net/s"), "{t}");
    }

    #[test]
    fn text_has_a_source_column_beyond_the_slab() {
        let mut iv = interval();
        let t = text(
            &iv,
            &opts(GroupBy::Site, TopSort::Bytes),
            &ObjectSizes::default(),
            5,
            None,
        );
        assert!(!t.contains("source"), "{t}");
        iv.report = report_of(&crate::report::fixtures::sources_snapshot(), 10, 1.0);
        let t = text(
            &iv,
            &opts(GroupBy::Site, TopSort::Bytes),
            &ObjectSizes::default(),
            5,
            None,
        );
        let header = t.lines().find(|l| l.contains("allocs/s ")).unwrap();
        let cols: Vec<&str> = header.split(['│', '┆']).map(str::trim).collect();
        assert_eq!(&cols[1..4], ["site", "source", "cache"], "{t}");
        let page = t.lines().find(|l| l.contains("[page]")).unwrap();
        let cols: Vec<&str> = page.split(['│', '┆']).map(str::trim).collect();
        assert_eq!(
            &cols[1..5],
            ["[page]", "page", "pages-order0,pages-order0-slab", "52"]
        );
    }

    #[test]
    fn empty_intervals_say_so() {
        let mut iv = interval();
        iv.report = Report::default();
        let t = text(
            &iv,
            &opts(GroupBy::Cache, TopSort::Bytes),
            &ObjectSizes::default(),
            20,
            None,
        );
        assert!(t.contains("(no allocations in this interval)"), "{t}");
    }

    #[test]
    fn json_is_one_line_with_record_fields() {
        let j = json(
            &interval(),
            TopSort::Count,
            &ObjectSizes::default(),
            Some(1),
        );
        assert_eq!(j.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["kind"], "top");
        assert_eq!(
            v["schema_version"],
            crate::contract::Kind::Top.schema_version()
        );
        assert_eq!(v["time"], "2026-11-29T17:30:01.000Z");
        assert_eq!(v["interval_s"], 1.0);
        assert!(v["overhead"]["bpf_cpu_pct"].is_number());
        assert_eq!(v["sites"].as_array().unwrap().len(), 1);
        assert_eq!(v["sites"][0]["function"], "load_msg");
        assert_eq!(v["sites"][0]["count"], 1000);
        assert_eq!(v["totals"]["count"], 1300);
        assert!(v["lost"]["map_full"].is_u64());
        let back: Interval = serde_json::from_str(&j).unwrap();
        assert_eq!(back.report.sites[0].counts.count, 1000);
    }

    /// `--by cache --sort net --format json`: the caches come in the order
    /// of the cache view's net/s, not of bytes (unknown net last).
    #[test]
    fn json_sorts_caches_by_net() {
        let mut iv = interval();
        let cache = |name: &str, count: u64, frees: u64| crate::report::CacheRow {
            source: Default::default(),
            counted_elsewhere: false,
            name: name.into(),
            frees,
            frees_untraced: false,
            counts: Counts {
                count,
                bytes_req: count * 192,
                bytes_alloc: count * 192,
                ..Default::default()
            },
            retention: None,
        };
        iv.report.caches.push(cache("dentry", 10, 30));
        iv.report.caches.push(cache("filp", 10, 5));
        let mut sizes = ObjectSizes::default();
        sizes.learn(&iv.report);
        let names = |j: String| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_str(&j).unwrap();
            v["caches"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names(json(&iv, TopSort::Net, &sizes, None)),
            ["filp", "dentry", "kmalloc-cg-4k"]
        );
        assert_eq!(
            names(json(&iv, TopSort::Bytes, &sizes, None))[0],
            "kmalloc-cg-4k"
        );
        assert_eq!(names(json(&iv, TopSort::Net, &sizes, Some(1))), ["filp"]);
    }

    #[test]
    fn sort_report_orders_each_list() {
        let mut r = interval().report;
        sort_report(&mut r, TopSort::Count, &ObjectSizes::default(), None);
        assert!(r
            .stacks
            .windows(2)
            .all(|w| w[0].counts.count >= w[1].counts.count));
        assert!(by_supported(GroupBy::Cache, false));
        assert!(!by_supported(GroupBy::Process, false));
    }
}
