//! Stacks through code built without frame pointers: sampled allocator
//! calls come with a copy of the top of their user stack and the registers
//! an unwinder needs (`bpf/user_stack.bpf.h`), unwound here from the
//! `.eh_frame` of each mapped object with framehop.
//!
//! The mappings of an address space are read from `/proc/PID/maps` when its
//! first sample arrives (the process is alive then: it was just inside the
//! allocator), and kept, so the frames can be symbolized after it exits.
//! A sample of a process that is already gone waits for the end of the run
//! and is unwound with the mappings the BPF side recorded for its frames.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::arch::{self, UnwindCache};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use object::{Object, ObjectSection, ObjectSegment};

use crate::model::malloc::{Key, Sample, UnwoundStack};
use crate::symbolize::user::{host_path, Modules, Vma};
use crate::sys::procmaps::{self, Mapping};

/// Frames kept per unwound stack (the caller included).
pub const MAX_FRAMES: usize = 128;

/// Samples of processes gone before their mappings were read, kept for the
/// end of the run (each holds up to 16 KiB of stack): beyond, they are
/// counted as not unwound.
const MAX_DEFERRED: usize = 1024;

/// How many times the mappings of one address space are read again for a
/// caller they do not cover (a library loaded since, with dlopen).
const MAX_REREADS: u32 = 16;

struct OwnedSample {
    key: Key,
    size: u64,
    sp: u64,
    bp: u64,
    start: u64,
    stack: Vec<u8>,
}

impl OwnedSample {
    fn sample(&self) -> Sample<'_> {
        Sample {
            key: self.key,
            size: self.size,
            sp: self.sp,
            bp: self.bp,
            start: self.start,
            stack: &self.stack,
        }
    }
}

/// What the unwinder did with the samples it was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindCounts {
    pub samples: u64,
    /// Samples whose process was gone with no mappings known for it.
    pub no_mappings: u64,
}

/// A file-backed mapping, from `/proc/PID/maps` or from the BPF side.
#[derive(Clone, Debug)]
struct MappedFile {
    start: u64,
    end: u64,
    offset: u64,
    dev: u32,
    ino: u64,
    name: String,
    path: Option<PathBuf>,
}

/// The parts of an ELF file framehop needs, read once per file.
struct FileUnwindInfo {
    /// PT_LOAD segments: (file offset, file size, virtual address).
    loads: Vec<(u64, u64, u64)>,
    sections: ExplicitModuleSectionInfo<Arc<[u8]>>,
}

impl FileUnwindInfo {
    fn read(path: &Path) -> Option<FileUnwindInfo> {
        let data = std::fs::read(path).ok()?;
        let elf = object::File::parse(&*data).ok()?;
        let section = |name: &str| {
            let s = elf.section_by_name(name)?;
            let bytes: Arc<[u8]> = Arc::from(s.data().ok()?);
            Some((s.address()..s.address() + s.size(), bytes))
        };
        let (eh_frame_svma, eh_frame) = section(".eh_frame").unzip();
        let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr").unzip();
        let (text_svma, text) = section(".text").unzip();
        let got_svma = elf
            .section_by_name(".got")
            .map(|s| s.address()..s.address() + s.size());
        let loads = elf
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (off, size, s.address())
            })
            .collect();
        Some(FileUnwindInfo {
            loads,
            sections: ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma,
                text,
                got_svma,
                eh_frame_svma,
                eh_frame,
                eh_frame_hdr_svma,
                eh_frame_hdr,
                ..Default::default()
            },
        })
    }

    /// Where the file's virtual address 0 is in a process that maps file
    /// offset `offset` over `start..end`. A page can hold the end of one
    /// segment and the start of the next (each mapped on its own, e.g. the
    /// read-only data and the code): the segment is the one that holds
    /// most of the mapping, so that a code mapping alone (all the BPF side
    /// records for a process gone) is not taken for the data before it.
    fn base_avma(&self, start: u64, end: u64, offset: u64) -> Option<u64> {
        let mapped = offset..offset.saturating_add(end.saturating_sub(start));
        let overlap = |p_off: u64, size: u64| {
            let from = mapped.start.max(p_off & !0xfff);
            let to = mapped.end.min(p_off + size);
            to.saturating_sub(from)
        };
        let &(p_off, _, p_vaddr) = self
            .loads
            .iter()
            .filter(|&&(p_off, size, _)| p_off & !0xfff <= offset && offset < p_off + size)
            .max_by_key(|&&(p_off, size, _)| (overlap(p_off, size), std::cmp::Reverse(p_off)))?;
        let svma = p_vaddr.wrapping_add(offset).wrapping_sub(p_off);
        Some(start.wrapping_sub(svma))
    }
}

