//! What the object is set up with from /proc/kallsyms: how kmalloc
//! objects' caches are found, and the text ranges that label events by
//! the functions on their stack.

use anyhow::Result;

use crate::arch::SlabPageBases;
use crate::kernel::features::KernelBtf;
use crate::kernel::skel::types;
use crate::model::Source;

use super::config::Config;

/// Where the slab page walk gets its bases (bpf/slab_cache.bpf.h).
pub(super) enum PageBases {
    /// The addresses of the kernel variables that hold them
    /// (`page_offset_base` and `vmemmap_base` on x86-64), read by BPF.
    Variables { direct_map: u64, vmemmap: u64 },
    /// Their values, derived and checked (arm64: super::page_map).
    Values(super::page_map::Bases),
}

/// How the kmalloc programs find the cache an object lives in
/// (bpf/slab_cache.bpf.h): Ok(None) through the kernel's kfunc (6.13+, any
/// attach mechanism), Ok(Some(bases)) through the object's page. Err: the
/// line the report header and `kheap doctor` show, where this kernel gives
/// no way (kallsyms without data symbols, i.e. no CONFIG_KALLSYMS_ALL, or
/// arm64 bases that could not be established); kmalloc caches are then
/// named by their size class.
pub(super) fn kmalloc_cache_resolution(
    kbtf: &KernelBtf,
    kallsyms: &Kallsyms,
) -> std::result::Result<Option<PageBases>, String> {
    if kbtf.kmem_cache_kfunc {
        return Ok(None);
    }
    let why = |what: &str| {
        format!(
            "kmalloc caches: named by size class, not by the object's slab ({what}): bucket, \
             random and accounted copies (msg_msg-4k, kmalloc-rnd-01-4k, kmalloc-cg-4k) are \
             not told apart"
        )
    };
    let text = kallsyms.text().map_err(|e| why(&format!("{e:#}")))?;
    match crate::arch::SLAB_PAGE_BASES {
        SlabPageBases::Variables {
            direct_map,
            vmemmap,
        } => {
            let find = |name| crate::model::kallsyms::address_of(text, name);
            match (find(direct_map), find(vmemmap)) {
                (Some(direct_map), Some(vmemmap)) => Ok(Some(PageBases::Variables {
                    direct_map,
                    vmemmap,
                })),
                _ => Err(why(&format!(
                    "/proc/kallsyms lists no {direct_map}/{vmemmap}: a kernel without \
                     CONFIG_KALLSYMS_ALL"
                ))),
            }
        }
        SlabPageBases::Derived => super::page_map::running_kernel_bases(text)
            .map(|b| Some(PageBases::Values(b)))
            .map_err(|e| why(&format!("the page bases could not be established: {e}"))),
    }
}

/// The text ranges that label events by the functions on their stack
/// (bpf/kheap/sources.c, `stack_label`), in the map's order: with the page
/// source and a source whose pages it would count again, the functions
/// that allocate those pages (only for the sources traced, so a page is
/// left out of the totals only when another source counts it); then, with
/// vmalloc, the functions that say what a vmap area is for.
#[derive(Default)]
pub(super) struct LabelRanges {
    pub(super) ranges: Vec<types::backing_range>,
    pub(super) page: u32,
    pub(super) vmap: u32,
}

/// /proc/kallsyms, read on first use.
#[derive(Default)]
pub(super) struct Kallsyms(std::cell::OnceCell<String>);

impl Kallsyms {
    pub(super) fn text(&self) -> Result<&str> {
        if let Some(t) = self.0.get() {
            return Ok(t);
        }
        let t = crate::sys::kallsyms_text()?;
        Ok(self.0.get_or_init(|| t))
    }
}

pub(super) fn label_ranges(cfg: &Config, kallsyms: &Kallsyms) -> Result<LabelRanges> {
    let pages = cfg.sources.contains(Source::Page);
    let vmap = cfg.sources.contains(Source::Vmalloc);
    if !pages && !vmap {
        return Ok(LabelRanges::default());
    }
    let kallsyms = kallsyms.text()?;
    let range = |start, end, label| types::backing_range {
        start,
        end,
        label,
        ..Default::default()
    };
    let mut ranges: Vec<types::backing_range> = Vec::new();
    if pages {
        ranges.extend(
            crate::model::backing::backing_ranges(kallsyms)
                .into_iter()
                .filter(|r| {
                    r.label
                        .counted_by()
                        .is_some_and(|s| cfg.sources.contains(s))
                })
                .map(|r| range(r.start, r.end, r.label.raw())),
        );
    }
    ranges.truncate(KHEAP_BACKING_RANGES);
    let page = ranges.len() as u32;
    if vmap {
        ranges.extend(
            crate::model::backing::vmap_ranges(kallsyms)
                .into_iter()
                .map(|r| range(r.start, r.end, r.label.raw())),
        );
    }
    ranges.truncate(KHEAP_BACKING_RANGES);
    Ok(LabelRanges {
        page,
        vmap: ranges.len() as u32 - page,
        ranges,
    })
}

/// KHEAP_BACKING_RANGES in bpf/kheap.h, the map's size (checked in kmem's
/// tests).
pub(super) const KHEAP_BACKING_RANGES: usize = 40;
