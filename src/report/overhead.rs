//! What kheap itself costs while top runs: the BPF programs' run time (from
//! the kernel's run-time statistics) and the user-space process's CPU and
//! memory. The arithmetic is pure; reading our own usage is one getrusage().

use serde::{Deserialize, Serialize};

use crate::model::round2;
use crate::model::snapshot::ProgRunTime;

/// This process's CPU time (user + system) and peak resident set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelfUsage {
    pub cpu_ns: u64,
    pub max_rss_bytes: u64,
}

pub fn self_usage() -> SelfUsage {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // Cannot fail for RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    SelfUsage {
        cpu_ns: ns(ru.ru_utime) + ns(ru.ru_stime),
        max_rss_bytes: ru.ru_maxrss as u64 * 1024,
    }
}

/// kheap's cost over one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    /// Whether BPF run-time statistics were on (the BPF numbers are 0 if not).
    pub bpf_stats: bool,
    pub bpf_run_time_ns: u64,
    pub bpf_runs: u64,
    pub bpf_ns_per_run: f64,
    /// BPF run time as a share of one CPU.
    pub bpf_cpu_pct: f64,
    /// The kheap process's own CPU time as a share of one CPU.
    pub self_cpu_pct: f64,
    pub self_max_rss_bytes: u64,
    /// How long the interval's one read of the maps took, in milliseconds
    /// (what grows with the keys, and with the CPUs for per-CPU maps).
    pub maps_read_ms: f64,
}

impl Overhead {
    /// `bpf`: what kheap's programs ran in the interval, if the kernel's
    /// statistics were on.
    pub fn between(
        bpf: Option<ProgRunTime>,
        usage: (SelfUsage, SelfUsage),
        interval_s: f64,
    ) -> Overhead {
        let share = |ns: u64| {
            if interval_s > 0.0 {
                round2(ns as f64 / (interval_s * 1e9) * 100.0)
            } else {
                0.0
            }
        };
        let mut o = Overhead {
            self_cpu_pct: share(usage.1.cpu_ns.saturating_sub(usage.0.cpu_ns)),
            self_max_rss_bytes: usage.1.max_rss_bytes,
            ..Default::default()
        };
        if let Some(ran) = bpf {
            o.bpf_stats = true;
            o.bpf_run_time_ns = ran.run_time_ns;
            o.bpf_runs = ran.run_cnt;
            o.bpf_cpu_pct = share(o.bpf_run_time_ns);
            if o.bpf_runs > 0 {
                o.bpf_ns_per_run = round2(o.bpf_run_time_ns as f64 / o.bpf_runs as f64);
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_is_a_share_of_one_cpu() {
        let a = ProgRunTime {
            run_time_ns: 1_000,
            run_cnt: 10,
        };
        let b = ProgRunTime {
            run_time_ns: 50_001_000,
            run_cnt: 1_000_010,
        };
        let u0 = SelfUsage {
            cpu_ns: 0,
            max_rss_bytes: 0,
        };
        let u1 = SelfUsage {
            cpu_ns: 4_000_000,
            max_rss_bytes: 12 << 20,
        };
        let o = Overhead::between(Some(b.since(&a)), (u0, u1), 2.0);
        assert_eq!(o.bpf_runs, 1_000_000);
        assert_eq!(o.bpf_ns_per_run, 50.0);
        assert_eq!(o.bpf_cpu_pct, 2.5, "50 ms of BPF in 2 s");
        assert_eq!(o.self_cpu_pct, 0.2);
        let o = Overhead::between(None, (u0, u1), 2.0);
        assert!(!o.bpf_stats && o.bpf_runs == 0);
    }

    #[test]
    fn own_usage_is_read() {
        let u = self_usage();
        assert!(u.max_rss_bytes > 0);
    }
}