type Unwinder = arch::Unwinder<Arc<[u8]>>;

/// The modules of one address space.
struct Space {
    unwinder: Unwinder,
    /// Mapped file ranges, for symbolization.
    vmas: Vec<Vma>,
    rereads: u32,
}

impl Space {
    fn covers(&self, addr: u64) -> bool {
        self.vmas.iter().any(|v| v.start <= addr && addr < v.end)
    }
}

/// Unwinds samples and collects, per row key, the distinct stacks seen.
#[derive(Default)]
pub struct StackUnwinder {
    files: HashMap<(u32, u64), Option<Arc<FileUnwindInfo>>>,
    /// By (address space, process): an mm_struct's address may be
    /// reused once its process is gone.
    spaces: HashMap<(u64, u32), Space>,
    cache: Option<Box<UnwindCache>>,
    deferred: Vec<OwnedSample>,
    pub stacks: HashMap<Key, Vec<UnwoundStack>>,
    pub counts: UnwindCounts,
}

impl StackUnwinder {
    /// Unwinds a sample now if its address space's mappings are known or
    /// can be read; else keeps it for `finish`.
    pub fn add(&mut self, s: &Sample) {
        self.counts.samples += 1;
        let rereads = match self.spaces.get(&(s.key.mm, s.key.tgid)) {
            None => Some(0),
            Some(space) if !space.covers(s.key.caller) && space.rereads < MAX_REREADS => {
                Some(space.rereads + 1)
            }
            Some(_) => None,
        };
        if let Some(rereads) = rereads {
            match procmaps::read(s.key.tgid).filter(|m| !m.is_empty()) {
                Some(maps) => {
                    let files = maps
                        .iter()
                        .filter(|m| m.inode != 0)
                        .map(|m| MappedFile {
                            start: m.start,
                            end: m.end,
                            offset: m.offset,
                            dev: m.dev,
                            ino: m.inode,
                            name: file_name(m),
                            path: host_path(s.key.tgid, m),
                        })
                        .collect();
                    self.add_space((s.key.mm, s.key.tgid), files, rereads);
                }
                None if rereads > 0 => {}
                None => {
                    if self.deferred.len() < MAX_DEFERRED {
                        self.deferred.push(OwnedSample {
                            key: s.key,
                            size: s.size,
                            sp: s.sp,
                            bp: s.bp,
                            start: s.start,
                            stack: s.stack.to_vec(),
                        });
                    } else {
                        self.counts.no_mappings += 1;
                    }
                    return;
                }
            }
        }
        self.unwind(s);
    }

    /// Unwinds the samples of processes that were gone, with the mappings
    /// the BPF side recorded for their address spaces.
    pub fn finish(&mut self, bpf_vmas: &HashMap<u64, Vec<Vma>>, modules: &Modules) {
        for d in std::mem::take(&mut self.deferred) {
            if !self.spaces.contains_key(&(d.key.mm, d.key.tgid)) {
                let Some(vmas) = bpf_vmas.get(&d.key.mm) else {
                    self.counts.no_mappings += 1;
                    continue;
                };
                let files = vmas
                    .iter()
                    .filter(|v| v.ino != 0)
                    .map(|v| MappedFile {
                        start: v.start,
                        end: v.end,
                        offset: v.file_offset(),
                        dev: v.dev,
                        ino: v.ino,
                        name: v.name.clone(),
                        path: modules.resolve(v),
                    })
                    .collect();
                self.add_space((d.key.mm, d.key.tgid), files, 0);
            }
            self.unwind(&d.sample());
        }
    }

    /// The mappings read for each address space (file-backed ones), for
    /// symbolizing the unwound frames.
    pub fn vmas(&self) -> impl Iterator<Item = (u64, &[Vma])> {
        self.spaces
            .iter()
            .map(|(&(mm, _), s)| (mm, s.vmas.as_slice()))
    }

