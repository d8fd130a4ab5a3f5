//! kheap-load: kernel allocation patterns whose sizes and counts are known,
//! for kheap's tests and benchmark, and for trying kheap out.
//!
//!   kheap-load msg COUNT SIZE [HOLD_SECS]   SysV messages: one kmalloc of
//!       48+SIZE bytes (SIZE <= 4000) each in load_msg (msgsnd), freed by msgrcv after
//!       HOLD_SECS; the queue is removed on every exit path.
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
//!   kheap-load writev COUNT                 writev(2) of 9 iovecs to
//!       /dev/null: exactly one kmalloc (144 bytes, iovec_from_user) and one
//!       kfree per call. Prints CPU ns per call.
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
//!       cache, journal) under the loop's PID.
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
//!
//! With KHEAP_LOAD_WAIT set, any mode prints `ready` once started and then
//! waits for a line on stdin: a test can then move the process into a
//! cgroup, so that only the workload (not the exec and start-up) runs
//! there.

use std::time::{Duration, Instant};

fn usage() -> ! {
    eprintln!(
        "usage: kheap-load msg COUNT SIZE [HOLD_SECS] | msg-steps COUNT SIZE STEP_SECS | fds COUNT PER_SEC [HOLD_SECS] | epoll COUNT [HOLD_SECS] | writev COUNT | writev-rate RATE SECS [wait] | malloc COUNT SIZE | probe-site nop5|push COUNT | pages COUNT [HOLD_SECS] | bpf-array array|percpu|ringbuf ENTRIES VALUE_SIZE [HOLD_SECS] | page-cycle COUNT [wait] | bpf-maps array|percpu COUNT ENTRIES VALUE_SIZE"
    );
    std::process::exit(2);
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage())
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
        Some("writev") => writev(arg(&args, 2)),
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

/// A private SysV message queue, removed when dropped.
struct MsgQueue(i32);

/// Every queue this process created and has not removed: removed on a
/// failure exit and on SIGINT/SIGTERM/SIGHUP too, so an interrupted run
/// leaves no SysV queue behind (they outlive processes, and a host runs out
/// of them: msgget then fails with ENOSPC).
static QUEUES: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

