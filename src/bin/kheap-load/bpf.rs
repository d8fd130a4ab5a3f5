//! BPF maps made with the raw bpf(2) syscall: array, percpu, ring buffer.

use std::time::Duration;

use crate::{cpu_time_ns, usage};

/// A BPF array map made with the raw bpf(2) syscall; closed (and freed by
/// the kernel) when the process exits.
pub fn bpf_array(kind: &str, entries: u32, value_size: u32, hold_secs: Option<u64>) {
    create_bpf_map(kind, entries, value_size);
    if let Some(secs) = hold_secs {
        println!("created");
        // On stderr too, as msg says it: a tracer running this as its
        // command passes its stderr on.
        eprintln!("holding a {kind} map of {entries} values of {value_size} bytes for {secs}s");
        std::thread::sleep(Duration::from_secs(secs));
    }
}

/// A BPF map of KIND `array` or `percpu` made with the raw bpf(2) syscall;
/// returns its fd.
fn create_bpf_map(kind: &str, entries: u32, value_size: u32) -> i32 {
    const BPF_MAP_CREATE: libc::c_long = 0;
    let map_type: u32 = match kind {
        "array" => 2,    // BPF_MAP_TYPE_ARRAY
        "percpu" => 6,   // BPF_MAP_TYPE_PERCPU_ARRAY
        "ringbuf" => 27, // BPF_MAP_TYPE_RINGBUF: no key, no value
        _ => usage(),
    };
    // Before 5.11 BPF maps are charged to RLIMIT_MEMLOCK (since, to the
    // memory cgroup): lift it, as BPF loaders do. Best effort.
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain struct passed by pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size,
    // max_entries, map_flags; the rest zero.
    let mut attr = [0u32; 32];
    attr[0] = map_type;
    attr[1] = if kind == "ringbuf" { 0 } else { 4 };
    attr[2] = value_size;
    attr[3] = entries;
    // SAFETY: attr outlives the call and its size is passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        eprintln!("bpf(BPF_MAP_CREATE): {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    fd as i32
}

/// COUNT maps created and closed, for the benchmark's vmalloc and percpu
/// modes: the allocations happen in this thread; the frees run later in a
/// kworker (the map is freed after its last reference goes), outside the
/// CPU time measured here.
pub fn bpf_maps(kind: &str, count: u64, entries: u32, value_size: u32) {
    let start = cpu_time_ns();
    for _ in 0..count {
        let fd = create_bpf_map(kind, entries, value_size);
        unsafe { libc::close(fd) };
    }
    let ns = (cpu_time_ns() - start) as f64 / count.max(1) as f64;
    println!("{count} {kind} maps created and closed, {ns:.1} ns per call");
}
