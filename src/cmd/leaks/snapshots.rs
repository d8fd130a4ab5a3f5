//! The snapshot files `kheap leaks` writes while it runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::kernel::kmem::Tracer;
use crate::leaks::render::LeaksFormat;
use crate::render::Format;
use crate::report::trigger::Trigger;
use crate::report::RunInfo;
use crate::session::learn_cgroups;
use crate::signals::take_snapshot_request;

use super::args::LeaksArgs;
use super::reports::{write_json, Reports};

/// The snapshot files written while the run goes on: every
/// --snapshot-every, on SIGUSR1, and when a --snapshot-when trigger fires.
pub(super) struct Snapshots {
    dir: PathBuf,
    every: Option<Duration>,
    /// When the next periodic snapshot is due (time since the wait began).
    next: Option<Duration>,
    /// Periodic and SIGUSR1 snapshots so far: their files' numbers.
    numbered: u32,
    /// A pprof profile beside each trigger's JSON (--format pprof).
    pprof_on_trigger: bool,
    run: RunInfo,
    start: Instant,
}

impl Snapshots {
    pub(super) fn new(args: &LeaksArgs, dir: PathBuf, run: RunInfo, start: Instant) -> Snapshots {
        Snapshots {
            dir,
            every: args.snapshot_every,
            next: args.snapshot_every,
            numbered: 0,
            pprof_on_trigger: args.report.output.format == LeaksFormat::Common(Format::Pprof),
            run,
            start,
        }
    }

    /// A periodic snapshot when one is due, or one SIGUSR1 asked for.
    pub(super) fn on_tick(&mut self, elapsed: Duration, tracer: &Tracer, reports: &mut Reports) {
        let secs = self.start.elapsed().as_secs_f64();
        let periodic = self.next.is_some_and(|n| elapsed >= n);
        if let (true, Some(next), Some(every)) = (periodic, &mut self.next, self.every) {
            // One snapshot for the snapshots a slow one made late.
            while *next <= elapsed {
                *next += every;
            }
        }
        if !(periodic || take_snapshot_request()) {
            return;
        }
        self.numbered += 1;
        let path = self.dir.join(format!("snapshot-{:03}.json", self.numbered));
        self.write(tracer, reports, path, secs, false);
    }

    /// The snapshot `trigger` fired: its name in the file's. Returns the
    /// JSON's path if written.
    pub(super) fn on_trigger(
        &mut self,
        trigger: &Trigger,
        tracer: &Tracer,
        reports: &mut Reports,
    ) -> Option<PathBuf> {
        learn_cgroups(&mut reports.cgroup_names, tracer);
        let secs = self.start.elapsed().as_secs_f64();
        let path = self
            .dir
            .join(format!("snapshot-{}-{secs:.1}s.json", trigger.slug()));
        self.write(tracer, reports, path, secs, self.pprof_on_trigger)
    }

    /// Reads the maps and writes the snapshot at `path` (and its pprof
    /// profile with `with_pprof`), saying so on stderr. A snapshot that
    /// cannot be written is said and skipped: a full disk must not cost
    /// the final report.
    fn write(
        &self,
        tracer: &Tracer,
        reports: &mut Reports,
        path: PathBuf,
        secs: f64,
        with_pprof: bool,
    ) -> Option<PathBuf> {
        let written = tracer.snapshot().and_then(|mut snap| {
            let r = reports.build(&mut snap, "snapshot", secs, self.run.clone());
            write_json(&r, &path)?;
            if with_pprof {
                let profile = crate::render::pprof::from_report(&r).encode_gzip();
                crate::output::write_bytes_atomic(&path.with_extension("pb.gz"), &profile)?;
            }
            Ok(r)
        });
        match written {
            Ok(r) => {
                let l = r.leaks.as_ref().map(|l| &l.retention);
                eprintln!(
                    "kheap: {:.1}s: snapshot {} ({} objects, {} outstanding)",
                    secs,
                    path.display(),
                    l.map_or(0, |l| l.outstanding_count),
                    crate::model::human_size(l.map_or(0, |l| l.outstanding_bytes)),
                );
                Some(path)
            }
            Err(e) => {
                eprintln!(
                    "kheap: warning: snapshot {} not written: {}",
                    path.display(),
                    format!("{e:#}").replace('\n', " ")
                );
                None
            }
        }
    }
}
