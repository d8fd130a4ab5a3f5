//! The hook table of the kmem tracer: which tracepoints it hooks, in which
//! order, what their events are and what their programs are called. Read by
//! the attach strategy and by feature probing.

use crate::model::Source;

/// What a hook's events are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    Alloc,
    Free,
    /// A process forked: its child is followed when the parent is traced.
    Fork,
}

/// One tracepoint the kmem object hooks.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub tracepoint: &'static str,
    /// Its tracefs event system.
    pub system: &'static str,
    pub role: Role,
    /// The program name without its mechanism suffix (bpf/kheap.bpf.c).
    program: &'static str,
    /// The allocator whose events these are (`--source`).
    pub source: Source,
    /// Only a raw_tp program exists (bpf/sources.bpf.h): whatever the
    /// mechanism of the run, this hook is attached as raw_tp.
    pub raw_only: bool,
    /// The kernel function the tracepoint sits in, hooked instead (fentry or
    /// kprobe) on kernels that lack the tracepoint: vmalloc's came with 6.2.
    pub function: Option<&'static str>,
}

/// How a hook whose tracepoint is missing is attached to its function.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fallback {
    Fentry,
    Kprobe,
}

impl Fallback {
    pub fn name(self) -> &'static str {
        match self {
            Fallback::Fentry => "fentry/fexit",
            Fallback::Kprobe => "kprobe/kretprobe",
        }
    }
}

impl Hook {
    /// The BPF program of this hook for a mechanism, given its suffix:
    /// `kmalloc_btf`, `cache_alloc_raw`, `fork_tp`…
    pub fn program_with_suffix(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.program)
    }

    /// The program that hooks this hook's function instead of its
    /// tracepoint: allocations on return (the area is known then), frees on
    /// entry.
    pub fn fallback_program(&self, via: Fallback) -> String {
        self.program_with_suffix(match (via, self.role) {
            (Fallback::Fentry, Role::Alloc) => "fexit",
            (Fallback::Fentry, _) => "fentry",
            (Fallback::Kprobe, Role::Alloc) => "kretprobe",
            (Fallback::Kprobe, _) => "kprobe",
        })
    }
}

/// Every hook, in attach order: frees before allocations, so that no
/// tracked object's free can be missed at start.
pub const HOOKS: [Hook; 11] = [
    Hook {
        tracepoint: "kfree",
        system: "kmem",
        role: Role::Free,
        program: "kfree",
        source: Source::Kmalloc,
        raw_only: false,
        function: None,
    },
    Hook {
        tracepoint: "kmem_cache_free",
        system: "kmem",
        role: Role::Free,
        program: "cache_free",
        source: Source::Kmalloc,
        raw_only: false,
        function: None,
    },
    Hook {
        tracepoint: "mm_page_free",
        system: "kmem",
        role: Role::Free,
        program: "page_free",
        source: Source::Page,
        raw_only: true,
        function: None,
    },
    Hook {
        tracepoint: "free_vmap_area_noflush",
        system: "vmalloc",
        role: Role::Free,
        program: "vmalloc_free",
        source: Source::Vmalloc,
        raw_only: true,
        function: Some("free_vmap_area_noflush"),
    },
    Hook {
        tracepoint: "percpu_free_percpu",
        system: "percpu",
        role: Role::Free,
        program: "percpu_free",
        source: Source::Percpu,
        raw_only: true,
        function: None,
    },
    Hook {
        tracepoint: "sched_process_fork",
        system: "sched",
        role: Role::Fork,
        program: "fork",
        source: Source::Kmalloc,
        raw_only: false,
        function: None,
    },
    Hook {
        tracepoint: "kmalloc",
        system: "kmem",
        role: Role::Alloc,
        program: "kmalloc",
        source: Source::Kmalloc,
        raw_only: false,
        function: None,
    },
    Hook {
        tracepoint: "kmem_cache_alloc",
        system: "kmem",
        role: Role::Alloc,
        program: "cache_alloc",
        source: Source::Kmalloc,
        raw_only: false,
        function: None,
    },
    Hook {
        tracepoint: "mm_page_alloc",
        system: "kmem",
        role: Role::Alloc,
        program: "page_alloc",
        source: Source::Page,
        raw_only: true,
        function: None,
    },
    Hook {
        tracepoint: "alloc_vmap_area",
        system: "vmalloc",
        role: Role::Alloc,
        program: "vmalloc_alloc",
        source: Source::Vmalloc,
        raw_only: true,
        function: Some("alloc_vmap_area"),
    },
    Hook {
        tracepoint: "percpu_alloc_percpu",
        system: "percpu",
        role: Role::Alloc,
        program: "percpu_alloc",
        source: Source::Percpu,
        raw_only: true,
        function: None,
    },
];

/// The slab's kmem tracepoints (allocations and frees), in attach order.
pub fn kmem_hooks() -> impl Iterator<Item = &'static Hook> {
    HOOKS
        .iter()
        .filter(|h| h.source == Source::Kmalloc && h.role != Role::Fork)
}

/// The hooks of one source beyond the slab, in attach order.
pub fn source_hooks(source: Source) -> impl Iterator<Item = &'static Hook> {
    HOOKS
        .iter()
        .filter(move |h| h.source == source && h.role != Role::Fork)
}
