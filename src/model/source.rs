//! Which kernel allocator an allocation came from (`--source`): the slab
//! (kmalloc and kmem_cache_alloc, the default), the page allocator, vmalloc
//! and percpu. A source is a property of a row's cache identity
//! (`CacheId::source`), so every row kind and every total carries it
//! without a second key.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One kernel allocator; the numbers match `enum kheap_source` in
/// bpf/kheap.h.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// kmalloc() and kmem_cache_alloc(): the slab allocator.
    #[default]
    Kmalloc,
    /// alloc_pages() and friends (kmem:mm_page_alloc).
    Page,
    /// vmalloc areas (vmalloc:alloc_vmap_area).
    Vmalloc,
    /// Per-CPU memory (percpu:percpu_alloc_percpu), size on every CPU.
    Percpu,
}

impl Source {
    pub const ALL: [Source; 4] = [
        Source::Kmalloc,
        Source::Page,
        Source::Vmalloc,
        Source::Percpu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Source::Kmalloc => "kmalloc",
            Source::Page => "page",
            Source::Vmalloc => "vmalloc",
            Source::Percpu => "percpu",
        }
    }

    /// From the BPF key's `source` byte.
    pub fn from_raw(v: u8) -> Option<Source> {
        Source::ALL.get(v as usize).copied()
    }

    pub fn raw(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of sources, as `--source kmalloc,page` or `all` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sources(u8);

impl Default for Sources {
    /// The slab only: what kheap traced before it had sources.
    fn default() -> Self {
        Sources::only(Source::Kmalloc)
    }
}

impl Sources {
    pub fn only(s: Source) -> Sources {
        Sources(1 << s.raw())
    }

    pub fn all() -> Sources {
        Sources(0b1111)
    }

    pub fn contains(self, s: Source) -> bool {
        self.0 & (1 << s.raw()) != 0
    }

    /// The set without `s`.
    pub fn without(self, s: Source) -> Sources {
        Sources(self.0 & !(1 << s.raw()))
    }

    /// The BPF config's bitmap (`cfg.sources`).
    pub fn bits(self) -> u8 {
        self.0
    }

    pub fn iter(self) -> impl Iterator<Item = Source> {
        Source::ALL.into_iter().filter(move |&s| self.contains(s))
    }

    /// Whether only the slab is traced (the default).
    pub fn is_default(self) -> bool {
        self == Sources::default()
    }
}

impl fmt::Display for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Source::name).collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for Sources {
    type Err = String;

    fn from_str(s: &str) -> Result<Sources, String> {
        let mut bits = 0u8;
        for part in s.split(',').map(str::trim) {
            if part == "all" {
                bits |= Sources::all().0;
                continue;
            }
            let src = Source::ALL
                .into_iter()
                .find(|x| x.name() == part)
                .ok_or_else(|| {
                    format!("unknown source '{part}': use kmalloc, page, vmalloc, percpu or all")
                })?;
            bits |= 1 << src.raw();
        }
        if bits == 0 {
            return Err("no source given: use kmalloc, page, vmalloc, percpu or all".into());
        }
        Ok(Sources(bits))
    }
}

/// What pages taken from the page allocator were for, as far as kheap can
/// tell (`enum kheap_page_use` in bpf/kheap.h). Pages that back slabs or
/// vmalloc areas are also counted by those sources: totals count them once,
/// under the source that handed them out.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PageUse {
    /// Used as pages (user memory, page cache, kmalloc-large…).
    #[default]
    Direct,
    /// New slabs of the slab allocator.
    Slab,
    /// The pages of a vmalloc area.
    Vmalloc,
    /// The pages of a percpu chunk.
    Percpu,
}

impl PageUse {
    pub fn from_raw(v: u8) -> PageUse {
        match v {
            1 => PageUse::Slab,
            2 => PageUse::Vmalloc,
            3 => PageUse::Percpu,
            _ => PageUse::Direct,
        }
    }

    /// The source that already counts these pages, if another one does.
    pub fn counted_by(self) -> Option<Source> {
        match self {
            PageUse::Direct => None,
            PageUse::Slab => Some(Source::Kmalloc),
            PageUse::Vmalloc => Some(Source::Vmalloc),
            PageUse::Percpu => Some(Source::Percpu),
        }
    }