    fn add_space(&mut self, space: (u64, u32), files: Vec<MappedFile>, rereads: u32) {
        let mut unwinder = Unwinder::new();
        // One module per file: its whole mapped range, based where its
        // first mapping says.
        let mut by_file: Vec<((u32, u64), Vec<&MappedFile>)> = Vec::new();
        for f in &files {
            match by_file.iter_mut().find(|(k, _)| *k == (f.dev, f.ino)) {
                Some((_, v)) => v.push(f),
                None => by_file.push(((f.dev, f.ino), vec![f])),
            }
        }
        for (key, maps) in by_file {
            let Some(path) = maps.iter().find_map(|m| m.path.clone()) else {
                continue;
            };
            let info = self
                .files
                .entry(key)
                .or_insert_with(|| FileUnwindInfo::read(&path).map(Arc::new));
            let Some(info) = info.clone() else {
                continue;
            };
            let first = maps.iter().min_by_key(|m| m.start).expect("not empty");
            let Some(base) = info.base_avma(first.start, first.end, first.offset) else {
                continue;
            };
            let range: Range<u64> =
                first.start..maps.iter().map(|m| m.end).max().expect("not empty");
            unwinder.add_module(Module::new(
                path.display().to_string(),
                range,
                base,
                info.sections.clone(),
            ));
        }
        let vmas = files
            .into_iter()
            .map(|f| Vma {
                start: f.start,
                end: f.end,
                pgoff: Vma::pgoff_of(f.offset),
                dev: f.dev,
                ino: f.ino,
                name: f.name,
            })
            .collect();
        self.spaces.insert(
            space,
            Space {
                unwinder,
                vmas,
                rereads,
            },
        );
    }

    fn unwind(&mut self, s: &Sample) {
        let Some(space) = self.spaces.get(&(s.key.mm, s.key.tgid)) else {
            return;
        };
        let cache = self
            .cache
            .get_or_insert_with(|| Box::new(UnwindCache::new()));
        let frames = unwind_from_entry(&space.unwinder, cache, s);
        let stacks = self.stacks.entry(s.key).or_default();
        match stacks.iter_mut().find(|u| u.frames == frames) {
            Some(u) => {
                u.samples += 1;
                u.bytes += s.size;
            }
            None => stacks.push(UnwoundStack {
                frames,
                samples: 1,
                bytes: s.size,
            }),
        }
    }
}

/// The return addresses of a call stopped at an allocator's entry: the one
/// at the stack pointer (the direct caller), then the caller's callers as
/// far as the copied stack and the unwind information reach.
fn unwind_from_entry(unwinder: &Unwinder, cache: &mut UnwindCache, s: &Sample) -> Vec<u64> {
    let caller = s.key.caller;
    let mut frames = vec![caller];
    // The allocator's first instruction has not run (or one that leaves
    // the stack pointer alone): returning gives the caller's registers.
    let mut regs = arch::caller_regs(caller, s.sp, s.bp);
    let mut read_stack = |addr: u64| {
        let off = addr.checked_sub(s.start).ok_or(())? as usize;
        let word = s.stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(word.try_into().expect("8 bytes")))
    };
    let mut addr = match FrameAddress::from_return_address(caller) {
        Some(a) => a,
        None => return frames,
    };
    while frames.len() < MAX_FRAMES {
        match unwinder.unwind_frame(addr, &mut regs, cache, &mut read_stack) {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(next) => {
                    frames.push(ra);
                    addr = next;
                }
                None => break,
            },
            _ => break,
        }
    }
    frames
}

