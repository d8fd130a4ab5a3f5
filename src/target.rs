//! The processes a run traces: PIDs given by the user, or a command kheap
//! starts itself, held between fork and exec until the probes are attached
//! so that not one of its allocations is missed.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::tree::TreeCgroup;

/// Resolves a user-given PID (or thread id) to its process (tgid).
pub fn resolve_pid(pid: u32) -> Result<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| {
        anyhow::anyhow!("no process with PID {pid}: check the PID with 'ps -p {pid}'")
    })?;
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(pid);
    Ok(tgid)
}

/// Finds a program the way a shell would (PATH search unless it has a '/').
pub fn find_program(name: &str) -> Result<PathBuf> {
    let is_exec = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| {
            m.is_file() && {
                use std::os::unix::fs::PermissionsExt;
                m.permissions().mode() & 0o111 != 0
            }
        })
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        if is_exec(&p) {
            return Ok(p);
        }
        bail!("cannot run '{name}': no such executable file");
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_exec(p))
        .ok_or_else(|| anyhow::anyhow!("command not found: '{name}' (not in PATH)"))
}

/// The name the kernel gives a task that execs `path`: the file's base
/// name, cut to the 15 bytes a task name holds.
pub fn comm_after_exec(path: &Path) -> String {
    let base = path
        .file_name()
        .map_or_else(Vec::new, |n| n.as_bytes().to_vec());
    String::from_utf8_lossy(&base[..base.len().min(15)]).into_owned()
}

/// A forked child waiting for `release()` before it execs the command.
/// Dropping it unreleased kills the child: a run that fails to attach never
/// lets the command run untraced. Once released, the command and all it
/// forks end with the run (see [`crate::tree`]) unless `keep_running`.
pub struct HeldCommand {
    pub pid: u32,
    /// The task name the command gets at exec (the kernel's comm).
    pub name_after_exec: String,
    go: Option<std::os::fd::OwnedFd>,
    exited: Option<i32>,
    keep_running: bool,
    tree: Option<TreeCgroup>,
}

/// The byte that releases the child: whether it keeps PR_SET_PDEATHSIG
/// (dies with kheap), clears it (--keep-running), or is only asked to stop
/// (SIGTERM) when kheap dies, because the guard of its tree's cgroup kills
/// it after the grace period (src/tree.rs).
const GO_WITH_KHEAP: u8 = 1;
const GO_ON_ITS_OWN: u8 = 2;
const GO_IN_GUARDED_TREE: u8 = 3;

impl HeldCommand {
    pub fn spawn(argv: &[String]) -> Result<HeldCommand> {
        Self::spawn_with_env(argv, &[])
    }

