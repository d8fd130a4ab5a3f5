//! The allocator functions kheap probes: the C family, C++'s operators
//! new and delete, Rust's global allocator entry points, the prefixes an
//! allocator exports the C family under, and the cookie (slot) of each.

/// How a function's arguments are read: one BPF program per layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `f(size)`: malloc, valloc, pvalloc
    Size,
    /// `calloc(n, size)`: counts n * size bytes
    Calloc,
    /// `f(align, size)`: memalign, aligned_alloc
    AlignSize,
    /// `posix_memalign(&ptr, align, size)`: the block comes back through ptr
    PosixMemalign,
    /// `realloc(ptr, size)`: a resize, counted at the new size
    Realloc,
    /// `reallocarray(ptr, n, size)`
    Reallocarray,
    /// `free(ptr)`
    Free,
    /// `operator delete(ptr…)`, `__rust_dealloc(ptr, size, align)`: frees
    /// that may end in another probed free of the same block
    OuterFree,
    /// `__rust_realloc(ptr, old_size, align, new_size)`
    RustRealloc,
}

impl Layout {
    /// Whether the function frees (no size, no return probe).
    pub fn is_free(self) -> bool {
        matches!(self, Layout::Free | Layout::OuterFree)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct AllocFn {
    /// The row label (`allocator` column).
    pub name: &'static str,
    /// The symbol probed: C names as they are, C++ operators mangled.
    pub symbol: &'static str,
    pub layout: Layout,
}

/// The C library's allocation family (and free).
const C_FUNCTIONS: [AllocFn; 10] = [
    c_fn("malloc", Layout::Size),
    c_fn("calloc", Layout::Calloc),
    c_fn("realloc", Layout::Realloc),
    c_fn("reallocarray", Layout::Reallocarray),
    c_fn("posix_memalign", Layout::PosixMemalign),
    c_fn("aligned_alloc", Layout::AlignSize),
    c_fn("memalign", Layout::AlignSize),
    c_fn("valloc", Layout::Size),
    c_fn("pvalloc", Layout::Size),
    c_fn("free", Layout::Free),
];

const fn c_fn(name: &'static str, layout: Layout) -> AllocFn {
    AllocFn {
        name,
        symbol: name,
        layout,
    }
}

/// A C++ operator (`new` and `new[]`, or `delete` and `delete[]`) in each of
/// its variants: `(label suffix, mangled parameters after the first)`. The
/// single-object and array forms alternate.
macro_rules! cxx_operators {
    ($layout:expr, ($one:literal, $one_mangled:literal), ($array:literal, $array_mangled:literal):
     $(($label:literal, $params:literal)),* $(,)?) => {
        [$(
            AllocFn {
                name: concat!($one, $label),
                symbol: concat!($one_mangled, $params),
                layout: $layout,
            },
            AllocFn {
                name: concat!($array, $label),
                symbol: concat!($array_mangled, $params),
                layout: $layout,
            },
        )*]
    };
}

/// C++ `operator new` and `new[]` (plain, nothrow, aligned): allocation
/// functions of their own, whose row label is the program's code that calls
/// them. libstdc++ and libc++ implement them with malloc (or aligned_alloc),
/// and new[] by calling new: those inner calls are the allocator's own and
/// counted once, as the outer call (see `crate::kernel::malloc`). All take
/// the size first.
pub(super) const CXX_NEW: [AllocFn; 8] = cxx_operators!(Layout::Size, ("new", "_Znwm"), ("new[]", "_Znam"):
    ("", ""),
    ("(nothrow)", "RKSt9nothrow_t"),
    ("(align)", "St11align_val_t"),
    ("(align,nothrow)", "St11align_val_tRKSt9nothrow_t"),
);

/// C++ `operator delete` and `delete[]` (plain, sized, nothrow, aligned):
/// frees, probed with the other frees when outstanding memory is tracked.
/// libstdc++'s (and jemalloc's unsized) end in free(), whose call of the
/// same block is the allocator's own and not counted again; jemalloc's and
/// tcmalloc's sized ones free without free(), and are only seen here. All
/// take the pointer first.
const CXX_DELETE: [AllocFn; 12] = cxx_operators!(Layout::OuterFree, ("delete", "_ZdlPv"), ("delete[]", "_ZdaPv"):
    ("", ""),
    ("(sized)", "m"),
    ("(nothrow)", "RKSt9nothrow_t"),
    ("(align)", "St11align_val_t"),
    ("(sized,align)", "mSt11align_val_t"),
    ("(align,nothrow)", "St11align_val_tRKSt9nothrow_t"),
);

/// Index of the first C++ entry point in FUNCTIONS.
pub const FIRST_CXX: usize = C_FUNCTIONS.len();
/// Index of the first Rust entry point in FUNCTIONS: the global allocator's
/// entry points, in the program itself.
pub const FIRST_RUST: usize = FIRST_CXX + CXX_NEW.len() + CXX_DELETE.len();

/// Rust's global allocator entry points, `__rust_alloc(size, align)`…,
/// found by demangled name. `__rust_dealloc(ptr, size, align)` is a free:
/// the default allocator's ends in free() (not counted again), others
/// (jemallocator: sdallocx) are only seen here.
const RUST: [AllocFn; 4] = [
    AllocFn {
        name: "rust",
        symbol: "__rust_alloc",
        layout: Layout::Size,
    },
    AllocFn {
        name: "rust_zeroed",
        symbol: "__rust_alloc_zeroed",
        layout: Layout::Size,
    },
    AllocFn {
        name: "rust_realloc",
        symbol: "__rust_realloc",
        layout: Layout::RustRealloc,
    },
    AllocFn {
        name: "rust_dealloc",
        symbol: "__rust_dealloc",
        layout: Layout::OuterFree,
    },
];

/// The allocation family. A probe's attach cookie is its index here, which
/// is how rows know their function.
pub const FUNCTIONS: &[AllocFn] =
    &concat_tables::<{ FIRST_RUST + RUST.len() }>(&[&C_FUNCTIONS, &CXX_NEW, &CXX_DELETE, &RUST]);

/// The tables one after another (N: their total length).
const fn concat_tables<const N: usize>(tables: &[&[AllocFn]]) -> [AllocFn; N] {
    let mut out = [C_FUNCTIONS[0]; N];
    let (mut t, mut n) = (0, 0);
    while t < tables.len() {
        let mut i = 0;
        while i < tables[t].len() {
            out[n] = tables[t][i];
            n += 1;
            i += 1;
        }
        t += 1;
    }
    assert!(n == N, "N is the tables' total length");
    out
}

/// Prefixes under which an allocator exports the C family instead of (or
/// besides) the plain names: jemalloc configured with
/// `--with-jemalloc-prefix=je_`, its documented convention, as programs
/// that link it statically or beside the C library's malloc build it.
pub const PREFIXES: &[&str] = &["je_"];

/// How many functions can be probed: FUNCTIONS, then the C family under
/// each of PREFIXES. A probe's attach cookie is its index in this order.
pub const fn slot_count() -> usize {
    FUNCTIONS.len() + PREFIXES.len() * FIRST_CXX
}

/// One probe-able function: its row label, the symbol probed, its layout.
pub struct Slot {
    pub label: String,
    pub symbol: String,
    pub layout: Layout,
}

/// The function at a cookie (`i < slot_count()`).
pub fn slot(i: usize) -> Slot {
    if let Some(f) = FUNCTIONS.get(i) {
        return Slot {
            label: f.name.into(),
            symbol: f.symbol.into(),
            layout: f.layout,
        };
    }
    let (prefix, f) = (
        (i - FUNCTIONS.len()) / FIRST_CXX,
        (i - FUNCTIONS.len()) % FIRST_CXX,
    );
    let name = format!("{}{}", PREFIXES[prefix], FUNCTIONS[f].name);
    // A prefixed allocator may sit on another one (a wrapper): its free
    // of a block may end in that one's free of the same block.
    let layout = match FUNCTIONS[f].layout {
        Layout::Free => Layout::OuterFree,
        other => other,
    };
    Slot {
        label: name.clone(),
        symbol: name,
        layout,
    }
}

/// The cookies of malloc itself: plain, then under each prefix.
pub(super) fn malloc_slots() -> impl Iterator<Item = usize> {
    std::iter::once(0).chain((0..PREFIXES.len()).map(|p| FUNCTIONS.len() + p * FIRST_CXX))
}

/// Whether an ELF symbol is the Rust runtime function `name`: unmangled
/// (older toolchains), or v0-mangled with a crate hash
/// (`_RNvCs…_7___rustc12___rust_alloc`: the identifier's length, a `_`
/// separator since it starts with `_`, then the identifier).
pub fn is_rust_symbol(symbol: &str, name: &str) -> bool {
    if symbol == name {
        return true;
    }
    let tail = format!("{}_{name}", name.len());
    symbol.starts_with("_R")
        && symbol.ends_with(&tail)
        && !symbol[..symbol.len() - tail.len()].ends_with(|c: char| c.is_ascii_digit())
}
