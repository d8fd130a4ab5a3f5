//! Comparing two kheap JSON reports: which sites, stacks or caches grew or
//! shrank between them. Pure: JSON in, rows out.
//!
//! Both reports are of one kind, told by their `"kind"` field. Between two
//! `kheap leaks` snapshots or reports, the measure is what is outstanding
//! (retained memory); between two `kheap record` reports, which know
//! nothing of frees, it is allocation volume.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use comfy_table::Cell;
use serde::{Deserialize, Serialize};

use crate::contract::{self, Kind};
use crate::model::{human_size, human_size_wide, signed_size_wide, Counts};
use crate::render::short_list;
use crate::render::table::{hidden_note, new_table, render};
use crate::report::{Report, Retention};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffBy {
    Site,
    Stack,
    Cache,
}

/// What `kheap diff` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    Table,
    Json,
    /// gzip-compressed pprof profile of the change (negative values for what
    /// shrank); needs -o FILE unless piped
    Pprof,
    /// A differential flame graph: widths from AFTER, red grew, blue shrank
    /// (SVG; needs -o FILE or a pipe)
    Svg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// Objects and bytes still allocated (kheap leaks, snapshots).
    Outstanding,
    /// Objects and bytes allocated during the run (kheap record).
    Allocated,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DiffRow {
    /// Site location, stack (innermost frame first, `;`-joined) or cache.
    pub name: String,
    /// The cache(s) of a site or stack.
    pub cache: String,
    pub before_count: u64,
    pub after_count: u64,
    pub before_bytes: u64,
    pub after_bytes: u64,
    /// after - before: i128, so that any two u64 values differ without
    /// wrapping (0 to 2^64-1 is +18446744073709551615).
    pub change_count: i128,
    pub change_bytes: i128,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diff {
    /// The kind of the two reports compared (record or leaks).
    pub compared: Kind,
    /// What the rows are: sites, stacks or caches.
    pub by: DiffBy,
    pub measure: Measure,
    /// Sums of the rows' changes: u128 never overflows for any number of
    /// rows a bounded input can hold.
    pub grew_bytes: u128,
    pub shrank_bytes: u128,
    pub net_bytes: i128,
    /// Largest growth first, largest shrink last; unchanged rows left out.
    pub rows: Vec<DiffRow>,
}

impl Measure {
    /// What a kind of report can be compared on.
    pub fn of(kind: Kind) -> Option<Measure> {
        match kind {
            Kind::Leaks => Some(Measure::Outstanding),
            Kind::Record => Some(Measure::Allocated),
            _ => None,
        }
    }
}

/// Parses a kheap JSON report `what` (a file name, for messages): a record
/// or leaks report, or a leaks snapshot. Returns its kind too.
pub fn parse_report(text: &str, what: &str) -> Result<(Kind, Report)> {
    let (kind, value) = contract::read(text, what)?;
    if Measure::of(kind).is_none() {
        bail!(
            "{what} is a kheap {} report: kheap diff compares record or leaks reports (and leaks snapshots)",
            kind.name()
        );
    }
    let report = serde_json::from_value(value)
        .with_context(|| format!("{what} is not a valid kheap {} report", kind.name()))?;
    Ok((kind, report))
}

/// Parses the two reports to compare; both must be of one kind.
pub fn parse_pair(before: (&str, &str), after: (&str, &str)) -> Result<(Kind, Report, Report)> {
    let (bk, b) = parse_report(before.0, before.1)?;
    let (ak, a) = parse_report(after.0, after.1)?;
    if bk != ak {
        bail!(
            "{} is a {} report and {} a {} report: kheap diff compares two reports of one kind",
            before.1,
            bk.name(),
            after.1,
            ak.name()
        );
    }
    Ok((bk, b, a))
}

/// Compares two reports of kind `kind` (record or leaks) per `by`.
pub fn diff(kind: Kind, before: &Report, after: &Report, by: DiffBy) -> Diff {
    let measure = Measure::of(kind).unwrap_or(Measure::Allocated);
    let (b, a) = (keyed(before, by, measure), keyed(after, by, measure));
    let mut names: Vec<&(String, String)> = b.keys().chain(a.keys()).collect();
    names.sort();
    names.dedup();
    let mut rows: Vec<DiffRow> = names
        .into_iter()
        .map(|k| {
            let (bc, bb) = b.get(k).copied().unwrap_or_default();
            let (ac, ab) = a.get(k).copied().unwrap_or_default();
            DiffRow {
                name: k.0.clone(),
                cache: k.1.clone(),
                before_count: bc,
                after_count: ac,
                before_bytes: bb,
                after_bytes: ab,
                change_count: i128::from(ac) - i128::from(bc),
                change_bytes: i128::from(ab) - i128::from(bb),
            }
        })
        .filter(|r| r.change_count != 0 || r.change_bytes != 0)
        .collect();
    rows.sort_by(|x, y| {
        y.change_bytes
            .cmp(&x.change_bytes)
            .then(y.change_count.cmp(&x.change_count))
            .then(x.name.cmp(&y.name))
    });
    let grew_bytes: u128 = rows.iter().map(|r| r.change_bytes.max(0) as u128).sum();
    let shrank_bytes: u128 = rows.iter().map(|r| (-r.change_bytes).max(0) as u128).sum();
    Diff {
        compared: kind,
        by,
        measure,
        grew_bytes,
        shrank_bytes,
        net_bytes: grew_bytes as i128 - shrank_bytes as i128,
        rows,
    }
}

/// (name, cache) → (count, bytes) under the chosen measure. Rows with the
/// same key (one site seen through different symbol offsets cannot happen;
/// identical stacks can, after symbolization) are summed.
fn keyed(r: &Report, by: DiffBy, measure: Measure) -> BTreeMap<(String, String), (u64, u64)> {
    let value = |ret: &Option<Retention>, c: &Counts| match (measure, ret) {
        (Measure::Outstanding, Some(ret)) => (ret.outstanding_count, ret.outstanding_bytes),
        (Measure::Outstanding, None) => (0, 0),
        (Measure::Allocated, _) => (c.count, c.bytes_alloc),
    };
    let mut out: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    let mut add = |k: (String, String), (c, b): (u64, u64)| {
        let e = out.entry(k).or_default();
        // Saturating: a sum past 2^64-1 shows as 2^64-1, never wrapped.
        e.0 = e.0.saturating_add(c);
        e.1 = e.1.saturating_add(b);
    };
    match by {
        DiffBy::Site => {
            for s in &r.sites {
                add(
                    (s.location.clone(), s.caches.join(",")),
                    value(&s.retention, &s.counts),
                )
            }
        }
        DiffBy::Stack => {
            for s in &r.stacks {
                add(
                    (s.frames.join(";"), s.cache.clone()),
                    value(&s.retention, &s.counts),
                )
            }
        }
        DiffBy::Cache => {
            for c in &r.caches {
                add(
                    (c.name.clone(), String::new()),
                    value(&c.retention, &c.counts),
                )
            }
        }
    }
    out
}

/// The caches of a row, as listed in its `cache` field.
fn caches(joined: &str) -> Vec<String> {
    joined
        .split(',')
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

/// The diff as a table, `n` rows at most, fitted to `width` columns.
pub fn table(d: &Diff, by: DiffBy, n: usize, width: Option<u16>) -> String {
    let mut out = String::new();
    let what = match d.measure {
        Measure::Outstanding => "outstanding (still allocated) memory",
        Measure::Allocated => "allocation volume (a record report has no frees)",
    };
    let _ = writeln!(
        out,
        "kheap diff of {what}: {} grew, {} shrank, net {}",
        human_size_wide(d.grew_bytes),
        human_size_wide(d.shrank_bytes),
        signed_size_wide(d.net_bytes)
    );
    let first = match by {
        DiffBy::Site => "site",
        DiffBy::Stack => "stack (innermost frame)",
        DiffBy::Cache => "cache",
    };
    let mut t = new_table(
        &[
            first, "cache", "before", "after", "change", "objects", "change",
        ],
        &[1],
        width,
    );
    for r in d.rows.iter().take(n) {
        let name = match by {
            DiffBy::Stack => r
                .name
                .split(';')
                .find(|f| !f.starts_with("__kmalloc") && !f.starts_with("kmem_cache_alloc"))
                .unwrap_or(&r.name)
                .to_string(),
            _ => r.name.clone(),
        };
        t.add_row(vec![
            Cell::new(name),
            Cell::new(short_list(&caches(&r.cache), 2)),
            Cell::new(human_size(r.before_bytes)),
            Cell::new(human_size(r.after_bytes)),
            Cell::new(signed_size_wide(r.change_bytes)),
            Cell::new(r.after_count),
            Cell::new(format!("{:+}", r.change_count)),
        ]);
    }
    let _ = writeln!(out, "{}", render(t));
    out.push_str(&hidden_note(d.rows.len().saturating_sub(n)));
    if d.rows.is_empty() {
        let _ = writeln!(out, "(no differences)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{CacheRow, LeakSummary, SiteRow, StackRow};
    use crate::testing::assert_contains;

    fn ret(count: u64, bytes: u64) -> Option<Retention> {
        Some(Retention {
            outstanding_count: count,
            outstanding_bytes: bytes,
            ..Default::default()
        })
    }

    fn site(loc: &str, allocs: u64, live: u64) -> SiteRow {
        SiteRow {
            function: loc.split('+').next().unwrap().into(),
            location: loc.into(),
            call_site: loc.into(),
            caches: vec!["kmalloc-cg-4k".into()],
            source: Default::default(),
            counts: Counts {
                count: allocs,
                bytes_alloc: allocs * 4096,
                ..Default::default()
            },
            retention: ret(live, live * 4096),
        }
    }

    fn leaks_report(sites: Vec<SiteRow>) -> Report {
        Report {
            leaks: Some(LeakSummary::default()),
            caches: vec![CacheRow {
                name: "kmalloc-cg-4k".into(),
                retention: ret(
                    sites
                        .iter()
                        .map(|s| s.retention.as_ref().unwrap().outstanding_count)
                        .sum(),
                    sites
                        .iter()
                        .map(|s| s.retention.as_ref().unwrap().outstanding_bytes)
                        .sum(),
                ),
                ..Default::default()
            }],
            stacks: vec![StackRow {
                function: "load_msg".into(),
                frames: vec!["__kmalloc_noprof+0x1".into(), "load_msg+0x10".into()],
                cache: "kmalloc-cg-4k".into(),
                retention: sites[0].retention.clone(),
                ..Default::default()
            }],
            sites,
            ..Default::default()
        }
    }

    /// The same rows as a kheap record report: no retention anywhere.
    fn as_record(mut r: Report) -> Report {
        r.leaks = None;
        r.sites.iter_mut().for_each(|s| s.retention = None);
        r.stacks.iter_mut().for_each(|s| s.retention = None);
        r.caches.iter_mut().for_each(|s| s.retention = None);
        r
    }

    #[test]
    fn outstanding_growth_is_sorted_largest_first() {
        let before = leaks_report(vec![
            site("load_msg+0x10", 10, 10),
            site("alloc_pipe_info+0x20", 50, 40),
            site("seq_open+0x5", 5, 5),
        ]);
        let after = leaks_report(vec![
            site("load_msg+0x10", 1010, 1010),
            site("alloc_pipe_info+0x20", 60, 10),
            site("seq_open+0x5", 9, 5),
            site("new_site+0x1", 2, 2),
        ]);
        let d = diff(Kind::Leaks, &before, &after, DiffBy::Site);
        assert_eq!(d.measure, Measure::Outstanding);
        let names: Vec<&str> = d.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            ["load_msg+0x10", "new_site+0x1", "alloc_pipe_info+0x20"]
        );
        assert_eq!(d.rows[0].change_bytes, 1000 * 4096);
        assert_eq!(d.rows[0].change_count, 1000);
        assert_eq!(d.rows[2].change_bytes, -30 * 4096);
        assert_eq!(d.grew_bytes, 1002 * 4096);
        assert_eq!(d.shrank_bytes, 30 * 4096);
        assert_eq!(d.net_bytes, 972 * 4096);
        let t = table(&d, DiffBy::Site, 10, None);
        assert_contains(&t, &["outstanding", "+3.9M", "-120K"]);
    }

    /// 2^64-1 was shown as a small negative number (issue 47): changes are
    /// exact, sums saturate, and the table and JSON show them right.
    #[test]
    fn the_largest_values_do_not_wrap() {
        let max = u64::MAX;
        let huge = |loc: &str| {
            let mut s = site(loc, 0, 0);
            s.counts.count = max;
            s.counts.bytes_alloc = max;
            s
        };
        let before = as_record(leaks_report(vec![
            site("small+0x1", 1, 0),
            huge("gone+0x1"),
        ]));
        // One site twice: its sum saturates at 2^64-1 instead of wrapping.
        let after = as_record(leaks_report(vec![huge("big+0x1"), huge("big+0x1")]));
        let d = diff(Kind::Record, &before, &after, DiffBy::Site);
        let row = |n: &str| d.rows.iter().find(|r| r.name == n).unwrap();
        assert_eq!(row("big+0x1").after_bytes, max);
        assert_eq!(row("big+0x1").change_bytes, i128::from(max));
        assert_eq!(row("big+0x1").change_count, i128::from(max));
        assert_eq!(row("gone+0x1").change_bytes, -i128::from(max));
        assert_eq!(d.grew_bytes, u128::from(max));
        assert_eq!(d.shrank_bytes, u128::from(max) + 4096);
        assert_eq!(d.net_bytes, -4096);
        let t = table(&d, DiffBy::Site, 10, None);
        assert_contains(&t, &["+18446744073709551615", "+16777216T", "-16777216T"]);
        assert!(t.contains("-18446744073709551615"), "{t}");
        let json = serde_json::to_string(&d).unwrap();
        assert!(
            json.contains("\"change_bytes\":18446744073709551615"),
            "{json}"
        );
        let back: Diff = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn long_cache_lists_are_shortened_in_the_table() {
        assert_eq!(short_list(&caches("a,b,c"), 2), "a,b +1");
        assert!(caches("").is_empty());
    }

    #[test]
    fn stacks_and_caches_are_compared_too() {
        let before = leaks_report(vec![site("load_msg+0x10", 10, 10)]);
        let after = leaks_report(vec![site("load_msg+0x10", 30, 30)]);
        let d = diff(Kind::Leaks, &before, &after, DiffBy::Stack);
        assert_eq!(d.rows.len(), 1);
        assert_eq!(d.rows[0].name, "__kmalloc_noprof+0x1;load_msg+0x10");
        assert_eq!(d.rows[0].change_bytes, 20 * 4096);
        assert!(table(&d, DiffBy::Stack, 5, None).contains("load_msg+0x10"));
        let d = diff(Kind::Leaks, &before, &after, DiffBy::Cache);
        assert_eq!(d.rows[0].name, "kmalloc-cg-4k");
        assert_eq!(d.rows[0].change_count, 20);
    }

    #[test]
    fn record_reports_compare_allocation_volume() {
        let before = as_record(leaks_report(vec![site("load_msg+0x10", 10, 0)]));
        let after = as_record(leaks_report(vec![site("load_msg+0x10", 30, 30)]));
        let d = diff(Kind::Record, &before, &after, DiffBy::Site);
        assert_eq!((d.compared, d.measure), (Kind::Record, Measure::Allocated));
        assert_eq!(d.rows[0].change_count, 20);
        assert!(table(&d, DiffBy::Site, 5, None).contains("allocation volume"));
    }

    #[test]
    fn reports_are_read_by_kind_and_kinds_must_match() {
        let rec = as_record(leaks_report(vec![site("load_msg+0x10", 10, 0)]));
        let rec_json = contract::pretty(Kind::Record, &rec);
        assert!(!rec_json.contains("outstanding_count"), "{rec_json}");
        let (kind, back) = parse_report(&rec_json, "before.json").unwrap();
        assert_eq!(kind, Kind::Record);
        assert!(
            back.sites[0].retention.is_none(),
            "record rows have no retention"
        );

        let leaks = leaks_report(vec![site("load_msg+0x10", 10, 7)]);
        let leaks_json = contract::pretty(Kind::Leaks, &leaks);
        let (kind, back) = parse_report(&leaks_json, "after.json").unwrap();
        assert_eq!(kind, Kind::Leaks);
        assert_eq!(
            back.sites[0].retention.as_ref().unwrap().outstanding_count,
            7
        );

        let err = |r: Result<(Kind, Report, Report)>| format!("{:#}", r.unwrap_err());
        let mixed = err(parse_pair(
            (&rec_json, "before.json"),
            (&leaks_json, "after.json"),
        ));
        assert_eq!(
            mixed,
            "before.json is a record report and after.json a leaks report: kheap diff compares two reports of one kind"
        );
        let untagged = serde_json::to_string(&leaks).unwrap();
        assert!(
            err(parse_pair((&untagged, "a.json"), (&leaks_json, "b.json")))
                .starts_with("a.json is not a kheap JSON report")
        );
        let slab = contract::pretty(Kind::Slab, &serde_json::json!({"caches": []}));
        assert!(err(parse_pair((&slab, "s.json"), (&slab, "t.json")))
            .contains("s.json is a kheap slab report: kheap diff compares record or leaks"));
        let (kind, _, _) = parse_pair((&leaks_json, "a"), (&leaks_json, "b")).unwrap();
        assert_eq!(kind, Kind::Leaks);
    }
}
