//! Rendering a report, the pieces every view shares: the header, the
//! source column, process and stack notes, folded stacks and flame samples;
//! `table` (the one table style, fitted to the terminal), `hist` (the one
//! histogram drawer), `flame` (SVG) and `pprof`. Pure string building; rows
//! are cut to `-r` by `report::top_n`. Each command's own view is in its
//! room (`record::view`, `leaks::render`, `top::view` …).

pub mod flame;
pub mod hist;
pub mod pprof;
pub mod table;

use std::fmt::Write as _;

use clap::ValueEnum;
use comfy_table::Cell;

use crate::model::{human_count, human_size, Counts, Source};
use crate::report::{top_n, Report, SiteRow};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    Site,
    Stack,
    Cache,
    Process,
    /// cgroup v2 (container, service), with accounted vs unaccounted bytes
    Cgroup,
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
    /// gzip-compressed pprof profile.proto (`go tool pprof`); needs -o FILE
    /// unless piped
    Pprof,
    /// An interactive flame graph (SVG; needs -o FILE or a pipe)
    Svg,
}

/// An output format: tables for people, JSON for scripts.
pub trait OutputFormat: ValueEnum + Clone + Copy + Send + Sync + 'static {
    fn is_table(self) -> bool;
    /// Formats nobody reads on a terminal (an SVG): they need -o or a pipe.
    fn is_file_only(self) -> bool {
        false
    }
}

impl OutputFormat for Format {
    fn is_table(self) -> bool {
        self == Format::Table
    }
    fn is_file_only(self) -> bool {
        self == Format::Svg
    }
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
    top_n::keep(rows, n)
}

/// Sorts every row list of the report and cuts each to `n` (JSON carries
/// every list); returns how many rows of the grouping shown, `by`, were cut.
pub fn apply_top(report: &mut Report, by: GroupBy, sort: SortBy, n: Option<usize>) -> usize {
    let hidden = [
        top_rows(&mut report.sites, |r| &r.counts, sort, n),
        top_rows(&mut report.stacks, |r| &r.counts, sort, n),
        top_rows(&mut report.caches, |r| &r.counts, sort, n),
        top_rows(&mut report.processes, |r| &r.counts, sort, n),
        top_rows(&mut report.cgroups, |r| &r.counts, sort, n),
    ];
    match by {
        GroupBy::Site => hidden[0],
        GroupBy::Stack => hidden[1],
        GroupBy::Cache => hidden[2],
        GroupBy::Process => hidden[3],
        GroupBy::Cgroup => hidden[4],
    }
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
    // Per source, once more than the slab is traced.
    if r.shows_sources() {
        let parts: Vec<String> = r
            .totals
            .sources
            .iter()
            .map(|t| {
                let mut p = format!(
                    "{} {} allocs {} alloc {} frees",
                    t.source,
                    human_count(t.count),
                    human_size(t.bytes_alloc),
                    human_count(t.frees)
                );
                if t.counted_elsewhere_bytes > 0 {
                    p += &format!(
                        " ({} of it backing other sources)",
                        human_size(t.counted_elsewhere_bytes)
                    );
                }
                p
            })
            .collect();
        let _ = writeln!(s, "sources: {}", parts.join("; "));
    }
    let _ = writeln!(s, "attach: {}", r.run.attach.join(", "));
    if r.run.kernel_memory_bytes > 0 {
        let _ = writeln!(
            s,
            "kernel memory: {} in kheap's BPF maps",
            human_size(r.run.kernel_memory_bytes)
        );
    }
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
        // Stacks are stored by content: no bucket collisions to report
        // (lost.stack_collisions stays in the JSON, always 0).
        "lost: {} stacks, {} events not aggregated (map full){}{}",
        r.lost.stacks,
        r.lost.map_full,
        unless_zero(
            r.lost.recursion_misses,
            "events skipped by the kernel (a kheap program was already running on their CPU)"
        ),
        unless_zero(r.totals.failed_allocs, "failed allocations not counted"),
    );
    if r.lost.kmalloc_cache_stale > 0 {
        let _ = writeln!(
            s,
            "WARNING: {} times a kmalloc call site's cache changed between checks \
             (a module reloaded at the same address?): up to 4096 events before each may \
             name the old cache",
            r.lost.kmalloc_cache_stale
        );
    }
    s
}

