//! Kernel functions that label the events below them on the stack
//! (bpf/kheap/sources.c, `stack_label`): a page allocation whose innermost
//! frames pass through one that allocates the pages backing another source
//! is already counted by that source (`page_use`); a vmap area is vmalloc,
//! vmap, ioremap or vm_map_ram by the interface that asked for it. Their
//! text ranges come from a /proc/kallsyms text; pure, so it is tested on a
//! fixture.

use crate::model::{PageUse, VmapKind};

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

/// Functions (x86 and generic names, 5.10 to 6.18) whose callees' vmap
/// areas are of one kind; the innermost one on the stack wins.
pub const VMAP_FUNCTIONS: [(&str, VmapKind); 18] = [
    ("__vmalloc_node_range", VmapKind::Vmalloc),
    ("__vmalloc_node_range_noprof", VmapKind::Vmalloc),
    // vmalloc()'s exported wrappers (functions until 6.10): 5.10 inlines
    // __vmalloc_node_range into some (vmalloc_node, seen in the guest),
    // whose stacks then go from it straight to __get_vm_area_node.
    ("vmalloc", VmapKind::Vmalloc),
    ("vzalloc", VmapKind::Vmalloc),
    ("vmalloc_user", VmapKind::Vmalloc),
    ("vmalloc_node", VmapKind::Vmalloc),
    ("vzalloc_node", VmapKind::Vmalloc),
    ("vmalloc_32", VmapKind::Vmalloc),
    ("vmalloc_32_user", VmapKind::Vmalloc),
    ("__vmalloc", VmapKind::Vmalloc),
    ("vmap", VmapKind::Vmap),
    ("vmap_pfn", VmapKind::Vmap),
    // x86's ioremap_*() all go through __ioremap_caller; other
    // architectures through generic_ioremap_prot (6.5+) or ioremap_prot.
    ("__ioremap_caller", VmapKind::Ioremap),
    ("generic_ioremap_prot", VmapKind::Ioremap),
    ("ioremap_prot", VmapKind::Ioremap),
    ("vm_map_ram", VmapKind::VmMapRam),
    ("new_vmap_block", VmapKind::VmMapRam),
    ("vb_alloc", VmapKind::VmMapRam),
];

/// One function's text `[start, end)` and the label of what is allocated
/// below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextRange<L> {
    pub start: u64,
    pub end: u64,
    pub label: L,
}

/// A function whose page allocations back another source.
pub type BackingRange = TextRange<PageUse>;

/// The ranges of the backing functions this kernel has.
pub fn backing_ranges(kallsyms: &str) -> Vec<BackingRange> {
    text_ranges(kallsyms, &BACKING_FUNCTIONS)
}

/// The ranges of the functions that say what a vmap area is for.
pub fn vmap_ranges(kallsyms: &str) -> Vec<TextRange<VmapKind>> {
    text_ranges(kallsyms, &VMAP_FUNCTIONS)
}

/// The ranges of the functions of `table` this kernel has: a function ends
/// where the next symbol starts. Compiler clones and split-off parts
/// (`allocate_slab.isra.0`, `__ioremap_caller.isra.0.cold`) count as the
/// function.
fn text_ranges<L: Copy + Eq>(kallsyms: &str, table: &[(&str, L)]) -> Vec<TextRange<L>> {
    let mut starts: Vec<u64> = Vec::new();
    let mut found: Vec<(u64, L)> = Vec::new();
    for sym in crate::model::kallsyms::symbols(kallsyms) {
        starts.push(sym.address);
        let base = sym.name.split_once('.').map_or(sym.name, |(b, _)| b);
        if !sym.in_module {
            if let Some(&(_, u)) = table.iter().find(|(n, _)| *n == base) {
                found.push((sym.address, u));
            }
        }
    }
    starts.sort_unstable();
    starts.dedup();
    let mut ranges: Vec<TextRange<L>> = found
        .into_iter()
        .filter_map(|(start, label)| {
            let next = starts.partition_point(|&a| a <= start);
            starts.get(next).map(|&end| TextRange { start, end, label })
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
                    label: PageUse::Slab
                },
                BackingRange {
                    start: 0xffffffff81320000,
                    end: 0xffffffff81320900,
                    label: PageUse::Vmalloc
                },
                BackingRange {
                    start: 0xffffffff81330000,
                    end: 0xffffffff81330200,
                    label: PageUse::Percpu
                },
            ]
        );
    }

    #[test]
    fn vmap_kinds_by_the_interface_that_asked() {
        let kallsyms = "\
ffffffff81206547 t __ioremap_caller.isra.0.cold
ffffffff81206600 t alloc_vmap_area.cold
ffffffff81347930 t __ioremap_caller.isra.0
ffffffff81347c00 T ioremap_prot
ffffffff81347c50 T ioremap_cache
ffffffff816235d0 T vm_map_ram
ffffffff816241e0 T vmap_pages_range
ffffffff816248c0 T vmap
ffffffff81624a00 T vunmap
ffffffff81624e70 T __vmalloc_node_range_noprof
ffffffff81625000 T __vmalloc_node_noprof
";
        let kinds: Vec<(u64, VmapKind)> = vmap_ranges(kallsyms)
            .iter()
            .map(|r| (r.end - r.start, r.label))
            .collect();
        assert_eq!(
            kinds,
            [
                (0xb9, VmapKind::Ioremap),
                (0x2d0, VmapKind::Ioremap),
                (0x50, VmapKind::Ioremap),
                (0xc10, VmapKind::VmMapRam),
                (0x140, VmapKind::Vmap),
                (0x190, VmapKind::Vmalloc),
            ]
        );
    }
}
