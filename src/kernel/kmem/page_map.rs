//! The slab page walk's bases where the kernel keeps them in no variable
//! (arm64; `crate::arch::SLAB_PAGE_BASES`). bpf/slab_page.bpf.h finds an
//! address's `struct page` as `map + ((ptr - base) >> PAGE_SHIFT)` struct
//! pages, for any direct-map address `base` whose page is `map`. arm64's
//! virt_to_page() uses PAGE_OFFSET and VMEMMAP_START, compile-time constants
//! whose formulas depend on CONFIG_ARM64_VA_BITS, the page size and the
//! kernel version; so no formula is used. The pair is that of physical
//! address 0, from the kernel's own data (read with bpf/page_map.bpf.c):
//!
//! - `map`, the struct page of pfn 0 (the kernel's `vmemmap`): what every
//!   present memory section stores (sparse_encode_mem_map(): the section's
//!   mem_map minus its first pfn, flag bits below bit 6) in
//!   `mem_section`;
//! - `base`, the direct-map address of physical 0: `PAGE_OFFSET -
//!   memstart_addr` (`__phys_to_virt`). PAGE_OFFSET is `-(1 << VA_BITS)` on
//!   every arm64 kernel since 5.4; each VA_BITS a kernel can be built with is
//!   tried. memstart_addr already holds the shift of a 52-bit kernel on
//!   48-bit hardware (its linear map then starts higher).
//!
//! Nothing is trusted unchecked: the kmalloc caches' own `struct kmem_cache`
//! objects are allocated from the `kmem_cache` cache, so with the right
//! bases the page walk of each (the event path's own BPF code) must lead
//! to the slab cache `kmem_cache` points to. Exactly one candidate must
//! pass for every one of them, or the bases stay unknown (kmalloc caches are
//! then named by size class, and the report says why).

use std::mem::MaybeUninit;

use libbpf_rs::{OpenObject, ProgramInput};

use crate::model::kallsyms::address_of;

skeleton!("page_map");

use skel::{PageMapSkel, PageMapSkelBuilder};

/// The slab page walk's bases: the direct-map address `direct_map` has the
/// struct page at `vmemmap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bases {
    pub direct_map: u64,
    pub vmemmap: u64,
}

/// What the derivation reads of the running kernel.
pub trait KernelMemory {
    /// `len` bytes (at most 4096) at the kernel address `addr`.
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, String>;
    /// The slab cache the BPF page walk finds for each of `ptrs` (at most
    /// `CHECKS`) with `bases` (0: none).
    fn caches_of(
        &mut self,
        bases: Bases,
        page_shift: u32,
        ptrs: &[u64],
    ) -> Result<Vec<u64>, String>;
    /// The kernel's `sizeof(struct mem_section)`.
    fn mem_section_size(&self) -> u64;
}

/// Pointers checked in one run of the BPF check (bpf/page_map.bpf.c's
/// PAGE_MAP_CHECKS).
pub const CHECKS: usize = 16;
/// The kmalloc caches checked at least (fewer listed: not trusted).
const MIN_CHECKED: usize = 3;
/// VA_BITS an arm64 kernel can be built with (CONFIG_ARM64_VA_BITS_*).
const VA_BITS: [u32; 6] = [52, 48, 47, 42, 39, 36];
/// Memory section roots (SPARSEMEM_EXTREME) searched for a present
/// section: each covers 2^(PAGE_SHIFT - 4 or 5) sections of 128 MiB or more
/// (32 GiB or more), enough to reach the first RAM of any machine.
const ROOTS: u64 = 32;
/// The flags below a section's coded mem_map (SECTION_MARKED_PRESENT,
/// SECTION_HAS_MEM_MAP, …; at most six bits up to 6.18).
const SECTION_FLAGS: u64 = 0x3f;
const SECTION_PRESENT_WITH_MAP: u64 = 0b11;

/// The addresses of the kernel variables the derivation reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbols {
    memstart_addr: u64,
    mem_section: u64,
    kmem_cache: u64,
    kmalloc_caches: u64,
}

