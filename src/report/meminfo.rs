//! The accounting of `kheap leaks --source …`: per source, the bytes kheap
//! saw allocated and not freed since it attached, beside the change of the
//! matching /proc/meminfo line over the same period, and what neither
//! explains. Pure (the text of /proc/meminfo is read by the caller).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::model::{Source, Sources};

/// /proc/meminfo, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemInfo(HashMap<String, u64>);

impl MemInfo {
    /// Parses `Name:   123 kB` lines; lines without a unit are counts.
    pub fn parse(text: &str) -> MemInfo {
        let mut fields = HashMap::new();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let mut parts = rest.split_whitespace();
            let Some(Ok(v)) = parts.next().map(str::parse::<u64>) else {
                continue;
            };
            let v = if parts.next() == Some("kB") {
                v * 1024
            } else {
                v
            };
            fields.insert(name.trim().to_string(), v);
        }
        MemInfo(fields)
    }

    /// The SUnreclaim line of the running system now, in bytes (0 if it
    /// cannot be read): what `--snapshot-when sunreclaim+=N` watches.
    pub fn sunreclaim_now() -> u64 {
        MemInfo::parse(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
            .line("SUnreclaim")
    }

    /// The running system's, or empty if it cannot be read, with the free
    /// pages on the per-CPU lists ([`PCP_LINE`], from /proc/zoneinfo) and
    /// the kernel's own counts of pages allocated and freed ([`PGALLOC_LINE`],
    /// [`PGFREE_LINE`], from /proc/vmstat), in bytes.
    pub fn read() -> MemInfo {
        let text = |path| std::fs::read_to_string(path).unwrap_or_default();
        let mut m = MemInfo::parse(&text("/proc/meminfo"));
        let page = Geometry::read().page_size;
        let vmstat = text("/proc/vmstat");
        let counts = [
            (PCP_LINE, pcp_pages(&text("/proc/zoneinfo"))),
            (
                PGALLOC_LINE,
                vmstat_sum(&vmstat, |n| n.starts_with("pgalloc_")),
            ),
            (PGFREE_LINE, vmstat_sum(&vmstat, |n| n == "pgfree")),
        ];
        for (line, pages) in counts {
            m.0.insert(line.to_string(), pages * page);
        }
        m
    }

    /// One line in bytes (a count for lines without a unit); 0 if absent.
    pub fn line(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    fn get(&self, name: &str) -> i64 {
        self.0.get(name).copied().unwrap_or(0) as i64
    }
}

/// Free pages on the per-CPU lists, which MemFree does not count: a page
/// freed there fires mm_page_free but reaches MemFree only when the list is
/// drained, and an allocation served from there leaves MemFree alone. The
/// lists hold tens to hundreds of MB on a busy machine (`count:` of every
/// pageset in /proc/zoneinfo), so the page row compares with their sum.
pub const PCP_LINE: &str = "pcp";

/// Pages allocated (every zone's `pgalloc_*`) and freed (`pgfree`) by the
/// page allocator, as /proc/vmstat counts them: beside kheap's events, they
/// show the allocations that fire no mm_page_alloc (the bulk allocator's).
pub const PGALLOC_LINE: &str = "pgalloc";
pub const PGFREE_LINE: &str = "pgfree";

/// The sum of the /proc/vmstat counters whose name passes `wanted`.
fn vmstat_sum(vmstat: &str, wanted: impl Fn(&str) -> bool) -> u64 {
    vmstat
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| wanted(name))
        .filter_map(|(_, n)| n.trim().parse::<u64>().ok())
        .sum()
}

/// The pages on the per-CPU free lists: the `count:` lines of the pagesets
/// in /proc/zoneinfo.
pub fn pcp_pages(zoneinfo: &str) -> u64 {
    zoneinfo
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("count:"))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}

/// What each source is compared with, and that quantity's change between
/// two readings (`change` of one line). The page allocator's is every page
/// that left the free pool, whatever it backs: MemFree's drop and that of
/// the per-CPU lists MemFree does not count.
fn compared_with(source: Source, change: impl Fn(&str) -> i64) -> (String, i64) {
    let line = match source {
        Source::Kmalloc => "Slab",
        Source::Vmalloc => "VmallocUsed",
        Source::Percpu => "Percpu",
        Source::Page => {
            return (
                format!("-MemFree - {PCP_LINE}"),
                -change("MemFree") - change(PCP_LINE),
            )
        }
    };
    (line.to_string(), change(line))
}

/// What one source holds at the end of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceOutstanding {
    /// Allocated since kheap attached and not seen freed (pages backing
    /// another source are that source's).
    pub bytes: u64,
    /// The part of `bytes` its /proc/meminfo line does not count by design
    /// (`AccountingRow::excluded_bytes`).
    pub excluded: u64,
    /// Outstanding pages that back another source (the page source's
    /// layers counted elsewhere): not in `bytes`.
    pub counted_elsewhere: u64,
    /// Freed during the run though allocated before it (the page source's
    /// frees of pages it never saw allocated): the line went down by them.
    pub freed_untracked: u64,
}