fn file_name(m: &Mapping) -> String {
    m.path
        .as_deref()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// The registers an allocator probe reads on entry.
    #[derive(Default)]
    #[repr(C)]
    struct EntryRegs {
        sp: u64,
        bp: u64,
        /// The link register (aarch64), the return address there.
        lr: u64,
    }

    /// Called like an allocator: on entry the return address is at sp.
    #[cfg(target_arch = "x86_64")]
    #[unsafe(naked)]
    extern "C" fn enter(regs: *mut EntryRegs) {
        std::arch::naked_asm!("mov [rdi], rsp", "mov [rdi + 8], rbp", "ret")
    }

    /// Called like an allocator: on entry the return address is in x30.
    #[cfg(target_arch = "aarch64")]
    #[unsafe(naked)]
    extern "C" fn enter(regs: *mut EntryRegs) {
        std::arch::naked_asm!(
            "mov x9, sp",
            "str x9, [x0]",
            "str x29, [x0, #8]",
            "str x30, [x0, #16]",
            "ret"
        )
    }

    /// The return address of the call to `enter`.
    fn return_address(regs: &EntryRegs) -> u64 {
        if cfg!(target_arch = "x86_64") {
            // Still at sp: nothing has been called since.
            unsafe { std::ptr::read_volatile(regs.sp as *const u64) }
        } else {
            regs.lr
        }
    }

    /// This thread's stack from the page of `sp` up, as the BPF side copies
    /// it: whole pages, up to the first that cannot be read.
    fn copy_stack(sp: u64) -> (u64, Vec<u8>) {
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        let start = sp & !0xfff;
        let mut data = vec![0u8; 16384];
        let mut len = 0;
        while len < data.len() {
            let page = &mut data[len..len + 4096];
            if mem.read_exact_at(page, start + len as u64).is_err() {
                break;
            }
            len += 4096;
        }
        data.truncate(len);
        (start, data)
    }

    /// (return address into `inner`, entry registers, stack copy)
    #[inline(never)]
    fn inner() -> (u64, EntryRegs, u64, Vec<u8>) {
        let mut regs = EntryRegs::default();
        enter(&mut regs);
        let ret = return_address(&regs);
        let (start, stack) = copy_stack(regs.sp);
        (ret, regs, start, std::hint::black_box(stack))
    }

    #[inline(never)]
    fn outer() -> (u64, EntryRegs, u64, Vec<u8>) {
        let r = inner();
        std::hint::black_box(&r);
        r
    }

    /// A real stack of this process, unwound from its own .eh_frame: the
    /// frames are the return addresses into inner, then outer, then this
    /// test.
    #[test]
    fn unwinds_a_real_stack_from_eh_frame() {
        let (ret, regs, start, stack) = outer();
        let key = Key {
            mm: 1,
            tgid: std::process::id(),
            func: 0,
            caller: ret,
            stack_id: -1,
        };
        let mut u = StackUnwinder::default();
        u.add(&Sample {
            key,
            size: 8,
            sp: regs.sp,
            bp: regs.bp,
            start,
            stack: &stack,
        });
        assert_eq!(u.counts.samples, 1);
        let stacks = &u.stacks[&key];
        assert_eq!(
            (stacks.len(), stacks[0].samples, stacks[0].bytes),
            (1, 1, 8)
        );
        let frames = &stacks[0].frames;
        let within = |addr: u64, f: usize| (f as u64) < addr && addr - (f as u64) < 0x1000;
        type Captured = fn() -> (u64, EntryRegs, u64, Vec<u8>);
        assert!(within(frames[0], inner as Captured as usize), "{frames:x?}");
        assert!(within(frames[1], outer as Captured as usize), "{frames:x?}");
        let test_fn = unwinds_a_real_stack_from_eh_frame as fn() as usize;
        assert!(within(frames[2], test_fn), "{frames:x?}");
        assert!(frames.len() > 3, "on into the test harness: {frames:x?}");
        assert!(u.vmas().any(|(mm, v)| mm == 1 && !v.is_empty()));
    }

    #[test]
    fn base_address_of_a_mapping() {
        let info = FileUnwindInfo {
            loads: vec![
                (0, 0x1000, 0),
                (0x1000, 0x5000, 0x1000),
                (0x6de0, 0x300, 0x7de0),
            ],
            sections: ExplicitModuleSectionInfo::default(),
        };
        assert_eq!(
            info.base_avma(0x5555_0000_0000, 0x5555_0000_1000, 0),
            Some(0x5555_0000_0000)
        );
        assert_eq!(
            info.base_avma(0x5555_0000_1000, 0x5555_0000_6000, 0x1000),
            Some(0x5555_0000_0000)
        );
        // The data segment's page is mapped from its page-aligned offset.
        assert_eq!(
            info.base_avma(0x5555_0000_7000, 0x5555_0000_8000, 0x6000),
            Some(0x5555_0000_0000)
        );
        assert_eq!(info.base_avma(0x1000, 0x2000, 0x9000), None);
    }

    /// As lld lays out a Rust program: the read-only segment ends and the
    /// code starts in the same file page, which is mapped twice, a page
    /// apart. The code mapping alone gives the code segment's base.
    #[test]
    fn base_address_of_a_code_mapping_sharing_a_page() {
        let info = FileUnwindInfo {
            loads: vec![
                (0, 0x12efc, 0),
                (0x12f00, 0x3d910, 0x13f00),
                (0x50810, 0x2748, 0x52810),
            ],
            sections: ExplicitModuleSectionInfo::default(),
        };
        let base = 0x564a_2b44_d000;
        // r--p at offset 0, then r-xp from offset 0x12000 at 0x13000
        assert_eq!(info.base_avma(base, base + 0x13000, 0), Some(base));
        assert_eq!(
            info.base_avma(base + 0x13000, base + 0x52000, 0x12000),
            Some(base)
        );
    }
}
