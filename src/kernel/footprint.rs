//! The shapes of an opened (not yet loaded) BPF object's maps, for the
//! kernel-memory model (`model::kernel_memory`): what the kernel will
//! create when the object loads, as the object is configured now; and the
//! limits this machine sets on them.

use anyhow::Result;

use crate::model::human_size;
use crate::model::kernel_memory::{largest_fitting, round_suggestion};
use libbpf_rs::{MapType, OpenObject};

use crate::model::kernel_memory::{MapKind, MapShape};

/// BPF_F_MMAPABLE.
const MMAPABLE: u32 = 1 << 10;

/// Every map the object will create, except those named in `borrowed`
/// (maps that reuse another object's, counted there).
pub fn map_shapes(object: &OpenObject, borrowed: &[&str]) -> Vec<MapShape> {
    object
        .maps()
        .filter(|m| m.autocreate())
        .filter_map(|m| {
            let name = m.name().to_string_lossy().into_owned();
            if borrowed.contains(&name.as_str()) {
                return None;
            }
            let kind = match m.map_type() {
                MapType::Hash => MapKind::Hash,
                MapType::PercpuHash => MapKind::PercpuHash,
                MapType::PercpuArray => MapKind::PercpuArray,
                MapType::RingBuf => MapKind::RingBuf,
                _ => MapKind::Array {
                    mmapable: m.map_flags() & MMAPABLE != 0,
                },
            };
            Some(MapShape {
                name,
                kind,
                key_size: m.key_size(),
                value_size: m.value_size(),
                max_entries: m.max_entries(),
            })
        })
        .collect()
}

/// The number of possible CPUs: what the kernel sizes per-CPU storage for
/// (not the online ones).
pub fn possible_cpus() -> Result<u32> {
    Ok(libbpf_rs::num_possible_cpus()? as u32)
}

/// What an object store may take: a quarter of the memory available now,
/// and what RLIMIT_MEMLOCK leaves where the kernel charges it.
fn store_limit(memlock_left: Option<u64>) -> (u64, String) {
    let available = crate::sys::mem_available().unwrap_or(u64::MAX);
    let quarter = (available / 4, "a quarter of MemAvailable".to_string());
    match memlock_left {
        Some(left) if left < quarter.0 => (left, "what RLIMIT_MEMLOCK leaves".into()),
        _ => quarter,
    }
}

/// Refuses a preallocated object store of `asked` entries (`flag` sizes
/// it: leaks' `--max-objects`, malloc's `--max-outstanding`) that would
/// take more than `store_limit` gives it, beside `rest` bytes of the run's
/// other maps. `bytes_at(n)` is the store's bytes at n entries. The line
/// names the largest that fits, rounded (`round_suggestion`): the limit
/// moves with MemAvailable.
pub fn check_store(
    flag: &str,
    what: &str,
    asked: u32,
    rest: u64,
    mut bytes_at: impl FnMut(u32) -> Option<u64>,
) -> Result<()> {
    let (limit, why) = store_limit(memlock_limit().map(|m| m.saturating_sub(rest)));
    check_store_within(flag, what, asked, (limit, &why), &mut bytes_at)
}

/// `check_store` against a given limit and the reason for it.
pub fn check_store_within(
    flag: &str,
    what: &str,
    asked: u32,
    (limit, why): (u64, &str),
    mut bytes_at: impl FnMut(u32) -> Option<u64>,
) -> Result<()> {
    let needed = bytes_at(asked).unwrap_or(u64::MAX);
    if needed <= limit {
        return Ok(());
    }
    let fits = round_suggestion(largest_fitting(1, asked, |n| {
        bytes_at(n).is_some_and(|b| b <= limit)
    }));
    anyhow::bail!(
        "{flag} {asked}: {what} would take {} of kernel memory, above {} ({why}); at most {flag} {fits} fits here",
        human_size(needed),
        human_size(limit),
    )
}

/// RLIMIT_MEMLOCK where it limits BPF maps: kernels before 5.11 charge
/// maps to it (later ones to the memory cgroup), and libbpf raises it to
/// unlimited where it may (CAP_SYS_RESOURCE); otherwise its hard limit.
pub fn memlock_limit() -> Option<u64> {
    if !charges_memlock(&crate::kernel::features::kernel_release()) {
        return None;
    }
    if crate::kernel::features::has_capability(crate::kernel::features::CAP_SYS_RESOURCE) {
        return None;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0
        || lim.rlim_max == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(lim.rlim_max)
}

/// Whether a kernel of this release charges BPF maps to RLIMIT_MEMLOCK
/// (before 5.11).
fn charges_memlock(release: &str) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) < (5, 11)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_before_5_11_charge_maps_to_memlock() {
        assert!(charges_memlock("5.10.0-33-amd64"));
        assert!(charges_memlock("5.4.0-216-generic"));
        assert!(!charges_memlock("5.11.0"));
        assert!(!charges_memlock("5.15.0-130-generic"));
        assert!(!charges_memlock("6.18.0"));
    }
}