/// One source's line of the accounting.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccountingRow {
    pub source: Source,
    /// Allocated since kheap attached and not seen freed (pages backing
    /// another source are that source's).
    pub outstanding_bytes: u64,
    /// The part of outstanding_bytes the meminfo line does not count by
    /// design: vmalloc guard pages and vmap, ioremap and vm_map_ram areas
    /// (address space over memory counted elsewhere); percpu's obj_cgroup
    /// pointers (kept in chunk metadata, which is slab or vmalloc memory).
    #[serde(default)]
    pub excluded_bytes: u64,
    /// Bytes freed during the run of what was allocated before it, which
    /// the line lost: the page source's frees of pages it did not see
    /// allocated (PAGE_SIZE << order each). 0 for the other sources, whose
    /// free events carry no size.
    #[serde(default)]
    pub frees_untracked_bytes: u64,
    /// The page source's outstanding pages that back slabs, vmalloc areas
    /// and percpu chunks (not in outstanding_bytes): the page row compares
    /// every page with the free pages' drop.
    #[serde(default)]
    pub counted_elsewhere_bytes: u64,
    /// The page row only: pages the kernel counted allocated and freed
    /// over the run (/proc/vmstat `pgalloc_*` and `pgfree`, in bytes), an
    /// independent measure of what kheap's events should add up to: the
    /// bulk allocator's pages are in `vmstat_pgalloc_bytes` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmstat_pgalloc_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmstat_pgfree_bytes: Option<i64>,
    /// What it is compared with, e.g. "VmallocUsed" or "-MemFree - pcp".
    pub meminfo: String,
    pub meminfo_change_bytes: i64,
    /// meminfo_change_bytes - (outstanding_bytes - excluded_bytes +
    /// counted_elsewhere_bytes - frees_untracked_bytes).
    pub unexplained_bytes: i64,
}

/// The machine's page size and possible CPUs (percpu allocations have a
/// copy on each), which the outstanding bytes are converted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub page_size: u64,
    pub possible_cpus: u64,
}

impl Geometry {
    pub fn read() -> Geometry {
        let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible");
        Geometry {
            page_size: crate::sys::page_size(),
            possible_cpus: possible.map_or(1, |t| count_cpus(&t)),
        }
    }
}

