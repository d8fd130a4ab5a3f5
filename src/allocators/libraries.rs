//! Which allocator files to probe: the C library each traced process
//! maps, the C++ runtime and allocator libraries it maps, and any file that
//! defines allocator functions (a Rust program's global allocator, a
//! statically linked jemalloc); for a command kheap starts, the same read
//! from its program before it runs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{check_elf, defines_allocator, extra_allocators_of_program, libc_of_program};
use crate::symbolize::user::host_path;
use crate::sys::procmaps;
use crate::target::find_program;

/// The allocator libraries to probe before anything runs.
///
/// `lib`: --lib (that file only); `pids`: the processes traced already;
/// `command`: the command kheap starts, if any (its program's libraries).
pub fn initial_libraries(
    lib: Option<&Path>,
    pids: &[u32],
    command: &[String],
) -> Result<Vec<PathBuf>> {
    if let Some(lib) = lib {
        if !lib.exists() {
            bail!("--lib {}: no such file", lib.display());
        }
        check_elf(lib)?;
        // Checked here, before anything starts, as it will be when probed
        // (--lib means no preload library).
        super::plan(&super::lookup_symbols(lib)?)
            .with_context(|| format!("{} is not an allocator library", lib.display()))?;
        return Ok(vec![lib.to_path_buf()]);
    }
    let mut libs: Vec<PathBuf> = Vec::new();
    for &pid in pids {
        let maps = procmaps::read(pid)
            .ok_or_else(|| anyhow::anyhow!("no process with PID {pid} (it exited)"))?;
        let Some(libc) = procmaps::find_libc(&maps).and_then(|m| host_path(pid, m)) else {
            if is_kernel_thread(pid) {
                bail!(
                    "process {pid} ({}) is a kernel thread: it has no malloc to trace (kheap record -p {pid} traces its kernel allocations)",
                    comm(pid)
                );
            }
            bail!(
                "process {pid} ({}) maps no C library (a static binary?): use --lib PATH to name its allocator",
                comm(pid)
            );
        };
        if !libs.contains(&libc) {
            libs.push(libc);
        }
        for p in other_allocators(pid, &maps, &mut HashSet::new()) {
            if !libs.contains(&p) {
                libs.push(p);
            }
        }
    }
    if let Some(prog) = command.first() {
        let path = find_program(prog)?;
        let libc = libc_of_program(&path)?;
        if !libs.contains(&libc) {
            libs.push(libc);
        }
        // A Rust program's global allocator entry points are in itself, as
        // is an allocator linked in statically (prefixed or not).
        let exe = super::executable_of(&path)?;
        if defines_allocator(&exe) && !libs.contains(&exe) {
            libs.push(exe);
        }
        for lib in extra_allocators_of_program(&path)? {
            if !libs.contains(&lib) {
                libs.push(lib);
            }
        }
    }
    Ok(libs)
}

/// The kernel marks its own threads PF_KTHREAD (the ninth field of
/// /proc/PID/stat, after the name in parentheses).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Whether `pid` is a kernel thread (no user memory, no C library).
fn is_kernel_thread(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| stat_is_kernel_thread(&s))
}

fn stat_is_kernel_thread(stat: &str) -> bool {
    crate::sys::stat_field(stat, 9)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The allocator files a process maps besides its C library: C++ runtimes
/// and allocator libraries known by name, and any other file (the program
/// too) that defines allocator functions. `inspected` holds the files
/// whose symbols were read already, by (device, inode): each is read once.
pub fn other_allocators(
    pid: u32,
    maps: &[procmaps::Mapping],
    inspected: &mut HashSet<(u32, u64)>,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for m in procmaps::mapped_files(maps) {
        if !inspected.insert((m.dev, m.inode)) {
            continue;
        }
        let Some(path) = host_path(pid, m) else {
            continue;
        };
        let by_name = m
            .path
            .as_deref()
            .is_some_and(procmaps::is_extra_allocator_name);
        let libc = m.path.as_deref().is_some_and(procmaps::is_libc_name);
        if by_name || !libc && defines_allocator(&path) {
            out.push(path);
        }
    }
    out
}

fn comm(pid: u32) -> String {
    crate::sys::process_name(pid).unwrap_or_else(|| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_threads_are_told_apart() {
        // The flags field after a name that holds ") " itself.
        let kthread = "2 (a) 0 1 2) S 0 0 0 0 -1 2129984 0 0";
        assert!(stat_is_kernel_thread(kthread));
        let user = "42 (a) 0 1 2) S 1 42 42 0 -1 4194560 0 0";
        assert!(!stat_is_kernel_thread(user));
        assert!(!stat_is_kernel_thread("garbage"));
        assert!(!is_kernel_thread(std::process::id()));
        assert!(is_kernel_thread(2), "PID 2 is kthreadd");
        let err = initial_libraries(None, &[2], &[]).unwrap_err().to_string();
        assert!(err.contains("is a kernel thread"), "{err}");
        assert!(!err.contains("static"), "{err}");
    }
}
