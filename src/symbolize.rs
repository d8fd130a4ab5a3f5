//! Kernel address symbolization (blazesym over /proc/kallsyms) and the pure
//! rules that pick a row's label from a stack; user-space addresses
//! (`user`: ELF files through the mappings a process had).

pub mod user;

use std::path::PathBuf;

use anyhow::{Context, Result};
use blazesym::symbolize::source::{Kernel, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::MaybeDefault;

/// One symbolized frame: `name+0xoff`, or the bare address if unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub addr: u64,
    pub function: Option<String>,
    pub offset: u64,
}

impl Frame {
    pub fn unknown(addr: u64) -> Frame {
        Frame {
            addr,
            function: None,
            offset: 0,
        }
    }

    /// A label that is not an address: `[page]` for the whole page
    /// allocator, whose events carry no call site.
    pub fn named(name: &str) -> Frame {
        Frame {
            addr: 0,
            function: Some(name.to_string()),
            offset: 0,
        }
    }

    /// `function+0xoff`, the form kernel oopses and `%pS` use.
    pub fn display(&self) -> String {
        match &self.function {
            // A named label (Frame::named) is no address.
            Some(f) if self.addr == 0 && self.offset == 0 => f.clone(),
            Some(f) => format!("{f}+{:#x}", self.offset),
            None => format!("{:#x}", self.addr),
        }
    }

    pub fn name(&self) -> &str {
        self.function.as_deref().unwrap_or("[unknown]")
    }
}

/// Turns addresses into frames; a trait so reports can be built in tests
/// from a fixture symbol table.
pub trait Symbolize {
    fn symbolize(&self, addrs: &[u64]) -> Vec<Frame>;
}

/// Remembers the addresses it resolved: kernel text does not move, and a
/// refreshing view asks for the same addresses every interval. At most
/// `limit` of them: a daemon that runs for weeks sees ever more return
/// addresses in its sampled stacks, and its memory must stay flat, so a
/// full cache starts over (the addresses still in use come back at once).
pub struct CachingSymbols<S> {
    inner: S,
    cache: std::cell::RefCell<std::collections::HashMap<u64, Frame>>,
    limit: usize,
}

/// Addresses a cache holds by default: a few MB of frames at most, far
/// more than the call sites and stack frames one interval refers to.
const CACHED_ADDRESSES: usize = 1 << 16;

impl<S: Symbolize> CachingSymbols<S> {
    pub fn new(inner: S) -> CachingSymbols<S> {
        CachingSymbols::with_limit(inner, CACHED_ADDRESSES)
    }

    pub fn with_limit(inner: S, limit: usize) -> CachingSymbols<S> {
        CachingSymbols {
            inner,
            cache: Default::default(),
            limit,
        }
    }
}

impl<S: Symbolize> Symbolize for CachingSymbols<S> {
    fn symbolize(&self, addrs: &[u64]) -> Vec<Frame> {
        let mut cache = self.cache.borrow_mut();
        let missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !cache.contains_key(a))
            .collect();
        if !missing.is_empty() {
            if cache.len() + missing.len() > self.limit {
                cache.clear();
            }
            for (a, f) in missing.iter().zip(self.inner.symbolize(&missing)) {
                cache.insert(*a, f);
            }
        }
        addrs
            .iter()
            .map(|a| cache.get(a).cloned().unwrap_or_else(|| Frame::unknown(*a)))
            .collect()
    }
}

/// Kernel symbols from a kallsyms file (the running kernel's by default).
pub struct KernelSymbols {
    symbolizer: Symbolizer,
    source: Source<'static>,
}

impl KernelSymbols {
    pub fn new(kallsyms: Option<PathBuf>) -> KernelSymbols {
        let kernel = Kernel {
            kallsyms: match kallsyms {
                Some(p) => MaybeDefault::Some(p),
                None => MaybeDefault::Default,
            },
            // Distribution kernels rarely ship an unstripped vmlinux, and the
            // search for one is slow; kallsyms has the function names we show.
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Default::default()
        };
        KernelSymbols {
            symbolizer: Symbolizer::new(),
            source: Source::Kernel(kernel),
        }
    }

    fn try_symbolize(&self, addrs: &[u64]) -> Result<Vec<Frame>> {
        let syms = self
            .symbolizer
            .symbolize(&self.source, Input::AbsAddr(addrs))
            .context("symbolizing kernel addresses")?;
        Ok(addrs
            .iter()
            .zip(syms)
            .map(|(&addr, s)| match s {
                Symbolized::Sym(sym) => Frame {
                    addr,
                    function: Some(sym.name.into_owned()),
                    offset: sym.offset as u64,
                },
                Symbolized::Unknown(_) => Frame::unknown(addr),
            })
            .collect())
    }
}

impl Symbolize for KernelSymbols {
    fn symbolize(&self, addrs: &[u64]) -> Vec<Frame> {
        // An unreadable kallsyms degrades to addresses rather than no report.
        self.try_symbolize(addrs).unwrap_or_else(|e| {
            eprintln!("kheap: warning: {e:#}; showing raw addresses");
            addrs.iter().map(|&a| Frame::unknown(a)).collect()
        })
    }
}

