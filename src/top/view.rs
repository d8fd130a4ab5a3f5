//! What one interval of `kheap top` shows: rows per site, stack, cache or
//! process with per-second rates, their sorting, the header, and the cell
//! formatting shared by the full-screen view and batch mode. Pure.

use std::collections::HashMap;
use std::fmt::Write as _;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::model::{human_count, human_size, pct, signed_size, Counts, Source};
use crate::render::{cgroup_label, process_cells, short_list, unless_zero, GroupBy, SourceColumn};
use crate::report::overhead::Overhead;
use crate::report::{CacheRow, Report};
use crate::top::columns::fitting_line;

/// Columns `kheap top` can sort by (all per second except the ratios).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopSort {
    /// Bytes allocated per second (what the slab allocator handed out)
    Bytes,
    /// Allocations per second
    Count,
    /// Bytes requested per second
    Req,
    /// Bytes lost to size-class rounding per second
    Waste,
    /// Waste as a share of the allocated bytes
    WastePct,
    /// Average requested size
    Avg,
    /// Net bytes per second (allocated minus freed): --by cache only, caches with attributable frees
    Net,
}

impl TopSort {
    const ALL: [TopSort; 7] = [
        TopSort::Bytes,
        TopSort::Count,
        TopSort::Req,
        TopSort::Waste,
        TopSort::WastePct,
        TopSort::Avg,
        TopSort::Net,
    ];

    /// The next sort column of view `by`, for the sort key. Net bytes are
    /// known per cache only (the other views show `-` there), so only the
    /// cache view offers them.
    pub fn next(self, by: GroupBy) -> TopSort {
        let i = Self::ALL.iter().position(|&s| s == self).unwrap_or(0);
        let next = Self::ALL[(i + 1) % Self::ALL.len()];
        if next.offered_in(by) {
            next
        } else {
            TopSort::Bytes
        }
    }

    /// Whether view `by` has this column's numbers.
    pub fn offered_in(self, by: GroupBy) -> bool {
        self != TopSort::Net || by == GroupBy::Cache
    }

    /// `--sort` checked against `--by` before anything is attached: a
    /// free names the object's cache, not the site, stack, process or
    /// cgroup that allocated it, so net bytes exist in the cache view only
    /// (elsewhere every row's net/s would be `-`).
    pub fn check_offered(self, by: GroupBy) -> Result<(), String> {
        if self.offered_in(by) {
            return Ok(());
        }
        Err(format!(
            "--sort net needs --by cache: a free names the object's cache, not the {} that \
             allocated it, so net/s is known per cache only",
            group_name(by)
        ))
    }

    /// The header of the column this sorts by.
    pub fn column(self) -> &'static str {
        match self {
            TopSort::Bytes => "alloc/s",
            TopSort::Count => "allocs/s",
            TopSort::Req => "req/s",
            TopSort::Waste => "waste/s",
            TopSort::WastePct => "waste%",
            TopSort::Avg => "avg",
            TopSort::Net => "net/s",
        }
    }
}

/// The next grouping, for the view key. The process and cgroup views need
/// their own counting in the kernel, so `counted` (the one the run counts,
/// if any) is the only one offered.
pub fn next_group(by: GroupBy, counted: Option<GroupBy>) -> GroupBy {
    match by {
        GroupBy::Site => GroupBy::Stack,
        GroupBy::Stack => GroupBy::Cache,
        GroupBy::Cache => counted.unwrap_or(GroupBy::Site),
        _ => GroupBy::Site,
    }
}

/// The per-process or per-cgroup view a run counts in the kernel, if any.
pub fn counted_view(by: GroupBy) -> Option<GroupBy> {
    matches!(by, GroupBy::Process | GroupBy::Cgroup).then_some(by)
}

pub fn group_name(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Site => "site",
        GroupBy::Stack => "stack",
        GroupBy::Cache => "cache",
        GroupBy::Process => "process",
        GroupBy::Cgroup => "cgroup",
    }
}

/// One row of one interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopRow {
    /// What identifies the row across intervals (two sites can share a
    /// label): call site and caches, stack frames, cache name, or PID.
    pub key: String,
    /// Site location, stack label, cache name, or PID.
    pub name: String,
    /// Caches of a site or stack, frees/s of a cache, comm of a process.
    pub detail: String,
    /// Counts over the interval (not per second).
    pub counts: Counts,
    /// Allocated minus freed bytes over the interval, where frees can be
    /// attributed (dedicated caches, through kmem_cache_free's cache).
    pub net_bytes: Option<i64>,
    /// Stacks to show when the row is expanded, innermost frame first.
    pub stacks: Vec<Vec<String>>,
    /// Whether the counts are scaled from sampled stacks.
    pub estimated: bool,
    /// The row's allocator, when the run traces more than the slab (site,
    /// stack and cache rows; `SourceColumn`).
    pub source: Option<Source>,
}

