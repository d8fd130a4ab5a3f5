//! Small reads of the running system that several commands make: the page
//! size, a process's name, whether the kernel has BTF of its own, where
//! cgroup2 is mounted, /proc/kallsyms. One place, so every command agrees. `/proc/slabinfo` and SLUB's
//! `/sys/kernel/slab`, read by `slab`, `serve` and the kmem tracer, are its
//! `slabinfo` and `slab_sysfs`; a process's mappings, `procmaps`.

pub mod preempt;
pub mod procmaps;
pub mod slab_sysfs;
pub mod slabinfo;
pub mod wake;

use std::path::PathBuf;

use anyhow::{Context, Result};

/// 64 random bits from the kernel, for names another user must not guess
/// (temporary files and directories kheap makes as root in shared places).
pub fn random_u64() -> std::io::Result<u64> {
    let mut bytes = [0u8; 8];
    // The system call, not glibc's wrapper: that came in glibc 2.25, and the
    // portable binary links against 2.17 (docs/packaging.md).
    // SAFETY: bytes is writable for its length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            bytes.as_mut_ptr(),
            bytes.len(),
            0 as libc::c_uint,
        )
    };
    if n != bytes.len() as libc::c_long {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(bytes))
}

/// The page size in bytes (4096 if the C library cannot say).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

/// MemAvailable of /proc/meminfo in bytes.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = text.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    Some(kib.split_whitespace().next()?.parse::<u64>().ok()? * 1024)
}

/// Where a kernel built with CONFIG_DEBUG_INFO_BTF exposes its BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The text of /proc/kallsyms (addresses read as zero without root).
pub fn kallsyms_text() -> Result<String> {
    std::fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")
}

/// Whether the running kernel exposes its own BTF. Without it (a kernel
/// built without CONFIG_DEBUG_INFO_BTF, read through `--btf FILE`) the
/// kernel cannot check typed programs (tp_btf, fentry) or kfunc calls, and
/// libbpf cannot resolve them: only untyped programs are loaded there.
pub fn kernel_has_own_btf() -> bool {
    std::path::Path::new(KERNEL_BTF).exists()
}

/// A process's name (`/proc/PID/comm`) as it is now; None once the process
/// has exited (or was never there).
pub fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim_end_matches('\n').to_string())
}

/// When a process started (`/proc/PID/stat`'s starttime, in clock ticks
/// since boot): with its pid, what tells a process from a later one that
/// reuses the pid. None once it has exited.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_start_time(&stat)
}

/// The starttime field (the 22nd) of a /proc/PID/stat line.
pub fn stat_start_time(stat: &str) -> Option<u64> {
    stat_field(stat, 22)?.parse().ok()
}

/// Field `n` of a /proc/PID/stat line, numbered as proc(5) numbers them
/// (3: state, 4: ppid, 9: flags, 22: starttime); from 3 on, as the
/// command name (2) is in parentheses and may hold spaces and
/// parentheses: the fields follow its last ')'.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n.checked_sub(3)?)
}

/// The cgroup2 mount point in a /proc/mounts text (the first one), if any.
/// Hybrid hosts mount it at /sys/fs/cgroup/unified, pure v2 hosts at
/// /sys/fs/cgroup: never assume either.
pub fn cgroup2_mount_in(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_src, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mount(dir)))
    })
}

/// /proc/mounts escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This host's cgroup2 mount point, or a one-line error.
pub fn cgroup2_mount() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts")
        .map_err(|e| anyhow::anyhow!("reading /proc/mounts: {e}"))?;
    cgroup2_mount_in(&mounts).ok_or_else(|| {
        anyhow::anyhow!(
            "no cgroup2 filesystem is mounted (see /proc/mounts): mount one, e.g. `mount -t cgroup2 none /sys/fs/cgroup/unified`"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_past_a_name_with_parentheses() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10 18446744073709551615";
        assert_eq!(stat_start_time(stat), Some(123456));
        assert_eq!(stat_start_time("42 (x) S 1"), None);
        assert_eq!(stat_start_time(""), None);
        // The fields proc(5) numbers, past the same name.
        assert_eq!(stat_field(stat, 3), Some("S"));
        assert_eq!(stat_field(stat, 4), Some("1"));
        assert_eq!(stat_field(stat, 9), Some("4194560"));
        assert_eq!(stat_field(stat, 2), None, "the name is not a field here");
    }

    #[test]
    fn finds_cgroup2_on_hybrid_and_unified_hosts() {
        let hybrid = "sysfs /sys sysfs rw 0 0\n\
            tmpfs /sys/fs/cgroup tmpfs ro,nosuid 0 0\n\
            cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nsdelegate 0 0\n\
            cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n";
        assert_eq!(
            cgroup2_mount_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n";
        assert_eq!(
            cgroup2_mount_in(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            cgroup2_mount_in("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"),
            None
        );
        let spaced = "none /mnt/my\\040cg cgroup2 rw 0 0\n";
        assert_eq!(cgroup2_mount_in(spaced), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn this_process_and_the_page() {
        let own = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(
            process_name(std::process::id()),
            Some(own.trim_end().to_string())
        );
        assert_eq!(process_name(u32::MAX), None);
        assert!(page_size().is_power_of_two() && page_size() >= 4096);
    }
}
