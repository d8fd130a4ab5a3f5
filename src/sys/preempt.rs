//! Whether the running kernel preempts a task in the middle of kernel code,
//! and so in the middle of a BPF program that runs with only migration
//! disabled (uprobe programs before 6.10's `bpf_preempt_disable`). A
//! kernel's build says it (`uname -v` holds PREEMPT, PREEMPT_RT or
//! PREEMPT_DYNAMIC); a dynamic kernel's mode is read from the scheduler's
//! debugfs file, else its command line's `preempt=`, else the default its
//! config chose. Where none of those can be read the answer is unknown,
//! never guessed.

use std::io::Read;
use std::path::Path;

/// How the running kernel preempts kernel code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Preemption {
    /// `none` or `voluntary`: kernel code runs until it gives the CPU up.
    Off,
    /// Preempted anywhere: the mode's name (`full`, `lazy`, `PREEMPT_RT`).
    On(String),
    /// A PREEMPT_DYNAMIC kernel whose mode nothing readable says.
    Unknown,
}

/// Reads how this kernel preempts (`uname -v`, then for a dynamic kernel
/// /sys/kernel/debug/sched/preempt, /proc/cmdline and /boot/config-RELEASE).
pub fn preemption(release: &str) -> Preemption {
    // Kernel files and root's /boot: read at most 1 MiB of each.
    let read = |path: &str| {
        let mut text = String::new();
        std::fs::File::open(Path::new(path))
            .and_then(|f| f.take(1 << 20).read_to_string(&mut text))
            .ok()
            .map(|_| text)
    };
    match build(&uname_version()) {
        Some(fixed) => fixed,
        None => read("/sys/kernel/debug/sched/preempt")
            .and_then(|s| debugfs_mode(&s))
            .or_else(|| read("/proc/cmdline").and_then(|s| cmdline_mode(&s)))
            .or_else(|| read(&format!("/boot/config-{release}")).and_then(|s| config_mode(&s)))
            .unwrap_or(Preemption::Unknown),
    }
}

fn uname_version() -> String {
    // SAFETY: uname fills the struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: the kernel terminates each field.
    unsafe { std::ffi::CStr::from_ptr(u.version.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// What the build string says: a fixed answer, or None for a dynamic
/// kernel (whose mode is chosen at boot or at run time).
fn build(version: &str) -> Option<Preemption> {
    let words: Vec<&str> = version.split_whitespace().collect();
    if words.contains(&"PREEMPT_DYNAMIC") {
        return None;
    }
    if words.contains(&"PREEMPT_RT") {
        return Some(Preemption::On("PREEMPT_RT".into()));
    }
    if words.contains(&"PREEMPT_LAZY") {
        return Some(Preemption::On("lazy".into()));
    }
    if words.contains(&"PREEMPT") {
        return Some(Preemption::On("full".into()));
    }
    Some(Preemption::Off)
}

fn named(mode: &str) -> Option<Preemption> {
    match mode {
        "none" | "voluntary" => Some(Preemption::Off),
        "full" | "lazy" => Some(Preemption::On(mode.into())),
        _ => None,
    }
}

/// debugfs's `sched/preempt`: the modes, the running one in parentheses
/// (`none (voluntary) full lazy`).
fn debugfs_mode(text: &str) -> Option<Preemption> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('(')?.strip_suffix(')'))
        .and_then(named)
}

/// The last `preempt=` of the kernel's command line, as the kernel reads it.
fn cmdline_mode(text: &str) -> Option<Preemption> {
    text.split_whitespace()
        .rev()
        .find_map(|w| w.strip_prefix("preempt="))
        .and_then(named)
}

/// The default mode a dynamic kernel's config chose.
fn config_mode(text: &str) -> Option<Preemption> {
    let set = |option: &str| text.lines().any(|l| l.trim() == format!("{option}=y"));
    if set("CONFIG_PREEMPT_RT") {
        Some(Preemption::On("PREEMPT_RT".into()))
    } else if set("CONFIG_PREEMPT_LAZY") {
        Some(Preemption::On("lazy".into()))
    } else if set("CONFIG_PREEMPT") {
        Some(Preemption::On("full".into()))
    } else if set("CONFIG_PREEMPT_VOLUNTARY") || set("CONFIG_PREEMPT_NONE") {
        Some(Preemption::Off)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_string_says_fixed_modes_and_leaves_dynamic_ones_open() {
        let on = |m: &str| Some(Preemption::On(m.into()));
        assert_eq!(build("#1 SMP Debian 5.10.244-1"), Some(Preemption::Off));
        assert_eq!(build("#1 SMP PREEMPT Mon Jan 1"), on("full"));
        assert_eq!(build("#1 SMP PREEMPT_RT Debian"), on("PREEMPT_RT"));
        assert_eq!(build("#1 SMP PREEMPT_LAZY"), on("lazy"));
        assert_eq!(build("#1 SMP PREEMPT_DYNAMIC Debian 6.12"), None);
        // A word that only starts with PREEMPT is not the flag.
        assert_eq!(build("#1 SMP PREEMPTED"), Some(Preemption::Off));
    }

    #[test]
    fn a_dynamic_kernels_mode_is_read_from_debugfs_the_command_line_or_its_config() {
        assert_eq!(
            debugfs_mode("none (voluntary) full lazy\n"),
            Some(Preemption::Off)
        );
        assert_eq!(
            debugfs_mode("none voluntary full (lazy)\n"),
            Some(Preemption::On("lazy".into()))
        );
        assert_eq!(debugfs_mode("garbage\n"), None);
        assert_eq!(
            cmdline_mode("BOOT_IMAGE=/vmlinuz preempt=none ro preempt=full quiet"),
            Some(Preemption::On("full".into()))
        );
        assert_eq!(cmdline_mode("BOOT_IMAGE=/vmlinuz ro quiet"), None);
        assert_eq!(cmdline_mode("preempt=bogus"), None);
        assert_eq!(
            config_mode("CONFIG_PREEMPT_BUILD=y\nCONFIG_PREEMPT_VOLUNTARY=y\n# CONFIG_PREEMPT is not set\nCONFIG_PREEMPT_DYNAMIC=y\n"),
            Some(Preemption::Off)
        );
        assert_eq!(
            config_mode("CONFIG_PREEMPT_BUILD=y\nCONFIG_PREEMPT=y\nCONFIG_PREEMPT_DYNAMIC=y\n"),
            Some(Preemption::On("full".into()))
        );
        assert_eq!(config_mode("CONFIG_PREEMPT_BUILD=y\n"), None);
    }
}
