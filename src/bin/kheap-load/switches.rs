//! Context switches without kernel allocations: what a program on
//! sched_switch costs (scripts/bench, mode `switch`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use crate::process_cpu_time_ns;

/// A pipe's two ends.
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        eprintln!("kheap-load: pipe: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    // SAFETY: two new descriptors, owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// One byte passed back and forth between two threads, which share one
/// CPU when the process is pinned to it (taskset): each pass wakes the
/// thread that waits and puts the other to sleep, one context switch. A
/// one-byte pipe write reuses the pipe's page, so the loop makes no kmem
/// event. COUNT round trips in blocks of 100, each block followed by 100
/// rounds of the same four pipe calls made by one thread alone (a write
/// and a read on a pipe of its own, twice: no switch), timed by the
/// process's CPU time (both threads); prints the CPU ns of each per switch
/// and their difference, what the switches alone cost (as writev-diff
/// does for a kmalloc: what slows the machine for a moment slows both
/// halves and cancels out).
pub fn switch_pingpong(count: u64) {
    const BLOCK: u64 = 100;
    let (mut to_echo_r, mut to_echo_w) = pipe();
    let (mut back_r, mut back_w) = pipe();
    let (mut solo_r, mut solo_w) = pipe();
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8];
        while to_echo_r.read_exact(&mut byte).is_ok() {
            if back_w.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let mut byte = [0u8];
    let mut round_trip = || {
        to_echo_w
            .write_all(&byte)
            .and_then(|()| back_r.read_exact(&mut byte))
            .expect("kheap-load: the echo thread")
    };
    let mut solo = [0u8];
    let mut alone = || {
        for _ in 0..2 {
            solo_w
                .write_all(&solo)
                .and_then(|()| solo_r.read_exact(&mut solo))
                .expect("kheap-load: a pipe of its own")
        }
    };
    // One of each first: the thread is started and the pages in use.
    round_trip();
    alone();
    let (mut switching, mut not) = (0u128, 0u128);
    let blocks = count.div_ceil(BLOCK).max(1);
    for _ in 0..blocks {
        let start = process_cpu_time_ns();
        for _ in 0..BLOCK {
            round_trip();
        }
        let middle = process_cpu_time_ns();
        for _ in 0..BLOCK {
            alone();
        }
        switching += middle - start;
        not += process_cpu_time_ns() - middle;
    }
    drop(to_echo_w);
    let _ = echo.join();
    let switches = (2 * blocks * BLOCK) as f64;
    let (a, b) = (switching as f64 / switches, not as f64 / switches);
    println!(
        "{} switches: round trips {a:.1} ns, alone {b:.1} ns, difference {:.1} ns per call",
        2 * blocks * BLOCK,
        a - b
    );
}