/// Frames of the tracing machinery itself (the BPF program, the tracepoint
/// trampolines): never part of the answer, dropped from every stack.
pub fn is_tracing_frame(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "bpf_prog_",
        "bpf_trace_run",
        "__bpf_trace_",
        "__traceiter_",
        "trace_call_bpf",
        "perf_trace_",
        "trace_event_raw_event_",
        "bpf_get_stack",
        "__bpf_get_stack",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The allocator's own functions and allocation wrappers: a row is labelled
/// with the first frame that is not one of these, which is the code that
/// asked for the memory.
pub fn is_allocator_frame(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "__kmalloc",
        "kmalloc",
        "__do_kmalloc",
        "___kmalloc",
        "__kvmalloc",
        "kvmalloc",
        "kvzalloc",
        "kvcalloc",
        "kzalloc",
        "kcalloc",
        "krealloc",
        "kvrealloc",
        "__kvrealloc",
        "kmem_cache_alloc",
        "__kmem_cache_alloc",
        "kmem_cache_zalloc",
        "slab_alloc",
        "___slab_alloc",
        "__slab_alloc",
        "kmemdup",
        "kstrdup",
        "kstrndup",
        "kmemdup_nul",
        "memdup_user",
        "vmemdup_user",
        "strndup_user",
        "alloc_pages",
        "__alloc_pages",
        "__alloc_frozen_pages",
        "alloc_frozen_pages",
        "allocate_slab",
        "new_slab",
        "refill_obj_stock",
        "obj_cgroup_charge",
        "__memcg_slab_post_alloc_hook",
        "__memcg_slab_",
    ];
    name.ends_with("_noprof") || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A stack (innermost first, `name+0xoff [module]` as reports write it)
/// without the allocator's own frames at its inner end (`__kmalloc*`,
/// `kmem_cache_alloc*`, `*_noprof`, the wrappers of `is_allocator_frame`),
/// so that a profile's leaf, its "flat" function, is the code that asked
/// for the memory. A stack made only of allocator frames keeps its
/// outermost one: a sample always has a frame.
pub fn caller_frames<S: AsRef<str>>(frames: &[S]) -> &[S] {
    let name = |f: &S| {
        let f = f.as_ref();
        let head = f.split(' ').next().unwrap_or(f);
        head.split_once('+').map_or(head, |(n, _)| n).to_string()
    };
    let skip = frames
        .iter()
        .take_while(|f| is_allocator_frame(&name(f)))
        .count()
        .min(frames.len().saturating_sub(1));
    &frames[skip..]
}

/// How deep the tracing machinery can reach into a captured stack.
const TRACING_DEPTH: usize = 6;

/// Largest return-address offset of a function's ftrace entry call
/// (`endbr64` + `call __fentry__`): a frame there is a BPF trampoline
/// (fentry/fexit) or kretprobe returning into the function's start.
const FTRACE_ENTRY_MAX_OFFSET: u64 = 9;

/// Drops what tracing adds to a captured stack: everything down to the last
/// tracing frame among the first few (the BPF program's own frame is not
/// always in kallsyms, so it can show up under a wrong name), and the
/// trampoline frames that fexit/kretprobe insert (an unknown frame followed
/// by a return into a function's first bytes).
pub fn strip_tracing_frames(frames: Vec<Frame>) -> Vec<Frame> {
    let skip = frames
        .iter()
        .take(TRACING_DEPTH)
        .rposition(|f| is_tracing_frame(f.name()))
        .map_or(0, |i| i + 1);
    let frames: Vec<Frame> = frames.into_iter().skip(skip).collect();
    let is_entry =
        |f: &Frame| f.function.is_some() && (1..=FTRACE_ENTRY_MAX_OFFSET).contains(&f.offset);
    let mut out = Vec::with_capacity(frames.len());
    let mut i = 0;
    while i < frames.len() {
        if frames.get(i + 1).is_some_and(is_entry) {
            i += 2; // the trampoline and the function-entry return point
            continue;
        }
        out.push(frames[i].clone());
        i += 1;
    }
    out
}

/// The frame a row is named after: the innermost frame outside the
/// allocator, or the innermost frame if the whole stack is allocator code.
pub fn label_frame(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .find(|f| f.function.is_some() && !is_allocator_frame(f.name()))
        .or_else(|| frames.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, offset: u64) -> Frame {
        Frame {
            addr: 0xffffffff81000000 + offset,
            function: Some(name.to_string()),
            offset,
        }
    }

    #[test]
    fn allocator_frames_are_recognised() {
        for n in [
            "__kmalloc_noprof",
            "__kvmalloc_node_noprof",
            "kmem_cache_alloc_noprof",
            "kmalloc_trace",
            "__kmalloc_cache_noprof",
            "kmemdup_noprof",
            "vmemdup_user",
        ] {
            assert!(is_allocator_frame(n), "{n}");
        }
        for n in [
            "load_msg",
            "simple_xattr_alloc",
            "iovec_from_user",
            "do_sys_open",
        ] {
            assert!(!is_allocator_frame(n), "{n}");
        }
    }

    #[test]
    fn label_skips_allocator_and_tracing_frames() {
        let stack = strip_tracing_frames(vec![
            frame("__stop_runtime_ptr_USER_PTR_MAX", 0x3c501cb9),
            frame("bpf_trace_run4", 0x80),
            frame("__kmalloc_noprof", 0x1a0),
            frame("__kvmalloc_node_noprof", 0x5d),
            frame("simple_xattr_alloc", 0x2b),
            frame("shmem_xattr_handler_set", 0x8e),
        ]);
        assert_eq!(stack.len(), 4);
        assert_eq!(stack[0].name(), "__kmalloc_noprof");
        let label = label_frame(&stack).unwrap();
        assert_eq!(label.display(), "simple_xattr_alloc+0x2b");
    }

    #[test]
    fn fexit_trampoline_frames_are_dropped() {
        // As captured on 6.1 with fexit on __kmalloc: the trampoline (an
        // unknown address, misnamed after a module symbol) and the return
        // into __kmalloc+0x5 sit between the allocator and its caller.
        let stack = strip_tracing_frames(vec![
            frame("__kmalloc", 0xa2),
            frame("__this_module", 0x5dc4),
            frame("__kmalloc", 0x5),
            frame("load_msg", 0x35),
            frame("do_msgsnd", 0x8e),
        ]);
        let names: Vec<String> = stack.iter().map(Frame::display).collect();
        assert_eq!(names, ["__kmalloc+0xa2", "load_msg+0x35", "do_msgsnd+0x8e"]);
        assert_eq!(label_frame(&stack).unwrap().name(), "load_msg");
    }

    #[test]
    fn label_of_pure_allocator_stack_is_innermost() {
        let stack = vec![frame("__kmalloc_noprof", 1), frame("kmalloc_trace", 2)];
        assert_eq!(label_frame(&stack).unwrap().name(), "__kmalloc_noprof");
        assert!(label_frame(&[]).is_none());
        assert_eq!(Frame::unknown(0x10).display(), "0x10");
    }

    #[test]
    fn caching_symbols_ask_once_per_address() {
        struct Counting(std::cell::Cell<usize>);
        impl Symbolize for Counting {
            fn symbolize(&self, addrs: &[u64]) -> Vec<Frame> {
                self.0.set(self.0.get() + addrs.len());
                addrs.iter().map(|&a| frame("f", a)).collect()
            }
        }
        let c = CachingSymbols::new(Counting(std::cell::Cell::new(0)));
        assert_eq!(c.symbolize(&[1, 2]).len(), 2);
        let again = c.symbolize(&[2, 1, 3]);
        assert_eq!(again[0].offset, 2);
        assert_eq!(again[2].offset, 3);
        assert_eq!(c.inner.0.get(), 3, "1 and 2 were cached");

        // Bounded: a full cache starts over, and answers stay right.
        let c = CachingSymbols::with_limit(Counting(std::cell::Cell::new(0)), 2);
        c.symbolize(&[1, 2]);
        assert_eq!(c.symbolize(&[3])[0].offset, 3);
        assert_eq!(c.cache.borrow().len(), 1);
        assert_eq!(c.symbolize(&[3, 4]).len(), 2);
        assert_eq!(c.inner.0.get(), 4, "3 stayed cached");
    }

    #[test]
    fn blazesym_reads_a_kallsyms_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kallsyms");
        std::fs::write(
            &path,
            "ffffffff81a9ea20 T load_msg\n\
             ffffffff81a9ec00 T store_msg\n\
             ffffffff81bb35a0 T iovec_from_user\n\
             ffffffff81bb3700 t iovec_from_user.cold\n",
        )
        .unwrap();
        let syms = KernelSymbols::new(Some(path));
        let frames = syms.symbolize(&[0xffffffff81a9ea7b, 0xffffffff81bb35a5]);
        assert_eq!(frames[0].display(), "load_msg+0x5b");
        assert_eq!(frames[1].display(), "iovec_from_user+0x5");
    }

    #[test]
    fn caller_frames_leave_the_allocator_out() {
        let st = [
            "__kmalloc_node_noprof+0x256",
            "__kvmalloc_node_noprof+0x10",
            "load_msg+0x41",
            "do_msgsnd+0x8c",
        ];
        assert_eq!(caller_frames(&st), &st[2..]);
        let cache = ["kmem_cache_alloc_noprof+0x230", "getname_flags.part.0+0x24"];
        assert_eq!(caller_frames(&cache), &cache[1..]);
        let trace = ["kmalloc_trace+0x1 [x]", "__kmalloc_node+0x2", "f+0x3"];
        assert_eq!(caller_frames(&trace), &trace[2..]);
        // Nothing but the allocator: its outermost frame stays.
        let only = ["__kmalloc_noprof+0x1", "kmalloc_trace_noprof+0x2"];
        assert_eq!(caller_frames(&only), &only[1..]);
        assert!(caller_frames::<&str>(&[]).is_empty());
        let caller_first = ["load_msg+0x41", "__kmalloc_noprof+0x1"];
        assert_eq!(caller_frames(&caller_first), &caller_first);
    }
}
