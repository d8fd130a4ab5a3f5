//! What the running kernel offers: privileges, BTF, tracefs, tracepoints,
//! kprobes, uprobes. The facts are probed once per process into `Features`,
//! which `kheap doctor` prints and the attach strategy reads; each check
//! answers with a fact or a one-line error that says what to do.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Result};
use libbpf_rs::btf::types::{Enum, Func, Struct, Typedef};
use libbpf_rs::btf::{Btf, BtfType, TypeId};

use crate::kernel::btf_check::CheckFailed;
use crate::sys::{kernel_has_own_btf, KERNEL_BTF};

const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
/// Raising resource limits beyond their hard limit (RLIMIT_MEMLOCK).
pub const CAP_SYS_RESOURCE: u32 = 24;

/// A BTF file given with `--btf`, set before the kernel is first probed.
static BTF_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Largest BTF file read: a distribution kernel's is 4-8 MiB.
const MAX_BTF_FILE: u64 = 256 << 20;

/// Uses `path` as the kernel's BTF for this run (`--btf FILE`): for the
/// facts kheap reads from BTF and for the CO-RE relocations of every BPF
/// object. Checked against the running kernel when first used.
pub fn use_btf_file(path: &Path) -> Result<()> {
    // Not followed: a symlink may be another user's.
    let meta =
        fs::symlink_metadata(path).map_err(|e| anyhow::anyhow!("--btf {}: {e}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!(
            "--btf {}: not a regular file (give the BTF file itself, not a link or a directory)",
            path.display()
        );
    }
    if meta.len() > MAX_BTF_FILE {
        bail!(
            "--btf {}: {} bytes is too big for a BTF file (at most {MAX_BTF_FILE})",
            path.display(),
            meta.len()
        );
    }
    let _ = BTF_FILE.set(path.to_path_buf());
    Ok(())
}

/// Where the kernel's BTF is read from: `KHEAP_BTF` (used by the tests to
/// check the missing-BTF error on a kernel that has BTF), `--btf FILE`, or
/// the kernel's own.
pub fn btf_path() -> PathBuf {
    std::env::var_os("KHEAP_BTF")
        .map(PathBuf::from)
        .or_else(|| BTF_FILE.get().cloned())
        .unwrap_or_else(|| PathBuf::from(KERNEL_BTF))
}

/// The BTF file the BPF objects are relocated against when it is not the
/// kernel's own.
pub fn custom_btf_path() -> Option<PathBuf> {
    let p = btf_path();
    (p != Path::new(KERNEL_BTF)).then_some(p)
}

/// Opens a skeleton against the BTF this run uses (`custom_btf_path`).
pub fn open_skel<'obj, B: libbpf_rs::skel::SkelBuilder<'obj>>(
    builder: B,
    slot: &'obj mut std::mem::MaybeUninit<libbpf_rs::OpenObject>,
) -> Result<B::Output> {
    crate::kernel::btf_check::open_with_btf(builder, slot, custom_btf_path().as_deref())
}

/// Where the BTF comes from, in words (`kheap doctor`).
pub fn btf_origin() -> String {
    match custom_btf_path() {
        None => format!("the kernel's own ({KERNEL_BTF})"),
        Some(p) if kernel_has_own_btf() => format!("{} (given with --btf)", p.display()),
        Some(p) => format!(
            "{} (given with --btf); the kernel has none of its own ({KERNEL_BTF}): untyped programs only (raw_tp, kprobes), no malloc",
            p.display()
        ),
    }
}

/// How to get a BTF file for a kernel that exposes none.
pub const HOW_TO_GET_BTF: &str = "give kheap one with --btf FILE: BTFHub (github.com/aquasecurity/btfhub-archive) has them for distribution kernels, or make one with 'pahole --btf_encode_detached=FILE vmlinux' from the kernel's debug package (Debian: linux-image-$(uname -r)-dbg)";