/// Object sizes of caches, remembered across intervals: a cache that only
/// frees in an interval still has a known size.
#[derive(Clone, Debug, Default)]
pub struct ObjectSizes(HashMap<String, u64>);

impl ObjectSizes {
    pub fn learn(&mut self, report: &Report) {
        for c in &report.caches {
            if let Some(size) = c.counts.bytes_alloc.checked_div(c.counts.count) {
                self.0.insert(c.name.clone(), size);
            }
        }
    }
    pub fn get(&self, cache: &str) -> Option<u64> {
        self.0.get(cache).copied()
    }
}

/// Frees of kmalloc memory go through kfree(), whose event names no cache:
/// only caches allocated from by kmem_cache_alloc() have attributable frees
/// (a bucket cache such as msg_msg-4k is kmalloc'ed too). The other
/// sources' frees are counted per source, not per cache (`totals.sources`).
pub fn frees_attributable(cache: &CacheRow) -> bool {
    cache.source == Source::Kmalloc && !cache.frees_untraced
}

/// A cache's allocated minus freed bytes over an interval, where its
/// frees are attributable and its object size known.
pub fn cache_net_bytes(cache: &CacheRow, sizes: &ObjectSizes) -> Option<i64> {
    if !frees_attributable(cache) {
        return None;
    }
    let size = sizes.get(&cache.name)?;
    Some((cache.counts.count as i64 - cache.frees as i64) * size as i64)
}

/// The rows of one grouping of an interval report.
pub fn rows(report: &Report, by: GroupBy, sizes: &ObjectSizes) -> Vec<TopRow> {
    let shown = SourceColumn::of(report).0;
    let source = |s: Source| shown.then_some(s);
    match by {
        GroupBy::Site => report
            .sites
            .iter()
            .map(|s| TopRow {
                key: format!("{} {}", s.call_site, s.caches.join(",")),
                name: s.location.clone(),
                detail: short_list(&s.caches, 2),
                counts: s.counts.clone(),
                net_bytes: None,
                // The site's sampled stacks: those passing through its call
                // site into one of its caches.
                stacks: report
                    .stacks
                    .iter()
                    .filter(|st| st.frames.contains(&s.call_site) && s.caches.contains(&st.cache))
                    .map(|st| st.frames.clone())
                    .collect(),
                estimated: false,
                source: source(s.source),
            })
            .collect(),
        GroupBy::Stack => report
            .stacks
            .iter()
            .map(|s| TopRow {
                key: format!("{} {}", s.frames.join(";"), s.cache),
                name: s.function.clone(),
                detail: s.cache.clone(),
                counts: s.counts.clone(),
                net_bytes: None,
                stacks: vec![s.frames.clone()],
                estimated: s.estimated,
                source: source(s.source),
            })
            .collect(),
        GroupBy::Cache => report
            .caches
            .iter()
            .map(|c| {
                let net = cache_net_bytes(c, sizes);
                TopRow {
                    key: c.name.clone(),
                    name: c.name.clone(),
                    detail: if frees_attributable(c) {
                        c.frees.to_string()
                    } else {
                        "-".into()
                    },
                    counts: c.counts.clone(),
                    net_bytes: net,
                    stacks: Vec::new(),
                    estimated: false,
                    source: source(c.source),
                }
            })
            .collect(),
        GroupBy::Process => report
            .processes
            .iter()
            .map(|p| {
                let (pid, comm) = process_cells(p.process.pid, p.process.comm.as_deref(), "");
                TopRow {
                    key: pid.clone(),
                    name: pid,
                    detail: comm,
                    counts: p.counts.clone(),
                    net_bytes: None,
                    stacks: Vec::new(),
                    estimated: false,
                    source: None,
                }
            })
            .collect(),
        GroupBy::Cgroup => report
            .cgroups
            .iter()
            .map(|c| {
                let label = cgroup_label(c);
                TopRow {
                    key: label.clone(),
                    name: label,
                    // Bytes the cgroup's memory limit does not see.
                    detail: c.accounting.unaccounted_bytes.to_string(),
                    counts: c.counts.clone(),
                    net_bytes: None,
                    stacks: Vec::new(),
                    estimated: false,
                    source: None,
                }
            })
            .collect(),
    }
}

