//! Timed system and library calls with known allocations: writev(2) to
//! /dev/null (one kmalloc each), paced or not; malloc/free; uprobe sites.

use std::time::{Duration, Instant};

use crate::{catch_stop_early, cpu_time_ns, fail, stopping_early, usage};

/// /dev/null opened for writing, closed when dropped.
struct DevNull(i32);

impl DevNull {
    fn open() -> DevNull {
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) };
        if fd < 0 {
            fail("open /dev/null");
        }
        DevNull(fd)
    }

    /// One writev(2) of 9 one-byte iovecs: more than UIO_FASTIOV (8), so
    /// the kernel must kmalloc the iovec array.
    fn writev9(&self) {
        let byte = [0u8; 1];
        let iov = [libc::iovec {
            iov_base: byte.as_ptr() as *mut _,
            iov_len: 1,
        }; 9];
        if unsafe { libc::writev(self.0, iov.as_ptr(), iov.len() as i32) } != 9 {
            fail("writev");
        }
    }

    /// One write(2) of one byte: the same file's write path without the
    /// iovec import, so no kmem event at all (a writev(2) of 8 iovecs
    /// allocates nothing but still calls kfree(NULL), a traced event).
    fn write1(&self) {
        let byte = [0u8; 1];
        if unsafe { libc::write(self.0, byte.as_ptr() as *const _, 1) } != 1 {
            fail("write");
        }
    }
}

impl Drop for DevNull {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

pub fn writev(count: u64) {
    let null = DevNull::open();
    // CPU time, not wall time: time the loop spends preempted by other
    // work on a busy machine must not count as tracing overhead.
    let start = cpu_time_ns();
    for _ in 0..count {
        null.writev9();
    }
    let ns = (cpu_time_ns() - start) as f64 / count.max(1) as f64;
    println!("{count} writev calls, {ns:.1} ns per call");
}

/// What the kmalloc and kfree of a writev(2) cost, tracing included, less
/// a constant: blocks of 9-iovec writev calls alternate with blocks of
/// one-byte write calls to the same file (which make no kmem event), and
/// the CPU time per call of the second is taken from the first's. Whatever
/// slows the machine for a millisecond slows both alike and cancels out, so
/// the difference between two tracers is measured with far less noise than
/// from whole loops run seconds apart.
pub fn writev_diff(count: u64) {
    const BLOCK: u64 = 200;
    let null = DevNull::open();
    let (mut with_alloc, mut without) = (0u128, 0u128);
    let blocks = count.div_ceil(BLOCK).max(1);
    for _ in 0..blocks {
        let start = cpu_time_ns();
        for _ in 0..BLOCK {
            null.writev9();
        }
        let middle = cpu_time_ns();
        for _ in 0..BLOCK {
            null.write1();
        }
        with_alloc += middle - start;
        without += cpu_time_ns() - middle;
    }
    let calls = (blocks * BLOCK) as f64;
    let (a, b) = (with_alloc as f64 / calls, without as f64 / calls);
    println!(
        "{} calls of each: writev {a:.1} ns, write {b:.1} ns, difference {:.1} ns per call",
        blocks * BLOCK,
        a - b
    );
}

pub fn writev_rate(rate: u64, secs: f64, ticks: Option<std::fs::File>) {
    use std::io::Write;
    catch_stop_early();
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis()
    };
    let null = DevNull::open();
    // Touched before the loop: growing it inside would fault in pages
    // and map memory, kernel allocations of their own. One burst per 2 ms
    // at most, with room to spare.
    let mut bursts = vec![
        (0u128, 0u128, 0u64);
        if ticks.is_some() {
            (secs * 600.0) as usize + 16
        } else {
            0
        }
    ];
    let mut logged = 0;
    let start = Instant::now();
    let mut done = 0u64;
    loop {
        let stopping = stopping_early();
        let elapsed = start.elapsed().as_secs_f64();
        if elapsed >= secs {
            break;
        }
        // Calls due by now: a late tick catches up, so the rate holds on
        // average even when the CPU is busy.
        let due = (elapsed * rate as f64) as u64;
        if done < due {
            let before = ticks.is_some().then(unix_ms);
            while done < due {
                null.writev9();
                done += 1;
            }
            if let (Some(before), Some(slot)) = (before, bursts.get_mut(logged)) {
                *slot = (before, unix_ms(), done);
                logged += 1;
            }
        }
        if stopping {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Some(file) = ticks {
        let mut out = std::io::BufWriter::new(file);
        for (before, after, done) in &bursts[..logged] {
            let _ = writeln!(out, "{before} {after} {done}");
        }
        let _ = out.flush();
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "{done} writev calls in {elapsed:.3} s, {:.1} per second",
        done as f64 / elapsed
    );
}

// Never inlined: tests find its calls by this function's name in the user
// stacks, and test builds are optimized (Cargo.toml's profile.dev).
#[inline(never)]
pub fn malloc_free(count: u64, size: usize) {
    let start = cpu_time_ns();
    for _ in 0..count {
        // black_box: the optimizer may not pair the calls away.
        let p = std::hint::black_box(unsafe { libc::malloc(size) });
        if p.is_null() {
            fail("malloc");
        }
        unsafe { libc::free(p) };
    }
    let ns = (cpu_time_ns() - start) as f64 / count.max(1) as f64;
    println!("{count} malloc+free pairs of {size} bytes, {ns:.1} ns per pair");
}

// Two functions that differ only in their first instruction, for
// scripts/bench-malloc to measure what one uprobe hit costs at each: a
// 5-byte NOP, which kernels from 6.18 on x86-64 replace with a call into a
// trampoline after the first hit (an optimized uprobe), and `push %rbp`,
// which the kernel emulates after a breakpoint trap (as at malloc's first
// instruction). Global symbols, so that a probe names them.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl kheap_load_nop5_site",
    ".type kheap_load_nop5_site, @function",
    "kheap_load_nop5_site:",
    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
    "mov rax, rdi",
    "ret",
    ".size kheap_load_nop5_site, . - kheap_load_nop5_site",
    ".globl kheap_load_push_site",
    ".type kheap_load_push_site, @function",
    "kheap_load_push_site:",
    "push rbp",
    "pop rbp",
    "mov rax, rdi",
    "ret",
    ".size kheap_load_push_site, . - kheap_load_push_site",
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    fn kheap_load_nop5_site(x: u64) -> u64;
    fn kheap_load_push_site(x: u64) -> u64;
}

/// COUNT calls of one of the two probe sites above, timed as the malloc
/// loop is (CPU time of this thread).
#[cfg(target_arch = "x86_64")]
pub fn probe_site(which: &str, count: u64) {
    let f: unsafe extern "C" fn(u64) -> u64 = match which {
        "nop5" => kheap_load_nop5_site,
        "push" => kheap_load_push_site,
        _ => usage(),
    };
    let start = cpu_time_ns();
    let mut x = 0u64;
    for i in 0..count {
        // SAFETY: both functions return their argument and touch nothing.
        x = x.wrapping_add(unsafe { f(std::hint::black_box(i)) });
    }
    let ns = (cpu_time_ns() - start) as f64 / count.max(1) as f64;
    std::hint::black_box(x);
    println!("{count} calls of the {which} site, {ns:.1} ns per call");
}

/// The sites are x86-64 instructions: elsewhere a known site name fails
/// with that reason, any other with the usage, as on x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub fn probe_site(which: &str, _: u64) {
    match which {
        "nop5" | "push" => fail("probe-site: x86-64 only"),
        _ => usage(),
    }
}
