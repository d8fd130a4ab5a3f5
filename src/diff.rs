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
use crate::model::identity::unmerged_cache_name;
use crate::model::{human_size, human_size_wide, signed_size_wide, Counts};
use crate::render::pprof::{clamp_i64, Builder, Frame, Label, Sample, SampleType, KERNEL_MAPPING};
use crate::render::table::{hidden_note, new_table, render};
use crate::render::{folded_frame, short_list, OutputFormat};
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

impl OutputFormat for DiffFormat {
    fn is_table(self) -> bool {
        self == DiffFormat::Table
    }
    fn is_file_only(self) -> bool {
        self == DiffFormat::Svg
    }
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
    /// What the row is in both reports: the site's location, the stack's
    /// frames (innermost first, `;`-joined) or the cache's own name (the
    /// kernel's, without its merge note). Caches a site allocated from and
    /// caches merged into one are attributes, never part of it.
    pub name: String,
    /// A site's or stack's caches in either report, or a cache row's own
    /// cache; each as the reports name it, with its merge note (`signal_cache
    /// (merged: UNIX, UNIX-STREAM)`), the after report's name first.
    pub caches: Vec<String>,
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
    let kind = contract::read_kind(text, what)?;
    if Measure::of(kind).is_none() {
        bail!(
            "{what} is a kheap {} report: kheap diff compares record or leaks reports (and leaks snapshots)",
            kind.name()
        );
    }
    // Straight from the text, never through a serde_json::Value: an 89 MB
    // input once took 2.4 GB that way (issue 47).
    let report = serde_json::from_str(text)
        .with_context(|| format!("{what} is not a valid kheap {} report", kind.name()))?;
    Ok((kind, report))
}