impl Symbols {
    /// From /proc/kallsyms (data symbols: CONFIG_KALLSYMS_ALL).
    pub fn find(kallsyms: &str) -> Result<Symbols, String> {
        let find = |name: &str| {
            address_of(kallsyms, name)
                .filter(|&a| a != 0)
                .ok_or_else(|| {
                    format!(
                        "/proc/kallsyms lists no {name}: a kernel without CONFIG_KALLSYMS_ALL, or \
                     without SPARSEMEM_VMEMMAP"
                    )
                })
        };
        Ok(Symbols {
            memstart_addr: find("memstart_addr")?,
            mem_section: find("mem_section")?,
            kmem_cache: find("kmem_cache")?,
            kmalloc_caches: find("kmalloc_caches")?,
        })
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
}

fn read_u64(mem: &mut dyn KernelMemory, addr: u64, what: &str) -> Result<u64, String> {
    let b = mem
        .read(addr, 8)
        .map_err(|e| format!("reading {what}: {e}"))?;
    let w = words(&b).next().unwrap_or(0);
    Ok(w)
}

/// The struct page of pfn 0, as the first present memory section with a
/// mem_map codes it.
fn vmemmap_of_sections(
    mem: &mut dyn KernelMemory,
    mem_section: u64,
    page_size: u64,
) -> Result<u64, String> {
    let roots = read_u64(mem, mem_section, "mem_section")?;
    if roots == 0 {
        return Err("mem_section is not set".into());
    }
    let size = mem.mem_section_size();
    if !(8..=page_size).contains(&size) || !size.is_multiple_of(8) {
        return Err(format!("struct mem_section of {size} bytes"));
    }
    let root_list = mem.read(roots, (ROOTS * 8) as usize)?;
    for root in words(&root_list).filter(|&r| r != 0) {
        // A root is one page of sections, read 4096 bytes at a time.
        let chunk = 4096 - 4096 % size;
        let mut off = 0;
        while off + size <= page_size {
            let len = chunk.min(page_size - off);
            let bytes = mem.read(root + off, len as usize)?;
            for s in bytes.chunks_exact(size as usize) {
                let coded = words(s).next().unwrap_or(0);
                if coded & SECTION_PRESENT_WITH_MAP == SECTION_PRESENT_WITH_MAP {
                    return Ok(coded & !SECTION_FLAGS);
                }
            }
            off += len;
        }
    }
    Err(format!(
        "no present memory section in the first {ROOTS} roots of mem_section"
    ))
}

/// The bases of an arm64 kernel (see the module's comment), or why they
/// could not be established.
pub fn arm64_bases(
    mem: &mut dyn KernelMemory,
    syms: &Symbols,
    page_shift: u32,
) -> Result<Bases, String> {
    let page_size = 1u64 << page_shift;
    let memstart = read_u64(mem, syms.memstart_addr, "memstart_addr")?;
    if !memstart.is_multiple_of(page_size) {
        return Err(format!("memstart_addr {memstart:#x} is not page-aligned"));
    }
    let vmemmap = vmemmap_of_sections(mem, syms.mem_section, page_size)?;
    let own = read_u64(mem, syms.kmem_cache, "kmem_cache")?;
    let listed = mem.read(syms.kmalloc_caches, CHECKS * 8)?;
    let mut caches: Vec<u64> = words(&listed).filter(|&c| c != 0 && c != own).collect();
    caches.dedup();
    if own == 0 || caches.len() < MIN_CHECKED {
        return Err(format!(
            "{} kmalloc caches to check the bases against",
            caches.len()
        ));
    }
    let mut passed = Vec::new();
    for bits in VA_BITS {
        let page_offset = 0u64.wrapping_sub(1 << bits);
        // The linear map lies above PAGE_OFFSET.
        if caches.iter().any(|&c| c < page_offset) {
            continue;
        }
        let bases = Bases {
            direct_map: page_offset.wrapping_sub(memstart),
            vmemmap,
        };
        if mem
            .caches_of(bases, page_shift, &caches)?
            .iter()
            .all(|&c| c == own)
        {
            passed.push(bases);
        }
    }
    match passed[..] {
        [bases] => Ok(bases),
        [] => Err(format!(
            "no arm64 layout led the {} kmalloc caches' own objects to their slab (memstart_addr \
             {memstart:#x}, vmemmap {vmemmap:#x})",
            caches.len()
        )),
        _ => Err(format!(
            "{} arm64 layouts led the kmalloc caches' own objects to their slab",
            passed.len()
        )),
    }
}

/// The running kernel's memory, through bpf/page_map.bpf.c.
struct Bpf<'obj> {
    skel: PageMapSkel<'obj>,
}

