//! Which kernel functions allocate the pages that back another source:
//! a page allocation whose innermost frames pass through one of them is
//! already counted by that source (bpf/sources.bpf.h, `page_use`). Their
//! text ranges come from a /proc/kallsyms text; pure, so it is tested on a
//! fixture.

use crate::model::PageUse;

/// Functions (every name a kernel from 6.1 to 6.18 uses) whose own page
/// allocations back slabs (new slabs; kmalloc above 8 KiB, which the
/// kmalloc event counts in whole pages), vmalloc areas or percpu chunks.
pub const BACKING_FUNCTIONS: [(&str, PageUse); 14] = [
    ("allocate_slab", PageUse::Slab),
    ("alloc_slab_page", PageUse::Slab),
    ("new_slab", PageUse::Slab),
    ("__kmalloc_large_node", PageUse::Slab),
    ("__kmalloc_large_node_noprof", PageUse::Slab),
    ("___kmalloc_large_node", PageUse::Slab),
    ("kmalloc_large", PageUse::Slab),
    ("kmalloc_large_node", PageUse::Slab),
    ("__vmalloc_area_node", PageUse::Vmalloc),
    ("vm_area_alloc_pages", PageUse::Vmalloc),
    ("__vmalloc_node_range", PageUse::Vmalloc),
    ("__vmalloc_node_range_noprof", PageUse::Vmalloc),
    ("pcpu_alloc_pages", PageUse::Percpu),
    ("pcpu_populate_chunk", PageUse::Percpu),
];

/// One function's text `[start, end)` and what its pages back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackingRange {
    pub start: u64,
    pub end: u64,
    pub page_use: PageUse,
}

/// The ranges of the backing functions this kernel has: a function ends
/// where the next symbol starts. Compiler clones (`allocate_slab.isra.0`)
/// count as the function.
pub fn backing_ranges(kallsyms: &str) -> Vec<BackingRange> {
    let mut starts: Vec<u64> = Vec::new();
    let mut found: Vec<(u64, PageUse)> = Vec::new();
    for sym in crate::model::kallsyms::symbols(kallsyms) {
        starts.push(sym.address);
        let base = sym.name.split_once('.').map_or(sym.name, |(b, _)| b);
        if !sym.in_module {
            if let Some(&(_, u)) = BACKING_FUNCTIONS.iter().find(|(n, _)| *n == base) {
                found.push((sym.address, u));
            }
        }
    }
    starts.sort_unstable();
    starts.dedup();
    let mut ranges: Vec<BackingRange> = found
        .into_iter()
        .filter_map(|(start, page_use)| {
            let next = starts.partition_point(|&a| a <= start);
            starts.get(next).map(|&end| BackingRange {
                start,
                end,
                page_use,
            })
        })
        .collect();
    ranges.sort_by_key(|r| r.start);
    ranges.dedup();
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_end_at_the_next_symbol() {
        let kallsyms = "\
ffffffff81300000 T __alloc_pages_noprof
ffffffff81310000 t allocate_slab
ffffffff81310400 t shuffle_freelist
ffffffff81320000 T __vmalloc_node_range_noprof
ffffffff81320900 T vfree
ffffffff81330000 t pcpu_alloc_pages.constprop.0
ffffffff81330200 t pcpu_free_pages
ffffffff81340000 t new_slab [some_module]
0000000000000000 t kmalloc_large
";
        assert_eq!(
            backing_ranges(kallsyms),
            [
                BackingRange {
                    start: 0xffffffff81310000,
                    end: 0xffffffff81310400,
                    page_use: PageUse::Slab
                },
                BackingRange {
                    start: 0xffffffff81320000,
                    end: 0xffffffff81320900,
                    page_use: PageUse::Vmalloc
                },
                BackingRange {
                    start: 0xffffffff81330000,
                    end: 0xffffffff81330200,
                    page_use: PageUse::Percpu
                },
            ]
        );
    }
}