/// `, N what` when N is not 0, else nothing: an optional part of a line.
pub fn unless_zero(n: u64, what: &str) -> String {
    if n > 0 {
        format!(", {n} {what}")
    } else {
        String::new()
    }
}

/// The `source` column of site, stack and cache tables: shown right after
/// a table's first column when the report traces more than the slab
/// (`Report::shows_sources`), so `--source page` and `--source all` tables
/// read alike and a default table keeps its columns. Process and cgroup
/// rows sum every source: they have none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceColumn(pub bool);

impl SourceColumn {
    pub fn of(r: &Report) -> SourceColumn {
        SourceColumn(r.shows_sources())
    }

    /// Headers with `source` after the first.
    pub fn headers<'a>(self, names: &[&'a str]) -> Vec<&'a str> {
        let mut out = names.to_vec();
        if self.0 {
            out.insert(1.min(out.len()), "source");
        }
        out
    }

    /// The text (left-aligned) columns of `headers`: the source column, and
    /// the ones after it moved along.
    pub fn text(self, text: &[usize]) -> Vec<usize> {
        if !self.0 {
            return text.to_vec();
        }
        std::iter::once(1)
            .chain(text.iter().map(|&i| if i >= 1 { i + 1 } else { i }))
            .collect()
    }

    /// A row's cells with its source after the first, matching `headers`.
    pub fn cells<T: From<&'static str>>(self, mut cells: Vec<T>, source: Source) -> Vec<T> {
        if self.0 {
            cells.insert(1.min(cells.len()), T::from(source.name()));
        }
        cells
    }

    /// A stack's frames, callers first, under a root frame naming its
    /// source (`[page]`), so a flame graph of several sources has one tower
    /// per allocator.
    pub fn root(self, source: Source, callers_first: Vec<&str>) -> Vec<String> {
        let root = self.0.then(|| format!("[{source}]"));
        root.into_iter()
            .chain(callers_first.into_iter().map(str::to_string))
            .collect()
    }
}

/// The naming cells of a site row: where, and from which caches.
pub fn site_names(row: &SiteRow) -> [Cell; 2] {
    [
        Cell::new(&row.location),
        Cell::new(short_list(&row.caches, 2)),
    ]
}

/// A process row's pid and command cells (record, top and leaks): `-` and
/// `[interrupt]` for the interrupt row (no pid), as `cgroup_label` names it
/// among cgroups; `unnamed` where the process's name is not known.
pub fn process_cells(pid: Option<u32>, comm: Option<&str>, unnamed: &str) -> (String, String) {
    match (pid, comm) {
        (None, _) => ("-".to_string(), "[interrupt]".to_string()),
        (Some(pid), None | Some("")) => (pid.to_string(), unnamed.to_string()),
        (Some(pid), Some(comm)) => (pid.to_string(), comm.to_string()),
    }
}

/// A cgroup row's label: its path and what runs there, or the interrupt row.
pub fn cgroup_label(row: &crate::report::CgroupRow) -> String {
    match &row.cgroup {
        None => "[interrupt]".to_string(),
        Some(c) => {
            let path = match &c.path {
                Some(p) => p.clone(),
                None => format!("cgroup id {} (gone)", c.id),
            };
            match &c.container {
                Some(k) if !path.ends_with(&k.name) => format!("{path} ({})", k.name),
                _ => path,
            }
        }
    }
}

/// The first `n` items and how many more, for a table cell rather than a
/// list: "bio-120,bio-184 +3".
pub fn short_list(items: &[String], n: usize) -> String {
    let mut s = items.iter().take(n).cloned().collect::<Vec<_>>().join(",");
    if items.len() > n {
        let _ = write!(s, " +{}", items.len() - n);
    }
    s
}

