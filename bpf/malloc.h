/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Structs shared by bpf/malloc.bpf.c and src/malloc/: Rust uses the types
 * the malloc skeleton generates from this file's BTF.
 */
#ifndef KHEAP_MALLOC_H
#define KHEAP_MALLOC_H

#include "size_bucket.h"

/* User frames kept per stack (frame-pointer walk). */
#define MALLOC_STACK_DEPTH     64
#define MALLOC_MODULE_NAME_LEN 64

/* One allocator function called from one return address with one stack, in
 * one address space: per-site and per-stack rows are folded from this in
 * user space. Addresses mean something only within one address space (ASLR;
 * exec replaces it within the same process), hence the mm. */
struct malloc_key {
	__u64 mm; /* the struct mm_struct's address: an address space's id */
	__u32 tgid;
	/* Index into the allocator function table of src/allocators.rs,
	 * passed to every probe as its attach cookie. */
	__u32 func;
	/* The return address into the direct caller: read from the stack
	 * pointer on entry, as the frame-pointer walk skips that frame. */
	__u64 caller;
	__s64 stack_id;
};

struct malloc_stats {
	__u64 count;
	__u64 bytes; /* requested: calloc counts n * size */
	__u64 hist[KHEAP_HIST_BUCKETS];
};

/* A block that was allocated while tracing and not freed yet. */
struct live_key {
	__u32 tgid;
	__u32 pad;
	__u64 ptr;
};

struct live_alloc {
	struct malloc_key key;
	__u64 size;
};

/* An allocation between entry and return probe. */
struct pending_alloc {
	struct malloc_key key;
	__u64 size;
	__u64 old_ptr; /* realloc's block, freed when the call succeeds */
	__u64 memptr;  /* posix_memalign's result pointer */
	__u64 sp;      /* stack pointer on entry: its return has sp + 8 */
};

/* Per-thread state, in task storage. */
struct thread_state {
	/* The last counted entry: an allocator that tail-calls another one
	 * (glibc: reallocarray -> realloc, realloc(NULL) -> malloc,
	 * memalign(<=16) -> malloc) enters it with the same stack pointer and
	 * return address; that inner call is not counted again. */
	__u64 last_sp;
	__u64 last_ret;
	__u32 last_func;
	/* cfg.track_live: a call is between entry and return. Calls entered
	 * meanwhile at the same or a deeper stack pointer are the allocator's
	 * own (nested) calls. */
	__u32 pending_active;
	struct pending_alloc pending;
	/* cfg.track_live: the last outer free counted (operator delete,
	 * __rust_dealloc). A free of the same block at the same or a deeper
	 * stack pointer before the next allocation is one it makes inside
	 * (the block cannot be freed again before it is handed out again),
	 * and is not counted twice. */
	__u64 free_sp;
	__u64 free_ptr;
	__u32 free_active;
	__u32 pad;
};

/* A file-backed mapping a stack frame fell in, recorded when the stack is
 * first seen, so frames can be symbolized after the process has exited. */
struct vma_key {
	__u64 mm;
	__u64 start;
};

struct vma_info {
	__u64 end;
	__u64 pgoff; /* in pages */
	__u64 ino;
	__u32 dev; /* kernel encoding: major << 20 | minor */
	__u32 pad;
	char name[MALLOC_MODULE_NAME_LEN]; /* file name, without directory */
};

#define MALLOC_PATH_LEN 256

/* A file by identity, as mappings name it. */
struct file_id {
	__u64 ino;
	__u32 dev;
	__u32 pad;
};

/* The path a traced process exec'd a program by: lets user space find the
 * program's file even when the process was too short-lived to be seen. */
struct exec_path {
	char path[MALLOC_PATH_LEN];
};

/* Per-CPU event counters: nothing is dropped silently. */
struct malloc_counters {
	__u64 frees;
	__u64 frees_null;
	__u64 frees_untracked; /* blocks allocated before tracing began */
	__u64 failed;	       /* the allocator returned NULL */
	__u64 lost_stacks;
	__u64 map_full_sites;
	__u64 map_full_live;
	__u64 map_full_vmas;
	__u64 vma_lookup_failed;
	__u64 nested; /* allocator calls made by the allocator itself */
	__u64 no_thread_state; /* task storage unavailable: not counted */
	/* For the live status line: calls counted, and entries created in
	 * the sites map (counted only on the creation path). */
	__u64 allocs;
	__u64 sites_created;
	/* Calls counted whose return address could not be read at the stack
	 * pointer (caller 0: rows named [caller unreadable]). */
	__u64 caller_unreadable;
};

struct malloc_config {
	__u8 track_live; /* --outstanding: return probes and free tracking */
	/* --cgroup: only tasks in a cgroup of cgroup_filter or below one */
	__u8 cgroups;
	/* The path for kernels before 5.17 (src/kernel/features.rs says
	 * which lack what): thread state in a hash keyed by thread id, not
	 * task storage (5.11); the current task read through
	 * bpf_get_current_task(), not bpf_get_current_task_btf() (5.11); one
	 * program per allocator function (slot_N), not attach cookies (5.15);
	 * frames' mappings found by walking the address space's VMA tree,
	 * not bpf_find_vma() (5.17), in bounded loops, not bpf_loop()
	 * (5.17). */
	__u8 legacy;
	/* Kernels with the bpf_preempt_disable kfunc (6.10): the uprobe
	 * programs run with preemption off. Uprobe programs are preemptible
	 * (from 7.x kernels' default lazy preemption on, a tick can switch
	 * tasks in the middle of one), and what they share per CPU is then
	 * shared by two tasks: the scratch buffers, the counters and, from
	 * 6.13, the JIT's private stack that holds their locals (issue 48:
	 * a call's key took the tgid and return address of another traced
	 * or untraced process that hit the probe on that CPU meanwhile). */
	__u8 no_preempt;
};

/* Allocator functions that can be probed: src/allocators/functions.rs's
 * slot_count(), which the Rust side checks. On the legacy path, slot N's
 * program is slot_N, which reads its arguments as slot_layouts[N] says. */
#define MALLOC_SLOTS 44

/* How a function takes its arguments: the Rust side's Layout, as numbered
 * in slot_layouts (src/kernel/malloc.rs). */
enum malloc_layout {
	MALLOC_LAYOUT_NONE = 0, /* a free: its programs take no cookie */
	MALLOC_LAYOUT_SIZE,
	MALLOC_LAYOUT_CALLOC,
	MALLOC_LAYOUT_ALIGN_SIZE,
	MALLOC_LAYOUT_POSIX_MEMALIGN,
	MALLOC_LAYOUT_REALLOC,
	MALLOC_LAYOUT_REALLOCARRAY,
	MALLOC_LAYOUT_RUST_REALLOC,
};

#endif /* KHEAP_MALLOC_H */
