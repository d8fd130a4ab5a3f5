//! The cost of one `/metrics` scrape with 10,000 site series (plus 200
//! caches with their histograms): what a scrape handler does, timed. Run by
//! scripts/bench-serve.

use std::time::Instant;

use kheap::model::{AllocStats, Hist, Source};
use kheap::serve::exposition::{encode, Format};
use kheap::serve::families::{self, Health};
use kheap::serve::series::{SeriesState, SiteDelta, SiteLabel};

fn main() {
    let sites: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let mut state = SeriesState::new(vec![SiteLabel::Site, SiteLabel::Cache], sites);
    let deltas: Vec<SiteDelta> = (0..sites)
        .map(|i| {
            let size = 8 + (i as u64 * 37) % 4000;
            let mut hist = Hist::default();
            hist.0[Hist::bucket_of(size)] = 10;
            SiteDelta {
                site: format!("kernel_function_{i}"),
                cache: format!("cache-{}", i % 200),
                source: Source::Kmalloc,
                counted_elsewhere: false,
                stats: AllocStats {
                    count: 10 + i as u64,
                    bytes_req: size * 10,
                    bytes_alloc: size.next_power_of_two() * 10,
                    hist,
                },
            }
        })
        .collect();
    let t = Instant::now();
    state.add_interval(&deltas, &[]);
    let fams = families::build(&state, None, None, None, None, None, &Health::default());
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let series: usize = fams.iter().map(|f| f.samples.len()).sum();
    for format in [Format::Prometheus, Format::OpenMetrics] {
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..30 {
            let t = Instant::now();
            bytes = encode(&fams, format).len();
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{format:?}: {series} samples ({sites} sites), {bytes} bytes: scrape encode median {:.2} ms, max {:.2} ms (per-interval build {build_ms:.2} ms)",
            times[times.len() / 2],
            times[times.len() - 1]
        );
    }
}
