//! kheap: who allocates kernel heap memory, in what sizes, how much slab
//! rounding wastes, and what is never freed.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use kheap::cmd;

#[derive(Parser)]
#[command(name = "kheap", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace kernel heap allocations, then report by site, stack, cache or process
    Record(cmd::record::RecordArgs),
    /// Trace, then show what is still allocated (retained) vs allocated and freed (transient)
    Leaks(cmd::leaks::LeaksArgs),
    /// Compare two kheap JSON reports of one kind (record, or leaks and its snapshots): what grew or shrank
    Diff(cmd::diff::DiffArgs),
    /// Slab caches: memory, loss, growth, and (with -d) who allocates and wastes
    Slab(cmd::slab::SlabArgs),
    /// Trace malloc, calloc, realloc… of a process or command: who allocates, in what sizes, what is never freed
    Malloc(cmd::malloc::MallocArgs),
    /// Watch who allocates right now, refreshed every interval (like top/slabtop)
    Top(cmd::top::TopArgs),
    /// Serve kernel heap metrics to Prometheus (a daemon; see docs/serve.md)
    Serve(cmd::serve::ServeArgs),
    /// Show which tracing features this kernel has and how kheap will attach
    Doctor(cmd::doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, …) to stdout
    Completions(cmd::generate::CompletionsArgs),
    /// Write man pages (kheap.1 and one per subcommand) into a directory
    Man(cmd::generate::ManArgs),
}

fn main() {
    // --help ends with each command's examples and exit statuses.
    let parsed = kheap::help::with_help(Cli::command())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        // `kheap` alone: its usage and one line, not the whole help.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{}", kheap::cli::no_command(&mut Cli::command()));
            std::process::exit(2);
        }
        Err(e) if e.use_stderr() => {
            eprintln!("kheap: {}", kheap::cli::one_line_error(&e));
            std::process::exit(2);
        }
        // --help and --version
        Err(e) => e.exit(),
    };
    // Before anything else: a signal during startup must end the run with
    // a report, not kill it; one kheap does not use must not kill it.
    kheap::signals::ignore_unused();
    if matches!(
        cli.command,
        Command::Record(_)
            | Command::Leaks(_)
            | Command::Slab(_)
            | Command::Malloc(_)
            | Command::Top(_)
    ) {
        kheap::signals::install_stop_handler();
    }
    // libbpf's own log is noise when kheap probes features by trying them
    // (an fentry load refused on purpose); KHEAP_DEBUG=1 shows it.
    match std::env::var("KHEAP_DEBUG").as_deref() {
        Err(_) => drop(libbpf_rs::set_print(None)),
        // The verifier's statistics of each program loaded (load cost,
        // docs/benchmarks.md).
        Ok("verifier") => kheap::kernel::print_verifier_stats(),
        Ok(_) => {}
    }
    let result = match cli.command {
        Command::Record(a) => cmd::record::run(a),
        Command::Leaks(a) => cmd::leaks::run(a),
        Command::Diff(a) => cmd::diff::run(a),
        Command::Slab(a) => cmd::slab::run(a),
        Command::Malloc(a) => cmd::malloc::run(a),
        Command::Top(a) => cmd::top::run(a),
        Command::Serve(a) => cmd::serve::run(a, cmd::serve::command_line(std::env::args())),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Completions(a) => cmd::generate::completions(Cli::command(), &a),
        Command::Man(a) => cmd::generate::man(Cli::command(), &a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: what is wrong and what to do. Not eprintln!, which
            // panics when stderr is gone (a closed terminal).
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "kheap: {}",
                format!("{e:#}").replace('\n', " ")
            );
            std::process::exit(1);
        }
    }
}
