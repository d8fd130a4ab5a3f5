//! The shapes of an opened (not yet loaded) BPF object's maps, for the
//! kernel-memory model (`model::kernel_memory`): what the kernel will
//! create when the object loads, as the object is configured now.

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
