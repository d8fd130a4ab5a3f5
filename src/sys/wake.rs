//! A pipe that wakes a thread sleeping in poll(2): another thread, or a
//! signal handler (signal-hook's pipe registration), writes a byte, and the
//! sleeper drains it. A loop that waits for its next read of the maps
//! sleeps on one until then instead of waking every 100 ms to look at a
//! flag: ten wake-ups a second, which under an emulator were a large share
//! of what an idle `kheap serve` cost.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub struct WakePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl WakePipe {
    /// Both ends non-blocking (a wake of a full pipe is already pending;
    /// a drain stops when it is empty) and closed on exec.
    pub fn new() -> io::Result<WakePipe> {
        let mut fds = [0; 2];
        // SAFETY: fds is writable for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 just opened both, and nothing else owns them.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(WakePipe { read, write })
    }

    /// The end a sleeper polls for POLLIN.
    pub fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// The end a signal handler writes to (it must stay open as long as the
    /// handler is registered).
    pub fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// Wakes the sleeper (or the next one to sleep).
    pub fn wake(&self) {
        // SAFETY: one byte from a live buffer; a full pipe (EAGAIN) already
        // holds a wake.
        unsafe { libc::write(self.write.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }

    /// Sleeps until woken or until `timeout` has passed (`None`: until
    /// woken), then drains what woke it. A signal that interrupts the
    /// sleep ends it early too: callers look at their flags and sleep
    /// again for what is left.
    pub fn sleep(&self, timeout: Option<Duration>) {
        let ms = timeout.map_or(-1, |t| {
            // Rounded up: a sleep shorter than asked would wake to sleep
            // again for less than a millisecond.
            t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
        });
        let mut fd = libc::pollfd {
            fd: self.read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        if unsafe { libc::poll(&mut fd, 1, ms) } > 0 {
            self.drain();
        }
    }

    /// Empties the pipe.
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        // SAFETY: reads into a live buffer of its length; stops at EAGAIN.
        while unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_wake_from_another_thread_ends_the_sleep() {
        let pipe = std::sync::Arc::new(WakePipe::new().unwrap());
        let waker = pipe.clone();
        let start = Instant::now();
        let t = std::thread::spawn(move || waker.wake());
        pipe.sleep(Some(Duration::from_secs(60)));
        t.join().unwrap();
        assert!(start.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn wakes_before_the_sleep_are_kept_then_drained() {
        let pipe = WakePipe::new().unwrap();
        for _ in 0..100_000 {
            pipe.wake(); // past the pipe's capacity: never blocks
        }
        let start = Instant::now();
        pipe.sleep(None);
        assert!(start.elapsed() < Duration::from_secs(30));
        // Drained: a timed sleep now runs its time.
        let start = Instant::now();
        pipe.sleep(Some(Duration::from_millis(20)));
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
