// TEMPORARY (branch slab): skel, model and the traced-side API of slab are
// not used by this stand-in main yet; the main developer's wiring removes
// the need for these allows.
#[allow(dead_code, unused_imports)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/kheap.skel.rs"));
}
#[allow(dead_code)]
mod model;
#[allow(dead_code, unused_imports)]
mod slab;

use clap::{Parser, Subcommand};

/// TEMPORARY (branch slab): a minimal CLI to try `kheap slab` by hand; the
/// main developer registers the real subcommand.
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Slab(slab::SlabArgs),
}

fn main() {
    let Cli {
        command: Command::Slab(args),
    } = Cli::parse();
    if let Err(e) = slab::run_static(&args) {
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}
