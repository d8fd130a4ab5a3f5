//! The attach strategy shared by every object on the kmem tracepoints
//! (record/top/slab and leaks): which mechanisms to try, in which order,
//! whether a hook exists for one, and what its program is called.

use anyhow::Result;
use clap::ValueEnum;

use crate::kernel::features::{KernelBtf, Tracefs};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttachMode {
    /// The cheapest that loads: tp_btf, then raw_tp, then classic
    Auto,
    /// BTF-typed raw tracepoints (cheapest; 6.13+ verifiers accept them)
    Btf,
    /// Untyped raw tracepoints (as cheap; kernel structs read via CO-RE)
    Raw,
    /// Classic tracepoints, record fields read through CO-RE
    Tracepoint,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mechanism {
    Btf,
    Raw,
    Classic,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Btf => "tp_btf",
            Mechanism::Raw => "raw_tp",
            Mechanism::Classic => "tracepoint",
        }
    }

    /// Classic tracepoints are found (and attached) through tracefs.
    pub fn needs_tracefs(self) -> bool {
        self == Mechanism::Classic
    }

    /// Whether this kernel has the hook for this mechanism.
    pub fn has_hook(self, tp: &str, kbtf: &KernelBtf, tracefs: Option<&Tracefs>) -> bool {
        match self {
            // Raw tracepoints exist exactly where BTF names them.
            Mechanism::Btf | Mechanism::Raw => kbtf.btf_tracepoints.iter().any(|t| t == tp),
            Mechanism::Classic => {
                let system = if tp == "sched_process_fork" {
                    "sched"
                } else {
                    "kmem"
                };
                tracefs.is_some_and(|t| t.has_event(system, tp))
            }
        }
    }
}

/// The mechanisms to try, cheapest first.
pub fn order(mode: AttachMode) -> &'static [Mechanism] {
    match mode {
        AttachMode::Auto => &[Mechanism::Btf, Mechanism::Raw, Mechanism::Classic],
        AttachMode::Btf => &[Mechanism::Btf],
        AttachMode::Raw => &[Mechanism::Raw],
        AttachMode::Tracepoint => &[Mechanism::Classic],
    }
}

/// The BPF program for one hook and mechanism, as every kmem object names
/// them: `kmalloc_btf`, `cache_alloc_raw`, `fork_tp`…
pub fn program_name(tp: &str, mech: Mechanism) -> String {
    let base = match tp {
        "kmem_cache_alloc" => "cache_alloc",
        "kmem_cache_free" => "cache_free",
        "sched_process_fork" => "fork",
        other => other,
    };
    let suffix = match mech {
        Mechanism::Btf => "btf",
        Mechanism::Raw => "raw",
        Mechanism::Classic => "tp",
    };
    format!("{base}_{suffix}")
}

/// Tries each mechanism of `mode` in turn. Returns the first session that
/// started and, for the header, why the cheaper ones were refused.
pub fn start_first<T>(
    mode: AttachMode,
    mut start: impl FnMut(Mechanism) -> Result<T>,
) -> Result<(T, Vec<String>)> {
    let mut refused = Vec::new();
    let mut last_err = None;
    for &mech in order(mode) {
        match start(mech) {
            Ok(s) => return Ok((s, refused)),
            Err(e) => {
                refused.push(format!(
                    "{}: refused by this kernel ({})",
                    mech.name(),
                    format!("{e:#}").replace('\n', " ")
                ));
                last_err = Some(e);
            }
        }
    }
    Err(last_err.expect("every mode has at least one mechanism"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_match_every_kmem_object() {
        assert_eq!(program_name("kmalloc", Mechanism::Btf), "kmalloc_btf");
        assert_eq!(
            program_name("kmem_cache_free", Mechanism::Raw),
            "cache_free_raw"
        );
        assert_eq!(
            program_name("sched_process_fork", Mechanism::Classic),
            "fork_tp"
        );
        {
            let src = include_str!("../../bpf/kheap.bpf.c");
            for tp in [
                "kmalloc",
                "kmem_cache_alloc",
                "kfree",
                "kmem_cache_free",
                "sched_process_fork",
            ] {
                for m in [Mechanism::Btf, Mechanism::Raw, Mechanism::Classic] {
                    let name = program_name(tp, m);
                    assert!(
                        src.contains(&format!("({name},")) || src.contains(&format!(" {name}(")),
                        "{name} not defined"
                    );
                }
            }
        }
    }

    #[test]
    fn auto_tries_the_cheapest_first_and_reports_refusals() {
        let mut tried = Vec::new();
        let (got, refused) = start_first(AttachMode::Auto, |m| {
            tried.push(m);
            if m == Mechanism::Classic {
                Ok(m)
            } else {
                anyhow::bail!("no")
            }
        })
        .unwrap();
        assert_eq!(got, Mechanism::Classic);
        assert_eq!(tried, [Mechanism::Btf, Mechanism::Raw, Mechanism::Classic]);
        assert_eq!(
            refused,
            [
                "tp_btf: refused by this kernel (no)",
                "raw_tp: refused by this kernel (no)"
            ]
        );
        assert!(start_first(AttachMode::Raw, |_| -> Result<()> { anyhow::bail!("x") }).is_err());
    }
}
