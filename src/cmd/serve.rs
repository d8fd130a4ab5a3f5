//! `kheap serve`: a daemon that keeps the kmem tracer attached, reads its
//! maps on its own timer, and serves Prometheus/OpenMetrics metrics over
//! HTTP. The reading thread builds an immutable set of metric families
//! each interval and swaps it in behind an `Arc`; HTTP worker threads only
//! format the current one, so concurrent scrapes never see half an update
//! and never touch the kernel.
//!
//! Its command-layer parts are here: the flags and config file
//! (`settings`), the attach-wait-reload cycle (`daemon`), one read
//! (`publish`). The rest of its room is `crate::serve`: the HTTP server
//! (`server`, `routes`, `listen`, `webconfig`), its series and families.

mod daemon;
mod publish;
mod settings;

use std::sync::{Arc, RwLock};

use anyhow::{Context, Result};

use self::daemon::{one_malloc_arena, Daemon, Next};
use self::settings::{check, load_settings};
pub use self::settings::{command_line, ServeArgs};
use crate::kernel::features;
use crate::kernel::kmem::{Config, LiveConfig};
use crate::serve::listen::{group_id, Listener, SocketAccess};
use crate::serve::routes::{self, Shared};
use crate::serve::server::{Server, SharedWebConfig};
use crate::serve::webconfig::WebConfig;
use crate::session::Targets;
use crate::signals::install_reload_handler;

pub fn run(args: ServeArgs, command_line: Vec<String>) -> Result<i32> {
    one_malloc_arena();
    install_reload_handler();
    let args = match &args.config {
        Some(path) => load_settings(Some(path), &command_line)?,
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
    let bound = listener.local_addr();
    let web: SharedWebConfig = Arc::new(RwLock::new(Arc::new(web)));
    let shared = Arc::new(Shared::new(args.interval, args.expose_slabinfo));
    let handler = {
        let shared = shared.clone();
        Arc::new(move |req: &_, access| routes::handle(req, access, &shared))
    };
    let server = Server::start(listener, web.clone(), handler)
        .with_context(|| format!("cannot serve on {}", args.listen))?;

    let mut daemon = Daemon::new(args, command_line, shared, web);
    daemon.set_bound(bound);
    let result = loop {
        let targets = Targets::start(&daemon.args().filters.targets)?;
        let cfg = kernel_config(daemon.args(), &targets);
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

/// The kmem tracer's settings for `kheap serve`: frees (per cache too, for
/// kheap_cache_frees_total), cgroups, processes and outstanding objects
/// on request.
fn kernel_config(args: &ServeArgs, targets: &Targets) -> Config {
    let f = &args.filters;
    Config {
        min_size: f.min_size,
        max_size: f.max_size,
        pids: targets.pids.clone(),
        comm: f.comm.clone(),
        attach: f.attach.into(),
        // Metrics need call sites only; the profiles' stacks are sampled
        // (sites stay exact).
        stack_sample_every: args.stacks.sample_every(crate::cli::DEFAULT_STACK_SAMPLE),
        // The profiles' process labels: sampled stacks are keyed by who
        // made them (only on the sampled path).
        stack_owners: true,
        max_sites: args.max_entries,
        max_stacks: args.max_entries,
        kernel_memory: args.kernel_memory,
        trace_frees: true,
        // kheap_cache_frees_total counts kfree()'s too.
        kfree_caches: true,
        by_cgroup: args.by_cgroup,
        by_process: args.by_process,
        cgroups: f.cgroups.iter().map(|c| c.id).collect(),
        live: args.track_outstanding.then_some(LiveConfig {
            max_objects: args.max_objects,
            ..LiveConfig::default()
        }),
        sources: args.source.sources,
        ..Config::default()
    }
}
