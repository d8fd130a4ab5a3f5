//! The process tree of a command kheap starts: it ends with the run.
//!
//! The command and everything it forks, daemons that `setsid` included, go
//! into a cgroup of their own (cgroup2, `kheap.<pid>.<n>`); at the end of the
//! run kheap asks them to stop (SIGTERM), waits a little, then kills what is
//! left (`cgroup.kill`) and removes the cgroup. A process group would lose
//! daemons and would take the terminal away from an interactive command.
//! If kheap itself dies (SIGKILL), a small guard process it forked first
//! sees its pipe close and ends the cgroup the same way: SIGTERM, the same
//! grace, then `cgroup.kill`, or SIGKILL to each process before 5.14 (the
//! command's PR_SET_PDEATHSIG is then SIGTERM, not SIGKILL). Without
//! cgroup2 (or without the right to use it), the command's descendants
//! found through /proc are signalled instead, and PR_SET_PDEATHSIG ends the
//! command with kheap.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long the tree has to stop on SIGTERM before it is killed.
const GRACE: Duration = Duration::from_secs(1);

/// A cgroup holding the command's tree, and the guard that kills it if
/// kheap dies first.
pub struct TreeCgroup {
    pub path: PathBuf,
    guard: Option<(OwnedFd, libc::pid_t)>,
}

impl TreeCgroup {
    /// Creates an empty cgroup and its guard; None when cgroup2 cannot be
    /// used here (not mounted, not root).
    pub fn create() -> Option<TreeCgroup> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let mount = crate::sys::cgroup2_mount().ok()?;
        let name = format!(
            "kheap.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let path = mount.join(name);
        fs::create_dir(&path).ok()?;
        let mut cg = TreeCgroup { path, guard: None };
        cg.guard = spawn_guard(&cg.path);
        Some(cg)
    }

    /// Moves a process (the held command, before it execs) into the cgroup.
    pub fn adopt(&self, pid: u32) -> std::io::Result<()> {
        fs::write(self.path.join("cgroup.procs"), pid.to_string())
    }

    /// Whether a guard ends the tree if kheap dies.
    pub fn guarded(&self) -> bool {
        self.guard.is_some()
    }

    pub fn pids(&self) -> Vec<u32> {
        read_pids(&self.path.join("cgroup.procs"))
    }

    fn populated(&self) -> bool {
        fs::read_to_string(self.path.join("cgroup.events"))
            .map(|e| e.lines().any(|l| l == "populated 1"))
            .unwrap_or(false)
    }

