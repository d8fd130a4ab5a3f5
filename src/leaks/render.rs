//! Rendering a leaks report: what is outstanding (retained) beside what was
//! allocated and freed (transient), with age histograms. Pure string
//! building; the shared header and table style come from `render`.

use std::fmt::Write as _;

use std::sync::OnceLock;

use clap::builder::PossibleValue;
use clap::ValueEnum;
use comfy_table::Cell;

use crate::model::live::AgeBucket;
use crate::model::{human_count, human_size, unmerged_cache_name, Counts};
use crate::render::hist::{self, HistLine};
use crate::render::table::{hidden_note, table_text};
use crate::render::{self, Format, OutputFormat, SourceColumn};
use crate::report::retention::{sort_by_retention, Retention};
use crate::report::{top_n, Report, StackRow};

/// `kheap leaks --format`: the formats of every report, and the timeline's
/// chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaksFormat {
    /// One of the formats every report has, with its name and help text.
    Common(Format),
    /// The timeline as a chart: one self-contained HTML page.
    Html,
}

/// `--format html`'s help; the other values keep `Format`'s.
const HTML_HELP: &str =
    "The timeline as a chart: one self-contained HTML page (needs -o FILE or a pipe)";

/// Written by hand because clap's derive cannot flatten an enum into
/// another: the values are `Format`'s, in its order, then `html`.
impl ValueEnum for LeaksFormat {
    fn value_variants<'a>() -> &'a [Self] {
        static VARIANTS: OnceLock<Vec<LeaksFormat>> = OnceLock::new();
        VARIANTS.get_or_init(|| {
            Format::value_variants()
                .iter()
                .map(|&f| LeaksFormat::Common(f))
                .chain([LeaksFormat::Html])
                .collect()
        })
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            LeaksFormat::Common(f) => f.to_possible_value(),
            LeaksFormat::Html => Some(PossibleValue::new("html").help(HTML_HELP)),
        }
    }
}

