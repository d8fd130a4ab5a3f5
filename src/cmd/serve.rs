//! `kheap serve`: a daemon that keeps the kmem tracer attached, reads its
//! maps on its own timer, and serves Prometheus/OpenMetrics metrics over
//! HTTP. The reading thread builds an immutable set of metric families
//! each interval and swaps it in behind an `Arc`; HTTP worker threads only
//! format the current one, so concurrent scrapes never see half an update
//! and never touch the kernel.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser};

use crate::cgroup::{cgroup2_mount, CgroupNames};
use crate::cli::{parse_duration, parse_map_entries, FilterArgs, SourceArgs, StackArgs};
use crate::kernel::features;
use crate::kernel::kmem::{self, Config, LiveConfig, Tracer};
use crate::kernel::storage::ObjectStorage;
use crate::model::live::OutstandingRead;
use crate::model::snapshot::Snapshot;
use crate::model::{SiteKey, Source};
use crate::report::delta::Tracker;
use crate::report::meminfo::MemInfo;
use crate::report::overhead::self_usage;
use crate::report::trigger::{self, oom_kills, Condition, Reading as TriggerReading, Trigger};
use crate::serve::cgroups;
use crate::serve::families::{self, Health, OutstandingSite, SlabInput};
use crate::serve::listen::{group_id, parse_mode, Listen, Listener, SocketAccess};
use crate::serve::profile::ProfileState;
use crate::serve::profile::Which;
use crate::serve::routes::{self, Published, Shared};
use crate::serve::series::{Ranked, SeriesState, SiteDelta, SiteLabel};
use crate::serve::server::{Server, SharedWebConfig};
use crate::serve::triggers::{self, Watched};
use crate::serve::webconfig::WebConfig;
use crate::session::{stop_requested, Targets};
use crate::signals::{install_reload_handler, take_reload_request};
use crate::slab::slabinfo::{read_slabinfo, SlabinfoRow, PROC_SLABINFO};
use crate::slab::sysfs::{SlabSysfs, SYS_KERNEL_SLAB};
use crate::symbolize::{CachingSymbols, KernelSymbols, Symbolize};

/// The labels site series carry (`--labels site,cache`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels(pub Vec<SiteLabel>);

fn parse_labels(s: &str) -> Result<Labels, String> {
    SiteLabel::parse_list(s).map(Labels)
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address and port to serve on (loopback unless --allow-remote), or
    /// unix:PATH for a unix socket (see --socket-mode, --socket-group)
    #[arg(
        long,
        default_value = "127.0.0.1:9464",
        value_name = "ADDR:PORT|unix:PATH"
    )]
    pub listen: Listen,
    /// Allow a non-loopback --listen address (the metrics name kernel
    /// functions: expose them only on a network you trust, and with
    /// --web-config)
    #[arg(long)]
    pub allow_remote: bool,
    /// Permission bits of the --listen unix:PATH socket (octal)
    #[arg(long, value_parser = parse_mode, default_value = "0600", value_name = "MODE")]
    pub socket_mode: u32,
    /// Group of the --listen unix:PATH socket (name or number; with
    /// --socket-mode 0660 its members may connect)
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// TLS and basic authentication, in the Prometheus exporters' web
    /// config format (tls_server_config, basic_auth_users); re-read on
    /// SIGHUP
    #[arg(long, value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Serve the /proc/slabinfo gauges (root-only data) to unauthenticated
    /// TCP clients too; without it they go only to the unix socket and to
    /// authenticated clients
    #[arg(long)]
    pub expose_slabinfo: bool,
    /// Seconds between reads of the kernel maps (scrapes see the last read)
    #[arg(long, value_parser = parse_duration, default_value = "5", value_name = "SECS")]
    pub interval: Duration,
    /// Track every live object (outstanding bytes and objects gauges,
    /// /pprof/inuse; costlier)
    #[arg(long)]
    pub track_outstanding: bool,
    /// Seconds between reads of the live-object map (--track-outstanding):
    /// walking it is most of the daemon's cost, so it is read less often
    /// than the counters
    #[arg(long, value_parser = parse_duration, default_value = "30", value_name = "SECS")]
    pub outstanding_interval: Duration,
    /// Site series kept (the busiest N label sets); the rest is summed into
    /// site="other"
    #[arg(long, default_value = "100", value_name = "N")]
    pub sites: usize,
    /// Count per cgroup too (in the kernel) and export the
    /// kheap_cgroup_* families (labels cgroup, container, accounted)
    #[arg(long)]
    pub by_cgroup: bool,
    /// Cgroup series kept with --by-cgroup (the busiest N label sets); the
    /// rest is summed into cgroup="other"
    #[arg(long = "cgroups", default_value = "50", value_name = "N")]
    pub cgroup_series: usize,
    /// Labels of the site series: site, cache, or both (comma-separated)
    #[arg(long, value_parser = parse_labels, default_value = "site,cache", value_name = "LIST")]
    pub labels: Labels,
    /// Watch a condition at every read: sunreclaim+=N, site:PATTERN+=N
    /// (outstanding bytes; needs --track-outstanding) or oom. The metrics
    /// kheap_trigger_fired_total and kheap_trigger_last_fired_timestamp_seconds
    /// say when it held; with --snapshot-dir the profiles are written then
    /// (repeatable)
    #[arg(long, value_parser = trigger::parse, value_name = "COND")]
    pub snapshot_when: Vec<Trigger>,
    /// Where each firing of --snapshot-when writes the pprof profiles
    /// (allocations since the start; outstanding memory with
    /// --track-outstanding), named after the condition and the time
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// A file of these same flags (one or more per line, # comments),
    /// re-read on SIGHUP; flags on the command line win
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub filters: FilterArgs,
    #[command(flatten)]
    pub stacks: StackArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    /// Capacity of the per-site map (and of the per-stack map, and of the
    /// stacks the profiles keep their own counts for)
    #[arg(long, value_parser = parse_map_entries, default_value = "8192", value_name = "N")]
    pub max_entries: u32,
    /// Delete map entries idle for this many intervals (their counts are
    /// kept), so the maps do not fill over days
    #[arg(long, default_value = "12", value_name = "N")]
    pub idle_intervals: u32,
    #[command(flatten)]
    pub frames: crate::session::args::FrameArgs,
}