/// Root, or CAP_BPF together with CAP_PERFMON, is needed to load and attach.
pub fn check_privileges(command: &str) -> Result<()> {
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let caps = effective_caps().unwrap_or(0);
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_BPF) && has(CAP_PERFMON) {
        return Ok(());
    }
    bail!(
        "kheap {command} needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs: run it with sudo"
    )
}

/// Whether this process has `cap` in its effective set.
pub fn has_capability(cap: u32) -> bool {
    effective_caps().is_some_and(|caps| caps & (1u64 << cap) != 0)
}

fn effective_caps() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// What the running kernel offers, probed once per process.
#[derive(Debug)]
pub struct Features {
    /// `uname -r`.
    pub release: String,
    /// The kernel's BTF facts, or why there are none (one line).
    pub btf: std::result::Result<KernelBtf, String>,
    pub kprobes: bool,
    pub uprobes: bool,
}

impl Features {
    fn probe() -> Features {
        Features {
            release: read_release(),
            btf: read_kernel_btf().map_err(|e| format!("{e:#}")),
            kprobes: Path::new("/sys/bus/event_source/devices/kprobe").exists(),
            uprobes: Path::new("/sys/bus/event_source/devices/uprobe").exists(),
        }
    }
}

/// The running kernel's features, probed on first use.
pub fn kernel() -> &'static Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    FEATURES.get_or_init(Features::probe)
}

pub fn check_btf() -> Result<()> {
    kernel_btf().map(drop)
}

/// Facts about the kernel that decide how kheap attaches.
#[derive(Debug, Default)]
pub struct KernelBtf {
    /// `btf_trace_<name>` typedefs: the tracepoint can be attached as tp_btf.
    pub btf_tracepoints: Vec<String>,
    /// The hooks' kernel functions that BTF names (fentry can attach to
    /// them): the fallback where a tracepoint is missing.
    pub btf_functions: Vec<String>,
    /// `__GFP_ACCOUNT` as a mask, from the kernel's own enum when it has one.
    pub gfp_account_mask: u64,
    /// `SLAB_ACCOUNT` (caches whose every object is charged to a memory
    /// cgroup), from the kernel's enum when it has one.
    pub slab_account_mask: u64,
    /// 6.11+: kmalloc memory can come from dedicated bucket caches, which
    /// kmalloc events do not name.
    pub kmalloc_buckets: bool,
    /// 6.13+: the `bpf_get_kmem_cache` kfunc names an object's cache (any
    /// program may call it; libbpf resolves it through the kernel's own BTF,
    /// so only with `typed_programs`).
    pub kmem_cache_kfunc: bool,
    /// 6.10+: the `bpf_preempt_disable` and `bpf_preempt_enable` kfuncs
    /// (malloc's uprobe programs run with preemption off: bpf/malloc.h,
    /// `no_preempt`).
    pub preempt_kfuncs: bool,
    /// 6.1+: kmem_cache_alloc and kmem_cache_free pass the cache; before,
    /// the programs find it from the object's page (bpf/kmem_classic.bpf.h).
    pub cache_events_pass_cache: bool,
    /// The BPF helpers this kernel has (`bpf_func_id` without `BPF_FUNC_`:
    /// `get_func_ret`, `find_vma`…).
    pub helpers: Vec<String>,
    /// The BPF map types it has (`bpf_map_type` without `BPF_MAP_TYPE_`).
    pub map_types: Vec<String>,
    /// Hooks whose tracepoint exists with an older argument layout than
    /// their program reads (`Hook::layout`): their tracepoint names.
    pub old_layouts: Vec<String>,
    /// The kernel has its own BTF (`kernel_has_own_btf`): tp_btf and
    /// fentry programs can load.
    pub typed_programs: bool,
    /// The id of `btf_trace_kmalloc` in the kernel's own BTF (the type a
    /// tp_btf program on kmalloc attaches by), where kheap reads that BTF
    /// itself: a `--btf` file may number its types differently.
    pub kmalloc_trace_type: Option<u32>,
}