    /// SIGTERM to every process, a grace period, then SIGKILL to what is
    /// left; waits until the cgroup is empty. `reap` is called while
    /// waiting, so the direct child (a zombie still counts) can be reaped.
    pub fn end(&self, mut reap: impl FnMut()) {
        for pid in self.pids() {
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if !wait_until(GRACE, || {
            reap();
            !self.populated()
        }) {
            self.kill_all();
            wait_until(Duration::from_secs(5), || {
                reap();
                !self.populated()
            });
        }
    }

    fn kill_all(&self) {
        // cgroup.kill (Linux 5.14) also catches processes forked meanwhile.
        if fs::write(self.path.join("cgroup.kill"), "1").is_err() {
            for _ in 0..10 {
                let pids = self.pids();
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Drop for TreeCgroup {
    fn drop(&mut self) {
        if self.populated() {
            self.kill_all();
            wait_until(Duration::from_secs(5), || !self.populated());
        }
        // Tell the guard all is done (a byte, not EOF), then reap it.
        if let Some(guard) = self.guard.take() {
            dismiss_guard(guard);
        }
        let _ = fs::remove_dir(&self.path);
    }
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read_pids(path: &Path) -> Vec<u32> {
    fs::read_to_string(path)
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Forks the guard: it waits on a pipe only kheap writes to. A byte means
/// kheap ended the tree itself; EOF without one means kheap died, and the
/// guard ends the tree as kheap would have (SIGTERM, a grace period, then
/// `cgroup.kill`, or SIGKILL to each process before 5.14: a command that
/// cleans up on SIGTERM, such as removing SysV IPC objects that outlive it,
/// gets to) and removes the cgroup.
/// Returns the pipe and its PID.
fn spawn_guard(cgroup: &Path) -> Option<(OwnedFd, libc::pid_t)> {
    // Prepared before fork: after it only async-signal-safe calls.
    let kill_file = CString::new(cgroup.join("cgroup.kill").to_str()?).ok()?;
    let procs_file = CString::new(cgroup.join("cgroup.procs").to_str()?).ok()?;
    let dir = CString::new(cgroup.to_str()?).ok()?;
    fork_guard(move || unsafe {
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        if signal_procs(&procs_file, libc::SIGTERM) {
            let steps = GRACE.as_millis() / 10;
            for _ in 0..steps {
                if !signal_procs(&procs_file, 0) {
                    break;
                }
                libc::nanosleep(&pause, std::ptr::null_mut());
            }
        }
        let fd = libc::open(kill_file.as_ptr(), libc::O_WRONLY);
        if fd >= 0 {
            libc::write(fd, b"1".as_ptr().cast(), 1);
            libc::close(fd);
        } else {
            // No cgroup.kill before 5.14: SIGKILL what cgroup.procs lists
            // until it lists nothing (a process may fork meanwhile), as
            // kill_all does. Seen on 5.10: a child that got SIGTERM
            // between its fork and its exec lost it and ran on.
            for _ in 0..100 {
                if !signal_procs(&procs_file, libc::SIGKILL) {
                    break;
                }
                libc::nanosleep(&pause, std::ptr::null_mut());
            }
        }
        for _ in 0..500 {
            if libc::rmdir(dir.as_ptr()) == 0 {
                break;
            }
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
    })
}

/// Forks a guard process that waits on a pipe only kheap writes to, and
/// runs `on_death` if the pipe closes without a byte (kheap died, even by
/// SIGKILL). Returns the pipe's write end and the guard's PID: write a
/// byte before closing it to say all is done, then reap the guard.
///
/// `on_death` runs in the forked child of a possibly threaded process: it
/// may only make async-signal-safe calls (no allocation, no locks), on
/// things prepared before the fork.
pub fn fork_guard(on_death: impl FnOnce()) -> Option<(OwnedFd, libc::pid_t)> {
    let dev_null = CString::new("/dev/null").ok()?;
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    match unsafe { libc::fork() } {
        -1 => {
            unsafe {
                libc::close(read_end);
                libc::close(write_end);
            }
            None
        }
        0 => unsafe {
            // The terminal's Ctrl-C reaches the whole foreground group: the
            // guard outlives kheap's reaction to it.
            crate::signals::ignore(&[
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGTERM,
                libc::SIGHUP,
                libc::SIGUSR1,
                libc::SIGUSR2,
            ]);
            // Hold nothing of kheap's: not its output pipes (a reader would
            // wait for the guard), not its BPF descriptors.
            let null = libc::open(dev_null.as_ptr(), libc::O_RDWR);
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            libc::dup2(read_end, 3);
            libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
            let mut byte = 0u8;
            let n = loop {
                let n = libc::read(3, (&mut byte as *mut u8).cast(), 1);
                if n >= 0 || *libc::__errno_location() != libc::EINTR {
                    break n;
                }
            };
            if n != 1 {
                on_death();
            }
            libc::_exit(0);
        },
        pid => {
            unsafe { libc::close(read_end) };
            Some((unsafe { OwnedFd::from_raw_fd(write_end) }, pid))
        }
    }
}

/// Tells a guard from [`fork_guard`] all is done (a byte, not EOF) and
/// reaps it.
pub fn dismiss_guard(guard: (OwnedFd, libc::pid_t)) {
    let (pipe, pid) = guard;
    unsafe { libc::write(pipe.as_raw_fd(), [b'd'].as_ptr().cast(), 1) };
    drop(pipe);
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

/// Sends `sig` (0: none, only the check) to every process listed in the
/// cgroup.procs file `procs`; whether any was listed. Async-signal-safe (the
/// guard calls it after fork): no allocation, only open, read, kill, close.
unsafe fn signal_procs(procs: &CString, sig: libc::c_int) -> bool {
    let fd = libc::open(procs.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 512];
    let (mut pid, mut in_number, mut any) = (0 as libc::pid_t, false, false);
    loop {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        if n <= 0 {
            break;
        }
        // A PID may be split between two reads: the digits carry over.
        for &b in &buf[..n as usize] {
            if b.is_ascii_digit() {
                pid = pid
                    .saturating_mul(10)
                    .saturating_add((b - b'0') as libc::pid_t);
                in_number = true;
            } else if in_number {
                if sig != 0 {
                    libc::kill(pid, sig);
                }
                (pid, in_number, any) = (0, false, true);
            }
        }
    }
    if in_number {
        if sig != 0 {
            libc::kill(pid, sig);
        }
        any = true;
    }
    libc::close(fd);
    any
}

/// Descendants of `root` found through /proc (parent links), for when no
/// cgroup holds the tree; daemons that left it are not found.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = parent_pid(pid) {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|&&(_, pp)| pp == p)
                .map(|&(c, _)| c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    crate::sys::stat_field(&stat, 4)?.parse().ok()
}

/// Whether a process still runs: a zombie (exited, not yet reaped by its
/// parent) allocates no more.
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        crate::sys::stat_field(&s, 3).is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Whether every one of `pids` has exited (false for an empty list: no
/// PIDs were given, nothing to wait for).
pub fn all_exited(pids: &[u32]) -> bool {
    !pids.is_empty() && !pids.iter().any(|&p| alive(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_pids_are_told_from_running_ones() {
        assert!(alive(std::process::id()));
        assert!(!all_exited(&[]));
        assert!(!all_exited(&[std::process::id(), u32::MAX - 1]));
        assert!(all_exited(&[u32::MAX - 1]));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(all_exited(&[pid]));
    }

    #[test]
    fn every_listed_process_is_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let procs = dir.path().join("cgroup.procs");
        let procs_c = CString::new(procs.to_str().unwrap()).unwrap();
        assert!(
            !unsafe { signal_procs(&procs_c, 0) },
            "no file: none listed"
        );
        fs::write(&procs, "").unwrap();
        assert!(!unsafe { signal_procs(&procs_c, 0) }, "an empty cgroup");
        let mut sleeps: Vec<_> = (0..2)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap()
            })
            .collect();
        // The last PID without a newline, as a read can end.
        fs::write(&procs, format!("{}\n{}", sleeps[0].id(), sleeps[1].id())).unwrap();
        assert!(unsafe { signal_procs(&procs_c, 0) });
        assert!(sleeps.iter_mut().all(|s| s.try_wait().unwrap().is_none()));
        assert!(unsafe { signal_procs(&procs_c, libc::SIGTERM) });
        for s in &mut sleeps {
            let status = s.wait().unwrap();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(libc::SIGTERM)
            );
        }
    }

    #[test]
    fn descendants_are_found_through_parent_links() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let mut found = Vec::new();
        wait_until(Duration::from_secs(10), || {
            found = descendants(sh.id());
            found.len() == 2
        });
        for &p in &found {
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
        let _ = sh.wait();
        assert_eq!(found.len(), 2, "{found:?}");
    }
}