#[derive(Parser)]
#[command(name = "kheap serve", args_override_self = true)]
struct ServeCli {
    #[command(flatten)]
    args: ServeArgs,
}

/// The settings: the config file's flags, then the command line's (which
/// win). Re-run on SIGHUP.
fn load_settings(config: Option<&PathBuf>) -> Result<ServeArgs> {
    let cli: Vec<String> = std::env::args()
        .skip_while(|a| a != "serve")
        .skip(1)
        .collect();
    let mut tokens = vec!["kheap serve".to_string()];
    if let Some(path) = config {
        let text = crate::input::read_bounded(path, "the config file", crate::input::MAX_INPUT)?;
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            tokens.extend(line.split_whitespace().map(str::to_string));
        }
    }
    tokens.extend(cli);
    let parsed = ServeCli::try_parse_from(tokens)
        .map_err(|e| anyhow::anyhow!("{}", crate::cli::one_line_error(&e)))?;
    Ok(parsed.args)
}

fn check(args: &ServeArgs) -> Result<()> {
    args.filters.check()?;
    if matches!(args.listen, Listen::Tcp(addr) if !addr.ip().is_loopback()) && !args.allow_remote {
        bail!(
            "--listen {} is not a loopback address: the metrics name kernel functions; add --allow-remote to serve them to the network",
            args.listen
        );
    }
    if matches!(args.listen, Listen::Tcp(_))
        && (args.socket_group.is_some() || args.socket_mode != DEFAULT_SOCKET_MODE)
    {
        bail!(
            "--socket-mode and --socket-group set a unix socket's access: use them with --listen unix:PATH"
        );
    }
    if args.sites == 0 {
        bail!("--sites 0: give at least 1 (everything else goes to site=\"other\")");
    }
    if args.cgroup_series == 0 {
        bail!("--cgroups 0: give at least 1 (everything else goes to cgroup=\"other\")");
    }
    if !args.filters.targets.command.is_empty() {
        bail!("kheap serve is a daemon and runs no command: select processes with --comm or -p");
    }
    if let Some(t) = args
        .snapshot_when
        .iter()
        .find(|t| matches!(t.condition, Condition::SiteGrew { .. }))
    {
        if !args.track_outstanding {
            bail!(
                "--snapshot-when '{}' watches a site's outstanding bytes: add --track-outstanding",
                t.text
            );
        }
    }
    if let Some(dir) = &args.snapshot_dir {
        if args.snapshot_when.is_empty() {
            bail!("--snapshot-dir holds what --snapshot-when writes: add a condition (sunreclaim+=N, site:PATTERN+=N or oom)");
        }
        crate::output::check_dir_writable(dir, "--snapshot-dir")?;
    }
    Ok(())
}

