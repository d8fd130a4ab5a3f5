//! Typed readers for the BPF maps: per-CPU values are summed with `AddAssign`
//! on the generated types.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::AddAssign;
use std::os::fd::AsRawFd;

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

/// Deletes one entry of a per-CPU hash map and returns its value at the
/// moment of deletion, summed over CPUs: read and delete are one syscall,
/// so no event that lands in between is lost. `None` if the key was gone.
pub fn take_percpu<V, M>(map: &M, key: &[u8]) -> Result<Option<V>>
where
    M: MapCore,
    V: plain::Plain + Default + Copy + AddAssign,
{
    // libbpf-rs's lookup_and_delete sizes its buffer for one CPU; the
    // kernel writes one 8-byte-aligned value per possible CPU.
    let aligned = (map.value_size() as usize).div_ceil(8) * 8;
    let ncpu = libbpf_rs::num_possible_cpus()?;
    let mut buf = vec![0u8; aligned * ncpu];
    let ret = unsafe {
        libbpf_sys::bpf_map_lookup_and_delete_elem(
            map.as_fd().as_raw_fd(),
            key.as_ptr().cast(),
            buf.as_mut_ptr().cast(),
        )
    };
    if ret != 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::NotFound {
            return Ok(None);
        }
        return Err(err).with_context(|| {
            format!(
                "deleting an entry of BPF map {}",
                map.name().to_string_lossy()
            )
        });
    }
    let per_cpu: Vec<Vec<u8>> = buf
        .chunks_exact(aligned)
        .map(|c| c[..map.value_size() as usize].to_vec())
        .collect();
    Ok(Some(sum_per_cpu(&per_cpu)))
}