/// The source column of a view: shown when its rows carry their source.
pub fn source_column(rows: &[TopRow]) -> SourceColumn {
    SourceColumn(rows.iter().any(|r| r.source.is_some()))
}

fn sort_value(r: &TopRow, by: TopSort) -> f64 {
    let c = &r.counts;
    match by {
        TopSort::Bytes => c.bytes_alloc as f64,
        TopSort::Count => c.count as f64,
        TopSort::Req => c.bytes_req as f64,
        TopSort::Waste => c.waste_bytes as f64,
        TopSort::WastePct => c.waste_pct,
        TopSort::Avg => c.avg_size,
        // Rows without attributable frees sort below every known value.
        TopSort::Net => r.net_bytes.map_or(f64::NEG_INFINITY, |n| n as f64),
    }
}

/// Heaviest first; ties by name so the order is stable between refreshes.
pub fn sort_rows(rows: &mut [TopRow], by: TopSort) {
    rows.sort_by(|a, b| {
        sort_value(b, by)
            .total_cmp(&sort_value(a, by))
            .then_with(|| a.name.cmp(&b.name))
    });
}

/// Column headers: two identifying columns (and the source after the
/// first, when shown), then the rates.
pub fn headers(by: GroupBy, source: SourceColumn) -> Vec<&'static str> {
    let first: [&str; 2] = match by {
        GroupBy::Site => ["site", "cache"],
        GroupBy::Stack => ["stack", "cache"],
        GroupBy::Cache => ["cache", "frees/s"],
        GroupBy::Process => ["pid", "comm"],
        GroupBy::Cgroup => ["cgroup", "unacct/s"],
    };
    let first = source.headers(&first);
    first.into_iter().chain(RATE_HEADERS).collect()
}

pub const RATE_HEADERS: [&str; 7] = [
    "allocs/s", "req/s", "alloc/s", "waste/s", "waste%", "avg", "net/s",
];

/// A per-second rate over an interval.
pub fn per_sec(v: u64, interval_s: f64) -> f64 {
    if interval_s > 0.0 {
        v as f64 / interval_s
    } else {
        0.0
    }
}

/// The formatted cells of one row, matching `headers` (the source column
/// is there when the row has a source).
pub fn cells(r: &TopRow, by: GroupBy, interval_s: f64) -> Vec<String> {
    let c = &r.counts;
    let rate = |v: u64| per_sec(v, interval_s);
    let est = if r.estimated { "~" } else { "" };
    let detail = match by {
        GroupBy::Cache => match r.detail.parse::<u64>() {
            Ok(frees) => human_count(rate(frees).round() as u64),
            Err(_) => r.detail.clone(),
        },
        GroupBy::Cgroup => match r.detail.parse::<u64>() {
            Ok(bytes) => human_size(rate(bytes).round() as u64),
            Err(_) => r.detail.clone(),
        },
        _ => r.detail.clone(),
    };
    let names = vec![r.name.clone(), detail];
    let names = match r.source {
        Some(s) => SourceColumn(true).cells(names, s),
        None => names,
    };
    names
        .into_iter()
        .chain([
            format!("{est}{}", human_count(rate(c.count).round() as u64)),
            format!("{est}{}", human_size(rate(c.bytes_req).round() as u64)),
            format!("{est}{}", human_size(rate(c.bytes_alloc).round() as u64)),
            format!("{est}{}", human_size(rate(c.waste_bytes).round() as u64)),
            format!("{:.1}%", c.waste_pct),
            format!("{:.0}", c.avg_size),
            match r.net_bytes {
                Some(n) => {
                    signed_size((n as f64 / interval_s.max(f64::MIN_POSITIVE)).round() as i64)
                }
                None => "-".into(),
            },
        ])
        .collect()
}

/// One interval as read and reported, with how it was read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Wall-clock end of the interval, UTC, RFC 3339.
    pub time: String,
    /// Measured length of the interval: the time between the two map reads.
    pub interval_s: f64,
    /// Idle map entries deleted after this interval (their counts are kept).
    pub aged_out: u64,
    pub overhead: Overhead,
    /// Counts over the interval, with the same fields as `kheap record`.
    #[serde(flatten)]
    pub report: Report,
}

/// What the user chose to see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewOptions {
    pub by: GroupBy,
    pub sort: TopSort,
    pub paused: bool,
}

