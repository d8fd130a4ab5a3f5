//! The attach strategy of the kmem tracer: which mechanisms to try, in which
//! order, and whether a hook (`kernel::hooks`) exists for one.

use anyhow::Result;

use crate::kernel::features;
use crate::kernel::features::{KernelBtf, Tracefs};
pub use crate::kernel::hooks::{kmem_hooks, Fallback, Hook, Mechanism, Role, HOOKS};
use crate::model::Source;

/// Which mechanisms the kmem tracer tries (`--attach`, parsed as
/// `cli::AttachArg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl Hook {
    /// The BPF program of this hook for one mechanism.
    pub fn program(&self, mech: Mechanism) -> String {
        let mech = self.only.unwrap_or(mech);
        self.program_with_suffix(match mech {
            Mechanism::Btf => "btf",
            Mechanism::Raw => "raw",
            Mechanism::Classic => "tp",
        })
    }
}

impl Mechanism {
    /// Whether this kernel has the hook for this mechanism.
    pub fn has_hook(self, hook: &Hook, kbtf: &KernelBtf, tracefs: Option<&Tracefs>) -> bool {
        let mech = hook.only.unwrap_or(self);
        match mech {
            // Raw tracepoints exist exactly where BTF names them; one
            // with an older argument layout is not the hook's.
            Mechanism::Btf | Mechanism::Raw => {
                (mech == Mechanism::Raw || kbtf.typed_programs)
                    && hook
                        .tracepoints()
                        .all(|tp| kbtf.btf_tracepoints.iter().any(|t| t == tp))
                    && !kbtf.old_layouts.iter().any(|t| t == hook.tracepoint)
            }
            Mechanism::Classic => {
                tracefs.is_some_and(|t| hook.tracepoints().all(|tp| t.has_event(hook.system, tp)))
            }
        }
    }
}

