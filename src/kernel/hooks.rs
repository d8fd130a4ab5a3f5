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
    /// An interrupt's handler begins (the hook's tracepoint) and ends
    /// (`closed_by`): together they tell which events ran in interrupt
    /// context (bpf/kheap/interrupt_context.c).
    Interrupt,
    /// A CPU switches tasks: tells whether kheap's own process runs there,
    /// so that its own events are left out without asking each event for
    /// its tgid (bpf/kheap/own_process.c).
    Switch,
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
    /// The one mechanism this hook has a program for, whatever the run's:
    /// raw_tp for the sources beyond the slab (bpf/kheap/sources.c) and the
    /// interrupt brackets, tp_btf for the task switches
    /// (bpf/kheap/own_process.c).
    pub only: Option<Mechanism>,
    /// The kernel function the tracepoint sits in, hooked instead (fentry or
    /// kprobe) on kernels that lack the tracepoint: vmalloc's came with 6.2.
    pub function: Option<&'static str>,
    /// A tracepoint only kernels before this version have, which fires
    /// events the hook of the same program (`program`) sees from that
    /// version on: kmalloc_node and kmem_cache_alloc_node, folded into
    /// kmalloc and kmem_cache_alloc in 6.1. Its absence misses nothing.
    pub until: Option<&'static str>,
    /// The field of the tracepoint's record (`trace_event_raw_<name>`) that
    /// the program's argument layout came with, and the version that added
    /// it: without it the arguments are another layout, which the program
    /// does not read.
    pub layout: Option<(&'static str, &'static str)>,
    /// The tracepoint that ends what this hook's tracepoint begins (an
    /// interrupt handler's exit), hooked by the raw_tp program
    /// `<closed_by>_raw` and attached just before the hook's own program:
    /// no bracket is opened without its close watched.
    pub closed_by: Option<&'static str>,
}

/// How a hook's program is attached to its tracepoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mechanism {
    Btf,
    Raw,
    Classic,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Btf => "tp_btf",
            Mechanism::Raw => "raw_tp",
            Mechanism::Classic => "tracepoint",
        }
    }

    /// Classic tracepoints are found (and attached) through tracefs.
    pub fn needs_tracefs(self) -> bool {
        self == Mechanism::Classic
    }
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

    /// The program that also hooks the function's entry, where its return
    /// is hooked: on the kprobe path, an allocation is labelled and its
    /// stack captured at entry (before Linux 5.15 a kretprobe's stack ends
    /// at kretprobe_trampoline, bpf/kheap/sources.c).
    pub fn entry_program(&self, via: Fallback) -> Option<String> {
        (via == Fallback::Kprobe && self.role == Role::Alloc && self.function.is_some())
            .then(|| self.program_with_suffix("kprobe"))
    }
}

/// An interrupt bracket's hook: its handler's entry and exit (raw_tp only;
/// no source of its own).
const fn bracket(entry: &'static str, exit: &'static str, system: &'static str) -> Hook {
    Hook {
        tracepoint: entry,
        system,
        role: Role::Interrupt,
        program: entry,
        source: Source::Kmalloc,
        only: Some(Mechanism::Raw),
        function: None,
        until: None,
        layout: None,
        closed_by: Some(exit),
    }
}

