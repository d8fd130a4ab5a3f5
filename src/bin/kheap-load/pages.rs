//! Anonymous pages: faulted in at once and held, or cycled one page at a
//! time (a fault, then MADV_DONTNEED).

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
        if wait {
            // Also allocates stdout's buffer, used again below.
            println!("ready");
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        let start = cpu_time_ns();
        for i in 0..count {
            std::ptr::write_volatile(p as *mut u8, i as u8);
            if libc::madvise(p, 4096, libc::MADV_DONTNEED) != 0 {
                fail("madvise(MADV_DONTNEED)");
            }
        }
        let ns = (cpu_time_ns() - start) as f64 / count.max(1) as f64;
        println!("{count} page faults and frees, {ns:.1} ns per call");
        if wait {
            // Exiting allocates pages too (TLB batches while the address
            // space is torn down): alive until stdin ends, so a tracer can
            // read exactly COUNT first.
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        libc::munmap(area, 3 * 4096);
    }
}
