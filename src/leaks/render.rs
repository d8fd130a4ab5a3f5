//! Rendering a leaks report: what is outstanding (retained) beside what was
//! allocated and freed (transient), with age histograms. Pure string
//! building; the shared header and table style come from `render`.

use std::fmt::Write as _;

use clap::ValueEnum;
use comfy_table::Cell;

use crate::leaks::live::AgeBucket;
use crate::leaks::retention::{sort_by_retention, Retention};
use crate::model::{human_count, human_size};
use crate::render;
use crate::report::{Counts, Report};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LeakGroupBy {
    Site,
    Stack,
    Cache,
    /// The process that allocated the outstanding objects
    Process,
}

/// Sorts every row list (largest outstanding, then oldest, first) and keeps
/// the top `n`; returns how many rows of the shown grouping were cut.
pub fn apply_top(r: &mut Report, by: LeakGroupBy, n: Option<usize>) -> usize {
    sort_by_retention(&mut r.sites, |r| (&r.retention, &r.counts));
    sort_by_retention(&mut r.stacks, |r| (&r.retention, &r.counts));
    sort_by_retention(&mut r.caches, |r| (&r.retention, &r.counts));
    let cut = |len: &mut usize| match n {
        Some(n) if *len > n => {
            let hidden = *len - n;
            *len = n;
            hidden
        }
        _ => 0,
    };
    let procs = r.leaks.as_mut().map(|l| &mut l.processes);
    let mut d = procs.as_ref().map_or(0, |p| p.len());
    let (mut a, mut b, mut c) = (r.sites.len(), r.stacks.len(), r.caches.len());
    let hidden = [cut(&mut a), cut(&mut b), cut(&mut c), cut(&mut d)];
    if let Some(p) = procs {
        p.truncate(d);
    }
    r.sites.truncate(a);
    r.stacks.truncate(b);
    r.caches.truncate(c);
    match by {
        LeakGroupBy::Site => hidden[0],
        LeakGroupBy::Stack => hidden[1],
        LeakGroupBy::Cache => hidden[2],
        LeakGroupBy::Process => hidden[3],
    }
}

/// Seconds as a short duration: 850ms, 12.5s, 3m20s, 2h05m.
pub fn human_age(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0}ms", s * 1000.0)
    } else if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

/// The lines about retention under the shared header.
pub fn leak_header(r: &Report) -> String {
    let mut s = render::header(r);
    let Some(l) = &r.leaks else {
        return s;
    };
    let est = if l.estimated { "~" } else { "" };
    let t = &l.retention;
    let min_age = if l.min_age_s > 0.0 {
        format!(" at least {} old", human_age(l.min_age_s))
    } else {
        String::new()
    };
    let growth = if r.duration_s >= crate::leaks::retention::MIN_RATE_DURATION_S {
        format!("growth {est}{}/s", human_size(t.growth_bytes_per_s as u64))
    } else {
        "no growth rate (run shorter than 1 s)".to_string()
    };
    let _ = writeln!(
        s,
        "outstanding: {est}{} objects, {est}{} allocated while tracing and not freed{min_age} (oldest {}); {growth}",
        human_count(t.outstanding_count),
        human_size(t.outstanding_bytes),
        human_age(t.oldest_s),
    );
    let _ = writeln!(
        s,
        "transient: {est}{} objects ({est}{}) allocated and freed during the run",
        human_count(t.freed_count),
        human_size(t.freed_bytes),
    );
    if l.estimated {
        let _ = writeln!(
            s,
            "sampling: about 1 address in {} tracked (by address hash); every number is an estimate scaled by {}",
            l.sample_every, l.sample_every
        );
    }
    let _ = writeln!(
        s,
        "ignored frees: {} of untracked objects (allocated before tracing, or filtered out), {} of NULL",
        l.frees_untracked, l.frees_null
    );
    let _ = writeln!(
        s,
        "not tracked: {} allocations (object map full, --max-objects {}); {} map updates busy; {} events dropped by BPF recursion",
        l.map_full_objects, l.max_objects, l.map_busy, l.recursion_misses
    );
    if t.freed_unseen > 0 || l.reused_live > 0 {
        let _ = writeln!(
            s,
            "unseen frees: {} tracked objects were freed without a tracepoint (their address came back from the allocator)",
            l.reused_live
        );
    }
    let _ = writeln!(
        s,
        "invisible free paths: {}",
        l.unseen_free_paths.join("; ")
    );
    s
}