    /// As `spawn`, with these variables set (or replaced) in the command's
    /// environment.
    pub fn spawn_with_env(argv: &[String], set: &[(&str, String)]) -> Result<HeldCommand> {
        let Some(prog) = argv.first() else {
            bail!("no command given after --");
        };
        let path = find_program(prog)?;
        let name_after_exec = comm_after_exec(&path);
        // Everything the child needs is prepared before fork: after fork
        // only async-signal-safe calls are allowed.
        let c_path = CString::new(path.as_os_str().as_bytes())?;
        let c_args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        c_argv.push(std::ptr::null());
        let c_env: Vec<CString> = std::env::vars_os()
            .filter(|(k, _)| !set.iter().any(|(name, _)| k == name))
            .map(|(k, v)| {
                let mut kv = k.into_vec();
                kv.push(b'=');
                kv.extend(v.into_vec());
                kv
            })
            .chain(set.iter().map(|(k, v)| format!("{k}={v}").into_bytes()))
            .map(CString::new)
            .collect::<Result<_, _>>()?;
        let mut c_envp: Vec<*const libc::c_char> = c_env.iter().map(|a| a.as_ptr()).collect();
        c_envp.push(std::ptr::null());

        let mut fds = [0; 2];
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe: {}", std::io::Error::last_os_error());
        }
        let (read_end, write_end) = (fds[0], fds[1]);
        match unsafe { libc::fork() } {
            -1 => bail!("fork: {}", std::io::Error::last_os_error()),
            0 => unsafe {
                libc::close(write_end);
                // Dies with kheap, even by SIGKILL; cleared on release for
                // --keep-running.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                let mut byte = 0u8;
                let n = loop {
                    let n = libc::read(read_end, (&mut byte as *mut u8).cast(), 1);
                    if n >= 0 || *libc::__errno_location() != libc::EINTR {
                        break n;
                    }
                };
                if n != 1 {
                    // kheap went away without releasing us: never run untraced.
                    libc::_exit(126);
                }
                if byte == GO_ON_ITS_OWN {
                    libc::prctl(libc::PR_SET_PDEATHSIG, 0 as libc::c_ulong);
                } else if byte == GO_IN_GUARDED_TREE {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
                }
                // kheap's own signal handling is not the command's.
                crate::signals::reset_for_exec();
                libc::execve(c_path.as_ptr(), c_argv.as_ptr(), c_envp.as_ptr());
                libc::_exit(127);
            },
            pid => {
                unsafe { libc::close(read_end) };
                let go = unsafe {
                    <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(write_end)
                };
                Ok(HeldCommand {
                    pid: pid as u32,
                    name_after_exec,
                    go: Some(go),
                    exited: None,
                    keep_running: false,
                    tree: None,
                })
            }
        }
    }

    /// Leaves the command (and what it forks) running when the run ends
    /// or kheap dies. Call before `release`.
    pub fn keep_running(&mut self) {
        self.keep_running = true;
    }

    /// Lets the child exec the command; unless it is to keep running, puts
    /// it first into a cgroup of its own, so its whole tree can be ended.
    pub fn release(&mut self) -> Result<()> {
        if let Some(go) = self.go.take() {
            let byte = if self.keep_running {
                GO_ON_ITS_OWN
            } else {
                self.tree =
                    TreeCgroup::create().and_then(|cg| cg.adopt(self.pid).ok().map(|()| cg));
                if self.tree.as_ref().is_some_and(TreeCgroup::guarded) {
                    GO_IN_GUARDED_TREE
                } else {
                    GO_WITH_KHEAP
                }
            };
            let fd = std::os::fd::AsRawFd::as_raw_fd(&go);
            if unsafe { libc::write(fd, [byte].as_ptr().cast(), 1) } != 1 {
                bail!("releasing the command: {}", std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// The exit code once the command has ended (128+signal if killed).
    pub fn try_wait(&mut self) -> Option<i32> {
        if self.exited.is_none() {
            let mut status = 0;
            let r = unsafe { libc::waitpid(self.pid as i32, &mut status, libc::WNOHANG) };
            if r == self.pid as i32 {
                self.exited = Some(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                });
            }
        }
        self.exited
    }

    /// Ends the command and everything it started (SIGTERM, then SIGKILL
    /// after a grace period) and reaps it; with `keep_running`, leaves it.
    pub fn terminate(&mut self) {
        if self.keep_running || self.go.is_some() {
            return;
        }
        if let Some(tree) = self.tree.take() {
            tree.end(|| {
                self.try_wait();
            });
            drop(tree);
        } else {
            // No cgroup: the descendants still linked to the command.
            let mut pids = crate::tree::descendants(self.pid);
            if self.try_wait().is_none() {
                pids.push(self.pid);
            }
            for &p in &pids {
                unsafe { libc::kill(p as i32, libc::SIGTERM) };
            }
            for _ in 0..50 {
                if self.try_wait().is_some() && !pids.iter().any(|&p| crate::tree::alive(p)) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            for &p in &pids {
                if crate::tree::alive(p) {
                    unsafe { libc::kill(p as i32, libc::SIGKILL) };
                }
            }
        }
        if self.try_wait().is_none() {
            let mut status = 0;
            unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
            self.exited = Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
    }
}

impl Drop for HeldCommand {
    fn drop(&mut self) {
        if self.go.is_some() {
            // Never released: closing the pipe makes the child exit.
            self.go = None;
            let mut status = 0;
            unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
        } else {
            // An error path after release: the tree still ends with the run.
            self.terminate();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_pid_is_a_clear_error() {
        let e = resolve_pid(u32::MAX - 1).unwrap_err().to_string();
        assert!(e.contains("no process with PID"), "{e}");
        assert_eq!(resolve_pid(std::process::id()).unwrap(), std::process::id());
    }

    #[test]
    fn missing_command_is_a_clear_error() {
        let e = find_program("kheap-no-such-command")
            .unwrap_err()
            .to_string();
        assert!(e.contains("command not found"), "{e}");
        assert!(find_program("sh").is_ok());
    }

    #[test]
    fn held_command_runs_only_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let script = format!("touch {}", marker.display());
        let mut held = HeldCommand::spawn(&["sh".into(), "-c".into(), script]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!marker.exists(), "ran before release");
        assert_eq!(held.try_wait(), None);
        held.release().unwrap();
        let mut code = None;
        for _ in 0..200 {
            code = held.try_wait();
            if code.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(code, Some(0));
        assert!(marker.exists());
    }

    #[test]
    fn the_command_is_named_as_the_kernel_names_it_at_exec() {
        assert_eq!(comm_after_exec(Path::new("/usr/bin/sh")), "sh");
        assert_eq!(
            comm_after_exec(Path::new("/x/a-very-long-program-name")),
            "a-very-long-pro"
        );
        let held = HeldCommand::spawn(&["sh".into(), "-c".into(), "true".into()]).unwrap();
        assert_eq!(held.name_after_exec, "sh");
    }

    #[test]
    fn unreleased_command_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let held = HeldCommand::spawn(&[
            "sh".into(),
            "-c".into(),
            format!("touch {}", marker.display()),
        ])
        .unwrap();
        drop(held);
        assert!(!marker.exists());
    }
}
