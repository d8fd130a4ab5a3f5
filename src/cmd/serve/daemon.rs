//! The daemon's lifecycle: one attachment of the kmem tracer after another
//! (a SIGHUP that changes the filters attaches again), the wait between
//! reads, and the reloads of the settings and the web config. What one
//! read does is `cmd::serve::publish`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use anyhow::Result;

use super::settings::{check, load_settings, ServeArgs};
use crate::cgroup::CgroupNames;
use crate::kernel::kmem::{self, Config, Tracer};
use crate::kernel::storage::ObjectStorage;
use crate::model::live::{Outstanding, OutstandingRead};
use crate::model::SiteKey;
use crate::report::delta::Tracker;
use crate::serve::listen::Listen;
use crate::serve::processes::ProcessNames;
use crate::serve::profile::ProfileState;
use crate::serve::routes::Shared;
use crate::serve::series::{Ranked, SeriesState};
use crate::serve::server::SharedWebConfig;
use crate::serve::triggers::{self, Watched};
use crate::serve::webconfig::WebConfig;
use crate::session::stop_requested;
use crate::signals::take_reload_request;
use crate::symbolize::{CachingSymbols, KernelSymbols, Symbolize};
use crate::sys::cgroup2_mount;
use crate::sys::slab_sysfs::WatchedSlabSysfs;

/// What ends one attachment.
pub enum Next {
    Stop,
    Reattach,
}

/// Cumulative health counters kept across re-attaches.
#[derive(Default)]
pub(super) struct Totals {
    pub(super) events: crate::model::snapshot::EventCounters,
    pub(super) aged_out: u64,
    /// Objects the live-object store forgot while still outstanding
    /// (`--track-outstanding`'s ageing), by site.
    pub(super) objects_aged_out: HashMap<SiteKey, Outstanding>,
    pub(super) reads: u64,
    /// Run time and runs of kheap's programs over every attachment (a new
    /// one's programs start from zero).
    pub(super) bpf_run: crate::model::snapshot::ProgRunTime,
}

/// One attachment of the tracer and what reading it needs.
pub(super) struct Attached<'obj> {
    pub(super) tracer: Tracer<'obj>,
    pub(super) tracker: Tracker,
    pub(super) cfg: Config,
    /// Whether BPF run-time statistics advance (exported only then).
    pub(super) bpf_stats: bool,
    /// The last read of the live objects, and when it was made.
    pub(super) live: Option<(OutstandingRead, Instant)>,
    /// Since when the store holds every outstanding object it was given:
    /// the attachment, or the allocation of the youngest object aged out.
    pub(super) tracked_since: SystemTime,
}

/// The daemon's state: settings, everything cumulative (kept across
/// re-attaches), and what it publishes to the HTTP threads.
pub struct Daemon {
    pub(super) args: ServeArgs,
    /// The command line's flags, laid over the config file's at each
    /// reload.
    pub(super) command_line: Vec<String>,
    pub(super) state: SeriesState,
    /// The per-cgroup series (exported with --by-cgroup).
    pub(super) cgroups: Ranked,
    /// Cgroup paths learned while the run goes on: a removed cgroup keeps
    /// its last path.
    pub(super) cgroup_names: CgroupNames,
    /// The per-process series (exported with --by-process).
    pub(super) processes: Ranked,
    /// The names given to the processes seen, until they exit.
    pub(super) process_names: ProcessNames,
    pub(super) profile: ProfileState,
    pub(super) totals: Totals,
    pub(super) syms: CachingSymbols<KernelSymbols>,
    pub(super) shared: Arc<Shared>,
    pub(super) web: SharedWebConfig,
    pub(super) started: Instant,
    /// The --snapshot-when conditions and their records.
    pub(super) triggers: Vec<Watched>,
    /// The address the TCP listener was bound to: the port the kernel
    /// chose for `--listen HOST:0`.
    pub(super) bound: Option<std::net::SocketAddr>,
    /// SLUB's merges, for the slab families' merged-cache labels.
    pub(super) slab_sysfs: WatchedSlabSysfs,
}