impl KernelBtf {
    pub fn has_helper(&self, name: &str) -> bool {
        self.helpers.iter().any(|h| h == name)
    }

    pub fn has_map_type(&self, name: &str) -> bool {
        self.map_types.iter().any(|h| h == name)
    }
}

/// What the kmem object (bpf/kheap.bpf.c) needs of every kernel, and that
/// kernels before 5.5 lack (Ubuntu 20.04's 5.4 refused the whole object
/// with EINVAL): (helper, what to call it, the Linux version that brought
/// it).
const KMEM_NEEDS: [(&str, &str, &str); 2] = [
    ("probe_read_kernel", "bpf_probe_read_kernel", "5.5"),
    ("jiffies64", "bpf_jiffies64", "5.5"),
];

/// What the malloc object (bpf/malloc.bpf.c) needs beyond what the kmem
/// tracer does: (map type or helper, what to call it, the Linux version that
/// brought it).
const MALLOC_NEEDS: [(&str, &str, &str); 2] = [
    ("probe_read_user", "bpf_probe_read_user", "5.5"),
    ("map:ringbuf", "BPF ring buffers", "5.8"),
];

/// What the malloc object's default path uses and kernels before 5.17 lack:
/// without any of them it takes its legacy path (`cfg.legacy` in
/// bpf/malloc.h), which counts the same.
const MALLOC_NEWER: [(&str, &str, &str); 5] = [
    ("map:task_storage", "task storage maps", "5.11"),
    ("get_current_task_btf", "bpf_get_current_task_btf", "5.11"),
    ("get_attach_cookie", "bpf_get_attach_cookie", "5.15"),
    ("find_vma", "bpf_find_vma", "5.17"),
    ("loop", "bpf_loop", "5.17"),
];

/// Threads of traced processes that the legacy path follows at once (its
/// thread states are a preallocated hash map, not task storage); a thread
/// beyond them is not counted, and shown as such (`no_thread_state`).
pub const MALLOC_LEGACY_THREADS: u32 = 8192;

/// Whether `kheap malloc` takes its legacy path here, and the one line that
/// says what differs (the report header, `kheap doctor`).
pub fn malloc_legacy(k: &KernelBtf) -> Option<String> {
    let missing = lacking(k, &MALLOC_NEWER);
    (!missing.is_empty()).then(|| {
        format!(
            "this kernel ({}) lacks {}: malloc uses its path for older kernels, with the same counts; \
             it follows at most {MALLOC_LEGACY_THREADS} threads of traced processes at once",
            kernel_release(),
            missing.join(", ")
        )
    })
}

/// Whether `kheap malloc`'s uprobe programs run with preemption off here
/// (bpf/malloc.h, no_preempt): on its default path, where the kernel has
/// the bpf_preempt_disable kfuncs (6.10).
pub fn malloc_preemption_off(k: &KernelBtf) -> bool {
    malloc_legacy(k).is_none() && k.preempt_kfuncs
}

