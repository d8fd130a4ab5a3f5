//! Rendering a malloc report: tables, per-stack details with bpftrace-style
//! histograms, folded stacks. Pure string building.

use std::fmt::Write as _;

use clap::ValueEnum;
use comfy_table::Cell;

use super::report::{MallocReport, MallocRow};
use crate::model::{human_count, human_size};
use crate::render::table::{self, hidden_note, new_table};
use crate::render::{hist, stack_body, unless_zero};
use crate::report::top_n;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MallocGroupBy {
    /// One row per allocator function and direct caller
    Site,
    /// One entry per allocator function and whole user stack
    Stack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MallocSortBy {
    /// Bytes requested
    Bytes,
    /// Calls
    Count,
    /// Bytes still allocated at the end (needs --outstanding)
    Outstanding,
}

fn sort_key(r: &MallocRow, by: MallocSortBy) -> u64 {
    match by {
        MallocSortBy::Bytes => r.counts.bytes_req,
        MallocSortBy::Count => r.counts.count,
        MallocSortBy::Outstanding => r.outstanding.as_ref().map_or(0, |o| o.bytes),
    }
}

/// Sorts both row lists, heaviest first, keeping the top `n`; returns how
/// many rows of the grouping shown, `by`, were cut.
pub fn apply_top(
    r: &mut MallocReport,
    by: MallocGroupBy,
    sort: MallocSortBy,
    n: Option<usize>,
) -> usize {
    let cut = |rows: &mut Vec<MallocRow>| {
        rows.sort_by(|a, b| {
            sort_key(b, sort)
                .cmp(&sort_key(a, sort))
                .then_with(|| a.location.cmp(&b.location))
        });
        top_n::keep(rows, n)
    };
    let (sites, stacks) = (cut(&mut r.sites), cut(&mut r.stacks));
    match by {
        MallocGroupBy::Site => sites,
        MallocGroupBy::Stack => stacks,
    }
}

pub fn header(r: &MallocReport) -> String {
    let mut s = String::new();
    let t = &r.totals;
    let _ = write!(
        s,
        "kheap malloc: {:.1}s; {} allocation calls ({} requested)",
        r.duration_s,
        human_count(t.allocs),
        human_size(t.bytes),
    );
    match t.frees {
        Some(f) => {
            let _ = write!(s, ", {} frees", human_count(f));
        }
        None => s.push_str(" (frees counted with --outstanding)"),
    }
    if let Some(o) = &t.outstanding {
        let _ = write!(
            s,
            "; outstanding at the end: {} blocks, {}",
            human_count(o.count),
            human_size(o.bytes)
        );
    }
    s.push('\n');
    if let Some(note) = &r.kernel_note {
        let _ = writeln!(s, "kernel: {note}");
    }
    for p in &r.probes {
        let _ = writeln!(s, "probes: {p}");
    }
    if !r.run.filters.is_empty() {
        let _ = writeln!(s, "traced: {}", r.run.filters.join(", "));
    }
    let l = &r.lost;
    let _ = writeln!(
        s,
        "lost: {} stacks (rows keep the direct caller), {} calls not counted (map full){}{}",
        l.stacks,
        l.map_full_sites,
        if t.outstanding.is_some() {
            format!(
                ", {} blocks not tracked (map full{})",
                l.map_full_live,
                if l.map_full_live > 0 {
                    "; raise --max-outstanding"
                } else {
                    ""
                }
            )
        } else {
            String::new()
        },
        unless_zero(t.failed_allocs, "calls returned NULL")
    );
    if t.nested_calls > 0 {
        let _ = writeln!(
            s,
            "nested: {} calls made by the allocator itself while serving a call (e.g. realloc -> malloc) are counted once, as the outer call",
            t.nested_calls
        );
    }
    if l.map_full_vmas + l.vma_lookup_failed > 0 {
        let _ = writeln!(
            s,
            "lost: the mappings of {} frames ({} for a full map, the rest as the address space was busy); they show as addresses",
            l.map_full_vmas + l.vma_lookup_failed,
            l.map_full_vmas,
        );
    }
    if l.no_thread_state > 0 {
        let _ = writeln!(
            s,
            "lost: {} calls not counted (no per-thread state)",
            l.no_thread_state
        );
    }
    let d = &r.stack_depth;
    if d.stacks > 0 {
        let (fp, dw) = (&d.frame_pointer, &d.dwarf);
        let _ = writeln!(
            s,
            "stacks: {} walked by frame pointers (max {} frames, mean {}), {} unwound from .eh_frame (max {}, mean {}) from {} sampled stack copies",
            fp.stacks, fp.max_depth, fp.mean_depth, dw.stacks, dw.max_depth, dw.mean_depth, d.unwind_samples
        );
    }
    if l.unwind_dropped + l.unwind_copy_failed + l.unwind_no_mappings > 0 {
        let _ = writeln!(
            s,
            "lost: {} sampled stack copies ({} ring buffer full, {} unreadable, {} of processes gone with unknown mappings); those calls show the frame-pointer walk",
            l.unwind_dropped + l.unwind_copy_failed + l.unwind_no_mappings,
            l.unwind_dropped,
            l.unwind_copy_failed,
            l.unwind_no_mappings
        );
    }
    if l.caller_unreadable > 0 {
        let _ = writeln!(
            s,
            "lost: {} calls whose return address could not be read at the stack pointer, counted under [caller unreadable]",
            l.caller_unreadable
        );
    }
    if d.shallow > 0 {
        let _ = writeln!(
            s,
            "note: {} of {} stacks are only 1-2 frames deep: the frame-pointer walk stops at code built without them (most distribution binaries) and no deeper stack was unwound from a sampled copy (--exact-stacks copies every call); the direct caller is always right",
            d.shallow, d.stacks
        );
    }
    s
}

fn outstanding_cells(r: &MallocRow) -> Vec<Cell> {
    match &r.outstanding {
        Some(o) => vec![Cell::new(o.count), Cell::new(human_size(o.bytes))],
        None => Vec::new(),
    }
}

/// The report as a table of sites, or as stack details, fitted to `width`
/// columns.
pub fn table(r: &MallocReport, by: MallocGroupBy, hidden: usize, width: Option<u16>) -> String {
    let mut out = header(r);
    out.push('\n');
    let tracking = r.totals.outstanding.is_some();
    match by {
        MallocGroupBy::Site => {
            let mut headers = vec!["allocator", "caller", "count", "bytes", "avg"];
            if tracking {
                headers.extend(["live", "live bytes"]);
            }
            let mut t = new_table(&headers, &[1], width);
            for row in &r.sites {
                let mut cells = vec![
                    Cell::new(&row.allocator),
                    Cell::new(&row.location),
                    Cell::new(row.counts.count),
                    Cell::new(human_size(row.counts.bytes_req)),
                    Cell::new(format!("{:.0}", row.counts.avg_size)),
                ];
                cells.extend(outstanding_cells(row));
                t.add_row(cells);
            }
            let _ = writeln!(out, "{}", table::render(t));
        }
        MallocGroupBy::Stack => {
            let estimated = r.stacks.iter().filter(|s| s.estimated).count();
            if estimated > 0 {
                let _ = writeln!(
                    out,
                    "note: {estimated} stacks (~) are estimates: a call site's calls are shared out among the stacks unwound from some of them, in proportion (the sites' totals are exact; --exact-stacks unwinds every call)\n"
                );
            }
            for (i, s) in r.stacks.iter().enumerate() {
                let approx = if s.estimated { "~" } else { "" };
                let _ = write!(
                    out,
                    "#{} {} from {}: {approx}{} calls, {approx}{}",
                    i + 1,
                    s.allocator,
                    s.function,
                    s.counts.count,
                    human_size(s.counts.bytes_req),
                );
                if let Some(o) = &s.outstanding {
                    let _ = write!(
                        out,
                        ", outstanding {approx}{} ({approx}{})",
                        o.count,
                        human_size(o.bytes)
                    );
                }
                out.push('\n');
                out.push_str(&stack_body(
                    &s.frames,
                    &hist::log2(&s.counts.hist, "    ", width),
                ));
            }
        }
    }
    out.push_str(&hidden_note(hidden));
    out
}

/// `outer;…;caller;allocator count` lines for flamegraph tools (counts are
/// calls).
pub fn folded(r: &MallocReport) -> String {
    let mut out = String::new();
    for s in &r.stacks {
        let mut names: Vec<String> = s.frames.iter().rev().map(|f| function_part(f)).collect();
        names.push(s.allocator.clone());
        let _ = writeln!(
            out,
            "{} {}",
            crate::render::folded_stack(&names),
            s.counts.count
        );
    }
    out
}

/// The stacks of `folded`, with all their numbers, for a flame graph.
pub fn flame_samples(r: &MallocReport) -> Vec<crate::render::flame::Sample> {
    r.stacks
        .iter()
        .map(|s| {
            let mut frames: Vec<String> = s.frames.iter().rev().map(|f| function_part(f)).collect();
            frames.push(s.allocator.clone());
            crate::render::flame::Sample {
                frames,
                count: s.counts.count,
                bytes: s.counts.bytes_alloc,
                waste: s.counts.waste_bytes,
                before: None,
            }
        })
        .collect()
}

/// `name` of `name+0xoff (file:line)`, keeping `module+0xoff` whole when
/// there is no symbol (the offset is all that identifies the code).
fn function_part(frame: &str) -> String {
    let base = frame.split(" (").next().unwrap_or(frame);
    match base.rsplit_once('+') {
        Some((name, _)) if !name.contains('.') => name.to_string(),
        _ => base.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::malloc::report::{build, tests::opts, tests::sample};
    use crate::testing::{assert_contains, assert_line};

    fn report() -> MallocReport {
        let (snap, frames) = sample();
        build(&snap, &frames, opts())
    }

    #[test]
    fn sites_name_function_caller_and_outstanding_stacks_their_frames() {
        let r = report();
        #[rustfmt::skip]
        assert_contains(&table(&r, MallocGroupBy::Site, 0, None), &[
            "do_malloc+0x10", "live bytes", "outstanding at the end: 3 blocks",
            "lost: 7 stacks", "probes: libc.so.6: malloc, calloc",
            "stacks: 2 walked by frame pointers (max 3 frames, mean 3), 0 unwound from .eh_frame",
        ]);
        #[rustfmt::skip]
        assert_contains(&table(&r, MallocGroupBy::Stack, 0, None), &[
            "malloc from do_malloc: 15 calls", "    main+0x20\n", "[64, 128)",
        ]);
        assert!(!table(&r, MallocGroupBy::Stack, 0, None).contains('~'));
    }

    #[test]
    fn a_kernel_note_is_one_header_line_and_not_in_json() {
        let mut r = report();
        assert!(!table(&r, MallocGroupBy::Site, 0, None).contains("kernel: "));
        r.kernel_note = Some("this kernel (5.10) lacks bpf_loop (5.17): legacy".into());
        let t = table(&r, MallocGroupBy::Site, 0, None);
        assert_eq!(
            t.lines()
                .filter(|l| *l == "kernel: this kernel (5.10) lacks bpf_loop (5.17): legacy")
                .count(),
            1,
            "{t}"
        );
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("lacks bpf_loop"), "{json}");
    }

    #[test]
    fn estimated_stack_shares_are_marked() {
        let mut r = report();
        let i = r
            .stacks
            .iter()
            .position(|s| s.allocator == "malloc")
            .unwrap();
        r.stacks[i].estimated = true;
        let t = table(&r, MallocGroupBy::Stack, 0, None);
        #[rustfmt::skip]
        assert_contains(&t, &[
            "note: 1 stacks (~) are estimates: a call site's calls are shared out", "--exact-stacks unwinds every call",
            "malloc from do_malloc: ~15 calls, ~",
        ]);
        assert!(!table(&r, MallocGroupBy::Site, 0, None).contains("(~)"));
    }

    #[test]
    fn sorting_by_outstanding_and_top_n() {
        let mut r = report();
        assert_eq!((r.sites.len(), r.stacks.len()), (2, 2));
        let hidden = apply_top(&mut r, MallocGroupBy::Site, MallocSortBy::Count, Some(1));
        assert_eq!(hidden, 1, "one site row cut");
        assert_eq!(r.sites[0].allocator, "malloc", "15 calls beat 7");
        // The hidden count is the shown grouping's, not the larger list's.
        let mut r = report();
        r.stacks.truncate(1);
        assert_eq!(
            apply_top(&mut r, MallocGroupBy::Stack, MallocSortBy::Count, Some(1)),
            0
        );
        let mut r = report();
        apply_top(&mut r, MallocGroupBy::Site, MallocSortBy::Outstanding, None);
        assert_eq!(r.sites[0].allocator, "calloc");
    }

    #[test]
    fn folded_lines_end_in_the_allocator() {
        let f = folded(&report());
        assert_line(&f, "__libc_start_call_main;main;do_malloc;malloc 15");
        assert_eq!(function_part("libfoo.so+0x1234"), "libfoo.so+0x1234");
        assert_eq!(function_part("f+0x10 (w.c:3)"), "f");
    }
}
