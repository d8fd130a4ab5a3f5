//! `--latency`, the pure part: which allocator functions to time (their
//! names differ across kernel versions), and the per-call-site rows of the
//! report built from what the kernel measured (`crate::kernel::latency`).

use std::collections::{HashMap, HashSet};

use crate::model::{Hist, LatencyRow};
use crate::symbolize::{label_frame, Frame, Symbolize};

/// Allocator entry points, each with its names across kernel versions
/// (newest first). One fentry/fexit slot pair in the BPF object per entry.
pub const ALLOCATOR_FUNCTIONS: [&[&str]; 6] = [
    &["__kmalloc_noprof", "__kmalloc"],
    &["__kmalloc_node_noprof", "__kmalloc_node"],
    &["__kmalloc_cache_noprof", "kmalloc_trace"],
    &["__kmalloc_cache_node_noprof", "kmalloc_node_trace"],
    &["kmem_cache_alloc_noprof", "kmem_cache_alloc"],
    &["kmem_cache_alloc_node_noprof", "kmem_cache_alloc_node"],
];

/// The name each allocator entry point has on this kernel (None: absent).
pub fn resolve_functions(kernel_functions: &HashSet<String>) -> Vec<Option<&'static str>> {
    ALLOCATOR_FUNCTIONS
        .iter()
        .map(|names| {
            names
                .iter()
                .copied()
                .find(|n| kernel_functions.contains(*n))
        })
        .collect()
}

/// Function names from a kallsyms text (text symbols of the kernel proper).
pub fn kallsyms_functions(kallsyms: &str) -> HashSet<String> {
    kallsyms
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let (_addr, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            let module = parts.next();
            (module.is_none() && matches!(kind, "T" | "t")).then(|| name.to_string())
        })
        .collect()
}

/// Which probes `--latency` uses (`cmd::record::LatencyProbeArg` parses it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyProbe {
    /// fentry/fexit where the kernel allows them, else kprobe/kretprobe
    Auto,
    Fentry,
    Kprobe,
}

/// Raw latency map contents, before symbolization.
#[derive(Clone, Debug, Default)]
pub struct LatencyData {
    pub entries: Vec<LatencyEntry>,
    pub missed_start: u64,
    pub map_full: u64,
    /// Calls made inside a timed call on the same task (an interrupt's
    /// allocation), not timed.
    pub nested: u64,
}

#[derive(Clone, Debug)]
pub struct LatencyEntry {
    pub call_site: u64,
    pub func_ip: u64,
    pub count: u64,
    pub total_ns: u64,
    pub hist: Hist,
}

/// Symbolizes and merges entries per (call site, allocator function),
/// slowest in total first.
pub fn rows(data: &LatencyData, syms: &dyn Symbolize) -> Vec<LatencyRow> {
    let mut addrs: Vec<u64> = data
        .entries
        .iter()
        .flat_map(|e| [e.call_site, e.func_ip])
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    let frames: HashMap<u64, Frame> = addrs.iter().copied().zip(syms.symbolize(&addrs)).collect();
    let mut merged: HashMap<(String, String), LatencyRow> = HashMap::new();
    for e in &data.entries {
        let site = frames
            .get(&e.call_site)
            .cloned()
            .unwrap_or_else(|| Frame::unknown(e.call_site));
        let alloc = frames
            .get(&e.func_ip)
            .map(|f| f.name().to_string())
            .unwrap_or_default();
        let (function, call_site) = if e.call_site == 0 {
            ("[caller not found]".to_string(), String::new())
        } else {
            let label = label_frame(std::slice::from_ref(&site)).unwrap_or(&site);
            (label.name().to_string(), site.display())
        };
        let row = merged
            .entry((call_site.clone(), alloc.clone()))
            .or_insert_with(|| LatencyRow {
                function,
                call_site,
                allocator: alloc,
                ..Default::default()
            });
        let mut h = Hist::from_buckets(&row.hist);
        h += e.hist;
        row.hist = h.buckets();
        row.count += e.count;
        row.total_ns += e.total_ns;
    }
    let mut out: Vec<LatencyRow> = merged
        .into_values()
        .map(|mut r| {
            r.avg_ns = if r.count == 0 {
                0.0
            } else {
                (r.total_ns as f64 / r.count as f64).round()
            };
            r
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.total_ns));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Bucket;
    use crate::report::fixtures::FixtureSymbols;

    fn names(list: &[&str]) -> HashSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn resolves_renamed_allocator_functions() {
        // 6.1: no _noprof, kmalloc_trace for cache-backed kmalloc.
        let v61 = names(&[
            "__kmalloc",
            "__kmalloc_node",
            "kmalloc_trace",
            "kmalloc_node_trace",
            "kmem_cache_alloc",
            "kmem_cache_alloc_node",
        ]);
        assert_eq!(
            resolve_functions(&v61),
            vec![
                Some("__kmalloc"),
                Some("__kmalloc_node"),
                Some("kmalloc_trace"),
                Some("kmalloc_node_trace"),
                Some("kmem_cache_alloc"),
                Some("kmem_cache_alloc_node")
            ]
        );
        // 6.10+: _noprof names; the old ones are gone.
        let v618 = names(&[
            "__kmalloc_noprof",
            "__kmalloc_node_noprof",
            "__kmalloc_cache_noprof",
            "kmem_cache_alloc_noprof",
            "kmem_cache_alloc_node_noprof",
        ]);
        let r = resolve_functions(&v618);
        assert_eq!(r[0], Some("__kmalloc_noprof"));
        assert_eq!(r[3], None);
        assert_eq!(r[4], Some("kmem_cache_alloc_noprof"));
    }

    #[test]
    fn kallsyms_text_symbols_only() {
        let k = "ffffffff81648020 T __kmalloc_noprof\nffffffff82000000 D some_data\nffffffffc0000000 t helper\t[mod]\n";
        let f = kallsyms_functions(k);
        assert!(f.contains("__kmalloc_noprof"));
        assert!(!f.contains("some_data") && !f.contains("helper"));
    }

    #[test]
    fn rows_merge_and_label_sites() {
        let syms = FixtureSymbols(vec![(0x2000, "__kmalloc_noprof"), (0x3000, "load_msg")]);
        let mut h = Hist::default();
        h.record(300);
        let e = |ns| LatencyEntry {
            call_site: 0x3010,
            func_ip: 0x2000,
            count: 1,
            total_ns: ns,
            hist: h,
        };
        let data = LatencyData {
            entries: vec![e(300), e(500)],
            ..Default::default()
        };
        let r = rows(&data, &syms);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].function, "load_msg");
        assert_eq!(r[0].allocator, "__kmalloc_noprof");
        assert_eq!((r[0].count, r[0].avg_ns), (2, 400.0));
        assert_eq!(
            r[0].hist[0],
            Bucket {
                lo: 256,
                hi: 512,
                count: 2
            }
        );
    }
}