impl Daemon {
    pub fn new(
        args: ServeArgs,
        command_line: Vec<String>,
        shared: Arc<Shared>,
        web: SharedWebConfig,
    ) -> Daemon {
        let syms = CachingSymbols::new(KernelSymbols::new(None));
        let _ = syms.symbolize(&[0]);
        Daemon {
            state: SeriesState::new(args.labels.0.clone(), args.sites),
            cgroups: Ranked::new(args.cgroup_series),
            cgroup_names: CgroupNames::new(cgroup2_mount().ok()),
            processes: Ranked::new(args.process_series),
            process_names: ProcessNames::new(),
            profile: ProfileState::new(
                args.max_entries as usize,
                args.stacks.sample_every(crate::cli::DEFAULT_STACK_SAMPLE),
            )
            .keeping_allocator_frames(args.frames.keep_allocator_frames),
            totals: Totals::default(),
            syms,
            shared,
            web,
            started: Instant::now(),
            triggers: triggers::reconcile(&[], &args.snapshot_when),
            args,
            command_line,
            bound: None,
            slab_sysfs: WatchedSlabSysfs::default(),
        }
    }

    /// Where the listener really is (`Listener::local_addr`).
    pub fn set_bound(&mut self, addr: Option<std::net::SocketAddr>) {
        self.bound = addr;
    }

    /// The settings in force (the last reload's).
    pub fn args(&self) -> &ServeArgs {
        &self.args
    }

    pub fn serve_attached(&mut self, cfg: &Config) -> Result<Next> {
        let mut storage = ObjectStorage::default();
        let tracer = Tracer::start(cfg, &mut storage, None)?;
        let stats = match kmem::enable_run_time_stats() {
            Ok(fd) => Some(fd),
            Err(e) => {
                if !bpf_stats_sysctl() {
                    eprintln!(
                        "kheap: warning: {e:#} (needs CAP_SYS_ADMIN, or sysctl kernel.bpf_stats_enabled=1); BPF run time will not be exported"
                    );
                }
                None
            }
        };
        let (idle_intervals, kept) =
            crate::kernel::features::idle_intervals_here(self.args.idle_intervals);
        if let Some(why) = kept {
            eprintln!("kheap: warning: {why}");
        }
        self.args.idle_intervals = idle_intervals;
        for target in &self.args.filters.cgroups {
            self.cgroup_names.insert(target.id, target.path.clone());
        }
        let mut att = Attached {
            tracer,
            tracker: Tracker::new(),
            cfg: cfg.clone(),
            // Turned on for every program by the sysctl: run times advance.
            bpf_stats: stats.is_some() || bpf_stats_sysctl(),
            live: None,
            tracked_since: SystemTime::now(),
        };
        let web = self.web.read().unwrap().clone();
        eprintln!(
            "kheap: serving on {} (tracing kernel heap allocations: {}); {}; SIGHUP reloads, SIGTERM stops",
            self.metrics_url(&web),
            att.tracer.attached.join(", "),
            web.describe()
        );
        let mut deadline = Instant::now();
        loop {
            while Instant::now() < deadline {
                if stop_requested() {
                    break;
                }
                if take_reload_request() {
                    let reloaded = self.reload(cfg);
                    self.reload_web_config();
                    match reloaded {
                        Ok(true) => {
                            // The last read of this attachment: its counts and
                            // run time are in the totals before it detaches.
                            self.read_and_publish(&mut att)?;
                            return Ok(Next::Reattach);
                        }
                        Ok(false) => {}
                        Err(e) => eprintln!("kheap: reload refused, settings unchanged: {e:#}"),
                    }
                }
                // Woken by a signal (a stop, a reload): once an interval
                // otherwise.
                crate::signals::sleep_until_signal(
                    deadline.saturating_duration_since(Instant::now()),
                );
            }
            // The last read before detaching: nothing counted is lost.
            self.read_and_publish(&mut att)?;
            if stop_requested() {
                return Ok(Next::Stop);
            }
            deadline = (deadline + self.args.interval).max(Instant::now());
        }
    }

