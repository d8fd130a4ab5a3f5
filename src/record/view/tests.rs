use super::*;
use crate::render::{apply_top, short_list, SortBy};
use crate::report::fixtures::{report_of, sample_snapshot, sources_snapshot};
use crate::testing::{assert_contains, assert_line};

fn report() -> Report {
    report_of(&sample_snapshot(), 10, 2.0)
}

#[test]
fn site_table_has_label_counts_and_waste() {
    let r = report();
    let t = table(&r, GroupBy::Site, 0, 1, None);
    assert_contains(
        &t,
        &["load_msg+0x10", "kmalloc-cg-4k", "47.6%", "sampled 1 in 10"],
    );
    assert!(
        t.contains("Top stacks:") && t.contains("#1 load_msg"),
        "{t}"
    );
    assert!(t.contains("lost: 2 stacks"), "{t}");
    assert!(!t.contains("skipped by the kernel"), "{t}");
}

#[test]
fn events_the_kernel_skipped_are_on_the_lost_line() {
    let mut snap = sample_snapshot();
    snap.events.recursion_misses = 3;
    let r = report_of(&snap, 10, 2.0);
    assert_eq!(r.lost.recursion_misses, 3);
    let t = table(&r, GroupBy::Site, 0, 1, None);
    assert_line(
        &t,
        "lost: 2 stacks, 0 events not aggregated (map full), 3 events skipped by the kernel (a kheap program was already running on their CPU)",
    );
}

#[test]
fn top_n_counts_the_hidden_rows_of_the_grouping_shown() {
    // Two sites, three stacks, one cache: with -r 1, the site table
    // hides one row, the stack view two, the cache table none.
    let mut r = report();
    assert_eq!(apply_top(&mut r, GroupBy::Site, SortBy::Count, Some(1)), 1);
    assert_eq!((r.sites.len(), r.stacks.len()), (1, 1));
    let t = table(&r, GroupBy::Site, 1, 0, None);
    assert!(t.contains("(1 more rows not shown"), "{t}");
    let mut r = report();
    assert_eq!(apply_top(&mut r, GroupBy::Stack, SortBy::Count, Some(1)), 2);
    let mut r = report();
    let hidden = apply_top(&mut r, GroupBy::Cache, SortBy::Count, Some(1));
    assert_eq!(hidden, 0, "the one cache is shown");
    let t = table(&r, GroupBy::Cache, hidden, 0, None);
    assert!(!t.contains("more rows"), "{t}");
}

#[test]
fn tables_fit_a_narrow_terminal() {
    let r = report();
    let t = table(&r, GroupBy::Site, 0, 1, Some(80));
    let too_wide: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with(['┌', '│', '├', '└']) || l.starts_with("    "))
        .filter(|l| l.chars().count() > 80)
        .collect();
    assert!(too_wide.is_empty(), "{too_wide:#?}\n{t}");
    assert!(t.contains("load_msg+0x10"), "{t}");
}

#[test]
fn long_cache_lists_are_shortened() {
    let l = |v: &[&str]| short_list(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), 2);
    assert_eq!(l(&[]), "");
    assert_eq!(l(&["a"]), "a");
    assert_eq!(l(&["a", "b"]), "a,b");
    assert_eq!(l(&["a", "b", "c", "d"]), "a,b +2");
}

/// The cells of the table line that names `what`.
fn cells_of<'a>(t: &'a str, what: &str) -> Vec<&'a str> {
    let line = t
        .lines()
        .find(|l| l.starts_with('│') && l.contains(what))
        .unwrap_or_else(|| panic!("no {what} in {t}"));
    line.split(['│', '┆']).map(str::trim).collect()
}

#[test]
fn the_source_column_is_there_only_beyond_the_slab() {
    let plain = report();
    assert!(!plain.shows_sources());
    for by in [GroupBy::Site, GroupBy::Cache] {
        let t = table(&plain, by, 0, 0, None);
        assert!(!t.contains("source"), "{t}");
    }
    let r = report_of(&sources_snapshot(), 10, 2.0);
    assert!(r.shows_sources());
    let t = table(&r, GroupBy::Site, 0, 1, None);
    assert_eq!(
        cells_of(&t, "waste%"),
        ["", "site", "source", "cache", "count", "req", "alloc", "waste", "waste%", "avg", ""]
    );
    assert_eq!(
        cells_of(&t, "load_msg+0x10"),
        [
            "",
            "load_msg+0x10",
            "kmalloc",
            "kmalloc-cg-4k",
            "1000",
            "2.0M",
            "3.9M",
            "1.9M",
            "47.6%",
            "2148",
            ""
        ]
    );
    // Page events carry no call site: one site per source, all layers.
    assert_eq!(
        &cells_of(&t, "[page]")[1..5],
        ["[page]", "page", "pages-order0,pages-order0-slab", "52"]
    );
    assert!(t.contains("sources: kmalloc 1.3k allocs"), "{t}");
    let t = table(&r, GroupBy::Cache, 0, 0, None);
    assert_eq!(
        &cells_of(&t, "frees")[1..5],
        ["cache", "source", "frees", "count"]
    );
    assert_eq!(
        &cells_of(&t, "pages-order0-slab")[1..5],
        ["pages-order0-slab", "page", "0", "2"]
    );
    let t = table(&r, GroupBy::Stack, 0, 0, None);
    assert!(
        t.contains("cache pages-order0, source page\n"),
        "stack titles name the source: {t}"
    );
}

#[test]
fn the_interrupt_row_of_processes_names_no_process() {
    let mut snap = sample_snapshot();
    let some_site = *snap.sites.values().next().unwrap();
    snap.procs.insert(Some(42), ("cc1".into(), some_site));
    snap.procs.insert(None, (String::new(), some_site));
    let r = report_of(&snap, 10, 2.0);
    let t = table(&r, GroupBy::Process, 0, 0, None);
    assert_eq!(cells_of(&t, "cc1")[1..3], ["42", "cc1"], "{t}");
    assert_eq!(
        cells_of(&t, "[interrupt]")[1..3],
        ["-", "[interrupt]"],
        "{t}"
    );
}
