//! File descriptors: an eventfd leak, epoll watches, and a socket leak.

use std::time::{Duration, Instant};

use crate::{catch_stop_early, fail, stopping_early, usage};

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
pub fn fds(count: usize, per_sec: f64, hold_secs: Option<f64>) {
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

pub fn epoll(count: usize, hold_secs: Option<f64>) {
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

/// A socket leak: COUNT AF_UNIX stream socketpairs, two sockets each
/// (sk_alloc() from the protocol's cache: UNIX-STREAM since 5.15, UNIX
/// before), held HOLD_SECS or until SIGUSR1, then closed. Says how many
/// sockets the process holds in all (those it made before too).
pub fn unix_pairs(count: usize, hold_secs: f64) {
    raise_fd_limit(2 * count + 64);
    catch_stop_early();
    let mut fds = Vec::with_capacity(2 * count);
    for _ in 0..count {
        let mut pair = [0i32; 2];
        let flags = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
        if unsafe { libc::socketpair(libc::AF_UNIX, flags, 0, pair.as_mut_ptr()) } != 0 {
            fail("socketpair");
        }
        fds.extend(pair);
    }
    // The process's every socket, those made before too (signal-hook's
    // self-pipe is a unix stream socketpair): what a tracer of this
    // process sees held.
    let sockets = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or_else(|_| fail("reading /proc/self/fd"));
    eprintln!(
        "holding {} unix stream sockets ({sockets} sockets in all)",
        fds.len()
    );
    let end = Instant::now() + Duration::from_secs_f64(hold_secs);
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if stopping_early() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(10)));
    }
    for fd in &fds {
        unsafe { libc::close(*fd) };
    }
    eprintln!("closed {} unix stream sockets", fds.len());
}