fn kernel_config(args: &ServeArgs, targets: &Targets) -> Config {
    let f = &args.filters;
    Config {
        min_size: f.min_size,
        max_size: f.max_size,
        pids: targets.pids.clone(),
        comm: f.comm.clone(),
        attach: f.attach,
        // Metrics need call sites only; the profiles' stacks are sampled
        // (sites stay exact).
        stack_sample_every: args.stacks.sample_every(crate::cli::DEFAULT_STACK_SAMPLE),
        max_sites: args.max_entries,
        max_stacks: args.max_entries,
        trace_frees: true,
        by_cgroup: args.by_cgroup,
        cgroups: f.cgroups.iter().map(|c| c.id).collect(),
        live: args.track_outstanding.then(LiveConfig::default),
        sources: args.source.sources,
        ..Config::default()
    }
}

/// `--socket-mode`'s default: root only.
const DEFAULT_SOCKET_MODE: u32 = 0o600;

pub fn run(args: ServeArgs) -> Result<i32> {
    one_malloc_arena();
    install_reload_handler();
    let args = match &args.config {
        Some(path) => load_settings(Some(path))?,
        None => args,
    };
    check(&args)?;
    features::check_privileges("serve")?;
    features::check_btf()?;
    let web = match &args.web_config {
        Some(path) => WebConfig::load(path)?,
        None => WebConfig::default(),
    };
    let access = SocketAccess {
        mode: args.socket_mode,
        gid: args.socket_group.as_deref().map(group_id).transpose()?,
    };
    // Bound before anything is attached: a busy port is said at once.
    let listener = Listener::bind(&args.listen, access)?;
    let web: SharedWebConfig = Arc::new(RwLock::new(Arc::new(web)));
    let shared = Arc::new(Shared::new(args.interval, args.expose_slabinfo));
    let handler = {
        let shared = shared.clone();
        Arc::new(move |req: &_, access| routes::handle(req, access, &shared))
    };
    let server = Server::start(listener, web.clone(), handler)
        .with_context(|| format!("cannot serve on {}", args.listen))?;

    let mut daemon = Daemon::new(args, shared, web);
    let result = loop {
        let targets = Targets::start(&daemon.args.filters.targets)?;
        let cfg = kernel_config(&daemon.args, &targets);
        match daemon.serve_attached(&cfg) {
            Ok(Next::Stop) => break Ok(0),
            Ok(Next::Reattach) => continue,
            Err(e) => break Err(e),
        }
    };
    server.stop();
    if result.is_ok() {
        eprintln!("kheap: stopped by signal; detached");
    }
    result
}

enum Next {
    Stop,
    Reattach,
}

/// Cumulative health counters kept across re-attaches.
#[derive(Default)]
struct Totals {
    events: crate::model::snapshot::EventCounters,
    aged_out: u64,
    reads: u64,
    /// Run time of earlier attachments (a new one starts from zero).
    bpf_base: crate::model::snapshot::ProgRunTime,
}

/// One attachment of the tracer and what reading it needs.
struct Attached<'obj> {
    tracer: Tracer<'obj>,
    tracker: Tracker,
    cfg: Config,
    /// Whether BPF run-time statistics advance (exported only then).
    bpf_stats: bool,
    /// The last read of the live objects, and when it was made.
    live: Option<(OutstandingRead, Instant)>,
}

/// The daemon's state: settings, everything cumulative (kept across
/// re-attaches), and what it publishes to the HTTP threads.
struct Daemon {
    args: ServeArgs,
    state: SeriesState,
    /// The per-cgroup series (exported with --by-cgroup).
    cgroups: Ranked,
    /// Cgroup paths learned while the run goes on: a removed cgroup keeps
    /// its last path.
    cgroup_names: CgroupNames,
    profile: ProfileState,
    totals: Totals,
    syms: CachingSymbols<KernelSymbols>,
    shared: Arc<Shared>,
    web: SharedWebConfig,
    started: Instant,
    /// The --snapshot-when conditions and their records.
    triggers: Vec<Watched>,
}

impl Daemon {
    fn new(args: ServeArgs, shared: Arc<Shared>, web: SharedWebConfig) -> Daemon {
        let syms = CachingSymbols::new(KernelSymbols::new(None));
        let _ = syms.symbolize(&[0]);
        Daemon {
            state: SeriesState::new(args.labels.0.clone(), args.sites),
            cgroups: Ranked::new(args.cgroup_series),
            cgroup_names: CgroupNames::new(cgroup2_mount().ok()),
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
        }
    }