/// How a source's hooks are attached on this kernel: `Ok(None)` through
/// their tracepoints (raw_tp), `Ok(Some(_))` through the kernel functions
/// the tracepoints sit in (fentry where BTF names the functions, else
/// kprobes; `KHEAP_FALLBACK=kprobe` forces kprobes even where the
/// tracepoints exist, for the tests), Err:
/// the line that says why the source cannot be traced.
pub fn source_mechanism(
    source: Source,
    kbtf: &KernelBtf,
) -> std::result::Result<Option<Fallback>, String> {
    let hooks: Vec<&Hook> = crate::kernel::hooks::source_hooks(source).collect();
    let functions: Vec<&str> = hooks.iter().filter_map(|h| h.function).collect();
    // For the tests: the kprobe path even where the tracepoints exist (or
    // fentry would be preferred), so every kernel tests it or its refusal.
    if std::env::var_os("KHEAP_FALLBACK").is_some_and(|v| v == "kprobe")
        && !functions.is_empty()
        && functions.len() == hooks.len()
    {
        return if features::has_kprobes() {
            Ok(Some(Fallback::Kprobe))
        } else {
            Err(format!(
                "kprobes on {} were asked for (KHEAP_FALLBACK=kprobe) and this kernel has none",
                functions.join(", ")
            ))
        };
    }
    // A tracepoint with an older argument layout than its program reads.
    if let Some((hook, (field, since))) = hooks
        .iter()
        .filter(|h| kbtf.old_layouts.iter().any(|t| t == h.tracepoint))
        .find_map(|h| Some((h, h.layout?)))
    {
        return Err(format!(
            "this kernel's {}:{} tracepoint predates its {field} argument (Linux {since})",
            hook.system, hook.tracepoint
        ));
    }
    let missing: Vec<String> = hooks
        .iter()
        .filter(|h| !Mechanism::Raw.has_hook(h, kbtf, None))
        .map(|h| format!("{}:{}", h.system, h.tracepoint))
        .collect();
    if missing.is_empty() {
        return Ok(None);
    }
    let no_tracepoints = format!("this kernel has no {} tracepoint", missing.join(", "));
    if functions.len() < hooks.len() {
        return Err(no_tracepoints);
    }
    // fexit reads the return value with bpf_get_func_ret (5.17): the
    // number of arguments before it changes between kernels.
    if kbtf.has_helper("get_func_ret")
        && functions
            .iter()
            .all(|f| kbtf.btf_functions.iter().any(|b| b == f))
    {
        return Ok(Some(Fallback::Fentry));
    }
    if features::has_kprobes() {
        return Ok(Some(Fallback::Kprobe));
    }
    Err(format!(
        "{no_tracepoints}, its BTF does not name {} (for fentry) and it has no kprobes",
        functions.join(", ")
    ))
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

/// Tries each mechanism of `mode` in turn. Returns the first session that
/// started and, for the header, why the cheaper ones were refused and what
/// was used instead (a refusal alone reads like a failed run).
pub fn start_first<T>(
    mode: AttachMode,
    mut start: impl FnMut(Mechanism) -> Result<T>,
) -> Result<(T, Vec<String>)> {
    let mut refused = Vec::new();
    let mut last_err = None;
    for &mech in order(mode) {
        match start(mech) {
            Ok(s) => {
                let used = |r: String| format!("{r}; {} used instead", mech.name());
                return Ok((s, refused.into_iter().map(used).collect()));
            }
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
    fn every_hook_has_a_program_for_every_mechanism() {
        // The kmem object, with the fork follower it shares with malloc.
        let src = [
            include_str!("../../bpf/kheap.bpf.c"),
            include_str!("../../bpf/task_filter.bpf.h"),
            include_str!("../../bpf/kheap/sources.c"),
            include_str!("../../bpf/kheap/interrupt_context.c"),
            include_str!("../../bpf/kheap/own_process.c"),
        ]
        .concat();
        let defined =
            |name: &str| src.contains(&format!("({name},")) || src.contains(&format!(" {name}("));
        // By name: the table's indices move as hooks are added.
        let named = |tp: &str| HOOKS.iter().find(|h| h.tracepoint == tp).unwrap();
        assert_eq!(named("kfree").program(Mechanism::Btf), "kfree_btf");
        assert_eq!(
            named("kmem_cache_alloc").program(Mechanism::Raw),
            "cache_alloc_raw"
        );
        assert_eq!(
            named("sched_process_fork").program(Mechanism::Classic),
            "fork_tp"
        );
        // The other sources have raw_tp programs only.
        assert_eq!(
            named("mm_page_alloc").program(Mechanism::Btf),
            "page_alloc_raw"
        );
        for hook in &HOOKS {
            for m in [Mechanism::Btf, Mechanism::Raw, Mechanism::Classic] {
                let name = hook.program(m);
                assert!(defined(&name), "{name} not defined");
            }
        }
        // Hooks with a kernel function have its fentry and kprobe programs.
        for hook in HOOKS.iter().filter(|h| h.function.is_some()) {
            for via in [Fallback::Fentry, Fallback::Kprobe] {
                let name = hook.fallback_program(via);
                assert!(defined(&name), "{name} not defined");
            }
        }
        assert_eq!(
            named("alloc_vmap_area").fallback_program(Fallback::Fentry),
            "vmalloc_alloc_fexit"
        );
        assert_eq!(
            named("free_vmap_area_noflush").fallback_program(Fallback::Kprobe),
            "vmalloc_free_kprobe"
        );
        // The task switches before any event.
        assert_eq!(HOOKS[0].role, Role::Switch);
        assert_eq!(HOOKS[0].program(Mechanism::Classic), "own_switch_btf");
        // Frees are attached before allocations.
        let first_alloc = HOOKS.iter().position(|h| h.role == Role::Alloc).unwrap();
        assert!(HOOKS[first_alloc..].iter().all(|h| h.role != Role::Free));
        // Interrupt brackets before allocations, each closed before it is
        // opened, by a program of its own.
        let first_bracket = HOOKS
            .iter()
            .position(|h| h.role == Role::Interrupt)
            .unwrap();
        assert!(first_bracket < first_alloc);
        assert!(HOOKS[first_alloc..]
            .iter()
            .all(|h| h.role != Role::Interrupt));
        let softirq = named("softirq_entry");
        assert_eq!(softirq.program(Mechanism::Btf), "softirq_entry_raw");
        assert_eq!(
            softirq.closing_program().as_deref(),
            Some("softirq_exit_raw")
        );
        assert_eq!(
            softirq.tracepoints().collect::<Vec<_>>(),
            ["softirq_exit", "softirq_entry"]
        );
        for hook in HOOKS.iter().filter(|h| h.role == Role::Interrupt) {
            let name = hook.closing_program().expect(hook.tracepoint);
            assert!(defined(&name), "{name} not defined");
        }
        assert!(HOOKS
            .iter()
            .filter(|h| h.role != Role::Interrupt)
            .all(|h| h.closed_by.is_none()));
    }

    #[test]
    fn a_source_without_tracepoints_falls_back_to_its_functions() {
        let all_tracepoints = KernelBtf {
            btf_tracepoints: HOOKS.iter().map(|h| h.tracepoint.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(
            source_mechanism(Source::Vmalloc, &all_tracepoints),
            Ok(None)
        );
        // 6.1: no vmalloc tracepoints, BTF names the functions they sit in.
        let v6_1 = KernelBtf {
            btf_functions: vec!["alloc_vmap_area".into(), "free_vmap_area_noflush".into()],
            helpers: vec!["get_func_ret".into()],
            ..Default::default()
        };
        assert_eq!(
            source_mechanism(Source::Vmalloc, &v6_1),
            Ok(Some(Fallback::Fentry))
        );
        // A source with no functions to fall back to says what is missing.
        let err = source_mechanism(Source::Percpu, &v6_1).unwrap_err();
        assert!(err.starts_with("this kernel has no percpu:percpu_free_percpu, percpu:percpu_alloc_percpu tracepoint"), "{err}");
        // 5.10: no bpf_get_func_ret for fexit; percpu's tracepoints name no
        // call site yet.
        let v5_10 = KernelBtf {
            btf_tracepoints: HOOKS.iter().map(|h| h.tracepoint.to_string()).collect(),
            btf_functions: v6_1.btf_functions.clone(),
            old_layouts: vec!["percpu_alloc_percpu".into()],
            ..Default::default()
        };
        let err = source_mechanism(Source::Percpu, &v5_10).unwrap_err();
        assert_eq!(
            err,
            "this kernel's percpu:percpu_alloc_percpu tracepoint predates its call_site argument (Linux 5.19)"
        );
        let v5_10 = KernelBtf {
            btf_tracepoints: vec![],
            ..v5_10
        };
        // (kprobes decide the rest: asserted where the kernel has them)
        if features::has_kprobes() {
            assert_eq!(
                source_mechanism(Source::Vmalloc, &v5_10),
                Ok(Some(Fallback::Kprobe))
            );
        }
    }

    #[test]
    fn typed_programs_need_the_kernels_own_btf() {
        let kmalloc = HOOKS
            .iter()
            .find(|h| h.tracepoint == "kmalloc" && h.only.is_none())
            .unwrap();
        // A kernel read through a --btf file: its tracepoints, untyped.
        let from_a_file = KernelBtf {
            btf_tracepoints: vec!["kmalloc".into()],
            ..Default::default()
        };
        assert!(Mechanism::Raw.has_hook(kmalloc, &from_a_file, None));
        assert!(!Mechanism::Btf.has_hook(kmalloc, &from_a_file, None));
        let own = KernelBtf {
            typed_programs: true,
            ..from_a_file
        };
        assert!(Mechanism::Btf.has_hook(kmalloc, &own, None));
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
                "tp_btf: refused by this kernel (no); tracepoint used instead",
                "raw_tp: refused by this kernel (no); tracepoint used instead"
            ]
        );
        assert!(start_first(AttachMode::Raw, |_| -> Result<()> { anyhow::bail!("x") }).is_err());
    }
}
