//! Context switches without kernel allocations: what a program on
//! sched_switch costs (scripts/bench, mode `switch`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;

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

/// One byte passed back and forth COUNT times between two threads, which
/// share one CPU when the process is pinned to it (taskset): each pass
/// wakes the thread that waits and puts the other to sleep, one context
/// switch. A one-byte pipe write reuses the pipe's page, so the loop makes
/// no kmem event. Prints CPU ns per switch (the process's CPU time, both
/// threads).
pub fn switch_pingpong(count: u64) {
    let (mut to_echo_r, mut to_echo_w) = pipe();
    let (mut back_r, mut back_w) = pipe();
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8];
        while to_echo_r.read_exact(&mut byte).is_ok() {
            if back_w.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let mut byte = [0u8];
    let mut pass = || {
        to_echo_w
            .write_all(&byte)
            .and_then(|()| back_r.read_exact(&mut byte))
    };
    // One round trip first: the thread is started and the pages in use.
    pass().expect("kheap-load: the echo thread");
    let start = process_cpu_ns();
    for _ in 0..count {
        pass().expect("kheap-load: the echo thread");
    }
    let spent = process_cpu_ns() - start;
    drop(to_echo_w);
    let _ = echo.join();
    let switches = 2 * count.max(1);
    println!(
        "{switches} switches: {:.1} ns per call",
        spent as f64 / switches as f64
    );
}

fn process_cpu_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}
