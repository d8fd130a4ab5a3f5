//! What a run traces and how, fixed before load.

use crate::model::Sources;

use crate::kernel::attach::AttachMode;

/// What a run traces and how.
#[derive(Clone, Debug)]
pub struct Config {
    pub min_size: u64,
    pub max_size: Option<u64>,
    /// 1: every stack; N (a power of two): about one event in N; 0: none.
    pub stack_sample_every: u32,
    pub pids: Vec<u32>,
    pub follow_children: bool,
    pub comm: Option<String>,
    pub by_process: bool,
    /// Count per cgroup v2 id, accounted or not, and interrupts apart.
    pub by_cgroup: bool,
    /// Only tasks in these cgroup v2 ids or below them.
    pub cgroups: Vec<u64>,
    /// Key sampled stacks by who made them too (process and cgroup, or
    /// interrupt context): `Snapshot::stack_owners`, the labels of exported
    /// profiles. Costs a few helper calls on the sampled stack path only.
    pub stack_owners: bool,
    /// Frees per cache for kfree() too (top, slab, serve): each kfree event
    /// asks the object's slab, where the kernel's kfunc can (6.13+ with
    /// tp_btf); elsewhere kfree frees are counted in the total only.
    pub kfree_caches: bool,
    pub attach: AttachMode,
    pub max_sites: u32,
    pub max_stacks: u32,
    /// Attach the free tracepoints too (frees per cache, net counts).
    /// Tracking live objects always does.
    pub trace_frees: bool,
    /// Remember every object until its free (`kheap leaks`).
    pub live: Option<LiveConfig>,
    /// The allocators traced (`--source`); the slab only by default.
    pub sources: Sources,
    /// Count kheap's own allocations too. Off by default: reading the maps
    /// allocates in the kernel (batch lookups kvmalloc their buffers), and a
    /// tool should not report its own footprint as the workload's.
    pub include_self: bool,
}

/// Settings of live-object tracking.
#[derive(Clone, Copy, Debug)]
pub struct LiveConfig {
    /// 1: every address; N (a power of two): addresses whose hash picks
    /// about one in N.
    pub sample_every: u32,
    /// Capacity of the object map.
    pub max_objects: u32,
}

impl Default for LiveConfig {
    fn default() -> Self {
        LiveConfig {
            sample_every: 1,
            max_objects: 262_144,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_size: 0,
            max_size: None,
            stack_sample_every: 1024,
            pids: Vec::new(),
            follow_children: false,
            comm: None,
            by_process: false,
            by_cgroup: false,
            cgroups: Vec::new(),
            stack_owners: false,
            kfree_caches: false,
            attach: AttachMode::Auto,
            max_sites: 8192,
            max_stacks: 8192,
            trace_frees: true,
            live: None,
            include_self: false,
            sources: Sources::default(),
        }
    }
}

impl Config {
    /// Stacks are captured and keyed by who made them.
    pub(super) fn stacks_by_owner(&self) -> bool {
        self.stack_owners && self.stack_sample_every != 0
    }

    /// Every stack is captured and counted under its stack only; sites are
    /// summed from stacks in user space (one map update per event).
    pub(super) fn sites_from_stacks(&self) -> bool {
        self.stack_sample_every == 1 && self.live.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exact_record_runs_sum_sites_from_stacks() {
        let exact = Config {
            stack_sample_every: 1,
            ..Config::default()
        };
        assert!(exact.sites_from_stacks());
        assert!(!Config::default().sites_from_stacks());
        let leaks = Config {
            live: Some(LiveConfig::default()),
            ..exact
        };
        assert!(!leaks.sites_from_stacks());
    }
}
