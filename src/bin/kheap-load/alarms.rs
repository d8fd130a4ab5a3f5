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
