//! `kheap slab`: the static slab picture, joined with traced allocations
//! over `-d SECS` (who allocates into each cache, what rounding wastes).

mod args;
mod untraced;

use std::collections::HashMap;
use std::time::Instant;

use anyhow::Result;

pub use self::args::{SlabArgs, SortArg};
use self::untraced::{print_report, run_static};
use crate::kernel::features;
use crate::kernel::kmem::{Config, Tracer};
use crate::kernel::storage::ObjectStorage;
use crate::model::snapshot::Snapshot;
use crate::model::CacheId;
use crate::report::labelled_sites;
use crate::session::{install_stop_handler, kmem_config, wait_for_end, Targets};
use crate::slab::{watch::series, ReportInput, TracedCache, TracedRun, TracedSite};
use crate::symbolize::{KernelSymbols, Symbolize};

/// The kmem tracer's settings for a traced `kheap slab`: the shared ones,
/// and kfree's frees per cache for the traced net growth per cache.
fn kernel_config(args: &SlabArgs, targets: &Targets) -> Config {
    Config {
        kfree_caches: true,
        ..kmem_config(&args.trace, targets, crate::cli::DEFAULT_STACK_SAMPLE)
    }
}

pub fn run(args: SlabArgs) -> Result<i32> {
    if !args.traced()? {
        run_static(&args)?;
        return Ok(0);
    }
    args.trace.filters.check()?;
    let first = args.read_static()?; // says plainly when slabinfo is root-only
    features::check_privileges("slab")?;
    install_stop_handler();

    let mut targets = Targets::start(&args.trace.filters.targets)?;
    let cfg = kernel_config(&args, &targets);
    let mut storage = ObjectStorage::default();
    let mut session = Tracer::start(&cfg, &mut storage, None)?;
    eprintln!(
        "kheap: tracing slab allocations {}({})",
        match (args.trace.duration, &targets.command) {
            (Some(d), _) => format!("for {}s ", d.as_secs_f64()),
            (None, Some(_)) => "until the command exits ".to_string(),
            (None, None) => "until Ctrl-C ".to_string(),
        },
        session.attached.join(", ")
    );
    targets.release()?;
    let start = Instant::now();
    let mut samples = vec![(0.0, first)];
    // About ten static reads over the run tell steady growth from a blip.
    let every = (args.trace.duration.map_or(10.0, |d| d.as_secs_f64()) / 10.0).max(1.0);
    let mut next = every;
    let ended = wait_for_end(args.trace.duration, &mut targets, |elapsed| {
        if elapsed.as_secs_f64() >= next {
            next += every;
            if let Ok(s) = args.read_static() {
                samples.push((elapsed.as_secs_f64(), s));
            }
        }
    });
    session.detach();
    targets.terminate();
    let elapsed = start.elapsed().as_secs_f64();
    let snap = session.snapshot()?;
    let session_skipped = std::mem::take(&mut session.skipped);
    drop(session);
    samples.push((elapsed, args.read_static()?));
    let exit_code = ended.report();

    let traced = TracedRun {
        skipped: session_skipped,
        ..traced_run(&snap, &KernelSymbols::new(None), elapsed)
    };
    let series = series(&samples);
    print_report(
        &args,
        ReportInput {
            before: samples.first().map(|(_, s)| s),
            after: samples.last().map(|(_, s)| s),
            traced: Some(&traced),
            series: &series,
        },
    )?;
    Ok(exit_code)
}

/// The traced half of the slab report, from a record snapshot.
pub fn traced_run(snap: &Snapshot, syms: &dyn Symbolize, duration_s: f64) -> TracedRun {
    let mut caches: HashMap<CacheId, TracedCache> = HashMap::new();
    let mut sites = Vec::new();
    for (label, key, stats) in labelled_sites(snap, syms) {
        let c = caches
            .entry(key.cache.clone())
            .or_insert_with(|| TracedCache::new(key.cache.clone()));
        c.allocs += stats.count;
        c.bytes_req += stats.bytes_req;
        c.bytes_alloc += stats.bytes_alloc;
        sites.push(TracedSite {
            function: label.name().to_string(),
            call_site: label.display(),
            cache: key.cache,
            stats,
        });
    }
    for (cache, &frees) in &snap.cache_frees {
        caches
            .entry(cache.clone())
            .or_insert_with(|| TracedCache::new(cache.clone()))
            .frees += frees;
    }
    TracedRun {
        duration_s,
        caches: caches.into_values().collect(),
        sites,
        skipped: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{fixture_symbols, sample_snapshot};

    #[test]
    fn traced_run_keeps_caches_and_labels_sites() {
        let run = traced_run(&sample_snapshot(), &fixture_symbols(), 2.0);
        assert_eq!(run.caches.len(), 1);
        let c = &run.caches[0];
        assert_eq!((c.allocs, c.frees), (1300, 700));
        let mut fns: Vec<&str> = run.sites.iter().map(|s| s.function.as_str()).collect();
        fns.sort();
        assert_eq!(fns, ["load_msg", "simple_xattr_alloc"]);
    }
}
