//! The shapes of an opened (not yet loaded) BPF object's maps, for the
//! kernel-memory model (`model::kernel_memory`): what the kernel will
//! create when the object loads, as the object is configured now; and the
//! limits this machine sets on them.

use anyhow::Result;
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
pub fn store_limit(memlock_left: Option<u64>) -> (u64, String) {
    let available = crate::sys::mem_available().unwrap_or(u64::MAX);
    let quarter = (available / 4, "a quarter of MemAvailable".to_string());
    match memlock_left {
        Some(left) if left < quarter.0 => (left, "what RLIMIT_MEMLOCK leaves".into()),
        _ => quarter,
    }
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
