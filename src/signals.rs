//! What the signals mean to a kheap run, the same in every subcommand:
//! SIGINT, SIGTERM and SIGHUP end the run and the report is still written,
//! and so do the other signals that would end it by default and that a
//! sender means as "stop" (SIGQUIT, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU);
//! SIGUSR1 asks `kheap leaks` for a snapshot and is ignored by the others
//! (it must never kill a run and lose its report); `kheap serve` reloads
//! its settings on SIGHUP instead of stopping. SIGUSR2, SIGPWR, SIGIO,
//! SIGSTKFLT, SIGXFSZ (a write past the limit then fails, and says so) and
//! the real-time signals are ignored by every subcommand. The command kheap
//! starts gets every signal back at its default (see [`reset_for_exec`]).
//!
//! The handlers are signal-hook's: each only sets a flag that the run
//! looks at, and wakes a run sleeping until its next read
//! ([`sleep_until_signal`]). Ignoring and resetting (SIG_IGN, SIG_DFL) are plain `signal(2)`
//! calls, which signal-hook has no words for, and the only ones that are
//! safe between fork and exec.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Once};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::SigId;

use crate::sys::wake::WakePipe;

/// A flag a signal sets; an `Arc` because signal-hook holds one too.
type Flag = LazyLock<Arc<AtomicBool>>;

static STOP: Flag = LazyLock::new(Default::default);
static RELOAD: Flag = LazyLock::new(Default::default);
static SNAPSHOT: Flag = LazyLock::new(Default::default);
static INSTALL: Once = Once::new();
/// SIGHUP's stop registration, which `serve` swaps for a reload.
static HUP_STOPS: Mutex<Option<SigId>> = Mutex::new(None);
/// SIGHUP asks for a reload (`serve`), not for the end of the run.
static HUP_RELOADS: AtomicBool = AtomicBool::new(false);

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

/// Woken by every signal that sets a flag here: a run waiting for its
/// next read sleeps on it ([`sleep_until_signal`]). `None` if no pipe could
/// be made (out of file descriptors): the sleeps then look at the flags
/// every 100 ms, as they all did before.
static WAKE: LazyLock<Option<WakePipe>> = LazyLock::new(|| WakePipe::new().ok());

/// Sets `flag` whenever `sig` arrives, and wakes [`sleep_until_signal`].
fn raise_flag_on(sig: libc::c_int, flag: &Flag) -> SigId {
    // Fails only for the signals signal-hook forbids (SIGKILL, SIGSEGV…),
    // none of which is asked for here. The flag is registered first, so a
    // woken sleeper finds it set.
    let id = signal_hook::flag::register(sig, Arc::clone(flag))
        .unwrap_or_else(|e| panic!("signal {sig}: {e}"));
    if let Some(wake) = WAKE.as_ref() {
        // The write end lives as long as the process (a static).
        signal_hook::low_level::pipe::register_raw(sig, wake.write_fd())
            .unwrap_or_else(|e| panic!("signal {sig}: {e}"));
    }
    id
}

/// Sleeps for `d`, or until one of the signals kheap handles arrives:
/// the caller then looks at what it asks for (a stop, a reload, a
/// snapshot). SIGHUP keeps waking it after `serve` swapped its meaning.
pub fn sleep_until_signal(d: Duration) {
    match WAKE.as_ref() {
        Some(wake) => wake.sleep(Some(d)),
        None => std::thread::sleep(d.min(Duration::from_millis(100))),
    }
}

/// Ignores `signals` (SIG_IGN, kept across exec). Async-signal-safe, so a
/// forked child may call it before it execs or instead.
pub fn ignore(signals: &[libc::c_int]) {
    for &sig in signals {
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Ignores the signals no subcommand uses (every subcommand, first thing).
pub fn ignore_unused() {
    for sig in unused() {
        ignore(&[sig]);
    }
}

/// Installs the stop handler (and ignores SIGUSR1 and the unused signals).
/// Called as early as possible (right after the arguments are parsed), so
/// that a signal during startup ends the run with a report instead of
/// killing it; later calls do nothing, so a handler `leaks` installs for
/// SIGUSR1 stays.
pub fn install_stop_handler() {
    INSTALL.call_once(|| {
        ignore_unused();
        ignore(&[SIGUSR1]);
        for sig in [SIGINT, SIGTERM].into_iter().chain(ALSO_STOP) {
            raise_flag_on(sig, &STOP);
        }
        *HUP_STOPS.lock().unwrap_or_else(|e| e.into_inner()) = Some(raise_flag_on(SIGHUP, &STOP));
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

/// For the daemon (`kheap serve`): SIGHUP asks for a reload instead of
/// ending the run. Installs the stop handler first, then swaps its SIGHUP
/// registration for the reload one.
pub fn install_reload_handler() {
    install_stop_handler();
    if let Some(id) = HUP_STOPS.lock().unwrap_or_else(|e| e.into_inner()).take() {
        signal_hook::low_level::unregister(id);
        raise_flag_on(SIGHUP, &RELOAD);
        HUP_RELOADS.store(true, Ordering::SeqCst);
    }
}

/// Whether a reload was asked for since the last call (and clears it).
pub fn take_reload_request() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// For `kheap leaks`: SIGUSR1 asks for a snapshot (instead of being
/// ignored).
pub fn install_snapshot_handler() {
    raise_flag_on(SIGUSR1, &SNAPSHOT);
}

/// Runs `f`, which loads BPF programs, with the signals that ask for
/// something without ending the run (leaks' SIGUSR1 snapshot, serve's
/// SIGHUP reload) blocked on this thread. The verifier gives up with EAGAIN
/// whenever a signal is pending for the loading thread, and libbpf tries a
/// load only a few times, so a SIGUSR1 every few milliseconds made `leaks`
/// fail to start. A blocked signal stays pending and is handled once `f`
/// returns. The stop signals are not held: a load runs on past one (its
/// handler only marks the stop) and the run then reports and ends; one that
/// makes the verifier give up ends the run before anything is attached
/// (`kernel::load_skel` says so).
pub fn holding_requests<T>(f: impl FnOnce() -> T) -> T {
    let mut held: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut held);
        libc::sigaddset(&mut held, SIGUSR1);
        if HUP_RELOADS.load(Ordering::SeqCst) {
            libc::sigaddset(&mut held, SIGHUP);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &held, &mut before);
    }
    let out = f();
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
    out
}

/// Whether a snapshot was asked for since the last call (and clears it).
pub fn take_snapshot_request() -> bool {
    SNAPSHOT.swap(false, Ordering::SeqCst)
}

/// Calls `on_interrupt` on a thread of its own when SIGINT, SIGTERM or
/// SIGHUP arrives, where it may do what a signal handler may not (lock,
/// allocate, exit): for kheap-load, which must clean up before it dies.
pub fn on_interrupt(on_interrupt: impl Fn() + Send + 'static) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::spawn(move || {
        for _ in signals.forever() {
            on_interrupt();
        }
    });
    Ok(())
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
        sleep_until_signal(left);
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
