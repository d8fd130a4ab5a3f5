//! The kernel side of unwinding without frame pointers: configuring the
//! sampled stack copies of `bpf/user_stack.bpf.h` before load, and reading
//! them from their ring buffer.

use std::time::Duration;

use anyhow::{Context, Result};
use libbpf_rs::{RingBuffer, RingBufferBuilder};

use crate::kernel::malloc_skel::{types, OpenMallocSkel};
use crate::kernel::maps;
use crate::model::malloc::{Sample, UnwindEvents};

/// By default, about one call in this many (and each row's first) sends a
/// copy of its stack to be unwound.
pub const DEFAULT_SAMPLE_EVERY: u32 = 1024;

/// The ring buffer's size: about 500 copies of 16 KiB waiting to be read
/// (the reader looks every 10 ms, and at once when a quarter is filled).
/// It counts in malloc's kernel-memory budget with the maps (32 MiB up to
/// 128 CPUs; the maps take about 20 MiB, and little more per CPU), so a
/// 16 MiB ring went over it at any CPU count.
const RING_BYTES: u32 = 8 << 20;

/// With every call copied (--exact-stacks), about 8000, stated apart from
/// the budget as leaks' object store is (an opt-in that sizes itself): a burst of calls
/// (calls made inside the allocator are copied too: they are told apart in
/// user space) must fit while a slow machine unwinds the first copies,
/// which is done on the thread that reads the ring. With 64 MiB (about
/// 4000), a burst of 5000 calls lost 317 copies in the 6.12 guest under
/// TCG while the first copy's unwind tables were read
/// (malloc_unwind::stacks_shared_out_from_samples_are_marked_estimated).
pub const RING_BYTES_EXACT: u32 = 128 << 20;

/// Sets up the copies before load: `sample_every` 0 turns them off, 1
/// copies every call, N about one call in N (a power of two).
pub fn configure(open: &mut OpenMallocSkel, sample_every: u32) -> Result<()> {
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .expect("the BPF object has read-only data");
    rodata.user_stack_copy = (sample_every > 0) as u8;
    rodata.user_stack_sample_mask = sample_every.saturating_sub(1);
    // Unused, the ring keeps one page.
    let size = match sample_every {
        0 => 4096,
        1 => RING_BYTES_EXACT,
        _ => RING_BYTES,
    };
    open.maps
        .user_stacks
        .set_max_entries(size)
        .context("sizing the user stack ring buffer")
}

/// Reads stack copies as they come; each is handed to the callback.
pub struct UserStackRing<'cb>(RingBuffer<'cb>);

impl<'cb> UserStackRing<'cb> {
    /// `ring`: the object's `user_stacks` map.
    pub fn new(
        ring: &libbpf_rs::Map,
        mut on_sample: impl FnMut(&Sample) + 'cb,
    ) -> Result<UserStackRing<'cb>> {
        let mut b = RingBufferBuilder::new();
        b.add(ring, move |data: &[u8]| {
            if let Ok(s) = plain::from_bytes::<types::user_stack_sample>(data) {
                let len = (s.len as usize).min(s.data.len());
                on_sample(&Sample {
                    key: (&s.key).into(),
                    size: s.size,
                    sp: s.sp,
                    bp: s.bp,
                    start: s.start,
                    stack: &s.data[..len],
                });
            }
            0
        })?;
        Ok(UserStackRing(b.build()?))
    }

    /// Handles what is waiting; if nothing was, waits at most `timeout` for
    /// a wakeup and handles what came. Most copies do not wake the reader
    /// (`copy_wakeup` in bpf/user_stack.bpf.h): they are found here, and
    /// while there are some, more may be coming, so there is no wait. A
    /// signal (Ctrl-C) ends the wait early, and is not an error.
    pub fn poll(&self, timeout: Duration) -> Result<()> {
        let handled = self.0.consume_raw();
        let n = if handled == 0 {
            self.0.poll_raw(timeout)
        } else {
            handled
        };
        if n < 0 && n != -libc::EINTR {
            anyhow::bail!(
                "reading the user stack ring: {}",
                std::io::Error::from_raw_os_error(-n)
            );
        }
        Ok(())
    }

    /// Handles everything waiting.
    pub fn drain(&self) -> Result<()> {
        self.0.consume().context("reading the user stack ring")
    }
}

/// What became of the copies, from the object's `user_stack_counters`.
pub fn events(counters: &libbpf_rs::Map) -> Result<UnwindEvents> {
    let c: types::user_stack_counters = maps::read_percpu_slot0(counters)?;
    Ok(UnwindEvents {
        sampled: c.sampled,
        dropped: c.dropped,
        copy_failed: c.copy_failed,
        ..Default::default()
    })
}
