//! Small reads of the running system that several commands make: the page
//! size, a process's name, whether the kernel has BTF of its own. One
//! place, so every command agrees. `/proc/slabinfo` and SLUB's
//! `/sys/kernel/slab`, read by `slab`, `serve` and the kmem tracer, are its
//! `slabinfo` and `slab_sysfs`.

pub mod slab_sysfs;
pub mod slabinfo;

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

/// Where a kernel built with CONFIG_DEBUG_INFO_BTF exposes its BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

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

#[cfg(test)]
mod tests {
    use super::*;

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
