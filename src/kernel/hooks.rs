//! The hook table of the kmem tracer: which tracepoints it hooks, in which
//! order, what their events are and what their programs are called. Read by
//! the attach strategy and by feature probing.

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
}

impl Hook {
    /// The BPF program of this hook for a mechanism, given its suffix:
    /// `kmalloc_btf`, `cache_alloc_raw`, `fork_tp`…
    pub fn program_with_suffix(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.program)
    }
}

/// Every hook, in attach order: frees before allocations, so that no
/// tracked object's free can be missed at start.
pub const HOOKS: [Hook; 5] = [
    Hook {
        tracepoint: "kfree",
        system: "kmem",
        role: Role::Free,
        program: "kfree",
    },
    Hook {
        tracepoint: "kmem_cache_free",
        system: "kmem",
        role: Role::Free,
        program: "cache_free",
    },
    Hook {
        tracepoint: "sched_process_fork",
        system: "sched",
        role: Role::Fork,
        program: "fork",
    },
    Hook {
        tracepoint: "kmalloc",
        system: "kmem",
        role: Role::Alloc,
        program: "kmalloc",
    },
    Hook {
        tracepoint: "kmem_cache_alloc",
        system: "kmem",
        role: Role::Alloc,
        program: "cache_alloc",
    },
];

/// The kmem tracepoints (allocations and frees), in attach order.
pub fn kmem_hooks() -> impl Iterator<Item = &'static Hook> {
    HOOKS.iter().filter(|h| h.system == "kmem")
}