    /// The raw value of `enum kheap_page_use`.
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// What a vmap area is for (`enum kheap_vmap_kind` in bpf/kheap.h), from
/// the function on its stack that asked for it. Only vmalloc proper has
/// pages behind it that `VmallocUsed` counts; vmap, ioremap and vm_map_ram
/// areas map memory allocated elsewhere (or device memory).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum VmapKind {
    /// None of the functions below was on the stack (get_vm_area callers
    /// such as BPF arenas, or a stack deeper than kheap looks).
    #[default]
    Other,
    /// `__vmalloc_node_range`: vmalloc(), kvmalloc() above a page, module
    /// and thread-stack memory.
    Vmalloc,
    /// `vmap()`/`vmap_pfn()`: pages the caller allocated, mapped together.
    Vmap,
    /// `ioremap*()`: device (or firmware) memory mapped into the kernel.
    Ioremap,
    /// `vm_map_ram()`: short-lived mappings of pages (filesystem buffers).
    VmMapRam,
}

impl VmapKind {
    pub const ALL: [VmapKind; 5] = [
        VmapKind::Other,
        VmapKind::Vmalloc,
        VmapKind::Vmap,
        VmapKind::Ioremap,
        VmapKind::VmMapRam,
    ];

    pub fn from_raw(v: u8) -> VmapKind {
        VmapKind::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(VmapKind::Other)
    }

    /// The raw value of `enum kheap_vmap_kind`.
    pub fn raw(self) -> u32 {
        self as u32
    }

    /// The row's cache name: the kernel interface that made the area.
    pub fn name(self) -> &'static str {
        match self {
            VmapKind::Other => "vmap-other",
            VmapKind::Vmalloc => "vmalloc",
            VmapKind::Vmap => "vmap",
            VmapKind::Ioremap => "ioremap",
            VmapKind::VmMapRam => "vm_map_ram",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_all() {
        let s: Sources = "kmalloc,page".parse().unwrap();
        assert!(s.contains(Source::Kmalloc) && s.contains(Source::Page));
        assert!(!s.contains(Source::Vmalloc));
        assert_eq!(s.to_string(), "kmalloc,page");
        assert_eq!("all".parse::<Sources>().unwrap(), Sources::all());
        assert_eq!(Sources::all().to_string(), "kmalloc,page,vmalloc,percpu");
        let no_page = Sources::all().without(Source::Page);
        assert_eq!(no_page.to_string(), "kmalloc,vmalloc,percpu");
        assert_eq!(no_page.without(Source::Page), no_page);
        assert!("slab"
            .parse::<Sources>()
            .unwrap_err()
            .contains("unknown source 'slab'"));
        assert!(Sources::default().is_default());
        assert_eq!(Sources::default().bits(), 1);
    }

    #[test]
    fn raw_values_match_the_bpf_enum() {
        let h = include_str!("../../bpf/kheap.h");
        for (s, n) in [
            (Source::Kmalloc, "KHEAP_SOURCE_KMALLOC = 0"),
            (Source::Page, "KHEAP_SOURCE_PAGE = 1"),
            (Source::Vmalloc, "KHEAP_SOURCE_VMALLOC = 2"),
            (Source::Percpu, "KHEAP_SOURCE_PERCPU = 3"),
        ] {
            assert!(h.contains(n), "{n}");
            assert_eq!(Source::from_raw(s.raw()), Some(s));
        }
        assert!(h.contains("KHEAP_PAGE_SLAB = 1") && h.contains("KHEAP_PAGE_VMALLOC = 2"));
        assert!(h.contains("KHEAP_PAGE_PERCPU = 3"));
        assert_eq!(PageUse::Percpu.raw(), 3);
        assert_eq!(PageUse::from_raw(1), PageUse::Slab);
        assert_eq!(PageUse::Slab.counted_by(), Some(Source::Kmalloc));
        for (k, n) in [
            (VmapKind::Other, "KHEAP_VMAP_OTHER = 0"),
            (VmapKind::Vmalloc, "KHEAP_VMAP_VMALLOC = 1"),
            (VmapKind::Vmap, "KHEAP_VMAP_VMAP = 2"),
            (VmapKind::Ioremap, "KHEAP_VMAP_IOREMAP = 3"),
            (VmapKind::VmMapRam, "KHEAP_VMAP_VM_MAP_RAM = 4"),
        ] {
            assert!(h.contains(n), "{n}");
            assert_eq!(VmapKind::from_raw(k.raw() as u8), k);
        }
        assert_eq!(VmapKind::from_raw(9), VmapKind::Other);
    }
}
