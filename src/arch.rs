//! What differs by CPU architecture in user space, in one place (the BPF
//! side's differences are in `bpf/arch.bpf.h`): the unwinder of sampled
//! user stacks and the registers it starts from, and the Debian multiarch
//! library directories and the ELF mapping symbols that name no function,
//! and where the slab page walk of kernels before 6.13 finds its bases
//! (`SLAB_PAGE_BASES`).
//! System call numbers come from the libc crate
//! (`libc::SYS_*`, per target). Built for x86_64 and aarch64.

/// Where the slab page walk (bpf/slab_page.bpf.h: an address's struct
/// page, for kernels before 6.13) finds a direct-map address and its page.
pub enum SlabPageBases {
    /// Kernel variables that hold them, listed in /proc/kallsyms (read by
    /// the BPF program at its first event).
    Variables {
        direct_map: &'static str,
        vmemmap: &'static str,
    },
    /// Derived from the kernel's data and checked before the load
    /// (src/kernel/kmem/page_map.rs): the kernel's bases are compile-time
    /// constants.
    Derived,
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};

    /// The architecture's name as `uname -m` prints it.
    pub const NAME: &str = "x86_64";
    /// Debian's multiarch library directories.
    pub const MULTIARCH_LIB_DIRS: [&str; 2] =
        ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"];

    pub type Unwinder<D> = UnwinderX86_64<D>;
    pub type UnwindCache = CacheX86_64;
    pub type UnwindRegs = UnwindRegsX86_64;

    /// The caller's registers at an allocator's first instruction (stack
    /// pointer `sp`, frame pointer `fp`): the call pushed the return address
    /// `caller`, so popping it gives the caller's stack pointer.
    #[inline]
    pub fn caller_regs(caller: u64, sp: u64, fp: u64) -> UnwindRegs {
        UnwindRegsX86_64::new(caller, sp.wrapping_add(8), fp)
    }

    /// KASLR randomizes the direct map and the vmemmap, and the kernel
    /// keeps both bases in variables.
    pub const SLAB_PAGE_BASES: super::SlabPageBases = super::SlabPageBases::Variables {
        direct_map: "page_offset_base",
        vmemmap: "vmemmap_base",
    };

    /// x86-64 ELF files have no mapping symbols.
    #[inline]
    pub fn is_mapping_symbol(_name: &str) -> bool {
        false
    }
}

#[cfg(target_arch = "aarch64")]
mod imp {
    use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64, UnwinderAarch64};

    /// The architecture's name as `uname -m` prints it.
    pub const NAME: &str = "aarch64";
    /// Debian's multiarch library directories.
    pub const MULTIARCH_LIB_DIRS: [&str; 2] =
        ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"];

    pub type Unwinder<D> = UnwinderAarch64<D>;
    pub type UnwindCache = CacheAarch64;
    pub type UnwindRegs = UnwindRegsAarch64;

    /// The caller's registers at an allocator's first instruction: a call
    /// (bl) leaves the return address `caller` in the link register and
    /// the stack pointer as the caller had it.
    #[inline]
    pub fn caller_regs(caller: u64, sp: u64, fp: u64) -> UnwindRegs {
        UnwindRegsAarch64::new(caller, sp, fp)
    }

    /// PAGE_OFFSET and VMEMMAP_START are constants of the kernel's build
    /// (VA_BITS, page size, version): derived, not looked up.
    pub const SLAB_PAGE_BASES: super::SlabPageBases = super::SlabPageBases::Derived;

    /// AArch64 ELF mapping symbols (`$x`: code follows, `$d`: data, as
    /// in a literal pool; optionally `$x.<anything>`): markers, not
    /// functions. A symbolizer that takes the nearest symbol below an
    /// address can land on one (the arm64 guest showed `$d+0x92`).
    pub fn is_mapping_symbol(name: &str) -> bool {
        matches!(name.as_bytes(), [b'$', b'x' | b'd', rest @ ..] if rest.is_empty() || rest[0] == b'.')
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("kheap is built for x86_64 and aarch64 only (src/arch.rs, bpf/arch.bpf.h)");

pub use imp::*;

#[cfg(all(test, target_arch = "aarch64"))]
mod tests {
    #[test]
    fn mapping_symbols_are_told_from_functions() {
        for m in ["$x", "$d", "$x.12", "$d.rodata"] {
            assert!(super::is_mapping_symbol(m), "{m}");
        }
        for f in ["$xy", "$dummy", "x", "malloc", "$", "$t"] {
            assert!(!super::is_mapping_symbol(f), "{f}");
        }
    }
}