impl OutputFormat for LeaksFormat {
    fn is_table(self) -> bool {
        matches!(self, LeaksFormat::Common(f) if f.is_table())
    }
    fn is_file_only(self) -> bool {
        match self {
            LeaksFormat::Common(f) => f.is_file_only(),
            LeaksFormat::Html => true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LeakGroupBy {
    Site,
    Stack,
    Cache,
    /// The process that allocated the outstanding objects
    Process,
    /// The cgroup v2 that allocated them (container, service), with the
    /// bytes charged to its memory cgroup and not; interrupts apart
    Cgroup,
}

/// Sorts every row list (largest outstanding, then oldest, first) and keeps
/// the top `n`; returns how many rows of the shown grouping were cut.
pub fn apply_top(r: &mut Report, by: LeakGroupBy, n: Option<usize>) -> usize {
    sort_by_retention(&mut r.sites, |r| (&r.retention, &r.counts));
    sort_by_retention(&mut r.stacks, |r| (&r.retention, &r.counts));
    sort_by_retention(&mut r.caches, |r| (&r.retention, &r.counts));
    sort_by_retention(&mut r.cgroups, |r| (&r.retention, &r.counts));
    let processes = r
        .leaks
        .as_mut()
        .map_or(0, |l| top_n::keep(&mut l.processes, n));
    let hidden = [
        top_n::keep(&mut r.sites, n),
        top_n::keep(&mut r.stacks, n),
        top_n::keep(&mut r.caches, n),
        processes,
        top_n::keep(&mut r.cgroups, n),
    ];
    match by {
        LeakGroupBy::Site => hidden[0],
        LeakGroupBy::Stack => hidden[1],
        LeakGroupBy::Cache => hidden[2],
        LeakGroupBy::Process => hidden[3],
        LeakGroupBy::Cgroup => hidden[4],
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
    let growth = if r.duration_s >= crate::report::retention::MIN_RATE_DURATION_S {
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
        "not tracked: {} allocations (object map full, --max-objects {}); {} map updates busy",
        l.map_full_objects, l.max_objects, l.map_busy
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
    if let Some(why) = &l.accounting_skipped {
        let _ = writeln!(s, "accounting: {why}");
    }
    for a in &l.accounting {
        let mut notes = Vec::new();
        if a.excluded_bytes > 0 {
            notes.push(format!(
                "{} not in {}",
                human_size(a.excluded_bytes),
                a.meminfo
            ));
        }
        // The page row compares every page: those backing other sources
        // count, and so do frees of pages allocated before the run.
        if a.counted_elsewhere_bytes > 0 {
            notes.push(format!(
                "+{} backing other sources",
                human_size(a.counted_elsewhere_bytes)
            ));
        }
        if a.frees_untracked_bytes > 0 {
            notes.push(format!(
                "-{} freed, allocated before the run",
                human_size(a.frees_untracked_bytes)
            ));
        }
        let excluded = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        let _ = writeln!(
            s,
            "accounting: {:<8} outstanding {:>8}{excluded}  {} {:>8}  unexplained {:>8}",
            a.source.name(),
            human_size(a.outstanding_bytes),
            a.meminfo,
            crate::model::signed_size(a.meminfo_change_bytes),
            crate::model::signed_size(a.unexplained_bytes),
        );
    }
    s
}

/// A row's naming cells, then what it holds and what it allocated.
fn with_retention<const N: usize>(
    names: [Cell; N],
    ret: &Option<Retention>,
    counts: &Counts,
) -> Vec<Cell> {
    let r = ret.clone().unwrap_or_default();
    names
        .into_iter()
        .chain([
            Cell::new(r.outstanding_count),
            Cell::new(human_size(r.outstanding_bytes)),
            Cell::new(human_age(r.oldest_s)),
            Cell::new(counts.count),
            Cell::new(human_size(counts.bytes_alloc)),
            Cell::new(r.freed_count),
            Cell::new(r.freed_unseen),
            Cell::new(format!("{}/s", human_size(r.growth_bytes_per_s as u64))),
        ])
        .collect()
}

/// What a row says of the caches its code asked for, where its objects
/// came from a merged cache: `asked: UNIX-STREAM 1600 of 1600` (of the
/// row's outstanding objects from that cache; those not counted in a name
/// are not known), after the cache's own name where the row has several
/// caches. Names escaped: a control character (a line end too) shows as
/// `\xNN`.
fn asked_note(ret: &Option<Retention>, one_cache: bool) -> Option<String> {
    let ret = ret.as_ref()?;
    let notes: Vec<String> = ret
        .merged_caches
        .iter()
        .map(|m| {
            let named = m
                .asked
                .iter()
                .map(|a| format!("{} {}", escape_name(&a.name), a.outstanding_count))
                .collect::<Vec<_>>()
                .join(" + ");
            let note = format!("asked: {named} of {}", m.outstanding_count);
            match one_cache {
                true => note,
                false => format!("{} {note}", unmerged_cache_name(&m.cache)),
            }
        })
        .collect();
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// A name read from the kernel, every control character escaped.
fn escape_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_control() || c == '\\' {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
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

/// The report as tables: retained first, transient beside it, fitted to
/// `width` columns.
pub fn table(
    r: &Report,
    by: LeakGroupBy,
    hidden: usize,
    details: usize,
    width: Option<u16>,
) -> String {
    let mut out = leak_header(r);
    out.push('\n');
    let source = SourceColumn::of(r);
    match by {
        LeakGroupBy::Site => {
            let rows = r.sites.iter().map(|row| {
                let [site, caches] = render::site_names(row);
                let caches = match asked_note(&row.retention, row.caches.len() == 1) {
                    Some(note) => {
                        Cell::new(format!("{}; {note}", render::short_list(&row.caches, 2)))
                    }
                    None => caches,
                };
                let cells = with_retention([site, caches], &row.retention, &row.counts);
                source.cells(cells, row.source)
            });
            out.push_str(&table_text(
                (&source.headers(&["site", "cache"]), &RETENTION_HEADERS),
                &source.text(&[1]),
                rows,
                width,
            ));
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
                    out.push_str(&age_histogram(&ret.ages, "    ", width));
                }
            }
            if details > 0 && !r.stacks.is_empty() {
                let _ = writeln!(out, "\nTop stacks:");
                out.push_str(&stack_details(r, &top_stacks(r, details), width));
            }
        }
        LeakGroupBy::Stack => {
            let all: Vec<&StackRow> = r.stacks.iter().collect();
            out.push_str(&stack_details(r, &all, width))
        }
        LeakGroupBy::Process => {
            let rows = r.leaks.iter().flat_map(|l| &l.processes).map(|p| {
                let ret = &p.retention;
                let (pid, comm) =
                    render::process_cells(p.process.pid, p.process.comm.as_deref(), "(exited)");
                vec![
                    Cell::new(pid),
                    Cell::new(comm),
                    Cell::new(ret.outstanding_count),
                    Cell::new(human_size(ret.outstanding_bytes)),
                    Cell::new(human_age(ret.oldest_s)),
                    Cell::new(format!("{}/s", human_size(ret.growth_bytes_per_s as u64))),
                ]
            });
            let headers = ["pid", "comm", "live", "live bytes", "oldest", "growth"];
            out.push_str("Outstanding objects by the process that allocated them:\n");
            out.push_str(&table_text((&headers, &[]), &[1], rows, width));
        }
        LeakGroupBy::Cgroup => {
            let rows = r.cgroups.iter().map(|row| {
                let split = row.outstanding_accounting.unwrap_or_default();
                with_retention(
                    [
                        Cell::new(render::cgroup_label(row)),
                        Cell::new(human_size(split.outstanding_accounted_bytes)),
                        Cell::new(human_size(split.outstanding_unaccounted_bytes)),
                    ],
                    &row.retention,
                    &row.counts,
                )
            });
            out.push_str("Outstanding objects by the cgroup that allocated them (live bytes charged to its memory cgroup, and not):\n");
            out.push_str(&table_text(
                (
                    &["cgroup", "live charged", "live uncharged"],
                    &RETENTION_HEADERS,
                ),
                &[0],
                rows,
                width,
            ));
        }
        LeakGroupBy::Cache => {
            let rows = r.caches.iter().map(|row| {
                let name = match asked_note(&row.retention, true) {
                    Some(note) => format!("{}; {note}", row.name),
                    None => row.name.clone(),
                };
                let cells = with_retention([Cell::new(name)], &row.retention, &row.counts);
                source.cells(cells, row.source)
            });
            out.push_str(&table_text(
                (&source.headers(&["cache"]), &RETENTION_HEADERS),
                &source.text(&[]),
                rows,
                width,
            ));
        }
    }
    out.push_str(&hidden_note(hidden));
    out
}

/// The stacks under the site table: the heaviest stack (by what it
/// holds) of each of the first `n` sites, in the table's order. The `n`
/// heaviest stacks once left the biggest site out, its objects spread over
/// more stacks than another site's. Where a stack's site is not known (a
/// report read back from JSON), the first `n` stacks.
fn top_stacks(r: &Report, n: usize) -> Vec<&StackRow> {
    if r.stacks.iter().any(|s| s.site_call_site.is_none()) {
        return r.stacks.iter().take(n).collect();
    }
    let held = |s: &StackRow| {
        let ret = s.retention.clone().unwrap_or_default();
        (ret.outstanding_bytes, ret.outstanding_count, s.counts.count)
    };
    r.sites
        .iter()
        .filter_map(|site| {
            r.stacks
                .iter()
                .filter(|s| {
                    s.source == site.source
                        && s.site_call_site.as_deref() == Some(site.call_site.as_str())
                })
                // The first of equals: the report's order.
                .rev()
                .max_by_key(|s| held(s))
        })
        .take(n)
        .collect()
}

fn stack_details(r: &Report, stacks: &[&StackRow], width: Option<u16>) -> String {
    let mut out = String::new();
    let source = SourceColumn::of(r);
    for (i, s) in stacks.iter().enumerate() {
        let ret = s.retention.clone().unwrap_or_default();
        let est = if s.estimated { "~" } else { "" };
        let _ = writeln!(
            out,
            "#{} {}  {est}{} live ({est}{}), oldest {}; {est}{} allocated, {est}{} freed; cache {}{}{}",
            i + 1,
            s.function,
            ret.outstanding_count,
            human_size(ret.outstanding_bytes),
            human_age(ret.oldest_s),
            s.counts.count,
            ret.freed_count,
            s.cache,
            render::source_note(source, s.source),
            render::process_note(&s.processes),
        );
        out.push_str(&render::stack_body(
            &s.frames,
            &age_histogram(&ret.ages, "    ", width),
        ));
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
pub fn age_histogram(buckets: &[AgeBucket], indent: &str, width: Option<u16>) -> String {
    let lines: Vec<HistLine> = buckets
        .iter()
        .map(|b| HistLine {
            range: format!("[{}, {})", age_label(b.lo_s), age_label(b.hi_s)),
            count: b.count,
            note: Some(human_size(b.bytes)),
        })
        .collect();
    hist::draw(&lines, indent, width)
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
        let _ = writeln!(
            out,
            "{} {bytes}",
            render::folded_stack(&render::callers_first(r, s))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{leak_snapshot, report_of};
    use crate::testing::{assert_contains, assert_line};

    fn report(sample_every: u32) -> Report {
        report_of(&leak_snapshot(sample_every), 10, 2.0)
    }

    #[test]
    fn site_and_cache_tables_name_the_source_beyond_the_slab() {
        let r = report(1);
        for by in [LeakGroupBy::Site, LeakGroupBy::Cache] {
            assert!(!table(&r, by, 0, 0, None).contains("source"));
        }
        let r = crate::report::fixtures::report_of(
            &crate::report::fixtures::sources_snapshot(),
            10,
            2.0,
        );
        let header = |by| {
            let t = table(&r, by, 0, 0, None);
            let line = t.lines().find(|l| l.contains("live")).unwrap().to_string();
            let cols: Vec<String> = line
                .split(['│', '┆'])
                .map(|c| c.trim().to_string())
                .collect();
            (t, cols)
        };
        let (t, cols) = header(LeakGroupBy::Site);
        assert_eq!(&cols[1..4], ["site", "source", "cache"], "{t}");
        assert!(
            t.lines()
                .any(|l| l.contains("[page]") && l.contains("┆ page ")),
            "{t}"
        );
        let (t, cols) = header(LeakGroupBy::Cache);
        assert_eq!(&cols[1..3], ["cache", "source"], "{t}");
    }

    #[test]
    fn merged_caches_name_the_cache_the_code_asked_for() {
        let mut r = report_of(&crate::report::fixtures::merged_leak_snapshot(), 10, 2.0);
        // The site allocates from TCP too: the note names its cache, and
        // counts of the merged cache's objects alone.
        let t = table(&r, LeakGroupBy::Site, 0, 0, None);
        assert!(
            t.lines().any(|l| l.contains(
                "TCP,signal_cache (merged: UNIX, UNIX-STREAM); signal_cache asked: UNIX-STREAM 3 of 4"
            ) && l.split('┆').nth(2).map(str::trim) == Some("6")),
            "{t}"
        );
        let t = table(&r, LeakGroupBy::Cache, 0, 0, None);
        assert_contains(
            &t,
            &["signal_cache (merged: UNIX, UNIX-STREAM); asked: UNIX-STREAM 3 of 4"],
        );
        // Names read from the kernel are escaped; rows of unmerged caches
        // say nothing of it.
        let row = r
            .caches
            .iter_mut()
            .find(|c| c.name.contains("merged"))
            .unwrap();
        row.retention.as_mut().unwrap().merged_caches[0].asked[0].name = "A\nB".into();
        let t = table(&r, LeakGroupBy::Cache, 0, 0, None);
        assert_contains(&t, &["asked: A\\x0aB 3 of 4"]);
        assert_eq!(t.matches("asked:").count(), 1, "{t}");
    }

    #[test]
    fn top_stacks_name_the_biggest_site_whatever_its_stacks_weigh() {
        // sock_alloc_inode holds the most, over four stacks; pipe holds
        // less, over three heavier ones: the three heaviest stacks are
        // all pipe's.
        let held = |bytes: u64| {
            Some(Retention {
                outstanding_count: bytes / 100,
                outstanding_bytes: bytes,
                ..Default::default()
            })
        };
        let site = |name: &str, bytes| crate::report::SiteRow {
            function: name.into(),
            location: format!("{name}+0x1"),
            call_site: format!("{name}+0x1"),
            caches: vec!["kmalloc-128".into()],
            retention: held(bytes),
            ..Default::default()
        };
        let stack = |name: &str, n: u64, bytes| StackRow {
            function: format!("{name}_caller{n}"),
            frames: vec![format!("{name}+0x1"), format!("{name}_caller{n}+0x2")],
            cache: "kmalloc-128".into(),
            retention: held(bytes),
            site_call_site: Some(format!("{name}+0x1")),
            ..Default::default()
        };
        let mut r = Report {
            leaks: Some(Default::default()),
            sites: vec![site("sock_alloc_inode", 1000), site("alloc_pipe_info", 900)],
            stacks: (1..=3)
                .map(|n| stack("alloc_pipe_info", n, 300))
                .chain((1..=4).map(|n| stack("sock_alloc_inode", n, 250)))
                .collect(),
            ..Default::default()
        };
        let shown = |r: &Report| {
            let t = table(r, LeakGroupBy::Site, 0, 3, None);
            let top = t.split("Top stacks:").nth(1).unwrap().to_string();
            top.lines()
                .filter(|l| l.starts_with('#'))
                .map(|l| l.split("  ").next().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            shown(&r),
            ["#1 sock_alloc_inode_caller1", "#2 alloc_pipe_info_caller1"]
        );
        // Read back from JSON, sites of stacks are not known: the heaviest.
        r.stacks.iter_mut().for_each(|s| s.site_call_site = None);
        assert_eq!(
            shown(&r),
            [
                "#1 alloc_pipe_info_caller1",
                "#2 alloc_pipe_info_caller2",
                "#3 alloc_pipe_info_caller3"
            ]
        );
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
        let t = table(&r, LeakGroupBy::Site, 0, 1, None);
        assert_contains(
            &t,
            &[
                "outstanding: 420 objects, 1.6M",
                "transient: 875 objects",
                "ignored frees: 123 of untracked objects",
                ", 9 of NULL",
                "3 events skipped by the kernel (a kheap program was already running on their CPU)",
            ],
        );
        assert!(
            t.contains("invisible free paths: kmem_cache_free_bulk"),
            "{t}"
        );
        let row = t.lines().find(|l| l.contains("load_msg+0x10")).unwrap();
        for cell in ["400", "1.6M", "1.5s", "1000", "600"] {
            assert!(row.contains(cell), "{cell} missing in {row}");
        }
        assert_contains(
            &t,
            &["Ages of what the top sites hold:", "[1.024s, 2.048s)"],
        );
        assert!(!t.contains("sampling: about"), "{t}");
    }

    #[test]
    fn sampled_reports_say_they_are_estimates() {
        let t = table(&report(4), LeakGroupBy::Cache, 0, 0, None);
        assert_contains(
            &t,
            &[
                "about 1 address in 4 tracked",
                "outstanding: ~1.7k objects",
                "kmalloc-cg-4k",
            ],
        );
    }

    #[test]
    fn process_view_lists_what_each_allocator_holds() {
        let mut r = report(1);
        let procs = &r.leaks.as_ref().unwrap().processes;
        assert_eq!(procs.len(), 2, "msgd and the interrupt row");
        assert_eq!(
            (procs[0].process.pid, procs[0].process.comm.as_deref()),
            (Some(7), Some("msgd"))
        );
        assert_eq!(procs[0].retention.outstanding_count, 400);
        let hidden = apply_top(&mut r, LeakGroupBy::Process, Some(5));
        let t = table(&r, LeakGroupBy::Process, hidden, 0, None);
        let row = t
            .lines()
            .find(|l| l.contains("msgd"))
            .unwrap_or_else(|| panic!("{t}"));
        assert!(row.contains("400") && row.contains("1.6M"), "{row}");
    }

    #[test]
    fn interrupt_objects_are_held_by_no_process() {
        // The fixture's 20 kvmalloc objects were allocated in interrupt
        // context while tgid 7 ran.
        let mut snap = leak_snapshot(1);
        let r = report_of(&snap, 10, 2.0);
        let procs = &r.leaks.as_ref().unwrap().processes;
        let row = procs.iter().find(|p| p.process.interrupt).unwrap();
        assert_eq!((row.process.pid, row.process.comm.as_deref()), (None, None));
        assert_eq!(row.retention.outstanding_count, 20);
        let t = table(&r, LeakGroupBy::Process, 0, 0, None);
        let line = t
            .lines()
            .find(|l| l.contains("[interrupt]"))
            .unwrap_or_else(|| panic!("{t}"));
        assert!(line.contains(" - "), "{line}");

        // Where the context of every object was not tested, an object
        // without a sampled stack would pass for the interrupted process's:
        // no process rows.
        snap.leaks.as_mut().unwrap().contexts_known = false;
        let r = report_of(&snap, 10, 2.0);
        assert!(r.leaks.as_ref().unwrap().processes.is_empty());
    }

    #[test]
    fn cgroup_view_shows_what_each_cgroup_holds_charged_or_not() {
        let mut r = report(1);
        let mut names = crate::cgroup::CgroupNames::new(None);
        names.insert(42, "/system.slice/msgd.service".into());
        r.name_cgroups(&mut names);
        let hidden = apply_top(&mut r, LeakGroupBy::Cgroup, Some(5));
        let t = table(&r, LeakGroupBy::Cgroup, hidden, 0, None);
        let row = |label: &str| {
            t.lines()
                .find(|l| l.contains(label))
                .unwrap_or_else(|| panic!("no {label} row: {t}"))
                .to_string()
        };
        let svc = row("/system.slice/msgd.service");
        for cell in ["400", "1.6M", "1000", "600"] {
            assert!(svc.contains(cell), "{cell} missing in {svc}");
        }
        let irq = row("[interrupt]");
        assert!(irq.contains("20") && irq.contains("280"), "{irq}");
        assert!(
            t.find("msgd.service").unwrap() < t.find("[interrupt]").unwrap(),
            "largest outstanding first: {t}"
        );
    }

    #[test]
    fn top_cuts_rows_and_folded_weighs_by_outstanding_bytes() {
        let mut r = report(1);
        assert_eq!(apply_top(&mut r, LeakGroupBy::Stack, Some(2)), 1);
        assert_eq!(r.stacks.len(), 2);
        let f = folded(&r);
        assert_line(
            &f,
            &format!("do_msgsnd;load_msg;__kmalloc_noprof {}", 400 * 4096),
        );
    }
}