/// What differs for `kheap malloc` on this kernel, in one line (the report
/// header, `kheap doctor`): the older kernels' path, and programs that can
/// be preempted in the middle.
pub fn malloc_kernel_note(k: &KernelBtf) -> Option<String> {
    let notes: Vec<String> = [malloc_legacy(k), malloc_preemption_note(k)]
        .into_iter()
        .flatten()
        .collect();
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// What `kheap malloc` says where its uprobe programs can be preempted in
/// the middle (the report header, `kheap doctor`): a kernel that preempts
/// kernel code and has no `bpf_preempt_disable` (6.10), or whose mode
/// cannot be read. Two threads on one CPU can then meet in the programs'
/// per-CPU scratch buffers and counters (docs/kernels.md).
fn malloc_preemption_note(k: &KernelBtf) -> Option<String> {
    use crate::sys::preempt::{preemption, Preemption};
    if malloc_preemption_off(k) {
        return None;
    }
    let consequence = "two threads on one CPU can meet in malloc's per-CPU scratch, \
                       so a call may rarely be miscounted";
    match preemption(&kernel_release()) {
        Preemption::Off => None,
        Preemption::On(mode) => Some(format!(
            "this kernel preempts kernel code ({mode}) and has no bpf_preempt_disable (6.10): \
             {consequence}"
        )),
        Preemption::Unknown => Some(format!(
            "this kernel's preemption mode could not be read (PREEMPT_DYNAMIC; mount debugfs \
             or boot with preempt=, to let kheap read it); if it is full or lazy, {consequence}"
        )),
    }
}

/// Which of `needs` (map types with a `map:` prefix, or helpers) the kernel
/// lacks, each as "what (version)".
fn lacking(k: &KernelBtf, needs: &[(&str, &str, &str)]) -> Vec<String> {
    needs
        .iter()
        .filter(|(need, _, _)| match need.strip_prefix("map:") {
            Some(map) => !k.has_map_type(map),
            None => !k.has_helper(need),
        })
        .map(|(_, what, since)| format!("{what} ({since})"))
        .collect()
}

/// The one line that says why kheap's kernel tracing (record, top, leaks,
/// slab -d, serve) cannot run on this kernel, if it cannot.
pub fn kmem_unsupported(k: &KernelBtf) -> Option<String> {
    let missing = lacking(k, &KMEM_NEEDS);
    (!missing.is_empty()).then(|| {
        format!(
            "this kernel ({}) lacks BPF helpers kheap's tracing needs: {}; record, top, leaks, \
             slab -d and serve need Linux 5.10 or newer, and `kheap slab` without -d (it reads \
             /proc/slabinfo) works here",
            kernel_release(),
            missing.join(", ")
        )
    })
}

/// The one line that says why `kheap malloc` cannot run on this kernel, if
/// it cannot: which of the BPF features it needs the kernel lacks.
pub fn malloc_unsupported(k: &KernelBtf) -> Option<String> {
    let own_btf = (!k.typed_programs)
        .then(|| format!("its own BTF ({KERNEL_BTF}; a --btf file serves kheap, not the kernel's checks of malloc's typed programs)"));
    let missing: Vec<String> = own_btf
        .into_iter()
        .chain(lacking(k, &MALLOC_NEEDS))
        .collect();
    let works_here = match kmem_unsupported(k) {
        None => "kheap record, leaks, top and slab work here",
        Some(_) => {
            "nor do record, top and leaks (Linux 5.10 or newer); `kheap slab` without -d works here"
        }
    };
    (!missing.is_empty()).then(|| {
        format!(
            "malloc needs BPF features this kernel ({}) lacks: {}; {works_here}",
            kernel_release(),
            missing.join(", ")
        )
    })
}

/// The kernel BTF's named types, indexed in one pass. libbpf's
/// `btf__find_by_name` scans the types in order, so every name looked up
/// cost a scan of the ~130,000 types of a distribution kernel, and a name
/// that is missing (a hook an older or newer kernel lacks) a whole one: 14
/// ms each on the development host, about twenty times that under qemu's
/// emulation, on every start of every command.
struct BtfIndex<'b> {
    btf: &'b Btf<'b>,
    by_name: HashMap<&'b OsStr, Vec<TypeId>>,
    enums: Vec<TypeId>,
}

