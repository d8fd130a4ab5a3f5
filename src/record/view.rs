//! `kheap record`'s text view: the report's tables, grouped as asked, the
//! top stacks with their histograms and the allocator latency. The pieces
//! other views share (the header, the source column, process and stack
//! notes) are `crate::render`'s.

use std::fmt::Write as _;

use comfy_table::Cell;

use crate::model::{human_size, Counts};
use crate::render::table::{self, hidden_note, new_table, table_text};
use crate::render::{
    cgroup_label, header, hist, process_cells, process_note, site_names, source_note, stack_body,
    GroupBy, SourceColumn,
};
use crate::report::Report;

/// A row's naming cells, then its counts.
fn with_counts<const N: usize>(names: [Cell; N], c: &Counts) -> Vec<Cell> {
    names.into_iter().chain(count_cells(c)).collect()
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

/// The report as tables, grouped as asked, fitted to `width` columns.
pub fn table(
    r: &Report,
    by: GroupBy,
    hidden: usize,
    stack_details: usize,
    width: Option<u16>,
) -> String {
    let mut out = header(r);
    out.push('\n');
    let source = SourceColumn::of(r);
    match by {
        GroupBy::Site => {
            let rows = r
                .sites
                .iter()
                .map(|row| source.cells(with_counts(site_names(row), &row.counts), row.source));
            out.push_str(&table_text(
                (&source.headers(&["site", "cache"]), &COUNT_HEADERS),
                &source.text(&[1]),
                rows,
                width,
            ));
            if stack_details > 0 && !r.stacks.is_empty() {
                let _ = writeln!(out, "\nTop stacks:");
                out.push_str(&stack_details_text(r, stack_details, width));
            }
        }
        GroupBy::Stack => out.push_str(&stack_details_text(r, r.stacks.len(), width)),
        GroupBy::Cache => {
            let rows = r.caches.iter().map(|row| {
                let names = [Cell::new(&row.name), Cell::new(row.frees)];
                source.cells(with_counts(names, &row.counts), row.source)
            });
            out.push_str(&table_text(
                (&source.headers(&["cache", "frees"]), &COUNT_HEADERS),
                &source.text(&[]),
                rows,
                width,
            ));
        }
        GroupBy::Process => {
            if r.processes.is_empty() {
                let _ = writeln!(out, "(no per-process data)");
            }
            let rows = r.processes.iter().map(|row| {
                let (pid, comm) = process_cells(row.process.pid, row.process.comm.as_deref(), "");
                with_counts([Cell::new(pid), Cell::new(comm)], &row.counts)
            });
            out.push_str(&table_text(
                (&["pid", "comm"], &COUNT_HEADERS),
                &[1],
                rows,
                width,
            ));
        }
        GroupBy::Cgroup => {
            if r.cgroups.is_empty() {
                let _ = writeln!(out, "(no per-cgroup data)");
            }
            let rows = r.cgroups.iter().map(|row| {
                with_counts(
                    [
                        Cell::new(cgroup_label(row)),
                        Cell::new(human_size(row.accounting.accounted_bytes)),
                        Cell::new(human_size(row.accounting.unaccounted_bytes)),
                    ],
                    &row.counts,
                )
            });
            out.push_str(&table_text(
                (&["cgroup", "accounted", "unaccounted"], &COUNT_HEADERS),
                &[0],
                rows,
                width,
            ));
        }
    }
    out.push_str(&hidden_note(hidden));
    if !r.latency.is_empty() {
        out.push_str(&latency_text(r, width));
    }
    out
}

/// Time inside the allocator per call site, with the slowest site's
/// histogram (nanoseconds).
fn latency_text(r: &Report, width: Option<u16>) -> String {
    let mut out = String::from("\nAllocator latency (time inside the allocator, per call site):\n");
    let mut t = new_table(
        &["site", "allocator", "calls", "avg ns", "total"],
        &[1],
        width,
    );
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
    let _ = writeln!(out, "{}", table::render(t));
    if let Some(top) = r.latency.first() {
        let _ = writeln!(out, "{} via {} (ns):", top.function, top.allocator);
        out.push_str(&hist::log2(&top.hist, "    ", width));
    }
    out
}

fn stack_details_text(r: &Report, n: usize, width: Option<u16>) -> String {
    let mut out = String::new();
    let source = SourceColumn::of(r);
    for (i, s) in r.stacks.iter().take(n).enumerate() {
        let est = if s.estimated { "~" } else { "" };
        let _ = writeln!(
            out,
            "#{} {}  {}{} allocs, {}{} req, {}{} alloc, {} wasted ({:.1}%), cache {}{}{}",
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
            s.cache,
            source_note(source, s.source),
            process_note(&s.processes),
        );
        out.push_str(&stack_body(
            &s.frames,
            &hist::log2(&s.counts.hist, "    ", width),
        ));
    }
    out
}

#[cfg(test)]
mod tests;