fn retention_cells(ret: &Option<Retention>, counts: &Counts) -> Vec<Cell> {
    let r = ret.clone().unwrap_or_default();
    vec![
        Cell::new(r.outstanding_count),
        Cell::new(human_size(r.outstanding_bytes)),
        Cell::new(human_age(r.oldest_s)),
        Cell::new(counts.count),
        Cell::new(human_size(counts.bytes_alloc)),
        Cell::new(r.freed_count),
        Cell::new(r.freed_unseen),
        Cell::new(format!("{}/s", human_size(r.growth_bytes_per_s as u64))),
    ]
}

const RETENTION_HEADERS: [&str; 8] = [
    "live",
    "live bytes",
    "oldest",
    "allocs",
    "alloc bytes",
    "freed",
    "unseen",
    "growth",
];

fn headers_with(first: &[&'static str]) -> Vec<&'static str> {
    first.iter().copied().chain(RETENTION_HEADERS).collect()
}

/// The report as tables: retained first, transient beside it.
pub fn table(r: &Report, by: LeakGroupBy, hidden: usize, details: usize) -> String {
    let mut out = leak_header(r);
    out.push('\n');
    match by {
        LeakGroupBy::Site => {
            let mut t = render::new_table(&headers_with(&["site", "cache"]));
            for row in &r.sites {
                let mut cells = vec![Cell::new(&row.location), Cell::new(row.caches.join(","))];
                cells.extend(retention_cells(&row.retention, &row.counts));
                t.add_row(cells);
            }
            let _ = writeln!(out, "{t}");
            let held: Vec<_> = r
                .sites
                .iter()
                .filter_map(|s| s.retention.as_ref().map(|ret| (s, ret)))
                .filter(|(_, ret)| ret.outstanding_count > 0)
                .take(details)
                .collect();
            if !held.is_empty() {
                let _ = writeln!(out, "\nAges of what the top sites hold:");
                for (s, ret) in held {
                    let _ = writeln!(out, "{} ({} objects)", s.location, ret.outstanding_count);
                    out.push_str(&age_histogram(&ret.ages, "    "));
                }
            }
            if details > 0 && !r.stacks.is_empty() {
                let _ = writeln!(out, "\nTop stacks:");
                out.push_str(&stack_details(r, details));
            }
        }
        LeakGroupBy::Stack => out.push_str(&stack_details(r, r.stacks.len())),
        LeakGroupBy::Process => {
            let mut t =
                render::new_table(&["pid", "comm", "live", "live bytes", "oldest", "growth"]);
            for p in r.leaks.iter().flat_map(|l| &l.processes) {
                let ret = &p.retention;
                t.add_row(vec![
                    Cell::new(p.pid),
                    Cell::new(if p.comm.is_empty() {
                        "(exited)"
                    } else {
                        &p.comm
                    }),
                    Cell::new(ret.outstanding_count),
                    Cell::new(human_size(ret.outstanding_bytes)),
                    Cell::new(human_age(ret.oldest_s)),
                    Cell::new(format!("{}/s", human_size(ret.growth_bytes_per_s as u64))),
                ]);
            }
            let _ = writeln!(
                out,
                "Outstanding objects by the process that allocated them:\n{t}"
            );
        }
        LeakGroupBy::Cache => {
            let mut t = render::new_table(&headers_with(&["cache"]));
            for row in &r.caches {
                let mut cells = vec![Cell::new(&row.name)];
                cells.extend(retention_cells(&row.retention, &row.counts));
                t.add_row(cells);
            }
            let _ = writeln!(out, "{t}");
        }
    }
    if hidden > 0 {
        let _ = writeln!(out, "({hidden} more rows not shown; use -n to see more)");
    }
    out
}

fn stack_details(r: &Report, n: usize) -> String {
    let mut out = String::new();
    for (i, s) in r.stacks.iter().take(n).enumerate() {
        let ret = s.retention.clone().unwrap_or_default();
        let est = if s.estimated { "~" } else { "" };
        let _ = writeln!(
            out,
            "#{} {}  {est}{} live ({est}{}), oldest {}; {est}{} allocated, {est}{} freed; cache {}",
            i + 1,
            s.function,
            ret.outstanding_count,
            human_size(ret.outstanding_bytes),
            human_age(ret.oldest_s),
            s.counts.count,
            ret.freed_count,
            s.cache
        );
        for f in &s.frames {
            let _ = writeln!(out, "    {f}");
        }
        out.push_str(&age_histogram(&ret.ages, "    "));
        out.push('\n');
    }
    out
}

fn age_label(s: f64) -> String {
    if s == f64::MAX {
        "...".into()
    } else if s < 1.0 {
        format!("{}ms", (s * 1000.0).round())
    } else {
        format!("{}s", (s * 1000.0).round() / 1000.0)
    }
}

/// Ages drawn like bpftrace's `hist()`: objects per bucket, with bytes.
pub fn age_histogram(buckets: &[AgeBucket], indent: &str) -> String {
    const WIDTH: u64 = 40;
    let mut out = String::new();
    let Some(max) = buckets.iter().map(|b| b.count).max() else {
        return out;
    };
    for b in buckets {
        let range = format!("[{}, {})", age_label(b.lo_s), age_label(b.hi_s));
        let bar = (b.count * WIDTH).div_ceil(max.max(1)) as usize;
        let _ = writeln!(
            out,
            "{indent}{range:<20} {:>8} {:>8} |{:<width$}|",
            b.count,
            human_size(b.bytes),
            "@".repeat(bar),
            width = WIDTH as usize
        );
    }
    out
}

/// `outer;…;inner bytes` lines of the stacks still holding memory, weighted
/// by outstanding bytes, for flamegraph tools.
pub fn folded(r: &Report) -> String {
    let mut out = String::new();
    for s in &r.stacks {
        let bytes = s.retention.as_ref().map_or(0, |r| r.outstanding_bytes);
        if bytes == 0 {
            continue;
        }
        let names: Vec<&str> = s
            .frames
            .iter()
            .rev()
            .map(|f| f.split_once('+').map_or(f.as_str(), |(n, _)| n))
            .collect();
        let _ = writeln!(out, "{} {bytes}", names.join(";"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{fixture_symbols, leak_snapshot};
    use crate::report::{build, BuildOptions, RunInfo};

    fn report(sample_every: u32) -> Report {
        build(
            &leak_snapshot(sample_every),
            &fixture_symbols(),
            BuildOptions {
                stack_sample_every: 10,
                duration_s: 2.0,
                run: RunInfo {
                    kernel: "6.18.0".into(),
                    ..Default::default()
                },
            },
        )
    }

    #[test]
    fn ages_read_like_durations() {
        assert_eq!(human_age(0.25), "250ms");
        assert_eq!(human_age(12.5), "12.5s");
        assert_eq!(human_age(200.0), "3m20s");
        assert_eq!(human_age(7500.0), "2h05m");
    }

    #[test]
    fn site_table_puts_retained_beside_transient() {
        let r = report(1);
        let t = table(&r, LeakGroupBy::Site, 0, 1);
        assert!(t.contains("outstanding: 420 objects, 1.6M"), "{t}");
        assert!(t.contains("transient: 875 objects"), "{t}");
        assert!(t.contains("ignored frees: 123 of untracked objects"), "{t}");
        assert!(t.contains(", 9 of NULL"), "{t}");
        assert!(t.contains("3 events dropped by BPF recursion"), "{t}");
        assert!(
            t.contains("invisible free paths: kmem_cache_free_bulk"),
            "{t}"
        );
        let row = t.lines().find(|l| l.contains("load_msg+0x10")).unwrap();
        for cell in ["400", "1.6M", "1.5s", "1000", "600"] {
            assert!(row.contains(cell), "{cell} missing in {row}");
        }
        assert!(t.contains("Ages of what the top sites hold:"), "{t}");
        assert!(t.contains("[1.024s, 2.048s)"), "{t}");
        assert!(!t.contains("sampling: about"), "{t}");
    }

    #[test]
    fn sampled_reports_say_they_are_estimates() {
        let t = table(&report(4), LeakGroupBy::Cache, 0, 0);
        assert!(t.contains("about 1 address in 4 tracked"), "{t}");
        assert!(t.contains("outstanding: ~1.7k objects"), "{t}");
        assert!(t.contains("kmalloc-cg-4k"), "{t}");
    }

    #[test]
    fn process_view_lists_what_each_allocator_holds() {
        let mut r = report(1);
        let procs = &r.leaks.as_ref().unwrap().processes;
        assert_eq!(procs.len(), 1);
        assert_eq!((procs[0].pid, procs[0].comm.as_str()), (7, "msgd"));
        assert_eq!(procs[0].retention.outstanding_count, 420);
        let hidden = apply_top(&mut r, LeakGroupBy::Process, Some(5));
        let t = table(&r, LeakGroupBy::Process, hidden, 0);
        let row = t
            .lines()
            .find(|l| l.contains("msgd"))
            .unwrap_or_else(|| panic!("{t}"));
        assert!(row.contains("420") && row.contains("1.6M"), "{row}");
    }

    #[test]
    fn top_cuts_rows_and_folded_weighs_by_outstanding_bytes() {
        let mut r = report(1);
        assert_eq!(apply_top(&mut r, LeakGroupBy::Stack, Some(2)), 1);
        assert_eq!(r.stacks.len(), 2);
        let f = folded(&r);
        assert!(
            f.lines()
                .any(|l| l == format!("do_msgsnd;load_msg;__kmalloc_noprof {}", 400 * 4096)),
            "{f}"
        );
    }
}
