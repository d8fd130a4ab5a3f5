//! Rendering a report: tables (comfy-table), bpftrace-style histograms,
//! folded stacks and JSON. Pure string building.

use std::fmt::Write as _;

use clap::ValueEnum;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};

use crate::model::{human_count, human_size, Bucket};
use crate::report::{Counts, Report};

/// Table rows default to 20; JSON and folded output show every row unless
/// `-n` says otherwise.
pub fn default_top(format: Format, top: Option<usize>) -> Option<usize> {
    match format {
        Format::Table => Some(top.unwrap_or(20)),
        _ => top,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    Site,
    Stack,
    Cache,
    Process,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    /// Bytes allocated (what the slab allocator handed out)
    Bytes,
    Count,
    /// Bytes lost to size-class rounding
    Waste,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    /// `frame;frame;… count` lines for flamegraph tools
    Folded,
}

pub fn sort_key(c: &Counts, by: SortBy) -> u64 {
    match by {
        SortBy::Bytes => c.bytes_alloc,
        SortBy::Count => c.count,
        SortBy::Waste => c.waste_bytes,
    }
}

/// Sorts rows in place, heaviest first, and keeps the top `n`; returns how
/// many rows were cut.
pub fn top_rows<T>(
    rows: &mut Vec<T>,
    counts: impl Fn(&T) -> &Counts,
    by: SortBy,
    n: Option<usize>,
) -> usize {
    rows.sort_by_key(|r| std::cmp::Reverse(sort_key(counts(r), by)));
    match n {
        Some(n) if rows.len() > n => {
            let hidden = rows.len() - n;
            rows.truncate(n);
            hidden
        }
        _ => 0,
    }
}

/// Applies sort and top-N to every row list of the report; returns how many
/// rows of the grouping that is shown were cut.
pub fn apply_top(report: &mut Report, by: SortBy, n: Option<usize>) -> usize {
    let hidden = [
        top_rows(&mut report.sites, |r| &r.counts, by, n),
        top_rows(&mut report.stacks, |r| &r.counts, by, n),
        top_rows(&mut report.caches, |r| &r.counts, by, n),
        top_rows(&mut report.processes, |r| &r.counts, by, n),
    ];
    hidden.into_iter().max().unwrap_or(0)
}

/// The one-paragraph header above every table.
pub fn header(r: &Report) -> String {
    let mut s = String::new();
    // Said first and loudly: the numbers below are missing events.
    for what in &r.sampling.incomplete {
        let _ = writeln!(s, "INCOMPLETE: {what}");
    }
    let _ = writeln!(
        s,
        "kheap: {} on {}; {} allocs ({} req, {} alloc, {} wasted = {:.1}%), {} frees",
        if r.duration_s < 1.0 {
            format!("{:.0}ms", r.duration_s * 1000.0)
        } else {
            format!("{:.1}s", r.duration_s)
        },
        r.run.kernel,
        human_count(r.totals.allocs),
        human_size(r.totals.bytes_req),
        human_size(r.totals.bytes_alloc),
        human_size(r.totals.waste_bytes),
        crate::model::pct(r.totals.waste_bytes, r.totals.bytes_alloc),
        human_count(r.totals.frees),
    );
    let _ = writeln!(s, "attach: {}", r.run.attach.join(", "));
    if !r.run.skipped.is_empty() {
        let _ = writeln!(s, "skipped: {}", r.run.skipped.join("; "));
    }
    if !r.run.filters.is_empty() {
        let _ = writeln!(s, "filters: {}", r.run.filters.join(", "));
    }
    let exact = match (r.sampling.sites_exact, r.sampling.processes_exact) {
        (true, true) => "sites, caches and processes are exact",
        (true, false) => "sites and caches are exact, processes are not",
        (false, true) => "sites and caches are NOT exact (see INCOMPLETE above)",
        (false, false) => "sites, caches and processes are NOT exact (see INCOMPLETE above)",
    };
    let sampling = if r.sampling.stack_sample_every <= 1 {
        format!("stacks: every allocation; {exact}")
    } else {
        format!(
            "stacks: sampled 1 in {} (and each site's first; {} captured), per-stack numbers are estimates scaled to site totals; {exact}",
            r.sampling.stack_sample_every, r.sampling.stack_samples
        )
    };
    let _ = writeln!(s, "{sampling}");
    let _ = writeln!(
        s,
        "lost: {} stacks ({} hash collisions), {} events not aggregated (map full){}",
        r.lost.stacks,
        r.lost.stack_collisions,
        r.lost.map_full,
        if r.totals.failed_allocs > 0 {
            format!(
                ", {} failed allocations not counted",
                r.totals.failed_allocs
            )
        } else {
            String::new()
        }
    );
    s
}

/// A table in the style of every kheap table: plain UTF-8 borders, numbers
/// right-aligned, no colours (so no escape codes in logs).
pub fn new_table(headers: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(headers.iter().map(Cell::new));
    for i in 1..headers.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

fn count_cells(c: &Counts) -> Vec<Cell> {
    vec![
        Cell::new(c.count),
        Cell::new(human_size(c.bytes_req)),
        Cell::new(human_size(c.bytes_alloc)),
        Cell::new(human_size(c.waste_bytes)),
        Cell::new(format!("{:.1}%", c.waste_pct)),
        Cell::new(format!("{:.0}", c.avg_size)),
    ]
}

const COUNT_HEADERS: [&str; 6] = ["count", "req", "alloc", "waste", "waste%", "avg"];

fn headers_with(first: &[&'static str]) -> Vec<&'static str> {
    first.iter().copied().chain(COUNT_HEADERS).collect()
}

/// The report as tables, grouped as asked.
pub fn table(r: &Report, by: GroupBy, hidden: usize, stack_details: usize) -> String {
    let mut out = header(r);
    out.push('\n');
    match by {
        GroupBy::Site => {
            let mut t = new_table(&headers_with(&["site", "cache"]));
            for row in &r.sites {
                let mut cells = vec![Cell::new(&row.location), Cell::new(cache_list(&row.caches))];
                cells.extend(count_cells(&row.counts));
                t.add_row(cells);
            }
            let _ = writeln!(out, "{t}");
            if stack_details > 0 && !r.stacks.is_empty() {
                let _ = writeln!(out, "\nTop stacks:");
                out.push_str(&stack_details_text(r, stack_details));
            }
        }
        GroupBy::Stack => out.push_str(&stack_details_text(r, r.stacks.len())),
        GroupBy::Cache => {
            let mut t = new_table(&headers_with(&["cache", "frees"]));
            for row in &r.caches {
                let mut cells = vec![Cell::new(&row.name), Cell::new(row.frees)];
                cells.extend(count_cells(&row.counts));
                t.add_row(cells);
            }
            let _ = writeln!(out, "{t}");
        }
        GroupBy::Process => {
            let mut t = new_table(&headers_with(&["pid", "comm"]));
            for row in &r.processes {
                let mut cells = vec![Cell::new(row.pid), Cell::new(&row.comm)];
                cells.extend(count_cells(&row.counts));
                t.add_row(cells);
            }
            if r.processes.is_empty() {
                let _ = writeln!(out, "(no per-process data)");
            }
            let _ = writeln!(out, "{t}");
        }
    }
    if hidden > 0 {
        let _ = writeln!(out, "({hidden} more rows not shown; use -n to see more)");
    }
    if !r.latency.is_empty() {
        out.push_str(&latency_text(r));
    }
    out
}

/// Time inside the allocator per call site, with the slowest site's
/// histogram (nanoseconds).
fn latency_text(r: &Report) -> String {
    let mut out = String::from("\nAllocator latency (time inside the allocator, per call site):\n");
    let mut t = new_table(&["site", "allocator", "calls", "avg ns", "total"]);
    for row in r.latency.iter().take(20) {
        t.add_row(vec![
            Cell::new(if row.call_site.is_empty() {
                &row.function
            } else {
                &row.call_site
            }),
            Cell::new(&row.allocator),
            Cell::new(row.count),
            Cell::new(format!("{:.0}", row.avg_ns)),
            Cell::new(format!("{:.2} ms", row.total_ns as f64 / 1e6)),
        ]);
    }
    let _ = writeln!(out, "{t}");
    if let Some(top) = r.latency.first() {
        let _ = writeln!(out, "{} via {} (ns):", top.function, top.allocator);
        out.push_str(&histogram(&top.hist, "    "));
    }
    out
}

/// A site's caches, the first two by name: a table cell, not a list.
fn cache_list(caches: &[String]) -> String {
    match caches {
        [] => String::new(),
        [a] => a.clone(),
        [a, b] => format!("{a},{b}"),
        [a, b, rest @ ..] => format!("{a},{b} +{}", rest.len()),
    }
}

fn stack_details_text(r: &Report, n: usize) -> String {
    let mut out = String::new();
    for (i, s) in r.stacks.iter().take(n).enumerate() {
        let est = if s.estimated { "~" } else { "" };
        let _ = writeln!(
            out,
            "#{} {}  {}{} allocs, {}{} req, {}{} alloc, {} wasted ({:.1}%), cache {}",
            i + 1,
            s.function,
            est,
            s.counts.count,
            est,
            human_size(s.counts.bytes_req),
            est,
            human_size(s.counts.bytes_alloc),
            human_size(s.counts.waste_bytes),
            s.counts.waste_pct,
            s.cache
        );
        for f in &s.frames {
            let _ = writeln!(out, "    {f}");
        }
        out.push_str(&histogram(&s.counts.hist, "    "));
        out.push('\n');
    }
    out
}

fn bucket_label(v: u64) -> String {
    match v {
        u64::MAX => "...".into(),
        v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{}G", v >> 30),
        v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}M", v >> 20),
        v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}K", v >> 10),
        v => v.to_string(),
    }
}

/// A log2 histogram drawn like bpftrace's `hist()`.
pub fn histogram(buckets: &[Bucket], indent: &str) -> String {
    const WIDTH: u64 = 52;
    let mut out = String::new();
    let Some(max) = buckets.iter().map(|b| b.count).max() else {
        return out;
    };
    for b in buckets {
        let range = format!("[{}, {})", bucket_label(b.lo), bucket_label(b.hi));
        let bar = (b.count * WIDTH).div_ceil(max.max(1)) as usize;
        let _ = writeln!(
            out,
            "{indent}{range:<18} {:>10} |{:<width$}|",
            b.count,
            "@".repeat(bar),
            width = WIDTH as usize
        );
    }
    out
}

/// `outer;…;inner count` lines (callers first), the input format of
/// flamegraph.pl and inferno. Counts are allocations.
pub fn folded(r: &Report) -> String {
    let mut out = String::new();
    for s in &r.stacks {
        let names: Vec<&str> = s.frames.iter().rev().map(|f| strip_offset(f)).collect();
        let _ = writeln!(out, "{} {}", names.join(";"), s.counts.count);
    }
    out
}

fn strip_offset(frame: &str) -> &str {
    frame.split_once('+').map_or(frame, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{fixture_symbols, sample_snapshot};
    use crate::report::{build, BuildOptions, RunInfo};

    fn report() -> Report {
        build(
            &sample_snapshot(),
            &fixture_symbols(),
            BuildOptions {
                stack_sample_every: 10,
                duration_s: 2.0,
                run: RunInfo {
                    kernel: "6.18.0".into(),
                    attach: vec!["kmalloc: tp_btf".into()],
                    ..Default::default()
                },
            },
        )
    }

    #[test]
    fn histogram_looks_like_bpftrace() {
        let h = histogram(
            &[
                Bucket {
                    lo: 2048,
                    hi: 4096,
                    count: 100,
                },
                Bucket {
                    lo: 4096,
                    hi: 8192,
                    count: 50,
                },
            ],
            "",
        );
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("[2K, 4K)"), "{h}");
        assert!(lines[0].contains(&format!("|{}|", "@".repeat(52))), "{h}");
        assert!(
            lines[1].contains(&format!("|{}{}|", "@".repeat(26), " ".repeat(26))),
            "{h}"
        );
    }

    #[test]
    fn site_table_has_label_counts_and_waste() {
        let r = report();
        let t = table(&r, GroupBy::Site, 0, 1);
        assert!(t.contains("load_msg+0x10"), "{t}");
        assert!(t.contains("kmalloc-cg-4k"), "{t}");
        assert!(t.contains("47.6%"), "{t}");
        assert!(t.contains("sampled 1 in 10"), "{t}");
        assert!(
            t.contains("Top stacks:") && t.contains("#1 load_msg"),
            "{t}"
        );
        assert!(t.contains("lost: 2 stacks"), "{t}");
    }

    #[test]
    fn top_n_cuts_and_counts_hidden_rows() {
        let mut r = report();
        let hidden = apply_top(&mut r, SortBy::Count, Some(1));
        assert_eq!(r.sites.len(), 1);
        assert_eq!(hidden, 2, "three stacks, one kept");
        let t = table(&r, GroupBy::Cache, hidden, 0);
        assert!(t.contains("2 more rows"), "{t}");
    }

    #[test]
    fn folded_lines_are_callers_first() {
        let f = folded(&report());
        assert!(
            f.lines()
                .any(|l| l == "do_msgsnd;load_msg;__kmalloc_noprof 1000"),
            "{f}"
        );
    }
}