    /// Applies a SIGHUP: re-reads the settings. Returns whether the tracer
    /// must be attached again (its filters or mode changed).
    fn reload(&mut self, cfg: &Config) -> Result<bool> {
        let args = &mut self.args;
        let new = load_settings(args.config.as_ref(), &self.command_line)?;
        check(&new)?;
        if new.listen != args.listen {
            eprintln!(
                "kheap: warning: --listen changed to {}; restart kheap serve to move it (still on {})",
                new.listen, args.listen
            );
        }
        if new.socket_mode != args.socket_mode || new.socket_group != args.socket_group {
            eprintln!(
                "kheap: warning: --socket-mode/--socket-group changed; restart kheap serve to apply them (the socket keeps its mode and group)"
            );
        }
        let listen = args.listen.clone();
        let (socket_mode, socket_group) = (args.socket_mode, args.socket_group.clone());
        self.shared
            .expose_root_only
            .store(new.expose_slabinfo, Ordering::Relaxed);
        if new.labels != args.labels {
            // Series of the old label sets end; the new ones count from here.
            self.state = SeriesState::new(new.labels.0.clone(), new.sites);
        }
        self.state.set_max_sites(new.sites);
        self.cgroups.set_max(new.cgroup_series);
        self.processes.set_max(new.process_series);
        self.triggers = triggers::reconcile(&self.triggers, &new.snapshot_when);
        self.profile.set_limits(
            new.max_entries as usize,
            new.stacks.sample_every(crate::cli::DEFAULT_STACK_SAMPLE),
        );
        let targets_same = new.filters.targets.pids == args.filters.targets.pids;
        let reattach = !targets_same
            || new.filters.comm != cfg.comm
            || new.filters.min_size != cfg.min_size
            || new.filters.max_size != cfg.max_size
            || kmem::AttachMode::from(new.filters.attach) != cfg.attach
            || new.track_outstanding != cfg.live.is_some()
            || cfg.live.is_some_and(|l| l.max_objects != new.max_objects)
            || new.by_cgroup != cfg.by_cgroup
            || new.by_process != cfg.by_process
            || new
                .filters
                .cgroups
                .iter()
                .map(|c| c.id)
                .ne(cfg.cgroups.iter().copied())
            || new.max_entries != cfg.max_sites
            || new.source.sources != cfg.sources
            || new.stacks.sample_every(crate::cli::DEFAULT_STACK_SAMPLE) != cfg.stack_sample_every;
        *args = ServeArgs {
            listen,
            socket_mode,
            socket_group,
            ..new
        };
        eprintln!(
            "kheap: reloaded settings{}",
            if reattach { "; attaching again" } else { "" }
        );
        Ok(reattach)
    }

    /// Applies a SIGHUP to the web config: the new one serves the next
    /// connections; a bad one leaves the old one in force.
    fn reload_web_config(&mut self) {
        let loaded = match &self.args.web_config {
            Some(path) => WebConfig::load(path),
            None => Ok(WebConfig::default()),
        };
        match loaded {
            Ok(web) => {
                let describe = web.describe();
                *self.web.write().unwrap() = Arc::new(web);
                eprintln!("kheap: web config: {describe}");
            }
            Err(e) => eprintln!("kheap: web config reload refused, the old one stays: {e:#}"),
        }
    }

    fn metrics_url(&self, web: &WebConfig) -> String {
        metrics_url(&self.args.listen, self.bound, web.tls.is_some())
    }
}

/// The URL of the metrics: at the address bound (a chosen port), else the
/// one asked for.
fn metrics_url(listen: &Listen, bound: Option<std::net::SocketAddr>, tls: bool) -> String {
    match listen {
        Listen::Tcp(asked) => {
            let scheme = if tls { "https" } else { "http" };
            format!("{scheme}://{}/metrics", bound.unwrap_or(*asked))
        }
        unix => format!("{unix}, path /metrics"),
    }
}

fn bpf_stats_sysctl() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1")
}

/// A daemon's allocations in one malloc arena. With glibc's default (an
/// arena per thread that allocates, up to 8 per core) each HTTP worker
/// that encodes a scrape kept its own arena, and the freed space in them
/// was not reused by the others: RSS crept by megabytes an hour (the
/// measurement is in docs/serve.md). The threads rarely allocate at once,
/// so one arena costs no contention worth measuring.
pub fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::listen::{Listener, SocketAccess};

    /// `--listen 127.0.0.1:0` said port 0 (issue 47): the line names the
    /// port the kernel chose.
    #[test]
    fn the_serving_line_names_the_port_bound() {
        let listen: Listen = "127.0.0.1:0".parse().unwrap();
        let access = SocketAccess {
            mode: 0o660,
            gid: None,
        };
        let listener = Listener::bind(&listen, access).unwrap();
        let bound = listener.local_addr().expect("a TCP address");
        assert_ne!(bound.port(), 0);
        let url = metrics_url(&listen, Some(bound), false);
        assert_eq!(url, format!("http://127.0.0.1:{}/metrics", bound.port()));
        assert_eq!(
            metrics_url(&listen, None, true),
            "https://127.0.0.1:0/metrics"
        );
    }
}
