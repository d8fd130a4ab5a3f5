//! kheap-load: kernel allocation patterns whose sizes and counts are known,
//! for kheap's tests and benchmark, and for trying kheap out.
//!
//!   kheap-load msg COUNT SIZE [HOLD_SECS]   SysV messages: one kmalloc of
//!       48+SIZE bytes (SIZE <= 4000) each in load_msg (msgsnd), freed by msgrcv after
//!       HOLD_SECS, or as soon as SIGUSR1 comes while they are held (a test
//!       holds them long enough for a slow tracer start, then lets them go
//!       when its tracer is ready); the queue is removed on every exit path.
//!   kheap-load msg-steps COUNT SIZE STEP_SECS   messages as msg makes them,
//!       held in three steps: COUNT, then 2*COUNT, then 3*COUNT, each step
//!       held STEP_SECS (said on stderr as it starts), then all received.
//!   kheap-load fds COUNT PER_SEC [HOLD_SECS] an fd leak: opens COUNT
//!       eventfds at PER_SEC per second and keeps them (one struct file and
//!       one eventfd_ctx each) for HOLD_SECS, then closes them.
//!   kheap-load epoll COUNT [HOLD_SECS]      COUNT eventfds watched by one
//!       epoll instance: each EPOLL_CTL_ADD allocates one epitem from
//!       eventpoll_epi (ep_insert) and one poll-table entry from
//!       eventpoll_pwq (ep_ptable_queue_proc), caches SLUB merges with
//!       others of their size on most kernels; held HOLD_SECS, then closed.
//!   kheap-load unix COUNT HOLD_SECS         a socket leak: COUNT AF_UNIX
//!       stream socketpairs (two sockets each, from the UNIX-STREAM cache,
//!       UNIX before 5.15, which SLUB merges with others of their size on
//!       most kernels), held HOLD_SECS or until SIGUSR1, then closed.
//!   kheap-load writev COUNT                 writev(2) of 9 iovecs to
//!       /dev/null: exactly one kmalloc (144 bytes, iovec_from_user) and one
//!       kfree per call. Prints CPU ns per call.
//!   kheap-load writev-diff COUNT            COUNT writev(2) calls as above
//!       in blocks of 200, each block followed by as many one-byte write(2)
//!       calls to /dev/null (no kmem event). Prints CPU ns per call of each
//!       and their difference: one kmalloc and kfree with their tracing,
//!       plus a constant that cancels out between tracers.
//!   kheap-load malloc COUNT SIZE            COUNT pairs of malloc(SIZE) and
//!       free() through the C library (for `kheap malloc`). Prints CPU ns
//!       per pair.
//!   kheap-load writev-rate RATE SECS [wait] [ticks=FILE]  the same call,
//!       paced at RATE calls per second for SECS seconds (catching up if it
//!       falls behind). Prints the calls made, the time taken and the rate
//!       achieved. With `wait`, starts only after reading a line from stdin
//!       (so a tracer can be attached to its PID first). With `ticks=FILE`,
//!       writes `MS_BEFORE MS_AFTER CALLS` (Unix time in ms, calls made so
//!       far) to FILE for every burst of calls: when the loop fell behind (a
//!       busy or emulated CPU), a test can still count the calls made in any
//!       time window. They are kept in memory and written at the end: a
//!       write while the loop runs would allocate kernel memory (page
//!       cache, journal) under the loop's PID. SIGUSR1 ends the run early,
//!       as if SECS had passed, once the calls due by then are made (a
//!       test runs it long enough for a slow tracer start, then stops it
//!       when the tracer is done).
//!   kheap-load pages COUNT [HOLD_SECS]      COUNT anonymous pages, without
//!       huge pages, faulted in for writing by MADV_POPULATE_WRITE (before
//!       5.14: by mlock, under __mm_populate): COUNT order-0 allocations in
//!       do_anonymous_page under madvise_populate; held HOLD_SECS, then
//!       unmapped.
//!   kheap-load bpf-array KIND ENTRIES VALUE_SIZE [HOLD_SECS]  creates a
//!       BPF map of KIND `array` (above 32 KiB its values are one vmalloc
//!       area) or `percpu` (one percpu allocation per entry) through the bpf
//!       syscall, and holds it HOLD_SECS; the map goes with the process.
//!       KIND `ringbuf` is a BPF ring buffer of ENTRIES bytes (a power of
//!       2, multiple of the page size; VALUE_SIZE must be 0): its pages are
//!       allocated one by one and mapped twice with vmap(), a vmap area
//!       without vmalloc (its page array is vmalloc'd above 32 KiB).
//!   kheap-load page-cycle COUNT [wait]      COUNT times: one write to an
//!       anonymous page (one order-0 page allocation in the fault handler),
//!       then MADV_DONTNEED (its free). Prints CPU ns per call. With
//!       `wait`, prints `ready` once the page and its page table are set
//!       up, and starts after reading a line from stdin: from then on the
//!       process allocates exactly COUNT pages, then prints its line and
//!       waits for stdin to end before it unmaps the page and exits.
//!   kheap-load bpf-maps KIND COUNT ENTRIES VALUE_SIZE   creates and closes
//!       COUNT BPF maps as bpf-array does (`array` above 32 KiB: one
//!       vmalloc area each; `percpu`: ENTRIES percpu allocations each; the
//!       kernel frees them later, in a kworker). Prints CPU ns per call.
//!   kheap-load alarm-spin COUNT             spins in user mode until an
//!       interval timer (every millisecond) has sent COUNT SIGALRMs: each
//!       allocates a `sigqueue` object in hard interrupt context, on the
//!       process's own kernel stack when the timer interrupts it in user
//!       mode. Prints `COUNT alarms`.
//!   kheap-load alarm-pending COUNT          COUNT child processes each
//!       hold one SIGALRM blocked and pending: COUNT `sigqueue` objects
//!       allocated in hard interrupt context and held. Prints `COUNT
//!       pending`, then waits for stdin to end before the children exit.
//!   kheap-load switch-pingpong COUNT        one byte passed back and forth
//!       through two pipes between two threads (two context switches per
//!       round trip on one CPU when pinned, no kmem event), COUNT round
//!       trips in blocks alternating with the same pipe calls made by one
//!       thread alone. Prints CPU ns per switch of each and their difference.
//!
//! With KHEAP_LOAD_WAIT set, any mode prints `ready` once started and then
//! waits for a line on stdin: a test can then move the process into a
//! cgroup, so that only the workload (not the exec and start-up) runs
//! there.