impl MsgQueue {
    fn new() -> MsgQueue {
        // Created under the lock: the interrupt handler, which takes it
        // before removing the queues, cannot miss one being created.
        let mut queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
        let id = unsafe { libc::msgget(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            drop(queues);
            fail("msgget");
        }
        queues.push(id);
        MsgQueue(id)
    }
}

impl Drop for MsgQueue {
    fn drop(&mut self) {
        QUEUES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&q| q != self.0);
        unsafe { libc::msgctl(self.0, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

fn remove_all_queues() {
    let mut queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    for id in queues.drain(..) {
        unsafe { libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
    // Still held while the process exits: no queue is created after this.
    std::mem::forget(queues);
}

fn fail(what: &str) -> ! {
    eprintln!("kheap-load: {what}: {}", std::io::Error::last_os_error());
    remove_all_queues();
    std::process::exit(1);
}

/// A queue holds at most msgmnb bytes (raising that needs CAP_SYS_RESOURCE),
/// so messages are spread over as many queues as needed.
fn queue_bytes() -> usize {
    std::fs::read_to_string("/proc/sys/kernel/msgmnb")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16384)
}

fn msg(count: usize, size: usize, hold_secs: Option<f64>) {
    let mut held = HeldMessages::new(count, size);
    held.send(count);
    if let Some(secs) = hold_secs {
        eprintln!("holding {count} messages of {size} bytes for {secs}s");
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
    held.receive_all();
    eprintln!("sent and received {count} messages of {size} bytes");
}

/// COUNT, 2*COUNT, then 3*COUNT messages held, STEP_SECS each: a timeline
/// shows three steps of known sizes.
fn msg_steps(count: usize, size: usize, step_secs: f64) {
    if !(step_secs.is_finite() && step_secs > 0.0) {
        usage();
    }
    let mut held = HeldMessages::new(3 * count, size);
    for step in 1..=3 {
        held.send(count);
        eprintln!(
            "step {step}: holding {} messages of {size} bytes for {step_secs}s",
            step * count
        );
        std::thread::sleep(Duration::from_secs_f64(step_secs));
    }
    held.receive_all();
    eprintln!("sent and received {} messages of {size} bytes", 3 * count);
}

/// Messages of one size sent into as many private queues as `capacity`
/// of them need; the queues go when this is dropped.
struct HeldMessages {
    queues: Vec<MsgQueue>,
    per_queue: usize,
    size: usize,
    sent: usize,
    buf: Vec<u8>,
}

impl HeldMessages {
    fn new(capacity: usize, size: usize) -> HeldMessages {
        if size == 0 || size > 4000 {
            eprintln!("kheap-load: msg SIZE must be 1..=4000 (one allocation per message)");
            std::process::exit(2);
        }
        let per_queue = (queue_bytes() / size).max(1);
        let queues = (0..capacity.div_ceil(per_queue))
            .map(|_| MsgQueue::new())
            .collect();
        // struct msgbuf: a long type, then the text.
        let mut buf = vec![0u8; 8 + size];
        buf[..8].copy_from_slice(&1i64.to_ne_bytes());
        HeldMessages {
            queues,
            per_queue,
            size,
            sent: 0,
            buf,
        }
    }

    fn send(&mut self, count: usize) {
        for _ in 0..count {
            let q = &self.queues[self.sent / self.per_queue];
            if unsafe { libc::msgsnd(q.0, self.buf.as_ptr().cast(), self.size, 0) } != 0 {
                fail("msgsnd");
            }
            self.sent += 1;
        }
    }

    fn receive_all(&mut self) {
        for i in 0..self.sent {
            let q = &self.queues[i / self.per_queue];
            let buf = self.buf.as_mut_ptr().cast();
            if unsafe { libc::msgrcv(q.0, buf, self.size, 0, 0) } < 0 {
                fail("msgrcv");
            }
        }
        self.sent = 0;
    }
}

/// Raises the soft limit on open files to `want` (within the hard limit), so
/// that a leak of thousands of fds runs where the default soft limit is 1024.
fn raise_fd_limit(want: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        fail("getrlimit");
    }
    let want = want as libc::rlim_t;
    if lim.rlim_cur >= want {
        return;
    }
    // Root may raise the hard limit too (a fresh VM's is 4096); others get
    // as far as their hard limit.
    let raised = libc::rlimit {
        rlim_cur: want,
        rlim_max: lim.rlim_max.max(want),
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        lim.rlim_cur = want.min(lim.rlim_max);
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            fail("setrlimit");
        }
    }
}

/// A slow leak, as a long-running service with a forgotten close() has.
fn fds(count: usize, per_sec: f64, hold_secs: Option<f64>) {
    if per_sec <= 0.0 {
        usage();
    }
    raise_fd_limit(count + 64);
    let start = Instant::now();
    let mut fds = Vec::with_capacity(count);
    for i in 0..count {
        let due = Duration::from_secs_f64(i as f64 / per_sec);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            fail("eventfd");
        }
        fds.push(fd);
    }
    eprintln!("holding {count} eventfds");
    if let Some(secs) = hold_secs {
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
    for fd in fds {
        unsafe { libc::close(fd) };
    }
    eprintln!("closed {count} eventfds");
}

fn epoll(count: usize, hold_secs: Option<f64>) {
    raise_fd_limit(count + 64);
    let fds: Vec<i32> = (0..count)
        .map(|_| {
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if fd < 0 {
                fail("eventfd");
            }
            fd
        })
        .collect();
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        fail("epoll_create1");
    }
    for &fd in &fds {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            fail("epoll_ctl");
        }
    }
    eprintln!("holding {count} epoll watches");
    if let Some(secs) = hold_secs {
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
    unsafe { libc::close(ep) };
    for fd in fds {
        unsafe { libc::close(fd) };
    }
    eprintln!("closed {count} epoll watches");
}

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
}

impl Drop for DevNull {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

/// CPU time (user + system) this thread has used.
fn cpu_time_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn writev(count: u64) {
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

fn writev_rate(rate: u64, secs: f64, ticks: Option<std::fs::File>) {
    use std::io::Write;
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
fn malloc_free(count: u64, size: usize) {
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
fn probe_site(which: &str, count: u64) {
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

#[cfg(not(target_arch = "x86_64"))]
fn probe_site(_: &str, _: u64) {
    fail("probe-site: x86-64 only");
}

/// COUNT order-0 anonymous pages, allocated by one madvise(2) call so the
/// allocations have a path no start-up fault shares.
fn pages(count: usize, hold_secs: Option<u64>) {
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

/// A BPF array map made with the raw bpf(2) syscall; closed (and freed by
/// the kernel) when the process exits.
fn bpf_array(kind: &str, entries: u32, value_size: u32, hold_secs: Option<u64>) {
    create_bpf_map(kind, entries, value_size);
    if let Some(secs) = hold_secs {
        println!("created");
        // On stderr too, as msg says it: a tracer running this as its
        // command passes its stderr on.
        eprintln!("holding a {kind} map of {entries} values of {value_size} bytes for {secs}s");
        std::thread::sleep(Duration::from_secs(secs));
    }
}

/// A BPF map of KIND `array` or `percpu` made with the raw bpf(2) syscall;
/// returns its fd.
fn create_bpf_map(kind: &str, entries: u32, value_size: u32) -> i32 {
    const BPF_MAP_CREATE: libc::c_long = 0;
    let map_type: u32 = match kind {
        "array" => 2,    // BPF_MAP_TYPE_ARRAY
        "percpu" => 6,   // BPF_MAP_TYPE_PERCPU_ARRAY
        "ringbuf" => 27, // BPF_MAP_TYPE_RINGBUF: no key, no value
        _ => usage(),
    };
    // Before 5.11 BPF maps are charged to RLIMIT_MEMLOCK (since, to the
    // memory cgroup): lift it, as BPF loaders do. Best effort.
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain struct passed by pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size,
    // max_entries, map_flags; the rest zero.
    let mut attr = [0u32; 32];
    attr[0] = map_type;
    attr[1] = if kind == "ringbuf" { 0 } else { 4 };
    attr[2] = value_size;
    attr[3] = entries;
    // SAFETY: attr outlives the call and its size is passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        eprintln!("bpf(BPF_MAP_CREATE): {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    fd as i32
}

/// COUNT maps created and closed, for the benchmark's vmalloc and percpu
/// modes: the allocations happen in this thread; the frees run later in a
/// kworker (the map is freed after its last reference goes), outside the
/// CPU time measured here.
fn bpf_maps(kind: &str, count: u64, entries: u32, value_size: u32) {
    let start = cpu_time_ns();
    for _ in 0..count {
        let fd = create_bpf_map(kind, entries, value_size);
        unsafe { libc::close(fd) };
    }
    let ns = (cpu_time_ns() - start) as f64 / count.max(1) as f64;
    println!("{count} {kind} maps created and closed, {ns:.1} ns per call");
}

/// COUNT page faults and frees of one anonymous page, for the benchmark's
/// page modes: each write faults in one order-0 page (mm_page_alloc), each
/// MADV_DONTNEED frees it (mm_page_free).
fn page_cycle(count: u64, wait: bool) {
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