impl<'b> BtfIndex<'b> {
    fn new(btf: &'b Btf<'b>) -> BtfIndex<'b> {
        let mut by_name: HashMap<&OsStr, Vec<TypeId>> = HashMap::new();
        let mut enums = Vec::new();
        for id in (1..btf.len() as u32).map(TypeId::from) {
            let Some(t) = btf.type_by_id::<BtfType>(id) else {
                continue;
            };
            if t.is_any_enum() {
                enums.push(id);
            }
            if let Some(name) = t.name().filter(|n| !n.is_empty()) {
                by_name.entry(name).or_default().push(id);
            }
        }
        BtfIndex {
            btf,
            by_name,
            enums,
        }
    }

    /// The first type named `name` of kind K (a name can be a struct and a
    /// function at once).
    fn find<K: TryFrom<BtfType<'b>>>(&self, name: &str) -> Option<K> {
        self.by_name
            .get(OsStr::new(name))?
            .iter()
            .find_map(|&id| self.btf.type_by_id::<K>(id))
    }

    fn has_func(&self, name: &str) -> bool {
        self.find::<Func>(name).is_some()
    }

    /// The value of the enum member `member` as a bit mask (`1 << value`),
    /// in whichever enum defines it.
    fn enum_bit(&self, member: &str) -> Option<u64> {
        self.enums.iter().find_map(|&id| {
            self.btf
                .type_by_id::<Enum>(id)?
                .iter()
                .find(|m| m.name.is_some_and(|n| n == member))
                .map(|m| 1u64 << m.value)
        })
    }

    /// The members of a kernel enum with a prefix, lower-cased without it
    /// (`BPF_FUNC_find_vma` → `find_vma`).
    fn enum_members(&self, name: &str, prefix: &str) -> Vec<String> {
        self.find::<Enum>(name)
            .map(|e| {
                e.iter()
                    .filter_map(|m| m.name?.to_str()?.strip_prefix(prefix))
                    .map(str::to_ascii_lowercase)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the kernel's struct `name` has a member `field`.
    fn struct_has_field(&self, name: &str, field: &str) -> bool {
        self.find::<Struct>(name)
            .is_some_and(|s| s.iter().any(|m| m.name.is_some_and(|n| n == field)))
    }
}

/// `SLAB_ACCOUNT` on kernels that define it as a macro (before 6.9).
const SLAB_ACCOUNT_FALLBACK: u64 = 0x0400_0000;

/// `__GFP_ACCOUNT` on kernels that define it as a macro (before 6.10).
const GFP_ACCOUNT_FALLBACK: u64 = 0x40_0000;

/// The kernel's BTF facts, or a one-line error that says what is missing.
pub fn kernel_btf() -> Result<&'static KernelBtf> {
    kernel().btf.as_ref().map_err(|e| anyhow::anyhow!("{e}"))
}

fn read_kernel_btf() -> Result<KernelBtf> {
    let path = btf_path();
    if !path.exists() {
        bail!(
            "this kernel exposes no BTF ({} is missing): {HOW_TO_GET_BTF}",
            path.display()
        );
    }
    let btf = Btf::from_path(&path)
        .map_err(|e| anyhow::anyhow!("reading kernel BTF from {}: {e}", path.display()))?;
    if custom_btf_path().is_some() && check_privileges("").is_ok() {
        check_btf_describes_this_kernel(&path)?;
    }
    let index = BtfIndex::new(&btf);
    let hooks = &crate::kernel::hooks::HOOKS;
    let btf_tracepoints = hooks
        .iter()
        .flat_map(|h| h.tracepoints())
        .filter(|tp| index.find::<Typedef>(&format!("btf_trace_{tp}")).is_some())
        .map(str::to_string)
        .collect();
    // Typed programs need the kernel's own BTF, whatever file describes it.
    let typed_programs = kernel_has_own_btf();
    let btf_functions = hooks
        .iter()
        .filter_map(|h| h.function)
        .filter(|f| typed_programs && index.has_func(f))
        .map(str::to_string)
        .collect();
    let old_layouts = hooks
        .iter()
        .filter(|h| {
            h.layout.is_some_and(|(field, _)| {
                !index.struct_has_field(&format!("trace_event_raw_{}", h.tracepoint), field)
            })
        })
        .map(|h| h.tracepoint.to_string())
        .collect();
    Ok(KernelBtf {
        old_layouts,
        cache_events_pass_cache: index
            .find::<Struct>("trace_event_raw_kmem_cache_alloc")
            .is_some(),
        helpers: index.enum_members("bpf_func_id", "BPF_FUNC_"),
        map_types: index.enum_members("bpf_map_type", "BPF_MAP_TYPE_"),
        btf_tracepoints,
        btf_functions,
        gfp_account_mask: index
            .enum_bit("___GFP_ACCOUNT_BIT")
            .unwrap_or(GFP_ACCOUNT_FALLBACK),
        slab_account_mask: index
            .enum_bit("_SLAB_ACCOUNT")
            .unwrap_or(SLAB_ACCOUNT_FALLBACK),
        kmalloc_buckets: index.has_func("kmem_buckets_create"),
        kmem_cache_kfunc: typed_programs && index.has_func("bpf_get_kmem_cache"),
        preempt_kfuncs: typed_programs
            && index.has_func("bpf_preempt_disable")
            && index.has_func("bpf_preempt_enable"),
        kmalloc_trace_type: index
            .find::<Typedef>("btf_trace_kmalloc")
            .filter(|_| typed_programs && custom_btf_path().is_none())
            .map(|t| t.type_id().into()),
        typed_programs,
    })
}

fn read_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown kernel".into())
}