/// Every hook, in attach order: the task switches first, so that kheap's
/// own events are known from the first; frees before allocations, so that no
/// tracked object's free can be missed at start; interrupt brackets before
/// allocations, so that the first allocations' context is known. A
/// static, not a const: every `&'static Hook` is then into this one array,
/// and the attach order is found by address (`kmem::start`); a const is
/// copied at each use, with no promise that two uses share an address.
pub static HOOKS: [Hook; 20] = [
    Hook {
        tracepoint: "sched_switch",
        system: "sched",
        role: Role::Switch,
        program: "own_switch",
        source: Source::Kmalloc,
        only: Some(Mechanism::Btf),
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "kfree",
        system: "kmem",
        role: Role::Free,
        program: "kfree",
        source: Source::Kmalloc,
        only: None,
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "kmem_cache_free",
        system: "kmem",
        role: Role::Free,
        program: "cache_free",
        source: Source::Kmalloc,
        only: None,
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "mm_page_free",
        system: "kmem",
        role: Role::Free,
        program: "page_free",
        source: Source::Page,
        only: Some(Mechanism::Raw),
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "free_vmap_area_noflush",
        system: "vmalloc",
        role: Role::Free,
        program: "vmalloc_free",
        source: Source::Vmalloc,
        only: Some(Mechanism::Raw),
        function: Some("free_vmap_area_noflush"),
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "percpu_free_percpu",
        system: "percpu",
        role: Role::Free,
        program: "percpu_free",
        source: Source::Percpu,
        only: Some(Mechanism::Raw),
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "sched_process_fork",
        system: "sched",
        role: Role::Fork,
        program: "fork",
        source: Source::Kmalloc,
        only: None,
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    bracket("softirq_entry", "softirq_exit", "irq"),
    bracket("irq_handler_entry", "irq_handler_exit", "irq"),
    bracket("local_timer_entry", "local_timer_exit", "irq_vectors"),
    bracket("irq_work_entry", "irq_work_exit", "irq_vectors"),
    bracket("call_function_entry", "call_function_exit", "irq_vectors"),
    bracket(
        "call_function_single_entry",
        "call_function_single_exit",
        "irq_vectors",
    ),
    Hook {
        tracepoint: "kmalloc",
        system: "kmem",
        role: Role::Alloc,
        program: "kmalloc",
        source: Source::Kmalloc,
        only: None,
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "kmem_cache_alloc",
        system: "kmem",
        role: Role::Alloc,
        program: "cache_alloc",
        source: Source::Kmalloc,
        only: None,
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "mm_page_alloc",
        system: "kmem",
        role: Role::Alloc,
        program: "page_alloc",
        source: Source::Page,
        only: Some(Mechanism::Raw),
        function: None,
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "alloc_vmap_area",
        system: "vmalloc",
        role: Role::Alloc,
        program: "vmalloc_alloc",
        source: Source::Vmalloc,
        only: Some(Mechanism::Raw),
        function: Some("alloc_vmap_area"),
        until: None,
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "percpu_alloc_percpu",
        system: "percpu",
        role: Role::Alloc,
        program: "percpu_alloc",
        source: Source::Percpu,
        only: Some(Mechanism::Raw),
        function: None,
        until: None,
        // call_site, bytes_alloc and gfp_flags came together.
        layout: Some(("call_site", "5.19")),
        closed_by: None,
    },
    // Before 6.1 the NUMA-node variants fired tracepoints of their own,
    // with kmalloc's and (pre-6.1) kmem_cache_alloc's arguments: the same
    // raw_tp programs, attached to them too.
    Hook {
        tracepoint: "kmalloc_node",
        system: "kmem",
        role: Role::Alloc,
        program: "kmalloc",
        source: Source::Kmalloc,
        only: Some(Mechanism::Raw),
        function: None,
        until: Some("6.1"),
        layout: None,
        closed_by: None,
    },
    Hook {
        tracepoint: "kmem_cache_alloc_node",
        system: "kmem",
        role: Role::Alloc,
        program: "cache_alloc",
        source: Source::Kmalloc,
        only: Some(Mechanism::Raw),
        function: None,
        until: Some("6.1"),
        layout: None,
        closed_by: None,
    },
];

impl Role {
    /// Allocations and frees: events of a source.
    pub fn is_event(self) -> bool {
        matches!(self, Role::Alloc | Role::Free)
    }
}

impl Hook {
    /// The tracepoints this hook attaches to, in attach order: a bracket's
    /// close before its opening.
    pub fn tracepoints(&self) -> impl Iterator<Item = &'static str> {
        self.closed_by
            .into_iter()
            .chain(std::iter::once(self.tracepoint))
    }

    /// The program of `closed_by`.
    pub fn closing_program(&self) -> Option<String> {
        self.closed_by.map(|tp| format!("{tp}_raw"))
    }
}

/// The slab's kmem tracepoints (allocations and frees), in attach order.
pub fn kmem_hooks() -> impl Iterator<Item = &'static Hook> {
    HOOKS
        .iter()
        .filter(|h| h.source == Source::Kmalloc && h.role.is_event())
}

/// The hooks of one source beyond the slab, in attach order.
pub fn source_hooks(source: Source) -> impl Iterator<Item = &'static Hook> {
    HOOKS
        .iter()
        .filter(move |h| h.source == source && h.role.is_event())
}
