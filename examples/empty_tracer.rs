//! Attaches empty BPF programs (bpf/empty.bpf.c) to the kmem tracepoints
//! and sched_switch, which kheap hooks, and waits for SIGINT: the floor
//! scripts/bench compares kheap's cost per event against. Prints "tracing"
//! once attached.

use std::mem::MaybeUninit;

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};

#[allow(clippy::all, dead_code, unused_imports, non_camel_case_types)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/empty.skel.rs"));
}

fn main() -> Result<()> {
    let mut storage = MaybeUninit::uninit();
    let skel = skel::EmptySkelBuilder::default()
        .open(&mut storage)
        .context("opening")?
        .load()
        .context("loading")?;
    let p = &skel.progs;
    let _links = [
        p.empty_kmalloc.attach()?,
        p.empty_cache_alloc.attach()?,
        p.empty_kfree.attach()?,
        p.empty_cache_free.attach()?,
        p.empty_sched_switch.attach()?,
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    kheap::signals::on_interrupt(move || {
        let _ = tx.send(());
    })?;
    eprintln!("empty_tracer: tracing");
    let _ = rx.recv();
    Ok(())
}
