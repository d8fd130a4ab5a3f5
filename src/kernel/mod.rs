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

/// `KHEAP_DEBUG=verifier`: the verifier statistics of each program of the
/// kmem object loaded go to stderr: what a program
/// costs to load (docs/benchmarks.md). The malloc and latency objects do
/// not ask for them.
pub fn verifier_stats_asked() -> bool {
    std::env::var("KHEAP_DEBUG").is_ok_and(|v| v == "verifier")
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