mod alarms;
mod bpf;
mod calls;
mod fds;
mod msg;
mod pages;
mod switches;

use alarms::{alarm_pending, alarm_spin};
use bpf::{bpf_array, bpf_maps};
use calls::{malloc_free, probe_site, writev, writev_diff, writev_rate};
use fds::{epoll, fds, unix_pairs};
use msg::{msg, msg_steps, remove_all_queues};
use pages::{page_cycle, pages};
use switches::switch_pingpong;

fn usage() -> ! {
    eprintln!(
        "usage: kheap-load msg COUNT SIZE [HOLD_SECS] | msg-steps COUNT SIZE STEP_SECS | fds COUNT PER_SEC [HOLD_SECS] | epoll COUNT [HOLD_SECS] | unix COUNT HOLD_SECS | writev COUNT | writev-diff COUNT | writev-rate RATE SECS [wait] | malloc COUNT SIZE | probe-site nop5|push COUNT | pages COUNT [HOLD_SECS] | bpf-array array|percpu|ringbuf ENTRIES VALUE_SIZE [HOLD_SECS] | page-cycle COUNT [wait] | bpf-maps array|percpu COUNT ENTRIES VALUE_SIZE | alarm-spin COUNT | alarm-pending COUNT | switch-pingpong COUNT"
    );
    std::process::exit(2);
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage())
}

