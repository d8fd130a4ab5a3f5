//! Anonymous pages: faulted in at once and held, or cycled one page at a
//! time (a fault, then MADV_DONTNEED).

use std::io::Write;
use std::time::Duration;

use crate::{cpu_time_ns, fail};

/// COUNT order-0 anonymous pages, allocated by one madvise(2) call so the
/// allocations have a path no start-up fault shares.
pub fn pages(count: usize, hold_secs: Option<u64>) {
    const MADV_POPULATE_WRITE: i32 = 23;
    let len = count * 4096;
    // SAFETY: a fresh private anonymous mapping, unmapped before return.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            eprintln!("mmap: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
        // Huge pages would turn 512 faults into one order-9 allocation.
        libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
        if libc::madvise(p, len, MADV_POPULATE_WRITE) != 0 {
            let err = std::io::Error::last_os_error();
            // Before 5.14 there is no MADV_POPULATE_WRITE: mlock(2)
            // populates a private writable mapping with write faults too
            // (__mm_populate), the same order-0 pages on a path of its own
            // (root needs no RLIMIT_MEMLOCK room); unlocked at once.
            if err.raw_os_error() != Some(libc::EINVAL) {
                eprintln!("MADV_POPULATE_WRITE: {err}");
                std::process::exit(1);
            }
            if libc::mlock(p, len) != 0 {
                eprintln!("mlock: {}", std::io::Error::last_os_error());
                std::process::exit(1);
            }
            libc::munlock(p, len);
        }
        if let Some(secs) = hold_secs {
            println!("populated");
            std::thread::sleep(Duration::from_secs(secs));
        }
        libc::munmap(p, len);
    }
}

/// COUNT page faults and frees of one anonymous page, for the benchmark's
/// page modes: each write faults in one order-0 page (mm_page_alloc), each
/// MADV_DONTNEED frees it (mm_page_free).
pub fn page_cycle(count: u64, wait: bool) {
    // SAFETY: three fresh private anonymous pages, written only inside
    // them and unmapped before return.
    unsafe {
        let area = libc::mmap(
            std::ptr::null_mut(),
            3 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if area == libc::MAP_FAILED {
            fail("mmap");
        }
        // The middle page is the one cycled. Its neighbours stay populated:
        // at least one shares its page table, which is then never empty, so
        // a kernel with CONFIG_PT_RECLAIM (6.14+) does not free the table at
        // MADV_DONTNEED and allocate it again at the next fault (seen: 1040
        // page allocations for 1000 cycles).
        let p = (area as *mut u8).add(4096) as *mut libc::c_void;
        std::ptr::write_volatile(area as *mut u8, 1);
        std::ptr::write_volatile((area as *mut u8).add(2 * 4096), 1);
        // The page table is allocated by these first faults, not in the loop.
        std::ptr::write_volatile(p as *mut u8, 1);
        libc::madvise(p, 4096, libc::MADV_DONTNEED);
        // A tracer that attaches after "ready" must see no page of this
        // process but the loop's. What runs after it has run once before
        // it: the clock, the result's formatting and printing (their code
        // and data faulted in, with a page table where they lie in a 2 MiB
        // region nothing touched yet) and a stack deeper than they need
        // (its start is randomised below a page). Without this about one
        // run in twenty counted 1002 page allocations for 1000 faults.
        let result = |start: u128| {
            let tenths = (cpu_time_ns() - start) * 10 / count.max(1) as u128;
            let (whole, tenth) = (tenths / 10, tenths % 10);
            format!("{count} page faults and frees, {whole}.{tenth} ns per call\n")
        };
        std::hint::black_box(result(cpu_time_ns()));
        fault_in_stack();
        let mut line = String::with_capacity(64);
        if wait {
            // Also allocates stdout's buffer, used again below.
            say("ready\n");
            let _ = std::io::stdin().read_line(&mut line);
        }
        let start = cpu_time_ns();
        for i in 0..count {
            std::ptr::write_volatile(p as *mut u8, i as u8);
            if libc::madvise(p, 4096, libc::MADV_DONTNEED) != 0 {
                fail("madvise(MADV_DONTNEED)");
            }
        }
        say(&result(start));
        if wait {
            // Exiting allocates pages too (TLB batches while the address
            // space is torn down): alive until stdin ends, so a tracer can
            // read exactly COUNT first.
            line.clear();
            let _ = std::io::stdin().read_line(&mut line);
        }
        libc::munmap(area, 3 * 4096);
    }
}

/// Writes 64 KiB of stack below the caller, so the deeper calls that
/// follow (formatting, reading stdin) fault no new stack page.
#[inline(never)]
fn fault_in_stack() {
    let mut below = [0u8; 64 * 1024];
    // black_box: the writes must happen, though nothing reads them.
    for page in below.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&mut below);
}

/// Writes `text` to stdout at once.
fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}