/// Refuses a BTF file that is not the running kernel's: its layouts would
/// make every number wrong.
fn check_btf_describes_this_kernel(path: &Path) -> Result<()> {
    let release = read_release();
    let one_line = |e: &anyhow::Error| format!("{e:#}").replace('\n', " ");
    let got = crate::kernel::btf_check::release_through(path).map_err(|failed| match failed {
        CheckFailed::Load(e) => anyhow::anyhow!(
            "the BTF in {} does not describe this kernel ({release}): reading the kernel through it failed ({}); give the BTF of {release}",
            path.display(),
            one_line(&e)
        ),
        CheckFailed::Run(e) => anyhow::anyhow!(
            "cannot check the BTF in {} against this kernel ({release}): the kernel would not run the check ({}; kernels before 5.10 cannot), and kheap's tracing needs Linux 5.10 or newer",
            path.display(),
            one_line(&e)
        ),
    })?;
    if got != release {
        bail!(
            "the BTF in {} is another kernel's: read through it, this kernel's release ({release}) comes out as {got:?}; give the BTF of {release}",
            path.display()
        );
    }
    Ok(())
}

/// Whether this kernel's verifier refuses a tp_btf program that reads a
/// tracepoint's `const void *` argument (kmalloc's `ptr`, as every kmem
/// program of kheap's does), asked of a three-instruction program. Kernels
/// before 6.13 refuse it ("arg1 type UNKNOWN is not a struct"); finding
/// that out by loading the whole kmem object cost about a sixth of a short
/// run in an emulated guest, and its maps were created and destroyed for
/// nothing. Only a refusal by the verifier (EACCES) counts: any other
/// failure of the probe leaves the answer to the real load.
pub fn tp_btf_refuses_void_pointers(k: &KernelBtf) -> bool {
    static REFUSES: OnceLock<bool> = OnceLock::new();
    let Some(attach_type) = k.kmalloc_trace_type else {
        return false;
    };
    *REFUSES.get_or_init(|| {
        // r2 = *(u64 *)(r1 + 8), kmalloc's second argument; r0 = 0; exit
        const INSNS: [u64; 3] = [0x0000_0000_0008_1279, 0x0000_00b7, 0x0000_0095];
        let mut opts = libbpf_sys::bpf_prog_load_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
            expected_attach_type: libbpf_sys::BPF_TRACE_RAW_TP,
            attach_btf_id: attach_type,
            ..Default::default()
        };
        // SAFETY: INSNS is static and holds INSNS.len() 8-byte instructions,
        // laid out as struct bpf_insn; opts outlives the call.
        let fd = unsafe {
            libbpf_sys::bpf_prog_load(
                libbpf_sys::BPF_PROG_TYPE_TRACING,
                c"kheap_tp_btf".as_ptr(),
                c"GPL".as_ptr(),
                INSNS.as_ptr().cast(),
                INSNS.len() as _,
                &mut opts,
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor the call above opened and nothing else owns.
            unsafe { libc::close(fd) };
            return false;
        }
        fd == -libc::EACCES
    })
}