impl Bpf<'_> {
    fn bss(&mut self) -> Result<&mut skel::types::bss, String> {
        self.skel
            .maps
            .bss_data
            .as_deref_mut()
            .ok_or_else(|| "the page map object has no .bss".to_string())
    }
}

impl KernelMemory for Bpf<'_> {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, String> {
        let len = len.min(4096);
        let bss = self.bss()?;
        bss.read_addr = addr;
        bss.read_len = len as u32;
        self.skel
            .progs
            .read_kernel
            .test_run(ProgramInput::default())
            .map_err(|e| format!("running the kernel read: {e}"))?;
        let bss = self.bss()?;
        // SAFETY: the kernel wrote them behind the compiler's back.
        let err = unsafe { std::ptr::read_volatile(&bss.read_err) };
        if err != 0 {
            return Err(format!("{len} bytes at {addr:#x} unreadable ({err})"));
        }
        let buf = unsafe { std::ptr::read_volatile(&bss.read_buf) };
        Ok(buf[..len].to_vec())
    }

    fn caches_of(
        &mut self,
        bases: Bases,
        page_shift: u32,
        ptrs: &[u64],
    ) -> Result<Vec<u64>, String> {
        let bss = self.bss()?;
        bss.check_base = bases.direct_map;
        bss.check_map = bases.vmemmap;
        bss.check_shift = page_shift;
        bss.check_ptrs = [0; CHECKS];
        bss.check_ptrs[..ptrs.len()].copy_from_slice(ptrs);
        self.skel
            .progs
            .check_bases
            .test_run(ProgramInput::default())
            .map_err(|e| format!("running the page walk check: {e}"))?;
        let bss = self.bss()?;
        // SAFETY: as above.
        let caches = unsafe { std::ptr::read_volatile(&bss.check_caches) };
        Ok(caches[..ptrs.len()].to_vec())
    }

    fn mem_section_size(&self) -> u64 {
        self.skel.maps.bss_data.as_deref().map_or(0, |b| unsafe {
            std::ptr::read_volatile(&b.mem_section_size)
        } as u64)
    }
}