/// The header above the table, each line in at most `width` characters:
/// its full form when that fits, else a shorter one with the same numbers
/// (an 80-column terminal), else that one elided in the middle.
pub fn header_lines(
    iv: &Interval,
    v: &ViewOptions,
    shown: usize,
    total: usize,
    width: usize,
) -> Vec<String> {
    let r = &iv.report;
    let s = iv.interval_s;
    let t = &r.totals;
    let rate = |v: u64| per_sec(v, s).round() as u64;
    let paused = if v.paused { "  [PAUSED]" } else { "" };
    let title = format!(
        "kheap top  {}  interval {:.2}s  view: {}  sort: {}{paused}",
        iv.time,
        s,
        group_name(v.by),
        v.sort.column(),
    );
    let title_short = format!(
        "kheap top  {}  {:.2}s  view {}, sort {}{paused}",
        iv.time,
        s,
        group_name(v.by),
        v.sort.column(),
    );
    let (allocs, frees) = (human_count(rate(t.allocs)), human_count(rate(t.frees)));
    let (req, alloc, waste) = (
        human_size(rate(t.bytes_req)),
        human_size(rate(t.bytes_alloc)),
        human_size(rate(t.waste_bytes)),
    );
    let waste_pct = pct(t.waste_bytes, t.bytes_alloc);
    let events = format!(
        "events: {allocs} allocs/s, {frees} frees/s; {req}/s requested, {alloc}/s allocated, {waste}/s wasted ({waste_pct:.1}%)"
    );
    let events_short = format!(
        "{allocs} allocs/s {frees} frees/s  req {req}/s alloc {alloc}/s waste {waste}/s ({waste_pct:.1}%)"
    );
    let (sampling, sampling_short) = match r.sampling.stack_sample_every {
        0 => ("no stacks".to_string(), "no stacks".to_string()),
        1 => (
            "every stack (exact)".to_string(),
            "exact stacks".to_string(),
        ),
        n => (
            format!(
                "stacks sampled 1 in {n} ({} this interval; stack rows are estimates)",
                r.sampling.stack_samples
            ),
            format!("stacks 1/{n} ({})", r.sampling.stack_samples),
        ),
    };
    let failed = unless_zero(t.failed_allocs, "failed allocs");
    let misses = r.lost.recursion_misses;
    let losses = format!(
        "sampling: {sampling}; lost: {} stacks, {} map-full drops{}{failed}; aged out: {} idle keys",
        r.lost.stacks,
        r.lost.map_full,
        unless_zero(misses, "skipped by the kernel (recursion)"),
        iv.aged_out
    );
    let losses_short = format!(
        "{sampling_short}; lost: {} stacks, {} drops{}{failed}; aged out {}",
        r.lost.stacks,
        r.lost.map_full,
        unless_zero(misses, "skipped"),
        iv.aged_out
    );
    let o = &iv.overhead;
    let runs = human_count(rate(o.bpf_runs));
    let own = format!(
        "kheap {:.1}% CPU, {} RSS",
        o.self_cpu_pct,
        human_size(o.self_max_rss_bytes)
    );
    let (overhead, overhead_short) = if o.bpf_stats {
        (
            format!(
                "overhead: BPF {:.1}% of a CPU ({:.0} ns x {runs} runs/s); {own}",
                o.bpf_cpu_pct, o.bpf_ns_per_run
            ),
            format!(
                "overhead: BPF {:.1}% CPU ({:.0} ns x {runs}/s); {own}",
                o.bpf_cpu_pct, o.bpf_ns_per_run
            ),
        )
    } else {
        (
            format!("overhead: BPF run time unknown (statistics could not be enabled); {own}"),
            format!("overhead: BPF time unknown; {own}"),
        )
    };
    let mut rows = format!("rows: {shown} of {total}");
    if total > shown {
        let _ = write!(rows, " ({} hidden)", total - shown);
    }
    let mut lines: Vec<String> = [
        [title, title_short],
        [events, events_short],
        [losses, losses_short],
        [overhead, overhead_short],
        [rows.clone(), rows],
    ]
    .iter()
    .map(|[full, short]| fitting_line(&[full, short], width).into_owned())
    .collect();
    // What this run could not trace or name (a hook this kernel lacks,
    // frees counted in the totals only): numbers read without it mislead.
    if !r.run.skipped.is_empty() {
        let notes = format!("notes: {}", r.run.skipped.join("; "));
        lines.push(fitting_line(&[&notes], width).into_owned());
    }
    lines
}

#[cfg(test)]
mod tests;
