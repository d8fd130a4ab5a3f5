//! `kheap serve`'s settings: its flags, the config file that holds the
//! same flags (re-read on SIGHUP; the command line's flags win), the checks
//! made before anything is attached, and the kmem tracer's settings they
//! give.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser};

use crate::cli::{parse_duration, parse_map_entries, FilterArgs, SourceArgs, StackArgs};
use crate::report::trigger::{self, Condition, Trigger};
use crate::serve::listen::{parse_mode, Listen};
use crate::serve::series::SiteLabel;

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
    #[arg(long, value_parser = parse_mode, default_value = DEFAULT_SOCKET_MODE, value_name = "MODE")]
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
    /// /pprof/inuse; costlier). From 3/4 of --max-objects on, the oldest
    /// objects are aged out down to half, and counted
    /// (kheap_*_outstanding_aged_out_*_total)
    #[arg(long)]
    pub track_outstanding: bool,
    /// Seconds between reads of the live-object map (--track-outstanding):
    /// walking it is most of the daemon's cost, so it is read less often
    /// than the counters
    #[arg(long, value_parser = parse_duration, default_value = "30", value_name = "SECS")]
    pub outstanding_interval: Duration,
    /// Capacity of the live-object store (--track-outstanding; objects
    /// tracked at once, about 80 bytes of kernel memory each)
    #[arg(long, value_parser = crate::cli::parse_tracked_objects, default_value = crate::cli::DEFAULT_TRACKED_OBJECTS, value_name = "N")]
    pub max_objects: u32,
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
    /// Count per process too (in the kernel) and export the
    /// kheap_process_* families (labels pid, comm): allocations (a
    /// process's series ends when it exits) or, with --track-outstanding,
    /// outstanding objects and bytes
    #[arg(long)]
    pub by_process: bool,
    /// Process series kept with --by-process (the busiest N, or the N
    /// holding the most outstanding bytes); the rest is summed into
    /// pid="other"
    #[arg(long = "processes", default_value = "20", value_name = "N")]
    pub process_series: usize,
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
    #[arg(long, value_parser = parse_map_entries, default_value = crate::cli::DEFAULT_MAP_ENTRIES, value_name = "N")]
    pub max_entries: u32,
    /// Kernel memory kheap's maps may take (default: 32M up to 128 CPUs,
    /// 128K more a CPU beyond)
    #[arg(long, value_parser = crate::cli::parse_size, value_name = "SIZE")]
    pub kernel_memory: Option<u64>,
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

/// The settings: the config file's flags, then the command line's
/// (`command_line`, the words after `serve`), which win. Re-run on SIGHUP.
pub fn load_settings(config: Option<&PathBuf>, command_line: &[String]) -> Result<ServeArgs> {
    let mut tokens = vec!["kheap serve".to_string()];
    if let Some(path) = config {
        let text = crate::input::read_regular(path, "the config file", crate::input::MAX_INPUT)?;
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            tokens.extend(line.split_whitespace().map(str::to_string));
        }
    }
    tokens.extend(command_line.iter().cloned());
    let parsed = ServeCli::try_parse_from(tokens).map_err(|e| {
        use clap::error::ErrorKind;
        // The command line's own --help was answered before
        // this: these came from the file.
        if matches!(e.kind(), ErrorKind::DisplayHelp) {
            let file = config.map(|p| p.display().to_string()).unwrap_or_default();
            anyhow::anyhow!(
                "the config file {file}: --help is not a setting (run kheap serve --help)"
            )
        } else {
            anyhow::anyhow!("{}", crate::cli::one_line_error(&e))
        }
    })?;
    Ok(parsed.args)
}

/// The words of kheap's command line after `serve`: what `load_settings`
/// lays over the config file's flags.
pub fn command_line(argv: impl IntoIterator<Item = String>) -> Vec<String> {
    argv.into_iter()
        .skip_while(|a| a != "serve")
        .skip(1)
        .collect()
}

pub fn check(args: &ServeArgs) -> Result<()> {
    args.filters.check()?;
    if matches!(args.listen, Listen::Tcp(addr) if !addr.ip().is_loopback()) && !args.allow_remote {
        bail!(
            "--listen {} is not a loopback address: the metrics name kernel functions; add --allow-remote to serve them to the network",
            args.listen
        );
    }
    if matches!(args.listen, Listen::Tcp(_))
        && (args.socket_group.is_some() || Ok(args.socket_mode) != parse_mode(DEFAULT_SOCKET_MODE))
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
    if args.process_series == 0 {
        bail!("--processes 0: give at least 1 (everything else goes to pid=\"other\")");
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

/// `--socket-mode`'s default: root only.
/// --socket-mode when not given (octal, as the option is written).
const DEFAULT_SOCKET_MODE: &str = "0600";

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_command_line_is_what_follows_serve() {
        assert_eq!(
            command_line(words("kheap serve --sites 7 --comm serve")),
            words("--sites 7 --comm serve")
        );
        assert!(command_line(words("kheap serve")).is_empty());
    }

    #[test]
    fn the_command_line_wins_over_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.conf");
        std::fs::write(
            &path,
            "--sites 3 --cgroups 9 # a comment --sites 1\n--interval 10\n",
        )
        .unwrap();
        let args = load_settings(Some(&path), &words("--sites 7")).unwrap();
        assert_eq!(args.sites, 7);
        assert_eq!(args.cgroup_series, 9);
        assert_eq!(args.interval, Duration::from_secs(10));
        let args = load_settings(None, &words("--sites 7")).unwrap();
        assert_eq!((args.sites, args.cgroup_series), (7, 50));
    }

    /// A config holding --help printed the help's first lines as the error
    /// (issue 47).
    #[test]
    fn help_in_a_config_file_is_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.conf");
        for word in ["--help", "-h"] {
            std::fs::write(&path, format!("--sites 3\n{word}\n")).unwrap();
            let e = format!("{:#}", load_settings(Some(&path), &[]).unwrap_err());
            assert_eq!(
                e,
                format!(
                    "the config file {}: --help is not a setting (run kheap serve --help)",
                    path.display()
                )
            );
        }
    }

    #[test]
    fn a_bad_flag_is_one_line() {
        let e = load_settings(None, &words("--sites x")).unwrap_err();
        assert!(!format!("{e:#}").contains('\n'), "{e:#}");
    }
}
