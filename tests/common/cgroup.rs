//! cgroup v2 directories and workloads run in them, for the root tests
//! that need them (cgroup, serve).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{wait_or_kill, HANG_LIMIT, LOAD};

/// A cgroup v2 directory made for the test: on drop, whatever still runs in
/// it (and in cgroups below it) is moved to the root cgroup and the
/// directories are removed, even when the test failed.
pub struct TestCgroup {
    pub dir: PathBuf,
    pub mount: PathBuf,
}

impl TestCgroup {
    pub fn new(parent: &Path, name: &str) -> TestCgroup {
        let mount =
            kheap::cgroup::cgroup2_mount().expect("cgroup2 must be mounted for these tests");
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        TestCgroup { dir, mount }
    }

    pub fn top(name: &str) -> TestCgroup {
        let mount =
            kheap::cgroup::cgroup2_mount().expect("cgroup2 must be mounted for these tests");
        TestCgroup::new(&mount, &format!("kheap-test-{name}"))
    }

    pub fn child(&self, name: &str) -> TestCgroup {
        TestCgroup::new(&self.dir, name)
    }

    pub fn path(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    /// The path relative to the cgroup2 mount, as reports show it.
    pub fn rel(&self) -> String {
        format!("/{}", self.dir.strip_prefix(&self.mount).unwrap().display())
    }

    pub fn remove(&self) {
        if !self.dir.exists() {
            return;
        }
        // Children first (a nested TestCgroup is dropped before its parent
        // only if declared after it; be safe either way).
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    TestCgroup {
                        dir: e.path(),
                        mount: self.mount.clone(),
                    }
                    .remove();
                }
            }
        }
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.mount.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A kheap-load running inside a test cgroup; killed (its SysV queues
/// removed by its signal handler) and reaped if the test fails.
pub struct Workload {
    pub child: std::process::Child,
    stdout: BufReader<std::process::ChildStdout>,
    stderr: BufReader<std::process::ChildStderr>,
    args: Vec<String>,
}

impl Workload {
    /// Starts kheap-load LOAD_ARGS outside `cg`, moves it in once its
    /// start-up is over, then lets it go.
    pub fn start_in(cg: &TestCgroup, load_args: &[&str]) -> Workload {
        let mut w = Workload::spawn_in(cg, load_args);
        w.go();
        w
    }

    /// Lets a workload from `spawn_in` run.
    pub fn go(&mut self) {
        let stdin = self.child.stdin.take().expect("let go once");
        { stdin }.write_all(b"go\n").unwrap();
    }

    /// Starts kheap-load LOAD_ARGS outside `cg` and moves it in once its
    /// start-up is over; it waits for `go`.
    pub fn spawn_in(cg: &TestCgroup, load_args: &[&str]) -> Workload {
        let mut child = Command::new(LOAD)
            .args(load_args)
            .env("KHEAP_LOAD_WAIT", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kheap-load");
        // Start-up (the runtime reads /proc/self/maps, allocating) is over
        // only once it says so: moved earlier, that would count in the
        // cgroup.
        let mut ready = String::new();
        // Kept open until it exits: it prints its result there.
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let stderr = BufReader::new(child.stderr.take().unwrap());
        stdout.read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready", "kheap-load did not start");
        std::fs::write(cg.dir.join("cgroup.procs"), child.id().to_string())
            .unwrap_or_else(|e| panic!("moving kheap-load into {}: {e}", cg.path()));
        Workload {
            child,
            stdout,
            stderr,
            args: load_args.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// Returns once it says it holds what it allocated (`msg ... HOLD_SECS`).
    pub fn wait_holding(&mut self) {
        let mut line = String::new();
        while self.stderr.read_line(&mut line).unwrap() > 0 {
            if line.starts_with("holding") {
                return;
            }
            line.clear();
        }
        panic!("kheap-load {:?} ended before holding", self.args);
    }

    /// Waits for it to exit successfully.
    pub fn finish(mut self) {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let _ = std::io::Read::read_to_string(&mut self.stderr, &mut rest);
        let status = wait_or_kill(&mut self.child, HANG_LIMIT);
        assert!(
            status.success(),
            "kheap-load {:?} failed: {rest}",
            self.args
        );
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = wait_or_kill(&mut self.child, HANG_LIMIT);
        }
    }
}

/// Runs kheap-load LOAD_ARGS inside `cg` (see `Workload::start_in`);
/// returns once it has exited successfully.
pub fn run_in(cg: &TestCgroup, load_args: &[&str]) {
    Workload::start_in(cg, load_args).finish();
}

/// Notices a directory being opened as one (`read_dir`), as a walk of the
/// cgroup2 tree does (kheap learns cgroup paths by walking it): an inotify
/// watch on the directory itself. Opens of the files in it (a workload
/// moved in through `cgroup.procs`) do not count.
pub struct DirOpened {
    fd: i32,
}

impl DirOpened {
    /// Watches `dir` from now on.
    pub fn watch(dir: &Path) -> DirOpened {
        use std::os::unix::ffi::OsStrExt;
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let watched = DirOpened { fd };
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        let wd = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_OPEN) };
        assert!(
            wd >= 0,
            "inotify_add_watch {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        watched
    }

    /// Waits at most `limit` for the directory to have been opened since
    /// `watch`; whether it was.
    pub fn wait(&self, limit: std::time::Duration) -> bool {
        let mut buf = [0u8; 4096];
        super::poll_until(limit, || {
            let mut opened = false;
            loop {
                let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    return opened;
                }
                // struct inotify_event: wd, mask, cookie, len, then the
                // name (len bytes; none for the watched directory itself).
                let field = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
                let mut at = 0;
                while at + 16 <= n as usize {
                    let (mask, len) = (field(at + 4), field(at + 12) as usize);
                    opened |= len == 0 && mask & libc::IN_OPEN != 0 && mask & libc::IN_ISDIR != 0;
                    at += 16 + len;
                }
            }
        })
    }
}

impl Drop for DirOpened {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}