/// What `kheap top` and `kheap serve` do where idle keys cannot be aged out.
const IDLE_KEYS_KEPT: &str = "idle keys are kept: this kernel cannot read and delete a BPF hash map entry in one step (BPF_MAP_LOOKUP_AND_DELETE_ELEM on hash maps, Linux 5.14), so aging them out could lose events; a long run may fill the maps";

/// Whether the kernel reads and deletes a per-CPU hash map entry in one
/// syscall (5.14; before, only queue and stack maps): what aging out idle
/// keys needs to lose no event. Probed once, on a map of one entry.
pub fn hash_lookup_and_delete() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        let Ok(map) = libbpf_rs::MapHandle::create(
            libbpf_rs::MapType::PercpuHash,
            Some("kheap_probe"),
            4,
            8,
            1,
            &opts,
        ) else {
            // No map at all: whatever this says, loading will fail first.
            return true;
        };
        use libbpf_rs::MapCore;
        let key = 0u32.to_ne_bytes();
        let cpus = libbpf_rs::num_possible_cpus().unwrap_or(1);
        let values = vec![0u64.to_ne_bytes().to_vec(); cpus];
        if map
            .update_percpu(&key, &values, libbpf_rs::MapFlags::ANY)
            .is_err()
        {
            return true;
        }
        !matches!(
            crate::kernel::maps::take_counts::<u64, _>(&map, &key),
            Err(e) if e
                .root_cause()
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
                == Some(ENOTSUPP)
        )
    })
}

/// The idle intervals after which `top` and `serve` age keys out, as this
/// kernel allows: `asked`, or 0 with the line that says why where aging
/// could lose events (`hash_lookup_and_delete`).
pub fn idle_intervals_here(asked: u32) -> (u32, Option<&'static str>) {
    if asked > 0 && !hash_lookup_and_delete() {
        (0, Some(IDLE_KEYS_KEPT))
    } else {
        (asked, None)
    }
}

/// The kernel's ENOTSUPP (not in libc: it is not a user-space errno).
const ENOTSUPP: i32 = 524;

pub fn kernel_release() -> String {
    kernel().release.clone()
}

pub fn has_kprobes() -> bool {
    kernel().kprobes
}

pub fn has_uprobes() -> bool {
    kernel().uprobes
}

const TRACEFS: &str = "/sys/kernel/tracing";

/// tracefs, mounted for as long as this value lives. If kheap had to mount
/// it, it unmounts it again when done, leaving the system as it found it.
pub struct Tracefs {
    pub path: PathBuf,
    mounted_here: bool,
}

impl Tracefs {
    pub fn find() -> Option<PathBuf> {
        [TRACEFS, "/sys/kernel/debug/tracing"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.join("events").is_dir())
    }