/// Parses the two reports to compare, each from the text its `read` gives
/// (`what`: its file name, for messages); both must be of one kind. One
/// text at a time, dropped once parsed: a diff holds one input's text and
/// the two reports, never both texts.
pub fn parse_pair(
    before: (impl FnOnce() -> Result<String>, &str),
    after: (impl FnOnce() -> Result<String>, &str),
) -> Result<(Kind, Report, Report)> {
    let (bk, b) = parse_report(&before.0()?, before.1)?;
    let (ak, a) = parse_report(&after.0()?, after.1)?;
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
    let mut names: Vec<&String> = b.keys().chain(a.keys()).collect();
    names.sort();
    names.dedup();
    let none = Keyed::default();
    let mut rows: Vec<DiffRow> = names
        .into_iter()
        .map(|k| {
            let (bk, ak) = (b.get(k).unwrap_or(&none), a.get(k).unwrap_or(&none));
            let mut caches = ak.caches.clone();
            for c in &bk.caches {
                if !caches
                    .iter()
                    .any(|x| unmerged_cache_name(x) == unmerged_cache_name(c))
                {
                    caches.push(c.clone());
                }
            }
            DiffRow {
                name: k.clone(),
                caches,
                before_count: bk.count,
                after_count: ak.count,
                before_bytes: bk.bytes,
                after_bytes: ak.bytes,
                change_count: i128::from(ak.count) - i128::from(bk.count),
                change_bytes: i128::from(ak.bytes) - i128::from(bk.bytes),
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

/// One row's measure in one report, and the caches it was seen with.
#[derive(Default)]
struct Keyed {
    count: u64,
    bytes: u64,
    /// As the report names them, in its order, each cache once.
    caches: Vec<String>,
}

/// Identity → measure and caches, in one report. Rows with the same
/// identity (identical stacks after symbolization, one stack seen with two
/// caches) are summed.
fn keyed(r: &Report, by: DiffBy, measure: Measure) -> BTreeMap<String, Keyed> {
    let value = |ret: &Option<Retention>, c: &Counts| match (measure, ret) {
        (Measure::Outstanding, Some(ret)) => (ret.outstanding_count, ret.outstanding_bytes),
        (Measure::Outstanding, None) => (0, 0),
        (Measure::Allocated, _) => (c.count, c.bytes_alloc),
    };
    let mut out: BTreeMap<String, Keyed> = BTreeMap::new();
    let mut add = |k: String, caches: &[String], (c, b): (u64, u64)| {
        let e = out.entry(k).or_default();
        // Saturating: a sum past 2^64-1 shows as 2^64-1, never wrapped.
        e.count = e.count.saturating_add(c);
        e.bytes = e.bytes.saturating_add(b);
        for cache in caches {
            if !e.caches.contains(cache) {
                e.caches.push(cache.clone());
            }
        }
    };
    match by {
        DiffBy::Site => {
            for s in &r.sites {
                add(
                    s.location.clone(),
                    &s.caches,
                    value(&s.retention, &s.counts),
                )
            }
        }
        DiffBy::Stack => {
            for s in &r.stacks {
                // Frames escaped as in folded stacks: a ';' inside a frame
                // (an input anyone may have written) must not split it.
                let key: Vec<_> = s.frames.iter().map(|f| folded_frame(f)).collect();
                add(
                    key.join(";"),
                    std::slice::from_ref(&s.cache),
                    value(&s.retention, &s.counts),
                )
            }
        }
        DiffBy::Cache => {
            for c in &r.caches {
                add(
                    unmerged_cache_name(&c.name).to_string(),
                    std::slice::from_ref(&c.name),
                    value(&c.retention, &c.counts),
                )
            }
        }
    }
    out
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
    // A cache row is its cache: no second cache column.
    let with_caches = by != DiffBy::Cache;
    let mut headers = vec![first];
    if with_caches {
        headers.push("caches");
    }
    headers.extend([
        "bytes before",
        "bytes after",
        "bytes change",
        "objects after",
        "objects change",
    ]);
    let mut t = new_table(&headers, if with_caches { &[1] } else { &[] }, width);
    for r in d.rows.iter().take(n) {
        let name = match by {
            DiffBy::Stack => r
                .name
                .split(';')
                .find(|f| !f.starts_with("__kmalloc") && !f.starts_with("kmem_cache_alloc"))
                .unwrap_or(&r.name)
                .to_string(),
            // As the report names it: with its merge note.
            DiffBy::Cache => r.caches.first().unwrap_or(&r.name).clone(),
            DiffBy::Site => r.name.clone(),
        };
        let mut cells = vec![Cell::new(name)];
        if with_caches {
            cells.push(Cell::new(short_list(&r.caches, 2)));
        }
        cells.extend([
            Cell::new(human_size(r.before_bytes)),
            Cell::new(human_size(r.after_bytes)),
            Cell::new(signed_size_wide(r.change_bytes)),
            Cell::new(r.after_count),
            Cell::new(format!("{:+}", r.change_count)),
        ]);
        t.add_row(cells);
    }
    let _ = writeln!(out, "{}", render(t));
    out.push_str(&hidden_note(d.rows.len().saturating_sub(n)));
    if d.rows.is_empty() {
        let _ = writeln!(out, "(no differences)");
    }
    out
}

/// The profile of a `kheap diff`: one sample per changed row, its values
/// the change (after minus before; negative where it shrank, which pprof
/// allows). Sample types are `inuse_*` between leaks reports (outstanding
/// memory) and `alloc_*` between record reports (allocation volume).
pub fn pprof(d: &Diff) -> Builder {
    let types: &[SampleType] = match d.measure {
        Measure::Outstanding => &[SampleType::InuseObjects, SampleType::InuseSpace],
        Measure::Allocated => &[SampleType::AllocObjects, SampleType::AllocSpace],
    };
    let mut b = Builder::new(types, types[1], 0);
    b.comment(&format!(
        "kheap diff of two {:?} reports by {:?}: values are after minus before (negative: shrank); grew {} B, shrank {} B, net {} B",
        d.compared, d.by, d.grew_bytes, d.shrank_bytes, d.net_bytes
    ));
    for row in &d.rows {
        let frames = match d.by {
            DiffBy::Stack => row.name.split(';').map(Frame::kernel).collect(),
            DiffBy::Site => vec![Frame::kernel(&row.name)],
            // Caches are not code: one frame named after the cache.
            DiffBy::Cache => vec![Frame {
                function: format!("cache {}", row.name),
                mapping: KERNEL_MAPPING.to_string(),
                ..Default::default()
            }],
        };
        b.add(&Sample {
            frames,
            // pprof's values are int64: a larger change is shown capped.
            values: vec![clamp_i64(row.change_count), clamp_i64(row.change_bytes)],
            labels: row
                .caches
                .iter()
                .map(|c| Label::Str("cache".into(), c.clone()))
                .collect(),
        });
    }
    b
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

    /// The site of a socket leak, with the caches it allocated from.
    fn sock_site(caches: &[&str], live: u64, bytes: u64) -> SiteRow {
        SiteRow {
            function: "sk_prot_alloc".into(),
            location: "sk_prot_alloc+0x3b".into(),
            call_site: "sk_prot_alloc+0x3b".into(),
            caches: caches.iter().map(|c| c.to_string()).collect(),
            counts: Counts {
                count: live,
                bytes_alloc: bytes,
                ..Default::default()
            },
            retention: ret(live, bytes),
            ..Default::default()
        }
    }

    fn cache(name: &str, live: u64, bytes: u64) -> CacheRow {
        CacheRow {
            name: name.into(),
            retention: ret(live, bytes),
            ..Default::default()
        }
    }

    const UNIX: &str = "signal_cache (merged: UNIX, UNIX-STREAM)";
    const UDP: &str = "UDPv6 (merged: PINGv6, UDPLITEv6, TCPv6, +4)";

    /// The user's snapshots: sk_prot_alloc went from 801 to 1600 live
    /// objects while a UDPv6 socket joined its cache list. 801 UNIX sockets
    /// of 1152 B before; 1599 of them and one UDPv6 of 1344 B after.
    fn socket_snapshots() -> (Report, Report) {
        let before = Report {
            leaks: Some(LeakSummary::default()),
            sites: vec![sock_site(&[UNIX], 801, 801 * 1152)],
            caches: vec![cache(UNIX, 801, 801 * 1152)],
            ..Default::default()
        };
        let after = Report {
            leaks: Some(LeakSummary::default()),
            sites: vec![sock_site(&[UDP, UNIX], 1600, 1599 * 1152 + 1344)],
            // The same cache, its merge note now naming another cache.
            caches: vec![
                cache(
                    "signal_cache (merged: UNIX, UNIX-STREAM, sighand_cache)",
                    1599,
                    1599 * 1152,
                ),
                cache(UDP, 1, 1344),
            ],
            ..Default::default()
        };
        (before, after)
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
    fn a_cache_joining_a_sites_list_keeps_the_site_one_row() {
        let (before, after) = socket_snapshots();
        let d = diff(Kind::Leaks, &before, &after, DiffBy::Site);
        assert_eq!(
            d.rows,
            vec![DiffRow {
                name: "sk_prot_alloc+0x3b".into(),
                caches: vec![UDP.into(), UNIX.into()],
                before_count: 801,
                after_count: 1600,
                before_bytes: 801 * 1152,
                after_bytes: 1599 * 1152 + 1344,
                change_count: 799,
                change_bytes: 798 * 1152 + 1344,
            }]
        );
        assert_eq!((d.grew_bytes, d.shrank_bytes), (920_640, 0));
        let t = table(&d, DiffBy::Site, 10, None);
        let row = t.lines().find(|l| l.contains("sk_prot_alloc")).unwrap();
        // +899K = 920640 B: not +1.8M from a before of 0.
        assert_contains(row, &["901K", "1.8M", "+899K", "1600", "+799"]);
        // Whole names, parentheses balanced: not `TCP,UDP (merged: PINGv6 +4`.
        assert_contains(row, &["UDPv6 (merged: PINGv6, UDPLITEv6, TCPv6, +4)"]);
    }

    #[test]
    fn caches_are_matched_by_their_own_name_whatever_their_merge_note() {
        let (before, after) = socket_snapshots();
        let d = diff(Kind::Leaks, &before, &after, DiffBy::Cache);
        assert_eq!(
            d.rows,
            vec![
                DiffRow {
                    name: "signal_cache".into(),
                    caches: vec!["signal_cache (merged: UNIX, UNIX-STREAM, sighand_cache)".into()],
                    before_count: 801,
                    after_count: 1599,
                    before_bytes: 801 * 1152,
                    after_bytes: 1599 * 1152,
                    change_count: 798,
                    change_bytes: 798 * 1152,
                },
                DiffRow {
                    name: "UDPv6".into(),
                    caches: vec![UDP.into()],
                    before_count: 0,
                    after_count: 1,
                    before_bytes: 0,
                    after_bytes: 1344,
                    change_count: 1,
                    change_bytes: 1344,
                },
            ]
        );
    }

    #[test]
    fn the_table_titles_each_column_once() {
        let (before, after) = socket_snapshots();
        for (by, header) in [
            (
                DiffBy::Cache,
                "cache|bytes before|bytes after|bytes change|objects after|objects change",
            ),
            (
                DiffBy::Site,
                "site|caches|bytes before|bytes after|bytes change|objects after|objects change",
            ),
        ] {
            let t = table(&diff(Kind::Leaks, &before, &after, by), by, 10, None);
            let cells = |l: &str| {
                l.split(['│', '┆'])
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect::<Vec<_>>()
                    .join("|")
            };
            let head = t.lines().map(cells).find(|l| l.contains("bytes before"));
            assert_eq!(head.as_deref(), Some(header), "{t}");
        }
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
    fn a_frame_holding_a_semicolon_stays_one_frame() {
        // Inputs are files anyone may have written (issue 47): the stack
        // key escapes ';' as folded stacks do, so no frame is split in two.
        let evil = |r: &mut Report| r.stacks[0].frames[1] = "evil;fake+0x1".into();
        let mut before = leaks_report(vec![site("load_msg+0x10", 10, 10)]);
        let mut after = leaks_report(vec![site("load_msg+0x10", 30, 30)]);
        evil(&mut before);
        evil(&mut after);
        let d = diff(Kind::Leaks, &before, &after, DiffBy::Stack);
        assert_eq!(d.rows.len(), 1);
        assert_eq!(d.rows[0].name, "__kmalloc_noprof+0x1;evil\\x3bfake+0x1");
        assert_eq!(d.rows[0].name.split(';').count(), 2);
        assert!(table(&d, DiffBy::Stack, 5, None).contains("evil\\x3bfake+0x1"));
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
        let text = |t: &String| {
            let t = t.clone();
            move || Ok(t)
        };
        let mixed = err(parse_pair(
            (text(&rec_json), "before.json"),
            (text(&leaks_json), "after.json"),
        ));
        assert_eq!(
            mixed,
            "before.json is a record report and after.json a leaks report: kheap diff compares two reports of one kind"
        );
        let untagged = serde_json::to_string(&leaks).unwrap();
        assert!(err(parse_pair(
            (text(&untagged), "a.json"),
            (text(&leaks_json), "b.json")
        ))
        .starts_with("a.json is not a kheap JSON report"));
        let slab = contract::pretty(Kind::Slab, &serde_json::json!({"caches": []}));
        assert!(
            err(parse_pair((text(&slab), "s.json"), (text(&slab), "t.json")))
                .contains("s.json is a kheap slab report: kheap diff compares record or leaks")
        );
        let (kind, _, _) = parse_pair((text(&leaks_json), "a"), (text(&leaks_json), "b")).unwrap();
        assert_eq!(kind, Kind::Leaks);
    }
}
