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
