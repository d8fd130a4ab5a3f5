//! Allocations made by interrupts that hit a process in user mode.

use std::sync::atomic::{AtomicU64, Ordering};

static ALARMS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_alarm(_: libc::c_int) {
    ALARMS.fetch_add(1, Ordering::Relaxed);
}

/// COUNT SIGALRMs of an interval timer (ITIMER_REAL, every millisecond)
/// while the process spins in user mode. The timer's expiry runs in hard
/// interrupt context and, for each signal, allocates the signal's queue
/// entry (a `sigqueue` object, under it_real_fn) there: when the timer
/// interrupts the spinning process, on the process's own kernel stack, with
/// the process as the current task. Prints `COUNT alarms`.
pub fn alarm_spin(count: u64) {
    // SAFETY: a handler that only adds to an atomic, and an interval timer
    // cleared before return.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_alarm as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut()) != 0 {
            crate::fail("sigaction");
        }
        let every = libc::timeval {
            tv_sec: 0,
            tv_usec: 1000,
        };
        let timer = libc::itimerval {
            it_interval: every,
            it_value: every,
        };
        if libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) != 0 {
            crate::fail("setitimer");
        }
        let mut spins = 0u64;
        while ALARMS.load(Ordering::Relaxed) < count {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
        let off: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_REAL, &off, std::ptr::null_mut());
    }
    println!("{count} alarms");
}

/// COUNT child processes, each holding one SIGALRM pending: each blocks the
/// signal, arms a one-shot ITIMER_REAL of a millisecond and spins in user
/// mode until the signal is pending. The timer's expiry allocates the
/// signal's `sigqueue` object in hard interrupt context, and the object
/// stays queued (blocked) until the child exits: COUNT objects held, none
/// of them any process's allocation. Prints `COUNT pending` once every
/// child holds its signal, then waits for stdin to end (or a line) before
/// the children exit and are reaped. A child whose parent dies sees its
/// release pipe end and exits too.
pub fn alarm_pending(count: u32) {
    let mut ready = [0; 2];
    let mut release = [0; 2];
    // SAFETY: plain pipes; after fork the child makes only
    // async-signal-safe calls (sigprocmask, setitimer, sigpending, read,
    // write, _exit).
    unsafe {
        if libc::pipe(ready.as_mut_ptr()) != 0 || libc::pipe(release.as_mut_ptr()) != 0 {
            crate::fail("pipe");
        }
        let mut children = Vec::new();
        for _ in 0..count {
            match libc::fork() {
                -1 => crate::fail("fork"),
                0 => {
                    libc::close(release[1]);
                    hold_one_alarm(ready[1], release[0]);
                }
                pid => children.push(pid),
            }
        }
        libc::close(ready[1]);
        libc::close(release[0]);
        let mut byte = [0u8; 1];
        for _ in 0..count {
            if libc::read(ready[0], byte.as_mut_ptr().cast(), 1) != 1 {
                crate::fail("a child ended before its alarm");
            }
        }
        println!("{count} pending");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        libc::close(release[1]);
        for pid in children {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
}

/// A child of `alarm_pending`: one SIGALRM blocked and pending, a byte on
/// `ready`, then waits for `release` to end.
unsafe fn hold_one_alarm(ready: libc::c_int, release: libc::c_int) -> ! {
    let mut alarm: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut alarm);
    libc::sigaddset(&mut alarm, libc::SIGALRM);
    libc::sigprocmask(libc::SIG_BLOCK, &alarm, std::ptr::null_mut());
    let once = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: 1000,
        },
    };
    if libc::setitimer(libc::ITIMER_REAL, &once, std::ptr::null_mut()) != 0 {
        libc::_exit(1);
    }
    let mut pending: libc::sigset_t = std::mem::zeroed();
    loop {
        libc::sigpending(&mut pending);
        if libc::sigismember(&pending, libc::SIGALRM) == 1 {
            break;
        }
        std::hint::spin_loop();
    }
    let byte = 1u8;
    libc::write(ready, (&byte as *const u8).cast(), 1);
    let mut buf = [0u8; 1];
    while libc::read(release, buf.as_mut_ptr().cast(), 1) > 0 {}
    libc::_exit(0);
}
