//! The one tracer on the kmem tracepoints: bpf/kheap.bpf.c loaded and
//! attached for record, top, slab (allocations by site, stack, cache and
//! process) and leaks (the same, plus every live object by address). The
//! difference between them is configuration, fixed before load. Links are
//! RAII: dropping the tracer (on any exit path, errors included) detaches
//! everything.
//!
//! The tracer's pieces: its settings (`config`), the tracer itself
//! (`tracer`), loading and attaching (`start`), what the object is set up
//! with from /proc/kallsyms (`labels`), one read of the maps (`read`), the
//! live objects of `leaks` (`live`), map keys as the model names them
//! (`keys`), the caches merged caches' objects were asked for (`asked`)
//! and the programs' run-time statistics (`stats`).

mod asked;
mod budget;
mod config;
mod keys;
mod labels;
mod live;
mod page_map;
mod read;
mod start;
mod stats;
mod tracer;

pub use crate::kernel::attach::AttachMode;
pub use budget::{budget, footprint, footprint_at, OBJECT_STORE};
pub use config::{Config, LiveConfig};
pub use keys::cache_id;
pub use stats::enable_run_time_stats;
pub use tracer::Tracer;

#[cfg(test)]
mod tests {
    use super::{asked, keys, labels};

    /// The value of `#define NAME value` in bpf/kheap.h.
    fn header_define(name: &str) -> u64 {
        let header = include_str!("../../../bpf/kheap.h");
        let value = header
            .lines()
            .find_map(|l| {
                l.strip_prefix("#define ")?
                    .strip_prefix(name)?
                    .split_whitespace()
                    .next()
            })
            .unwrap_or_else(|| panic!("no #define {name} in bpf/kheap.h"));
        let digits = value.trim_end_matches(['u', 'U', 'l', 'L']);
        match digits
            .strip_prefix("0x")
            .or_else(|| digits.strip_prefix("0X"))
        {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => digits.parse(),
        }
        .unwrap_or_else(|_| panic!("#define {name} {value}: not a number"))
    }

    #[test]
    fn what_user_space_reads_as_the_programs_define_it() {
        let rust = [
            ("KHEAP_INTERRUPT_TGID", keys::INTERRUPT_TGID as u64),
            ("KHEAP_CACHE_UNRESOLVED", keys::KHEAP_CACHE_UNRESOLVED),
            ("KHEAP_KFREE_CACHE_TAG", keys::KHEAP_KFREE_CACHE_TAG),
            ("KHEAP_BACKING_RANGES", labels::KHEAP_BACKING_RANGES as u64),
            ("KHEAP_ASKED_BATCH", asked::KHEAP_ASKED_BATCH as u64),
        ];
        for (name, value) in rust {
            assert_eq!(header_define(name), value, "{name}");
        }
    }
}
