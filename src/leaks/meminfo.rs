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

    /// The running system's, or empty if it cannot be read.
    pub fn read() -> MemInfo {
        MemInfo::parse(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
    }

    fn get(&self, name: &str) -> i64 {
        self.0.get(name).copied().unwrap_or(0) as i64
    }
}

/// The /proc/meminfo line that counts each source's memory. The page
/// allocator's is MemFree (its drop), less the other sources' lines.
fn meminfo_line(source: Source) -> &'static str {
    match source {
        Source::Kmalloc => "Slab",
        Source::Vmalloc => "VmallocUsed",
        Source::Percpu => "Percpu",
        Source::Page => "MemFree",
    }
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
    /// What it is compared with, e.g. "VmallocUsed" or "-MemFree - Slab".
    pub meminfo: String,
    pub meminfo_change_bytes: i64,
    /// meminfo_change_bytes - (outstanding_bytes - excluded_bytes).
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
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible");
        Geometry {
            page_size: if page > 0 { page as u64 } else { 4096 },
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
            let (meminfo, delta) = if source == Source::Page {
                // Memory that left the free pool, less what the other traced
                // sources' own lines account for.
                let mut name = "-MemFree".to_string();
                let mut delta = -change("MemFree");
                for other in sources.iter().filter(|&s| s != Source::Page) {
                    name += &format!(" - {}", meminfo_line(other));
                    delta -= change(meminfo_line(other));
                }
                (name, delta)
            } else {
                (
                    meminfo_line(source).to_string(),
                    change(meminfo_line(source)),
                )
            };
            let held = outstanding.get(&source).copied().unwrap_or_default();
            AccountingRow {
                source,
                outstanding_bytes: held.bytes,
                excluded_bytes: held.excluded,
                meminfo,
                meminfo_change_bytes: delta,
                unexplained_bytes: delta - held.bytes.saturating_sub(held.excluded) as i64,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "MemTotal:       24684000 kB\nMemFree:         3288668 kB\nSlab:             722164 kB\nVmallocUsed:       73004 kB\nPercpu:            11024 kB\nHugePages_Total:       0\n";
    const AFTER: &str = "MemFree:         3188668 kB\nSlab:             732164 kB\nVmallocUsed:      137004 kB\nPercpu:            11024 kB\n";

    #[test]
    fn parses_kilobytes_and_counts() {
        let m = MemInfo::parse(BEFORE);
        assert_eq!(m.get("MemFree"), 3288668 * 1024);
        assert_eq!(m.get("HugePages_Total"), 0);
        assert_eq!(m.get("Missing"), 0);
    }

    #[test]
    fn page_allocator_is_memfree_less_the_other_traced_lines() {
        let held = |bytes, excluded| SourceOutstanding { bytes, excluded };
        let outstanding = HashMap::from([
            (Source::Kmalloc, held(10_000 * 1024, 0)),
            (Source::Vmalloc, held(64_000 * 1024 + 3 * 4096, 2 * 4096)),
            (Source::Page, held(20_000 * 1024, 0)),
        ]);
        let rows = account(
            Sources::all(),
            &outstanding,
            &MemInfo::parse(BEFORE),
            &MemInfo::parse(AFTER),
        );
        let page = rows.iter().find(|r| r.source == Source::Page).unwrap();
        assert_eq!(page.meminfo, "-MemFree - Slab - VmallocUsed - Percpu");
        // 100000 kB left the free pool: 10000 slab, 64000 vmalloc.
        assert_eq!(page.meminfo_change_bytes, 26_000 * 1024);
        assert_eq!(page.unexplained_bytes, 6_000 * 1024);
        // What VmallocUsed does not count (a guard page, a vmap area) is
        // no remainder.
        let vmalloc = rows.iter().find(|r| r.source == Source::Vmalloc).unwrap();
        assert_eq!(vmalloc.excluded_bytes, 2 * 4096);
        assert_eq!(vmalloc.unexplained_bytes, -4096);
        let percpu = rows.iter().find(|r| r.source == Source::Percpu).unwrap();
        assert_eq!((percpu.outstanding_bytes, percpu.unexplained_bytes), (0, 0));
        // Only the page source: all of MemFree's drop is its.
        let only = account(
            Sources::only(Source::Page),
            &outstanding,
            &MemInfo::parse(BEFORE),
            &MemInfo::parse(AFTER),
        );
        assert_eq!(only[0].meminfo_change_bytes, 100_000 * 1024);
    }

    #[test]
    fn counts_cpu_lists() {
        assert_eq!(count_cpus("0-1\n"), 2);
        assert_eq!(count_cpus("0"), 1);
        assert_eq!(count_cpus("0-3,8-11"), 8);
        assert_eq!(count_cpus(""), 1);
    }
}