/// `; by comm [pid]` after a stack's title: who made it, so that two rows
/// with the same frames (made by two processes) say how they differ. The
/// two largest, then how many more.
pub fn process_note(processes: &[crate::report::StackProcess]) -> String {
    if processes.is_empty() {
        return String::new();
    }
    let mut note = processes
        .iter()
        .take(2)
        .map(|p| p.process.name())
        .collect::<Vec<_>>()
        .join(", ");
    if processes.len() > 2 {
        let _ = write!(note, " +{}", processes.len() - 2);
    }
    format!("; by {note}")
}

/// `, source page` after a stack's title when sources are shown.
pub fn source_note(column: SourceColumn, source: Source) -> String {
    if column.0 {
        format!(", source {source}")
    } else {
        String::new()
    }
}

/// Under a stack's title line: its frames, then its histogram, indented,
/// and a blank line.
pub fn stack_body(frames: &[String], histogram: &str) -> String {
    let mut out = String::new();
    for f in frames {
        let _ = writeln!(out, "    {f}");
    }
    out.push_str(histogram);
    out.push('\n');
    out
}

/// `outer;…;inner count` lines (callers first), the input format of
/// flamegraph.pl and inferno. Counts are allocations.
pub fn folded(r: &Report) -> String {
    let mut out = String::new();
    for s in &r.stacks {
        let _ = writeln!(
            out,
            "{} {}",
            folded_stack(&callers_first(r, s)),
            s.counts.count
        );
    }
    out
}

/// One folded stack: its frames joined with ';', each escaped with
/// [`folded_frame`]. Every `folded` output (record, leaks, malloc) is
/// written with it.
pub fn folded_stack<S: AsRef<str>>(frames: &[S]) -> String {
    frames
        .iter()
        .map(|f| folded_frame(f.as_ref()))
        .collect::<Vec<_>>()
        .join(";")
}

/// A frame name for folded stacks: ';' separates frames and a newline
/// ends a stack, so a symbol holding either (a traced binary's own
/// symbols can) would add frames or stacks that never ran. Both, and the
/// backslash that escapes them, become `\xNN`; other control characters
/// are escaped by `output::terminal_safe` as the text is written.
pub fn folded_frame(name: &str) -> std::borrow::Cow<'_, str> {
    let special = |c: char| matches!(c, ';' | '\n' | '\r' | '\\');
    if !name.contains(special) {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if special(c) {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A stack's function names, callers first, under its source's root frame
/// when sources are shown: what folded stacks and flame graphs draw.
pub fn callers_first(r: &Report, s: &crate::report::StackRow) -> Vec<String> {
    let names = s.frames.iter().rev().map(|f| strip_offset(f)).collect();
    SourceColumn::of(r).root(s.source, names)
}

/// The stacks of `folded`, with all their numbers, for a flame graph.
pub fn flame_samples(r: &Report) -> Vec<flame::Sample> {
    r.stacks
        .iter()
        .map(|s| flame::Sample {
            frames: callers_first(r, s),
            count: s.counts.count,
            bytes: s.counts.bytes_alloc,
            waste: s.counts.waste_bytes,
            before: None,
        })
        .collect()
}

/// The stacks of leaks' `folded` for a flame graph: outstanding objects, their
/// bytes, and the rounding those bytes include.
pub fn outstanding_flame_samples(r: &Report) -> Vec<flame::Sample> {
    r.stacks
        .iter()
        .filter_map(|s| {
            let ret = s.retention.as_ref().filter(|r| r.outstanding_bytes > 0)?;
            Some(flame::Sample {
                frames: callers_first(r, s),
                count: ret.outstanding_count,
                bytes: ret.outstanding_bytes,
                waste: ret
                    .outstanding_bytes
                    .saturating_sub(ret.outstanding_bytes_req),
                before: None,
            })
        })
        .collect()
}

/// Leaves the allocator's own entry frames out of every stack (innermost
/// first; `symbolize::caller_frames`), for profiles and flame graphs whose
/// leaf should be the caller. Rows and totals are unchanged.
pub fn drop_allocator_frames(r: &mut Report) {
    for s in &mut r.stacks {
        let drop = s.frames.len() - crate::symbolize::caller_frames(&s.frames).len();
        s.frames.drain(..drop);
    }
}

fn strip_offset(frame: &str) -> &str {
    frame.split_once('+').map_or(frame, |(name, _)| name)
}

#[cfg(test)]
mod tests;
