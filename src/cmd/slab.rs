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
use crate::kernel::kmem::{Config, LiveConfig, Tracer};
use crate::kernel::storage::ObjectStorage;
use crate::model::live::Outstanding;
use crate::model::snapshot::Snapshot;
use crate::model::{CacheId, SiteKey};
use crate::report::labelled_sites;
use crate::session::{install_stop_handler, kmem_config, wait_for_end, Targets};
use crate::slab::{watch::series, ReportInput, TracedCache, TracedRun, TracedSite};
use crate::symbolize::{KernelSymbols, Symbolize};

/// The kmem tracer's settings for a traced `kheap slab`: the shared ones,
/// and kfree's frees per cache for the traced net growth per cache. With
/// `--sort growth`, every object is tracked by address instead, as `kheap
/// leaks` does: a free names the object's cache, never the site that
/// allocated it, so only tracking says exactly what each site still holds
/// (frees are then not counted per cache: the report's figures say so).
fn kernel_config(args: &SlabArgs, targets: &Targets) -> Config {
    let base = kmem_config(&args.trace, targets, crate::cli::DEFAULT_STACK_SAMPLE);
    if args.sort == SortArg::Growth {
        return Config {
            live: Some(LiveConfig::default()),
            ..base
        };
    }
    Config {
        kfree_caches: true,
        ..base
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

    let mut traced = traced_run(&snap, &KernelSymbols::new(None), elapsed);
    traced.skipped.splice(0..0, session_skipped);
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

/// The traced half of the slab report, from a record snapshot. With live
/// objects in it (`--sort growth`), each site's objects still held, and
/// each cache's frees as the frees of the objects the run allocated.
pub fn traced_run(snap: &Snapshot, syms: &dyn Symbolize, duration_s: f64) -> TracedRun {
    let held: Option<HashMap<&SiteKey, Outstanding>> = snap.leaks.as_ref().map(|l| {
        let mut by_site: HashMap<&SiteKey, Outstanding> = HashMap::new();
        for o in &l.live {
            *by_site.entry(&o.site).or_default() += Outstanding::one(o.bytes_alloc);
        }
        by_site
    });
    let mut caches: HashMap<CacheId, TracedCache> = HashMap::new();
    let mut sites = Vec::new();
    for (label, key, stats) in labelled_sites(snap, syms) {
        let c = caches
            .entry(key.cache.clone())
            .or_insert_with(|| TracedCache::new(key.cache.clone()));
        c.allocs += stats.count;
        c.bytes_req += stats.bytes_req;
        c.bytes_alloc += stats.bytes_alloc;
        let site_held = held
            .as_ref()
            .map(|h| h.get(&key).copied().unwrap_or_default());
        if let Some(h) = site_held {
            // Allocated during the run and not held at its end: freed.
            c.frees += stats.count.saturating_sub(h.objects);
        }
        sites.push(TracedSite {
            function: label.name().to_string(),
            call_site: label.display(),
            cache: key.cache,
            stats,
            held: site_held,
        });
    }
    for (cache, &frees) in &snap.cache_frees {
        caches
            .entry(cache.clone())
            .or_insert_with(|| TracedCache::new(cache.clone()))
            .frees += frees;
    }
    let mut skipped = Vec::new();
    if let Some(l) = snap.leaks.as_ref().filter(|l| l.events.map_full_live > 0) {
        skipped.push(format!(
            "{} allocations were not tracked (the object store of {} was full): what sites \
             still hold is a lower bound",
            l.events.map_full_live, l.max_objects
        ));
    }
    TracedRun {
        duration_s,
        caches: caches.into_values().collect(),
        sites,
        skipped,
        objects_tracked: held.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{fixture_symbols, leak_snapshot, sample_snapshot};

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

    /// With every object tracked (`--sort growth`), each site holds what
    /// its live objects add up to, and its cache's frees are those of the
    /// run's objects: allocations minus frees is what is still held.
    #[test]
    fn tracked_objects_give_each_site_what_it_still_holds() {
        let mut snap = leak_snapshot(1);
        // Live-object tracking counts no frees per cache.
        snap.cache_frees.clear();
        let run = traced_run(&snap, &fixture_symbols(), 2.0);
        assert!(run.objects_tracked && run.skipped.is_empty());
        let c = &run.caches[0];
        assert_eq!((c.allocs, c.frees), (1300, (1000 - 400) + (300 - 20)));
        let held = |f: &str| run.sites.iter().find(|s| s.function == f).unwrap().held;
        let h = |objects: u64| {
            Some(Outstanding {
                objects,
                bytes_alloc: objects * 4096,
            })
        };
        assert_eq!(held("load_msg"), h(400));
        assert_eq!(held("simple_xattr_alloc"), h(20));
        // A full object store is said: what sites hold is a lower bound.
        snap.leaks.as_mut().unwrap().events.map_full_live = 5;
        let run = traced_run(&snap, &fixture_symbols(), 2.0);
        assert!(
            run.skipped[0].starts_with("5 allocations were not tracked"),
            "{:?}",
            run.skipped
        );
        // Without live objects nothing is held, or claimed.
        let run = traced_run(&sample_snapshot(), &fixture_symbols(), 2.0);
        assert!(!run.objects_tracked && run.sites.iter().all(|s| s.held.is_none()));
    }
}
