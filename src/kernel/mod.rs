//! The kernel layer: the only code that touches libbpf. Skeleton ownership,
//! hooks and the attach strategy, feature probing, typed map readers. Every
//! other module is pure and builds and tests without root or clang.

/// The skeleton libbpf-cargo generated for `bpf/<name>.bpf.c` (build.rs),
/// as a private module `skel`.
macro_rules! skeleton {
    ($name:literal) => {
        #[allow(clippy::all, dead_code, unused_imports, non_camel_case_types)]
        mod skel {
            include!(concat!(env!("OUT_DIR"), "/", $name, ".skel.rs"));
        }
    };
}

/// Marks generated BPF types as plain old data (every bit pattern is valid),
/// so map bytes can be read into them with `plain`.
macro_rules! plain_types {
    ($($ty:ty),* $(,)?) => {
        $(unsafe impl plain::Plain for $ty {})*
    };
}

/// `AddAssign` for a generated per-CPU value type: the named counters, and
/// every element of the named arrays after `;`, are summed across CPUs.
macro_rules! impl_sum {
    ($ty:ty { $($field:ident),* $(,)? $(; $($array:ident),*)? }) => {
        impl std::ops::AddAssign for $ty {
            fn add_assign(&mut self, o: Self) {
                $(self.$field += o.$field;)*
                $($(
                    for (a, b) in self.$array.iter_mut().zip(o.$array) {
                        *a += b;
                    }
                )*)?
            }
        }
    };
}

pub mod attach;
pub mod btf_check;
pub mod features;
pub mod footprint;
pub mod hooks;
pub mod kmem;
pub mod latency;
pub mod malloc;
pub mod malloc_skel;
pub mod maps;
pub mod skel;
pub mod storage;
pub mod user_stack;

/// BPF_LOG_STATS: the verifier reports how much work each program took.
pub const VERIFIER_STATS_LOG_LEVEL: u32 = 4;

/// The log level the kmem object's programs are loaded with. Without one,
/// libbpf loads a program the kernel refused a second time, with the
/// verifier's whole log; for a program refused at the verifier's
/// instruction limit that second pass took minutes (leaks' object table on
/// 5.15, emulated) for a log nobody reads. The statistics level keeps one
/// pass, and gives `KHEAP_DEBUG=verifier` its figures (docs/benchmarks.md);
/// any other `KHEAP_DEBUG` asks for libbpf's full log of a refusal.
pub fn load_log_level() -> u32 {
    match std::env::var("KHEAP_DEBUG").as_deref() {
        Ok(v) if v != "verifier" => 0,
        _ => VERIFIER_STATS_LOG_LEVEL,
    }
}

/// Loads an opened skeleton into the kernel with the request signals held
/// (`signals::holding_requests`). A load that a stop signal cut short (the
/// verifier gives up with EAGAIN when one is pending) says so, not EAGAIN:
/// nothing was attached yet.
pub fn load_skel<'obj, S: libbpf_rs::skel::OpenSkel<'obj>>(open: S) -> anyhow::Result<S::Output> {
    match crate::signals::holding_requests(|| open.load()) {
        Err(_) if crate::signals::stop_requested() => {
            anyhow::bail!("stopped by a signal while the kernel was checking the BPF programs; nothing was attached")
        }
        loaded => Ok(loaded?),
    }
}

/// Routes libbpf's debug output to stderr, keeping one line per program
/// loaded: its name, the instructions the verifier processed and the time
/// it took.
pub fn print_verifier_stats() {
    fn print(_: libbpf_rs::PrintLevel, msg: String) {
        let Some(name) = msg
            .split_once("prog '")
            .and_then(|(_, rest)| rest.split_once("': -- BEGIN PROG LOAD LOG"))
            .map(|(name, _)| name)
        else {
            return;
        };
        let field = |prefix: &str| {
            msg.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_string()
        };
        eprintln!(
            "kheap: verifier: {name}: {} instructions processed, {} us",
            field("processed "),
            field("verification time ")
        );
    }
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, print)));
}