    fn serve_attached(&mut self, cfg: &Config) -> Result<Next> {
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
            // Wakes often enough to see a signal, rarely enough to cost nothing.
            while Instant::now() < deadline {
                if stop_requested() {
                    break;
                }
                if take_reload_request() {
                    let reloaded = self.reload(cfg);
                    self.reload_web_config();
                    match reloaded {
                        Ok(true) => {
                            self.read_and_publish(&mut att)?;
                            // One read of the programs' stats, not one per field.
                            let ran = att.tracer.run_time();
                            let base = &mut self.totals.bpf_base;
                            base.run_time_ns += ran.run_time_ns;
                            base.run_cnt += ran.run_cnt;
                            base.recursion_misses += ran.recursion_misses;
                            return Ok(Next::Reattach);
                        }
                        Ok(false) => {}
                        Err(e) => eprintln!("kheap: reload refused, settings unchanged: {e:#}"),
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(left.min(Duration::from_millis(100)));
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
        let new = load_settings(args.config.as_ref())?;
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
            || new.filters.attach != cfg.attach
            || new.track_outstanding != cfg.live.is_some()
            || new.by_cgroup != cfg.by_cgroup
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
        match &self.args.listen {
            Listen::Tcp(addr) => {
                let scheme = if web.tls.is_some() { "https" } else { "http" };
                format!("{scheme}://{addr}/metrics")
            }
            unix => format!("{unix}, path /metrics"),
        }
    }

    /// The `site` label of a site: its function, or the whole allocator
    /// (`[page]`) for sources whose events carry no call site.
    fn site_name(&self, k: &SiteKey) -> String {
        if let Some(name) = k.whole_allocator() {
            return name;
        }
        let addr = k.call_site;
        self.syms
            .symbolize(&[addr])
            .into_iter()
            .next()
            .map(|f| f.name().to_string())
            .unwrap_or_else(|| format!("{addr:#x}"))
    }

    /// One interval: reads the maps (never from an HTTP thread), adds the
    /// deltas to the cumulative state, ages out idle map entries, and
    /// publishes the metric families and the profiles' rows.
    fn read_and_publish(&mut self, att: &mut Attached) -> Result<()> {
        let t0 = Instant::now();
        // Live objects first, then the totals: events keep arriving, and
        // this order keeps every site's allocations >= its outstanding.
        let due = att
            .live
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= self.args.outstanding_interval);
        if due || stop_requested() {
            if let Some(read) = att.tracer.outstanding()? {
                att.live = Some((read, Instant::now()));
            }
        }
        let live = att.live.as_ref().map(|(read, _)| read);
        let snap: Snapshot = att.tracer.counts_snapshot()?;
        if att.cfg.by_cgroup {
            // Before the rows are named: a cgroup seen now is walked for
            // while it still exists.
            self.cgroup_names.learn(att.tracer.cgroup_ids()?);
        }
        let read_duration_s = t0.elapsed().as_secs_f64();
        let site_entries = snap.sites.len();
        let stack_entries = snap.stacks.len();
        let cgroup_entries = snap.cgroups.len();
        let delta = att.tracker.interval(snap);
        let sites: Vec<SiteDelta> = delta
            .sites
            .iter()
            .map(|(k, s)| SiteDelta {
                site: self.site_name(k),
                cache: k.cache.name(),
                source: k.cache.source(),
                counted_elsewhere: k.cache.counted_elsewhere(),
                stats: *s,
            })
            .collect();
        let frees: Vec<(String, u64)> = delta
            .cache_frees
            .iter()
            .map(|(c, n)| (c.name(), *n))
            .collect();
        self.state.add_interval(&sites, &frees);
        let mut source_frees: Vec<(Source, u64)> =
            delta.source_frees.iter().map(|(&s, &n)| (s, n)).collect();
        if att.cfg.sources.contains(Source::Kmalloc) {
            source_frees.push((Source::Kmalloc, delta.slab_frees()));
        }
        self.state.add_source_frees(&source_frees);
        if att.cfg.by_cgroup {
            self.cgroups
                .add_interval(cgroups::by_values(&delta.cgroups, &self.cgroup_names));
        }
        self.profile.add_interval(&delta, &self.syms);
        add_events(&mut self.totals.events, &delta.events);
        self.totals.reads += 1;

        let cfg = &att.cfg;
        let mut map_fill = vec![("sites", site_entries as f64 / cfg.max_sites.max(1) as f64)];
        if cfg.stack_sample_every > 0 {
            map_fill.push((
                "stacks",
                stack_entries as f64 / cfg.max_stacks.max(1) as f64,
            ));
        }
        if cfg.by_cgroup {
            map_fill.push((
                "cgroups",
                cgroup_entries as f64 / att.tracer.cgroup_capacity().max(1) as f64,
            ));
        }
        let outstanding = live.map(|l| {
            if let Some(lc) = cfg.live {
                let objects: u64 = l.groups.values().map(|o| o.objects).sum();
                map_fill.push(("live", objects as f64 / lc.max_objects.max(1) as f64));
            }
            self.outstanding_sites(l)
        });

        if self.args.idle_intervals > 0 {
            let idle = att.tracker.idle_keys(self.args.idle_intervals);
            if !idle.is_empty() {
                let removed = att.tracer.remove_idle(&idle)?;
                self.totals.aged_out += removed.map_entries() as u64;
                att.tracker.forget(&removed);
                if !removed.cgroups.is_empty() {
                    let keep = att.tracer.cgroup_ids()?.into_iter().collect();
                    self.cgroup_names.retain(&keep);
                }
            }
        }

        let ran = att.tracer.run_time();
        let bpf = att.bpf_stats.then_some(ran);
        let totals = &self.totals;
        let e = &totals.events;
        let mut events_lost = vec![
            ("map_full_sites", e.map_full_sites),
            ("map_full_stacks", e.map_full_stacks),
            ("map_full_caches", e.map_full_caches),
            ("alloc_failed", e.alloc_failed),
            ("lost_stack", e.lost_stack_other),
        ];
        if let Some(l) = live {
            events_lost.push(("map_full_live", l.map_full_live));
        }
        if cfg.by_cgroup {
            events_lost.push(("map_full_cgroups", e.map_full_cgroups));
        }
        let usage = self_usage();
        let health = Health {
            bpf_run_time_ns: bpf.map(|b| totals.bpf_base.run_time_ns + b.run_time_ns),
            bpf_runs: bpf.map(|b| totals.bpf_base.run_cnt + b.run_cnt),
            bpf_recursion_misses: totals.bpf_base.recursion_misses + ran.recursion_misses,
            events_lost,
            stack_collisions: e.lost_stack_collision,
            map_fill,
            aged_out: totals.aged_out,
            read_duration_s,
            reads: totals.reads,
            cpu_seconds: usage.cpu_ns as f64 / 1e9,
            rss_bytes: resident_bytes(),
            site_label_sets: self.state.remembered() as u64,
            profile_stacks: self.profile.stacks_held() as u64,
            profile_stacks_folded: self.profile.stacks_folded,
        };
        // A kernel without slabinfo still serves everything else.
        let slab = read_slabinfo(std::path::Path::new(PROC_SLABINFO)).ok();
        let merged = slab.as_deref().map(merged_caches).unwrap_or_default();
        let (root_only, mut fams): (Vec<_>, Vec<_>) = families::build(
            &self.state,
            cfg.by_cgroup.then_some(&self.cgroups),
            outstanding.as_deref(),
            slab.as_deref().map(|rows| SlabInput {
                rows,
                page_size: crate::sys::page_size(),
                merged: &merged,
            }),
            &health,
        )
        .into_iter()
        .partition(|f| families::from_slabinfo(&f.name));
        let fired = self.check_triggers(outstanding.as_deref());
        fams.extend(triggers::families(&self.triggers));
        let profile = self.profile.snapshot(
            live.map(|l| &l.groups),
            self.started.elapsed().as_secs_f64(),
        );
        let published = Arc::new(Published::new(fams, root_only, profile, self.args.interval));
        *self.shared.current.write().unwrap() = published.clone();
        for i in fired {
            self.write_trigger_snapshot(i, &published);
        }
        return_free_memory();
        Ok(())
    }

    /// Checks the --snapshot-when conditions against this read: SUnreclaim
    /// now, the OOM kills so far, the sites' outstanding bytes as last read.
    /// Returns the indexes of those that fired.
    fn check_triggers(&mut self, outstanding: Option<&[OutstandingSite]>) -> Vec<usize> {
        if self.triggers.is_empty() {
            return Vec::new();
        }
        let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        let mut sites: HashMap<&str, u64> = HashMap::new();
        for o in outstanding.unwrap_or_default() {
            *sites.entry(&o.site).or_default() += o.bytes;
        }
        let sites: Vec<(String, u64)> =
            sites.into_iter().map(|(s, b)| (s.to_string(), b)).collect();
        let reading = TriggerReading {
            sunreclaim_bytes: MemInfo::sunreclaim_now(),
            oom_kills: oom_kills(&vmstat),
            sites: &sites,
        };
        triggers::check(&mut self.triggers, &reading, SystemTime::now())
    }

    /// Says that a condition fired and, with --snapshot-dir, writes the
    /// profiles of this read beside each other; a write that fails is said
    /// and the daemon goes on.
    fn write_trigger_snapshot(&self, i: usize, published: &Published) {
        let w = &self.triggers[i];
        let Some(dir) = &self.args.snapshot_dir else {
            eprintln!("kheap: --snapshot-when {} fired", w.trigger.text);
            return;
        };
        let stem = format!(
            "snapshot-{}-{}",
            w.trigger.slug(),
            crate::clock::compact_utc(w.last_fired.unwrap_or_else(SystemTime::now))
        );
        let mut kinds = vec![(Which::Alloc, "alloc")];
        if published.profile.inuse {
            kinds.push((Which::Inuse, "inuse"));
        }
        let mut written = Vec::new();
        for (which, name) in kinds {
            let path = dir.join(format!("{stem}-{name}.pb.gz"));
            match crate::output::write_bytes_atomic(&path, published.pprof(which)) {
                Ok(()) => written.push(path.display().to_string()),
                Err(e) => eprintln!("kheap: warning: --snapshot-when {}: {e:#}", w.trigger.text),
            }
        }
        eprintln!(
            "kheap: --snapshot-when {} fired: {}",
            w.trigger.text,
            written.join(", ")
        );
    }

    /// Outstanding objects per (site, cache) name: the stacks of a site
    /// summed (the gauges carry no stacks).
    fn outstanding_sites(&self, l: &OutstandingRead) -> Vec<OutstandingSite> {
        let mut by: HashMap<&SiteKey, (u64, u64)> = HashMap::new();
        for ((site, _), o) in &l.groups {
            let e = by.entry(site).or_default();
            e.0 += o.objects;
            e.1 += o.bytes_alloc;
        }
        by.into_iter()
            .map(|(k, (objects, bytes))| OutstandingSite {
                site: self.site_name(k),
                cache: k.cache.name(),
                source: k.cache.source(),
                objects,
                bytes,
            })
            .collect()
    }
}

/// (cache, merged name) for every cache of `/proc/slabinfo` that SLUB
/// merged other caches into (from the /sys/kernel/slab symlinks); empty
/// without SLUB's sysfs.
fn merged_caches(rows: &[SlabinfoRow]) -> Vec<(String, String)> {
    let Ok(Some(fs)) = SlabSysfs::open(std::path::Path::new(SYS_KERNEL_SLAB)) else {
        return Vec::new();
    };
    rows.iter()
        .flat_map(|r| {
            fs.aliases_of(&r.name)
                .into_iter()
                .map(|alias| (r.name.clone(), alias))
        })
        .collect()
}

fn bpf_stats_sysctl() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1")
}

fn add_events(
    total: &mut crate::model::snapshot::EventCounters,
    d: &crate::model::snapshot::EventCounters,
) {
    total.frees += d.frees;
    total.frees_null += d.frees_null;
    total.alloc_failed += d.alloc_failed;
    total.stack_samples += d.stack_samples;
    total.lost_stack_collision += d.lost_stack_collision;
    total.lost_stack_other += d.lost_stack_other;
    total.map_full_sites += d.map_full_sites;
    total.map_full_stacks += d.map_full_stacks;
    total.map_full_procs += d.map_full_procs;
    total.map_full_caches += d.map_full_caches;
    total.map_full_cgroups += d.map_full_cgroups;
}

/// A daemon's allocations in one malloc arena. With glibc's default (an
/// arena per thread that allocates, up to 8 per core) each HTTP worker
/// that encodes a scrape kept its own arena, and the freed space in them
/// was not reused by the others: RSS crept by megabytes an hour (the
/// measurement is in docs/serve.md). The threads rarely allocate at once,
/// so one arena costs no contention worth measuring.
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Gives the pages freed by the interval's transient buffers (map reads,
/// the last families) back to the kernel, so RSS follows what is held.
fn return_free_memory() {
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Current resident memory (not the peak getrusage gives).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * crate::sys::page_size())
        .unwrap_or(0)
}