/// The running arm64 kernel's bases, derived once per process (they never
/// change after boot), or why not.
pub fn running_kernel_bases(kallsyms: &str) -> Result<Bases, String> {
    static BASES: std::sync::OnceLock<Result<Bases, String>> = std::sync::OnceLock::new();
    BASES
        .get_or_init(|| {
            let syms = Symbols::find(kallsyms)?;
            let mut slot = MaybeUninit::<OpenObject>::uninit();
            let open = crate::kernel::features::open_skel(PageMapSkelBuilder::default(), &mut slot)
                .map_err(|e| format!("opening the page map check: {e:#}"))?;
            let skel = crate::kernel::load_skel(open)
                .map_err(|e| format!("loading the page map check: {e:#}"))?;
            let mut mem = Bpf { skel };
            // mem_section_size is written by the first run.
            mem.read(syms.memstart_addr, 8)?;
            let shift = crate::sys::page_size().trailing_zeros();
            arm64_bases(&mut mem, &syms, shift)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A fake arm64 kernel: memory of words, and the page walk of
    /// bpf/slab_page.bpf.h over it.
    struct Fake {
        words: BTreeMap<u64, u64>,
        mem_section_size: u64,
        /// What the true bases are: the page of a direct-map address.
        page_offset: u64,
        memstart: u64,
        vmemmap_start: u64,
        /// The slab cache of the slab at each page address.
        slab_of_page: BTreeMap<u64, u64>,
        runs: usize,
        shift: u32,
    }

    const PAGE_SHIFT: u32 = 12;
    const STRUCT_PAGE: u64 = 64;

    impl KernelMemory for Fake {
        fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, String> {
            assert!(len <= 4096 && len.is_multiple_of(8));
            let mut out = Vec::new();
            for i in 0..len as u64 / 8 {
                match self.words.get(&(addr + 8 * i)) {
                    Some(w) => out.extend(w.to_ne_bytes()),
                    None if i > 0 || len > 8 => out.extend(0u64.to_ne_bytes()),
                    None => return Err(format!("fault at {addr:#x}")),
                }
            }
            Ok(out)
        }
        fn caches_of(&mut self, b: Bases, shift: u32, ptrs: &[u64]) -> Result<Vec<u64>, String> {
            assert!(ptrs.len() <= CHECKS);
            self.runs += 1;
            Ok(ptrs
                .iter()
                .map(|&p| {
                    if p < b.direct_map {
                        return 0;
                    }
                    let page = b
                        .vmemmap
                        .wrapping_add(((p - b.direct_map) >> shift) * STRUCT_PAGE);
                    *self.slab_of_page.get(&page).unwrap_or(&0)
                })
                .collect())
        }
        fn mem_section_size(&self) -> u64 {
            self.mem_section_size
        }
    }

    const MEMSTART: u64 = 0x4000_0000;
    const SYMS: Symbols = Symbols {
        memstart_addr: 0xffff_8000_8200_0000,
        mem_section: 0xffff_8000_8200_0008,
        kmem_cache: 0xffff_8000_8200_0010,
        kmalloc_caches: 0xffff_8000_8200_0100,
    };

    /// A kernel of `va_bits` and 4 KiB pages whose RAM starts at
    /// `MEMSTART` (shifted as a 52-bit kernel on 48-bit hardware shifts it,
    /// when `lva_missing`).
    fn kernel(va_bits: u32, lva_missing: bool) -> Fake {
        kernel_of_pages(va_bits, lva_missing, PAGE_SHIFT)
    }

    fn kernel_of_pages(va_bits: u32, lva_missing: bool, shift: u32) -> Fake {
        let page_offset = 0u64.wrapping_sub(1 << va_bits);
        let memstart = if lva_missing {
            MEMSTART.wrapping_sub(0u64.wrapping_sub(1 << 48).wrapping_sub(page_offset))
        } else {
            MEMSTART
        };
        // 5.11's VMEMMAP_START (VMEMMAP_SHIFT = PAGE_SHIFT - 6).
        let vmemmap_start = 0u64.wrapping_sub(1 << (va_bits - (shift - 6)));
        let mut f = Fake {
            words: BTreeMap::new(),
            mem_section_size: 32,
            page_offset,
            memstart,
            vmemmap_start,
            slab_of_page: BTreeMap::new(),
            runs: 0,
            shift,
        };
        // vmemmap: the page of pfn 0 (memstart_addr is an s64: an
        // arithmetic shift, as the kernel's `vmemmap` macro does it).
        let vmemmap = vmemmap_start
            .wrapping_sub((((memstart as i64) >> shift) as u64).wrapping_mul(STRUCT_PAGE));
        let roots = 0xffff_0000_1000_0000u64.max(page_offset + 0x1000_0000);
        let root0 = roots + 0x10000;
        f.words.insert(SYMS.memstart_addr, memstart);
        f.words.insert(SYMS.mem_section, roots);
        f.words.insert(roots, root0);
        // Sections of 128 MiB; RAM from 1 GiB: section 8 is the first. With
        // 64 KiB pages (a root of 2048 sections) one further in, beyond the
        // first 4096 bytes read.
        let first = if shift == 16 { 200 } else { 8 };
        f.words.insert(root0 + first * 32, vmemmap | 0b1111);
        f.words.insert(root0 + (first + 1) * 32, vmemmap | 0b0111);
        // The caches: kmem_cache's object and seven kmalloc caches, in
        // slabs of kmem_cache.
        let own = f.linear(0x0200_0000);
        f.words.insert(SYMS.kmem_cache, own);
        let own_page = f.page_of(own);
        f.slab_of_page.insert(own_page, own);
        for i in 0..7u64 {
            let c = f.linear(0x0300_0000 + i * 0x10_0000 + 0x1000 + i * 0x100);
            f.words.insert(SYMS.kmalloc_caches + 8 * (i + 7), c);
            f.slab_of_page.insert(f.page_of(c), own);
        }
        f
    }

    impl Fake {
        /// The direct-map address of physical address MEMSTART + `off`.
        fn linear(&self, off: u64) -> u64 {
            (MEMSTART + off)
                .wrapping_sub(self.memstart)
                .wrapping_add(self.page_offset)
        }
        /// virt_to_page(), as the kernel computes it.
        fn page_of(&self, va: u64) -> u64 {
            self.vmemmap_start
                .wrapping_add(((va - self.page_offset) >> self.shift) * STRUCT_PAGE)
        }
        fn expected(&self) -> Bases {
            Bases {
                direct_map: self.page_offset.wrapping_sub(self.memstart),
                vmemmap: self.vmemmap_start.wrapping_sub(
                    (((self.memstart as i64) >> self.shift) as u64).wrapping_mul(STRUCT_PAGE),
                ),
            }
        }
    }

    #[test]
    fn each_layout_is_found_from_the_kernels_data() {
        for (bits, lva_missing) in [
            (48, false),
            (52, false),
            (52, true),
            (39, false),
            (47, false),
        ] {
            let mut k = kernel(bits, lva_missing);
            let got = arm64_bases(&mut k, &SYMS, PAGE_SHIFT);
            assert_eq!(got, Ok(k.expected()), "VA_BITS {bits}, {lva_missing}");
            // And the bases give the kernel's own answer for any address.
            let b = got.unwrap();
            for off in [0u64, 0x1234_5000, 0x7_0000_0000] {
                let va = k.linear(off);
                assert_eq!(
                    b.vmemmap
                        .wrapping_add(((va - b.direct_map) >> PAGE_SHIFT) * STRUCT_PAGE),
                    k.page_of(va),
                    "VA_BITS {bits} {lva_missing}: {va:#x}"
                );
            }
        }
    }

    #[test]
    fn pages_of_16_and_64_kib_are_walked_with_their_own_shift() {
        for (bits, shift) in [(47, 14), (48, 14), (42, 16), (48, 16), (52, 16)] {
            let mut k = kernel_of_pages(bits, false, shift);
            assert_eq!(
                arm64_bases(&mut k, &SYMS, shift),
                Ok(k.expected()),
                "VA_BITS {bits}, {} KiB pages",
                1 << (shift - 10)
            );
            // A 4 KiB walk of the same kernel finds no slab.
            let mut k = kernel_of_pages(bits, false, shift);
            assert!(arm64_bases(&mut k, &SYMS, PAGE_SHIFT).is_err());
        }
    }

    #[test]
    fn a_wrong_vmemmap_is_refused() {
        let mut k = kernel(48, false);
        let root0 = k.words[&k.words[&SYMS.mem_section]];
        k.words
            .insert(root0 + 8 * 32, (k.expected().vmemmap + 0x40) | 0b11);
        let why = arm64_bases(&mut k, &SYMS, PAGE_SHIFT).unwrap_err();
        assert!(
            why.starts_with("no arm64 layout led the 7 kmalloc caches"),
            "{why}"
        );
    }

    #[test]
    fn one_cache_of_another_slab_refuses_the_bases() {
        let mut k = kernel(52, true);
        let c = k.words[&(SYMS.kmalloc_caches + 8 * 9)];
        let p = k.page_of(c);
        k.slab_of_page.insert(p, 0xffff_0000_dead_0000);
        assert!(arm64_bases(&mut k, &SYMS, PAGE_SHIFT).is_err());
    }

    #[test]
    fn too_few_caches_are_no_evidence() {
        let mut k = kernel(48, false);
        for i in 9..14 {
            k.words.remove(&(SYMS.kmalloc_caches + 8 * i));
        }
        assert_eq!(
            arm64_bases(&mut k, &SYMS, PAGE_SHIFT),
            Err("2 kmalloc caches to check the bases against".into())
        );
    }

    #[test]
    fn unreadable_or_absent_sections_say_so() {
        let mut k = kernel(48, false);
        k.words.insert(SYMS.mem_section, 0);
        assert_eq!(
            arm64_bases(&mut k, &SYMS, PAGE_SHIFT),
            Err("mem_section is not set".into())
        );
        let mut k = kernel(48, false);
        let root0 = k.words[&k.words[&SYMS.mem_section]];
        k.words.remove(&(root0 + 8 * 32));
        k.words.remove(&(root0 + 9 * 32));
        let why = arm64_bases(&mut k, &SYMS, PAGE_SHIFT).unwrap_err();
        assert!(why.starts_with("no present memory section"), "{why}");
        assert_eq!(k.runs, 0);
    }

    #[test]
    fn symbols_come_from_kallsyms() {
        let text = "ffff800081a10000 D memstart_addr\nffff800081a20000 B mem_section\n\
                    ffff800081a30000 D kmem_cache\nffff800081a40000 D kmalloc_caches\n";
        assert_eq!(
            Symbols::find(text),
            Ok(Symbols {
                memstart_addr: 0xffff800081a10000,
                mem_section: 0xffff800081a20000,
                kmem_cache: 0xffff800081a30000,
                kmalloc_caches: 0xffff800081a40000,
            })
        );
        let why = Symbols::find("ffff800081a10000 D memstart_addr\n").unwrap_err();
        assert!(
            why.starts_with("/proc/kallsyms lists no mem_section"),
            "{why}"
        );
    }
}