/// Set by SIGUSR1: writev-rate ends early, msg lets its held messages go
/// (see the module comment).
static STOP_EARLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn stop_early(_: libc::c_int) {
    STOP_EARLY.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Sets STOP_EARLY on SIGUSR1 from now on.
fn catch_stop_early() {
    let handler = stop_early as extern "C" fn(libc::c_int);
    unsafe { libc::signal(libc::SIGUSR1, handler as libc::sighandler_t) };
}

/// Whether SIGUSR1 has come since `catch_stop_early`.
fn stopping_early() -> bool {
    STOP_EARLY.load(std::sync::atomic::Ordering::SeqCst)
}

fn main() {
    // Interrupted (as kheap ends a traced command's tree): remove the
    // queues first; the default action would leave them.
    let _ = kheap::signals::on_interrupt(|| {
        remove_all_queues();
        std::process::exit(130);
    });
    let args: Vec<String> = std::env::args().collect();
    if std::env::var_os("KHEAP_LOAD_WAIT").is_some() {
        // Said once start-up is over, so the move can wait for it.
        println!("ready");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    match args.get(1).map(String::as_str) {
        Some("msg") => msg(
            arg(&args, 2),
            arg(&args, 3),
            args.get(4).map(|_| arg(&args, 4)),
        ),
        Some("msg-steps") => msg_steps(arg(&args, 2), arg(&args, 3), arg(&args, 4)),
        Some("fds") => fds(
            arg(&args, 2),
            arg(&args, 3),
            args.get(4).map(|_| arg(&args, 4)),
        ),
        Some("epoll") => epoll(arg(&args, 2), args.get(3).map(|_| arg(&args, 3))),
        Some("unix") => unix_pairs(arg(&args, 2), arg(&args, 3)),
        Some("writev") => writev(arg(&args, 2)),
        Some("alarm-spin") => alarm_spin(arg(&args, 2)),
        Some("alarm-pending") => alarm_pending(arg(&args, 2)),
        Some("writev-diff") => writev_diff(arg(&args, 2)),
        Some("switch-pingpong") => switch_pingpong(arg(&args, 2)),
        Some("malloc") => malloc_free(arg(&args, 2), arg(&args, 3)),
        Some("probe-site") => probe_site(&arg::<String>(&args, 2), arg(&args, 3)),
        Some("pages") => pages(arg(&args, 2), args.get(3).map(|_| arg(&args, 3))),
        Some("bpf-array") => bpf_array(
            &arg::<String>(&args, 2),
            arg(&args, 3),
            arg(&args, 4),
            args.get(5).map(|_| arg(&args, 5)),
        ),
        Some("page-cycle") => page_cycle(arg(&args, 2), args.get(3).is_some_and(|a| a == "wait")),
        Some("bpf-maps") => bpf_maps(
            &arg::<String>(&args, 2),
            arg(&args, 3),
            arg(&args, 4),
            arg(&args, 5),
        ),
        Some("writev-rate") => {
            let extra = &args[args.len().min(4)..];
            let ticks = extra.iter().find_map(|a| a.strip_prefix("ticks="));
            let ticks = ticks.map(|path| {
                std::fs::File::create(path).unwrap_or_else(|e| fail(&format!("{path}: {e}")))
            });
            if extra.iter().any(|a| a == "wait") {
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
            }
            writev_rate(arg(&args, 2), arg(&args, 3), ticks)
        }
        _ => usage(),
    }
}

/// Says what failed (with errno) and exits 1, removing the queues first.
fn fail(what: &str) -> ! {
    eprintln!("kheap-load: {what}: {}", std::io::Error::last_os_error());
    remove_all_queues();
    std::process::exit(1);
}

/// CPU time (user + system) this thread has used.
fn cpu_time_ns() -> u128 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time (user + system) all of this process's threads have used.
fn process_cpu_time_ns() -> u128 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}
