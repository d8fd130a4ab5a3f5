//! What the signals mean to a kheap run, the same in every subcommand:
//! SIGINT, SIGTERM and SIGHUP end the run and the report is still written,
//! and so do the other signals that would end it by default and that a
//! sender means as "stop" (SIGQUIT, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU);
//! SIGUSR1 asks `kheap leaks` for a snapshot and is ignored by the others
//! (it must never kill a run and lose its report). SIGUSR2, SIGPWR, SIGIO,
//! SIGSTKFLT, SIGXFSZ (a write past the limit then fails, and says so) and
//! the real-time signals are ignored by every subcommand. The command kheap
//! starts gets every signal back at its default (see [`reset_for_exec`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// Signals that end a run like SIGTERM (besides SIGINT, SIGTERM, SIGHUP).
const ALSO_STOP: [libc::c_int; 5] = [
    libc::SIGQUIT,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGXCPU,
];

/// Signals no subcommand uses, which would otherwise kill kheap silently.
fn unused() -> impl Iterator<Item = libc::c_int> {
    [
        libc::SIGUSR2,
        libc::SIGPWR,
        libc::SIGIO,
        libc::SIGSTKFLT,
        libc::SIGXFSZ,
    ]
    .into_iter()
    .chain(libc::SIGRTMIN()..=libc::SIGRTMAX())
}

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Ignores the signals no subcommand uses (every subcommand, first thing).
pub fn ignore_unused() {
    for sig in unused() {
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Installs the stop handler (and ignores SIGUSR1 and the unused signals).
/// Called as early as possible (right after the arguments are parsed), so
/// that a signal during startup ends the run with a report instead of
/// killing it; later calls do nothing, so a handler `leaks` installs for
/// SIGUSR1 stays.
pub fn install_stop_handler() {
    INSTALL.call_once(|| {
        // Fails only if a handler is already installed, which is then ours.
        let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
        ignore_unused();
        for sig in ALSO_STOP {
            unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
        }
        unsafe { libc::signal(libc::SIGUSR1, libc::SIG_IGN) };
    });
}

/// Puts every signal back at its default and unblocks them all, for a
/// command about to exec (an ignored signal stays ignored across exec).
/// Async-signal-safe: called between fork and exec.
pub fn reset_for_exec() {
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sighup(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// For the daemon (`kheap serve`): SIGHUP asks for a reload instead of
/// ending the run. Called after `install_stop_handler`, whose SIGHUP
/// handling it replaces.
pub fn install_reload_handler() {
    install_stop_handler();
    unsafe { libc::signal(libc::SIGHUP, on_sighup as *const () as libc::sighandler_t) };
}

/// Whether a reload was asked for since the last call (and clears it).
pub fn take_reload_request() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Sleeps for `d`, or less if a stop is requested; returns whether the run
/// should go on.
pub fn sleep_unless_stopped(d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        if stop_requested() {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the handler and the flag are process-wide.
    #[test]
    fn signals_stop_the_run_and_usr1_is_harmless() {
        install_stop_handler();
        assert!(sleep_unless_stopped(Duration::from_millis(10)));
        // Would kill the test process if they were not ignored.
        unsafe { libc::raise(libc::SIGUSR1) };
        unsafe { libc::raise(libc::SIGUSR2) };
        unsafe { libc::raise(libc::SIGRTMIN() + 1) };
        assert!(!stop_requested());
        unsafe { libc::raise(libc::SIGHUP) };
        let start = Instant::now();
        while !stop_requested() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(stop_requested());
        assert!(!sleep_unless_stopped(Duration::from_secs(3600)));
    }
}