    pub fn ensure_mounted() -> Result<Tracefs> {
        if let Some(path) = Self::find() {
            return Ok(Tracefs {
                path,
                mounted_here: false,
            });
        }
        let target = std::ffi::CString::new(TRACEFS).expect("no NUL");
        let fstype = std::ffi::CString::new("tracefs").expect("no NUL");
        let rc = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            bail!(
                "tracefs is not mounted and mounting it on {TRACEFS} failed ({}): mount it with 'mount -t tracefs nodev {TRACEFS}'",
                std::io::Error::last_os_error()
            );
        }
        Ok(Tracefs {
            path: PathBuf::from(TRACEFS),
            mounted_here: true,
        })
    }

    /// A tracefs someone else mounted, looked at without taking ownership.
    pub fn unmounted_view(path: PathBuf) -> Tracefs {
        Tracefs {
            path,
            mounted_here: false,
        }
    }

    pub fn has_event(&self, system: &str, name: &str) -> bool {
        self.path.join("events").join(system).join(name).is_dir()
    }

    pub fn mounted_here(&self) -> bool {
        self.mounted_here
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.mounted_here {
            let target = std::ffi::CString::new(TRACEFS).expect("no NUL");
            // Lazy: perf events opened through it stay valid until closed.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel with BTF of its own and these helpers and map types.
    fn kernel_with(helpers: &[&str], map_types: &[&str]) -> KernelBtf {
        KernelBtf {
            helpers: helpers.iter().map(|h| h.to_string()).collect(),
            map_types: map_types.iter().map(|m| m.to_string()).collect(),
            typed_programs: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_kernel_before_5_5_is_refused_in_one_line_that_says_what_works() {
        // Ubuntu 20.04's 5.4: BTF, but neither 5.5 helper.
        let old = kernel_with(&["probe_read", "get_stack", "ringbuf_output"], &["hash"]);
        let why = kmem_unsupported(&old).unwrap();
        assert!(
            why.contains("needs: bpf_probe_read_kernel (5.5), bpf_jiffies64 (5.5); record, top, leaks, slab -d and serve need Linux 5.10 or newer")
                && why.contains("`kheap slab` without -d"),
            "{why}"
        );
        assert_eq!(why.lines().count(), 1, "{why}");
        // malloc's line does not say that record works where it does not.
        let malloc = malloc_unsupported(&old).unwrap();
        assert!(
            !malloc.contains("record, leaks, top and slab work here"),
            "{malloc}"
        );
        assert!(malloc.contains("nor do record, top and leaks"), "{malloc}");

        // 5.10: kernel tracing runs, and malloc on its legacy path, which
        // one line names.
        let debian11 = kernel_with(
            &["probe_read_kernel", "probe_read_user", "jiffies64"],
            &["hash", "ringbuf"],
        );
        assert_eq!(kmem_unsupported(&debian11), None);
        assert_eq!(malloc_unsupported(&debian11), None);
        let legacy = malloc_legacy(&debian11).unwrap();
        assert!(
            legacy.contains("lacks task storage maps (5.11), bpf_get_current_task_btf (5.11), bpf_get_attach_cookie (5.15), bpf_find_vma (5.17), bpf_loop (5.17): malloc uses its path for older kernels, with the same counts"),
            "{legacy}"
        );
        assert_eq!(legacy.lines().count(), 1, "{legacy}");
        // 5.15 has cookies and task storage, not 5.17's helpers.
        let jammy = kernel_with(
            &[
                "probe_read_kernel",
                "probe_read_user",
                "jiffies64",
                "get_current_task_btf",
                "get_attach_cookie",
            ],
            &["hash", "ringbuf", "task_storage"],
        );
        let legacy = malloc_legacy(&jammy).unwrap();
        assert!(
            legacy.contains("lacks bpf_find_vma (5.17), bpf_loop (5.17):"),
            "{legacy}"
        );
        let new = kernel_with(
            &[
                "probe_read_kernel",
                "probe_read_user",
                "jiffies64",
                "get_current_task_btf",
                "get_attach_cookie",
                "find_vma",
                "loop",
            ],
            &["hash", "ringbuf", "task_storage"],
        );
        assert_eq!(malloc_legacy(&new), None);
    }

    #[test]
    fn this_kernels_btf_names_the_kmem_tracepoints() {
        // Reading BTF needs no privileges; skip loudly where there is none.
        if !btf_path().exists() {
            eprintln!("SKIPPED: no kernel BTF on this machine");
            return;
        }
        let k = kernel_btf().unwrap();
        assert!(k.btf_tracepoints.iter().any(|t| t == "kmalloc"), "{k:?}");
        assert_eq!(kmem_unsupported(k), None, "{:?}", k.helpers);
        assert_eq!(k.gfp_account_mask.count_ones(), 1);
    }
}
