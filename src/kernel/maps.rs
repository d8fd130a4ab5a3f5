//! Typed readers for the BPF maps: per-CPU values are summed with `AddAssign`
//! on the generated types.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::AddAssign;
use std::os::fd::AsRawFd;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::kernel::skel::from_bytes;

/// Entries per BPF_MAP_LOOKUP_BATCH call.
const BATCH: u32 = 256;

/// Batch buffers up to this size are kept for the next read.
const KEPT_BUFFER_BYTES: usize = 1 << 20;

thread_local! {
    /// The key and value buffers of the batch reads, kept between reads
    /// (`visit_batched`): made anew, they were zeroed at every read, a tenth
    /// of what idle `kheap top` spent in a guest (profiled under TCG). Taken
    /// out while in use, so a read nested in a visit makes its own.
    static BATCH_BUFFERS: std::cell::Cell<Option<(Vec<u8>, Vec<u8>)>> =
        const { std::cell::Cell::new(None) };
}

/// Puts the batch buffers back for the next read when dropped.
struct KeptBuffers(Vec<u8>, Vec<u8>);

impl KeptBuffers {
    fn take() -> KeptBuffers {
        let (k, v) = BATCH_BUFFERS.with(|b| b.take()).unwrap_or_default();
        KeptBuffers(k, v)
    }

    /// The first `keys` and `values` bytes, zeroed only where the buffers
    /// grow (the kernel writes what is read).
    fn slices(&mut self, keys: usize, values: usize) -> (&mut [u8], &mut [u8]) {
        if self.0.len() < keys {
            self.0.resize(keys, 0);
        }
        if self.1.len() < values {
            self.1.resize(values, 0);
        }
        (&mut self.0[..keys], &mut self.1[..values])
    }
}

impl Drop for KeptBuffers {
    fn drop(&mut self) {
        if self.0.len() + self.1.len() <= KEPT_BUFFER_BYTES {
            let kept = (std::mem::take(&mut self.0), std::mem::take(&mut self.1));
            BATCH_BUFFERS.with(|b| b.set(Some(kept)));
        }
    }
}

/// Raw (key bytes, value bytes) entries of a map.
type RawEntries = Vec<(Vec<u8>, Vec<u8>)>;

/// Every (key, value) of a hash map in a few BPF_MAP_LOOKUP_BATCH calls
/// instead of two syscalls per key (kheap top reads the maps every second).
/// `value_len` is the bytes per value (all CPUs' for a per-CPU map). `None`
/// when the kernel has no batch operations for the map (before 5.6).
fn lookup_all_batched<M: MapCore>(map: &M, value_len: usize) -> Result<Option<RawEntries>> {
    let mut out = Vec::new();
    let batched = visit_batched(map, value_len, &mut |k, v| {
        out.push((k.to_vec(), v.to_vec()))
    })?;
    Ok(batched.then_some(out))
}