/// The CPUs of a cpu list such as "0-1", "0" or "0-3,8-11".
pub fn count_cpus(list: &str) -> u64 {
    list.trim()
        .split(',')
        .filter(|r| !r.is_empty())
        .map(|r| match r.split_once('-') {
            Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum::<u64>()
        .max(1)
}

/// The sources a run can compare with /proc/meminfo, given its filters (as
/// `Filters::describe` lists them), and why one was left out. The page row
/// compares with the whole machine's free pages and takes every task's
/// frees of pages allocated before the run: a filtered run cannot be read
/// against it. The other rows compare the traced part with its line, the
/// rest of the machine being their remainder.
pub fn comparable(sources: Sources, filters: &[String]) -> (Sources, Option<String>) {
    if filters.is_empty() || !sources.contains(Source::Page) {
        return (sources, None);
    }
    let why = format!(
        "page row not compared with -MemFree - {PCP_LINE}, which counts the whole machine's pages: this run counted only {} (run without filters to compare it)",
        filters.join(", ")
    );
    (sources.without(Source::Page), Some(why))
}

/// Per traced source: outstanding bytes against the change of its
/// /proc/meminfo line between `before` and `after`.
pub fn account(
    sources: Sources,
    outstanding: &HashMap<Source, SourceOutstanding>,
    before: &MemInfo,
    after: &MemInfo,
) -> Vec<AccountingRow> {
    let change = |line: &str| after.get(line) - before.get(line);
    sources
        .iter()
        .map(|source| {
            let (meminfo, delta) = compared_with(source, change);
            let held = outstanding.get(&source).copied().unwrap_or_default();
            let compared = held.bytes.saturating_sub(held.excluded) as i64
                + held.counted_elsewhere as i64
                - held.freed_untracked as i64;
            AccountingRow {
                source,
                outstanding_bytes: held.bytes,
                excluded_bytes: held.excluded,
                frees_untracked_bytes: held.freed_untracked,
                counted_elsewhere_bytes: held.counted_elsewhere,
                vmstat_pgalloc_bytes: (source == Source::Page).then(|| change(PGALLOC_LINE)),
                vmstat_pgfree_bytes: (source == Source::Page).then(|| change(PGFREE_LINE)),
                meminfo,
                meminfo_change_bytes: delta,
                unexplained_bytes: delta - compared,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "MemTotal:       24684000 kB\nMemFree:         3288668 kB\nSlab:             722164 kB\nVmallocUsed:       73004 kB\nPercpu:            11024 kB\nHugePages_Total:       0\npcp:               40000 kB\n";
    const AFTER: &str = "MemFree:         3188668 kB\nSlab:             732164 kB\nVmallocUsed:      137004 kB\nPercpu:            11024 kB\npcp:               50000 kB\n";

    #[test]
    fn a_filtered_run_has_no_page_row() {
        assert_eq!(comparable(Sources::all(), &[]), (Sources::all(), None));
        let (kept, why) = comparable(Sources::all(), &["pid [42]".to_string()]);
        assert_eq!(kept.to_string(), "kmalloc,vmalloc,percpu");
        let why = why.unwrap();
        assert!(
            why.contains("only pid [42]") && why.contains("run without filters"),
            "{why}"
        );
        let slab = Sources::default();
        assert_eq!(comparable(slab, &["comm x".to_string()]), (slab, None));
    }

    #[test]
    fn parses_kilobytes_and_counts() {
        let m = MemInfo::parse(BEFORE);
        assert_eq!(m.get("MemFree"), 3288668 * 1024);
        assert_eq!(m.get("HugePages_Total"), 0);
        assert_eq!(m.get("Missing"), 0);
    }

    #[test]
    fn page_allocator_is_every_page_against_the_free_pages() {
        let held = |bytes, excluded| SourceOutstanding {
            bytes,
            excluded,
            ..Default::default()
        };
        let outstanding = HashMap::from([
            (Source::Kmalloc, held(10_000 * 1024, 0)),
            (Source::Vmalloc, held(64_000 * 1024 + 3 * 4096, 2 * 4096)),
            (
                Source::Page,
                SourceOutstanding {
                    // 12000 kB of direct pages, 74000 kB behind slabs and
                    // vmalloc areas, 2000 kB freed that were allocated
                    // before the run
                    counted_elsewhere: 74_000 * 1024,
                    freed_untracked: 2_000 * 1024,
                    ..held(12_000 * 1024, 0)
                },
            ),
        ]);
        let rows = account(
            Sources::all(),
            &outstanding,
            &MemInfo::parse(BEFORE),
            &MemInfo::parse(AFTER),
        );
        let page = rows.iter().find(|r| r.source == Source::Page).unwrap();
        assert_eq!(page.meminfo, "-MemFree - pcp");
        // 100000 kB left MemFree, 10000 kB of it free on the per-CPU lists.
        assert_eq!(page.meminfo_change_bytes, 90_000 * 1024);
        assert_eq!(page.unexplained_bytes, 6_000 * 1024);
        assert_eq!(
            (page.counted_elsewhere_bytes, page.frees_untracked_bytes),
            (74_000 * 1024, 2_000 * 1024)
        );
        // What VmallocUsed does not count (a guard page, a vmap area) is
        // no remainder.
        let vmalloc = rows.iter().find(|r| r.source == Source::Vmalloc).unwrap();
        assert_eq!(vmalloc.excluded_bytes, 2 * 4096);
        assert_eq!(vmalloc.unexplained_bytes, -4096);
        assert_eq!(vmalloc.vmstat_pgalloc_bytes, None);
        let percpu = rows.iter().find(|r| r.source == Source::Percpu).unwrap();
        assert_eq!((percpu.outstanding_bytes, percpu.unexplained_bytes), (0, 0));
        // The page row does not depend on which other sources are traced.
        let only = account(
            Sources::only(Source::Page),
            &outstanding,
            &MemInfo::parse(BEFORE),
            &MemInfo::parse(AFTER),
        );
        assert_eq!(only[0], *page);
    }

    #[test]
    fn reads_per_cpu_lists_and_vmstat_counters() {
        let zoneinfo = "Node 0, zone   Normal\n  pages free     1000\n  pagesets\n    cpu: 0\n              count: 12\n              high:  100\n    cpu: 1\n              count: 30\n";
        assert_eq!(pcp_pages(zoneinfo), 42);
        let vmstat = "nr_free_pages 5\npgalloc_dma 1\npgalloc_normal 20\npgalloc_movable 3\npgfree 17\npgfree_x 9\n";
        assert_eq!(vmstat_sum(vmstat, |n| n.starts_with("pgalloc_")), 24);
        assert_eq!(vmstat_sum(vmstat, |n| n == "pgfree"), 17);
    }

    #[test]
    fn counts_cpu_lists() {
        assert_eq!(count_cpus("0-1\n"), 2);
        assert_eq!(count_cpus("0"), 1);
        assert_eq!(count_cpus("0-3,8-11"), 8);
        assert_eq!(count_cpus(""), 1);
    }
}
