//! Typed readers for the BPF maps: per-CPU values are summed with `AddAssign`
//! on the generated types.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::AddAssign;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::bpf::from_bytes;

/// Reads every entry of a per-CPU hash map, summing each value over CPUs.
/// Entries deleted between listing and lookup are skipped.
pub fn read_percpu_hash<K, V, M>(map: &M) -> Result<Vec<(K, V)>>
where
    M: MapCore,
    K: plain::Plain + Default + Copy,
    V: plain::Plain + Default + Copy + AddAssign,
{
    let mut out = Vec::new();
    for key in map.keys() {
        let Some(per_cpu) = map
            .lookup_percpu(&key, MapFlags::ANY)
            .with_context(|| format!("reading BPF map {}", map.name().to_string_lossy()))?
        else {
            continue;
        };
        out.push((from_bytes::<K>(&key), sum_per_cpu::<V>(&per_cpu)));
    }
    Ok(out)
}

/// Sums the per-CPU values of one entry.
pub fn sum_per_cpu<V>(per_cpu: &[Vec<u8>]) -> V
where
    V: plain::Plain + Default + Copy + AddAssign,
{
    let mut total = V::default();
    for bytes in per_cpu {
        total += from_bytes::<V>(bytes);
    }
    total
}

/// Reads every entry of a plain hash map.
pub fn read_hash<K, V, M>(map: &M) -> Result<HashMap<K, V>>
where
    M: MapCore,
    K: plain::Plain + Default + Copy + Eq + Hash,
    V: plain::Plain + Default + Copy,
{
    let mut out = HashMap::new();
    for key in map.keys() {
        if let Some(v) = map.lookup(&key, MapFlags::ANY)? {
            out.insert(from_bytes::<K>(&key), from_bytes::<V>(&v));
        }
    }
    Ok(out)
}

/// Reads every entry of a plain hash map as a list (for key types that are
/// not `Hash`, such as the generated ones).
pub fn read_hash_entries<K, V, M>(map: &M) -> Result<Vec<(K, V)>>
where
    M: MapCore,
    K: plain::Plain + Default + Copy,
    V: plain::Plain + Default + Copy,
{
    let mut out = Vec::new();
    for key in map.keys() {
        if let Some(v) = map.lookup(&key, MapFlags::ANY)? {
            out.push((from_bytes::<K>(&key), from_bytes::<V>(&v)));
        }
    }
    Ok(out)
}

/// Reads slot 0 of a per-CPU array, summed over CPUs.
pub fn read_percpu_slot0<V, M>(map: &M) -> Result<V>
where
    M: MapCore,
    V: plain::Plain + Default + Copy + AddAssign,
{
    let per_cpu = map
        .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)?
        .unwrap_or_default();
    Ok(sum_per_cpu(&per_cpu))
}

/// Reads one kernel stack from a stack-trace map: return addresses,
/// innermost first, up to the first zero.
pub fn read_stack<M: MapCore>(map: &M, id: u32) -> Result<Option<Vec<u64>>> {
    let Some(bytes) = map.lookup(&id.to_ne_bytes(), MapFlags::ANY)? else {
        return Ok(None);
    };
    Ok(Some(
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunk")))
            .take_while(|&a| a != 0)
            .collect(),
    ))
}