/// Calls `visit` with every (key bytes, value bytes) of a hash map, read in
/// BPF_MAP_LOOKUP_BATCH calls, without copying entries: a map of a few
/// hundred thousand entries is folded with no allocation per entry.
/// Returns false (nothing visited) when the kernel has no batch operations
/// for the map.
fn visit_batched<M: MapCore>(
    map: &M,
    value_len: usize,
    visit: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<bool> {
    let key_len = map.key_size() as usize;
    let mut batch = BATCH;
    // The kernel's cursor for hash maps is a bucket index (u32).
    let mut cursor = 0u64;
    let mut started = false;
    let mut buffers = KeptBuffers::take();
    loop {
        let (keys, values) = buffers.slices(key_len * batch as usize, value_len * batch as usize);
        let mut count = batch;
        let opts = libbpf_sys::bpf_map_batch_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
            ..Default::default()
        };
        let mut next = 0u64;
        let ret = unsafe {
            libbpf_sys::bpf_map_lookup_batch(
                map.as_fd().as_raw_fd(),
                if started {
                    (&mut cursor as *mut u64).cast()
                } else {
                    std::ptr::null_mut()
                },
                (&mut next as *mut u64).cast(),
                keys.as_mut_ptr().cast(),
                values.as_mut_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        let err = (ret != 0).then(std::io::Error::last_os_error);
        let errno = err.as_ref().and_then(|e| e.raw_os_error());
        match errno {
            // A bucket holds more entries than the buffer: retry it bigger.
            Some(libc::ENOSPC) if batch < map.max_entries().max(BATCH) * 2 => {
                batch *= 2;
                continue;
            }
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(524 /* ENOTSUPP */) if !started => {
                return Ok(false)
            }
            None | Some(libc::ENOENT) => {}
            Some(_) => {
                return Err(err.unwrap())
                    .with_context(|| format!("reading BPF map {}", map.name().to_string_lossy()))
            }
        }
        for i in 0..count as usize {
            visit(
                &keys[i * key_len..(i + 1) * key_len],
                &values[i * value_len..(i + 1) * value_len],
            );
        }
        // ENOENT: that was the last batch.
        if errno == Some(libc::ENOENT) {
            return Ok(true);
        }
        cursor = next;
        started = true;
    }
}

/// Every key of a hash map, listed before the caller deletes any (deleting
/// during a get-next-key walk restarts it). Batched where the kernel can.
pub fn keys<M: MapCore>(map: &M) -> Result<Vec<Vec<u8>>> {
    let len = value_layout(map)?.1;
    Ok(match lookup_all_batched(map, len)? {
        Some(entries) => entries.into_iter().map(|(k, _)| k).collect(),
        None => map.keys().collect(),
    })
}

/// How the kernel lays out one value of a map for user space: (bytes of
/// one CPU's value, bytes in all). A per-CPU map has one 8-byte-aligned
/// value per possible CPU; a shared map one value.
fn value_layout<M: MapCore>(map: &M) -> Result<(usize, usize)> {
    if !map.map_type().is_percpu() {
        let len = map.value_size() as usize;
        return Ok((len, len));
    }
    let aligned = (map.value_size() as usize).div_ceil(8) * 8;
    Ok((aligned, aligned * libbpf_rs::num_possible_cpus()?))
}

/// Sums a value as the kernel laid it out (`value_layout`): one CPU's
/// value after another for a per-CPU map, the value itself for a shared
/// one.
fn sum_value<V, M>(map: &M, bytes: &[u8], aligned: usize) -> V
where
    M: MapCore,
    V: plain::Plain + Default + Copy + AddAssign,
{
    let value_size = map.value_size() as usize;
    let mut total = V::default();
    for cpu in bytes.chunks_exact(aligned) {
        total += from_bytes::<V>(&cpu[..value_size]);
    }
    total
}

/// Reads every entry of a hash map of counters, per-CPU (each value summed
/// over CPUs) or shared alike. Entries deleted between listing and lookup
/// are skipped.
pub fn read_counts<K, V, M>(map: &M) -> Result<Vec<(K, V)>>
where
    M: MapCore,
    K: plain::Plain + Default + Copy,
    V: plain::Plain + Default + Copy + AddAssign,
{
    let (aligned, len) = value_layout(map)?;
    if let Some(entries) = lookup_all_batched(map, len)? {
        return Ok(entries
            .into_iter()
            .map(|(k, v)| (from_bytes::<K>(&k), sum_value::<V, _>(map, &v, aligned)))
            .collect());
    }
    let mut out = Vec::new();
    for key in map.keys() {
        let value = if map.map_type().is_percpu() {
            map.lookup_percpu(&key, MapFlags::ANY)
                .map(|v| v.map(|per_cpu| sum_per_cpu::<V>(&per_cpu)))
        } else {
            map.lookup(&key, MapFlags::ANY)
                .map(|v| v.map(|bytes| from_bytes::<V>(&bytes)))
        };
        let Some(value) =
            value.with_context(|| format!("reading BPF map {}", map.name().to_string_lossy()))?
        else {
            continue;
        };
        out.push((from_bytes::<K>(&key), value));
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
    if let Some(entries) = lookup_all_batched(map, map.value_size() as usize)? {
        return Ok(entries
            .into_iter()
            .map(|(k, v)| (from_bytes::<K>(&k), from_bytes::<V>(&v)))
            .collect());
    }
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

/// Every value of a plain hash map, batched where the kernel can. The batch
/// reader goes on until the kernel says the map has no more entries, so a
/// short batch never ends the read early.
pub fn read_hash_values<V, M>(map: &M) -> Result<Vec<V>>
where
    M: MapCore,
    V: plain::Plain + Default + Copy,
{
    if let Some(entries) = lookup_all_batched(map, map.value_size() as usize)? {
        return Ok(entries.iter().map(|(_, v)| from_bytes::<V>(v)).collect());
    }
    let mut out = Vec::new();
    for key in map.keys() {
        if let Some(v) = map.lookup(&key, MapFlags::ANY)? {
            out.push(from_bytes::<V>(&v));
        }
    }
    Ok(out)
}

/// Folds every value of a (not per-CPU) hash map into `visit`, batched
/// where the kernel can, without a copy per entry.
pub fn visit_hash_values<V, M>(map: &M, visit: &mut dyn FnMut(&V)) -> Result<()>
where
    M: MapCore,
    V: plain::Plain + Default + Copy,
{
    let batched = visit_batched(map, map.value_size() as usize, &mut |_, v| {
        visit(&from_bytes::<V>(v))
    })?;
    if !batched {
        for key in map.keys() {
            if let Some(v) = map.lookup(&key, MapFlags::ANY)? {
                visit(&from_bytes::<V>(&v));
            }
        }
    }
    Ok(())
}

/// Folds every entry of a (not per-CPU) hash map into `visit`, batched
/// where the kernel can, without a copy per entry.
pub fn visit_hash_entries<K, V, M>(map: &M, visit: &mut dyn FnMut(&K, &V)) -> Result<()>
where
    M: MapCore,
    K: plain::Plain + Default + Copy,
    V: plain::Plain + Default + Copy,
{
    let batched = visit_batched(map, map.value_size() as usize, &mut |k, v| {
        visit(&from_bytes::<K>(k), &from_bytes::<V>(v))
    })?;
    if !batched {
        for key in map.keys() {
            if let Some(v) = map.lookup(&key, MapFlags::ANY)? {
                visit(&from_bytes::<K>(&key), &from_bytes::<V>(&v));
            }
        }
    }
    Ok(())
}

/// A BPF array map created with BPF_F_MMAPABLE, mapped read-only (or, by
/// `writable`, for reading and writing): its values are read from memory,
/// with no syscall and no copy of the entries not asked for. Unmapped when
/// dropped.
pub struct MappedArray {
    base: *const u8,
    len: usize,
    value_size: usize,
    entries: u32,
    writable: bool,
}

impl MappedArray {
    pub fn new<M: MapCore>(map: &M) -> Result<MappedArray> {
        Self::map(map, false)
    }

    /// Mapped for writing too (`compare_and_clear`).
    pub fn writable<M: MapCore>(map: &M) -> Result<MappedArray> {
        Self::map(map, true)
    }

    fn map<M: MapCore>(map: &M, writable: bool) -> Result<MappedArray> {
        // The kernel lays values out 8-byte aligned, from offset 0.
        let value_size = (map.value_size() as usize).div_ceil(8) * 8;
        let entries = map.max_entries();
        let len = value_size * entries as usize;
        let prot = match writable {
            true => libc::PROT_READ | libc::PROT_WRITE,
            false => libc::PROT_READ,
        };
        // SAFETY: a fresh shared mapping of the map's fd; the kernel checks
        // the length against the map.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                map.as_fd().as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mapping BPF map {}", map.name().to_string_lossy()));
        }
        Ok(MappedArray {
            base: base.cast(),
            len,
            value_size,
            entries,
            writable,
        })
    }

    /// Sets the 64-bit word `word` of the value at `index` to 0 if it
    /// still holds `expected`, atomically, as BPF programs' compare-and-swap
    /// on the same word expects. True when it did. False past the end or
    /// in a read-only mapping.
    pub fn compare_and_clear(&self, index: u32, word: usize, expected: u64) -> bool {
        if !self.writable || index >= self.entries || (word + 1) * 8 > self.value_size {
            return false;
        }
        // SAFETY: inside the writable mapping (checked above), which lives
        // as long as self, 8-byte aligned (values start at multiples of 8
        // from a page-aligned base); the kernel's programs reach this word
        // only with atomic operations or aligned 8-byte loads and stores.
        let cell = unsafe {
            std::sync::atomic::AtomicU64::from_ptr(
                self.base
                    .add(index as usize * self.value_size + word * 8)
                    .cast::<u64>()
                    .cast_mut(),
            )
        };
        cell.compare_exchange(
            expected,
            0,
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
        )
        .is_ok()
    }

    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// The value at `index` as it is now (BPF programs write it meanwhile:
    /// read once, volatile). `None` past the end.
    pub fn get<V: plain::Plain + Copy>(&self, index: u32) -> Option<V> {
        if index >= self.entries
            || std::mem::size_of::<V>() > self.value_size
            || std::mem::align_of::<V>() > 8
        {
            return None;
        }
        // SAFETY: inside the mapping (checked above), which lives as long
        // as self, at a multiple of 8 bytes from its page-aligned start (V
        // needs no more); V is plain data, valid for any bytes.
        Some(unsafe {
            std::ptr::read_volatile(self.base.add(index as usize * self.value_size).cast::<V>())
        })
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Reads one stack from a map of stacks (a stack-trace map keyed by id, or
/// kheap's store keyed by the frames' hash): return addresses, innermost
/// first, up to the first zero.
pub fn read_stack<M: MapCore>(map: &M, key: &[u8]) -> Result<Option<Vec<u64>>> {
    let Some(bytes) = map.lookup(key, MapFlags::ANY)? else {
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

/// Deletes one entry of a hash map of counters (per-CPU or shared) and
/// returns its value at the moment of deletion, summed over CPUs: read and
/// delete are one syscall, so no event that lands in between is lost.
/// `None` if the key was gone.
pub fn take_counts<V, M>(map: &M, key: &[u8]) -> Result<Option<V>>
where
    M: MapCore,
    V: plain::Plain + Default + Copy + AddAssign,
{
    // libbpf-rs's lookup_and_delete sizes its buffer for one CPU; the
    // kernel writes one 8-byte-aligned value per possible CPU.
    let (aligned, len) = value_layout(map)?;
    let mut buf = vec![0u8; len];
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
    Ok(Some(sum_value(map, &buf, aligned)))
}
