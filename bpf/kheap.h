/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Structs shared by the BPF programs and the Rust side. Rust never copies
 * these by hand: it uses the types the skeleton generates from this file's
 * BTF (src/bpf.rs wraps them with `plain`).
 */
#ifndef KHEAP_H
#define KHEAP_H

/* log2 buckets over the requested size (KHEAP_HIST_BUCKETS, size_bucket()). */
#include "size_bucket.h"

/* Frames kept per kernel stack. Allocation stacks are rarely deeper; the
 * stack map's memory is max_entries * depth * 8 bytes. */
#define KHEAP_STACK_DEPTH 64

#define KHEAP_COMM_LEN	     16
#define KHEAP_CACHE_NAME_LEN 32

/* errno values compared in BPF (helpers return them negated) */
#define KHEAP_ENOENT 2
#define KHEAP_E2BIG  7
#define KHEAP_EEXIST 17

/* Which kernel allocator an event comes from (--source). kmalloc is the
 * slab (kmalloc and kmem_cache_alloc), the default and only one before
 * sources existed, so a zeroed key means the slab. */
enum kheap_source {
	KHEAP_SOURCE_KMALLOC = 0,
	KHEAP_SOURCE_PAGE = 1,
	KHEAP_SOURCE_VMALLOC = 2,
	KHEAP_SOURCE_PERCPU = 3,
	KHEAP_SOURCES = 4,
};

/* What a page-allocator allocation was for, as far as kheap can tell: pages
 * that back slabs or vmalloc areas are counted by those sources too, so
 * totals leave them out (kheap/sources.c explains the heuristics). */
enum kheap_page_use {
	KHEAP_PAGE_DIRECT = 0,
	KHEAP_PAGE_SLAB = 1,
	KHEAP_PAGE_VMALLOC = 2,
	KHEAP_PAGE_PERCPU = 3,
};

/* What a vmap area is for, from the function on its stack that asked for it:
 * vmalloc proper has pages behind it that VmallocUsed counts; vmap,
 * ioremap and vm_map_ram map memory someone else allocated (or device
 * memory). OTHER: none of those functions was found (get_vm_area callers
 * such as BPF arenas, or a stack too deep). */
enum kheap_vmap_kind {
	KHEAP_VMAP_OTHER = 0,
	KHEAP_VMAP_VMALLOC = 1,
	KHEAP_VMAP_VMAP = 2,
	KHEAP_VMAP_IOREMAP = 3,
	KHEAP_VMAP_VM_MAP_RAM = 4,
};

/* Innermost frames of a page allocation or vmap area that are searched
 * for the function it serves (tracing frames come first), and how many
 * function ranges can name one: the page ranges first, then the vmap ones. */
#define KHEAP_BACKING_DEPTH  12
#define KHEAP_BACKING_RANGES 40

/* A kernel function's text [start, end) that labels the events below it:
 * page allocations that back another source (label: enum kheap_page_use),
 * or vmap areas of one kind (enum kheap_vmap_kind). Filled from
 * /proc/kallsyms by user space. */
struct backing_range {
	__u64 start;
	__u64 end;
	__u32 label;
	__u32 _pad;
};

struct backing_frames {
	__u64 ip[KHEAP_BACKING_DEPTH];
};

/* Exact counters of one aggregation key, summed over CPUs in user space. */
struct alloc_stats {
	__u64 count;
	__u64 bytes_req;
	__u64 bytes_alloc;
	__u64 hist[KHEAP_HIST_BUCKETS];
};

/* One call site allocating from one cache: per-site and per-cache tables are
 * both folded from this in user space, so the hot path updates one map. */
struct site_key {
	__u64 call_site;
	/* struct kmem_cache *: of kmem_cache_alloc(), or the one a kmalloc()
	 * object lives in (bpf/slab_cache.bpf.h). kmalloc: 0 when not a slab
	 * object (kmalloc_large) or not resolved on this kernel (the size
	 * class stands in), KHEAP_CACHE_UNRESOLVED when resolution failed. */
	__u64 cache;
	/* kmalloc: the size class; pages: the order */
	__u32 kmalloc_size;
	__u8 kmalloc_accounted;
	__u8 source; /* enum kheap_source */
	/* pages: which allocator the pages went to (enum kheap_page_use) */
	__u8 page_use;
	/* vmalloc: what the area is for (enum kheap_vmap_kind) */
	__u8 vmap_kind;
};

/* One CPU's counts of one site, in the per-CPU front of the site map
 * (bpf/kheap/site_slots.c). The count comes first: user space reads it, and
 * only if it is above zero the rest, so the key written before that count
 * is complete (stores are seen in order on x86; elsewhere only a slot
 * claimed during a read could be torn). A count of zero: a free slot. */
struct site_slot {
	struct alloc_stats stats;
	struct site_key key;
};

/* site_key.cache of a kmalloc object whose slab gave no cache of its size
 * (never a pointer: even and below the first page). */
#define KHEAP_CACHE_UNRESOLVED 2

/* The `procs` key of allocations made in interrupt context (--by process):
 * no process's, and above every tgid (PID_MAX_LIMIT is 2^22). */
#define KHEAP_INTERRUPT_TGID 0xFFFFFFFFu

struct stack_key {
	struct site_key site;
	/* hash of the frames (stack_store.bpf.h), > 0 */
	__s64 stack_id;
	/* Who made the allocations (cfg.stack_owners; zero otherwise): the
	 * allocating task's cgroup v2 id and process, or interrupt context,
	 * which is no task's (cgroup and tgid 0 then). */
	__u64 cgroup;
	__u32 tgid;
	__u8 interrupt;
	__u8 _pad[3];
};

/* One kernel stack, innermost frame first, zero-filled past the last. */
struct stack_frames {
	__u64 ip[KHEAP_STACK_DEPTH];
};

struct cache_frees {
	__u64 frees;
};

struct cache_name {
	char name[KHEAP_CACHE_NAME_LEN];
};

struct proc_info {
	char comm[KHEAP_COMM_LEN];
	/* cgroup v2 id of the process's first counted allocation */
	__u64 cgroup;
};

/* Per cgroup v2 id (--by cgroup): who is charged, and whether the kernel
 * charged the memory to the cgroup's memory controller. */
struct cgroup_key {
	__u64 cgroup; /* 0 for the interrupt row */
	/* __GFP_ACCOUNT or a SLAB_ACCOUNT cache: charged to the memcg */
	__u8 accounted;
	/* allocated in hard/soft interrupt or NMI context: no task's */
	__u8 interrupt;
	__u8 _pad[6];
};

/* Per-CPU event counters: everything that is dropped, sampled or only
 * counted is reported, never silently lost. */
struct counters {
	__u64 frees;
	__u64 frees_null;
	/* leaks: frees of objects not tracked (allocated before tracing, or
	 * never tracked because a map was full) */
	__u64 frees_untracked;
	__u64 stack_samples;
	__u64 lost_stack_other;
	__u64 map_full_sites;
	__u64 map_full_stacks;
	__u64 map_full_procs;
	__u64 map_full_cgroups;
	__u64 map_full_caches;
	__u64 alloc_failed;
	/* leaks: an allocation returned an address that was still tracked */
	__u64 reused_live;
	__u64 map_full_live;
	/* leaks: a map update refused because its bucket lock was held on
	 * this CPU (an interrupt hit the tracer while it updated the map) */
	__u64 map_busy;
	/* For the live status line (src/model/progress.rs), read once a
	 * second instead of the big maps: allocation events counted (past
	 * the filters), entries created in each aggregation map (counted
	 * only on the creation path), and, for leaks, objects added to and
	 * removed from the live map. */
	__u64 allocs;
	__u64 sites_created;
	__u64 stacks_created;
	__u64 procs_created;
	__u64 cgroups_created;
	__u64 live_added;
	__u64 live_removed;
	/* frees per source (enum kheap_source), beside the total above */
	__u64 source_frees[KHEAP_SOURCES];
	/* pages whose use was reclassified (page to slab) after counting */
	__u64 pages_reclassified;
	/* leaks: bytes of the page frees of pages not tracked (allocated
	 * before tracing), PAGE_SIZE << order each: the frees the
	 * accounting's page row needs beside the outstanding pages */
	__u64 page_bytes_freed_untracked;
	/* kmalloc events: a remembered cache of a call site found changed
	 * when asked again (bpf/slab_cache.bpf.h); up to
	 * KHEAP_KMALLOC_MEMO_USES events before may name the old one */
	__u64 cache_memo_stale;
};

/* One object allocated while tracking outstanding memory and not yet seen
 * freed, keyed by its address: one per live object, so kept small. */
struct live_obj {
	struct site_key site;
	__s64 stack_id; /* 0: no stack sampled */
	/* u32 is enough: kmalloc() and slab objects are far below 4 GiB. */
	__u32 bytes_req;
	__u32 bytes_alloc;
	__u32 tgid;
	/* charged to the memory cgroup (only computed with --by cgroup) */
	__u8 accounted;
	/* allocated in interrupt context (known with --by cgroup / --cgroup,
	 * and when its stack was sampled with cfg.stack_owners) */
	__u8 interrupt;
	__u8 _pad[2];
	/* jiffies64 at the allocation (see struct clock_sample) */
	__u64 ts;
	/* cgroup v2 id of the allocating task; 0 in interrupt context */
	__u64 cgroup;
};

/* leaks: one bucket of the object table, one cache line: the addresses of
 * the objects in its slots (0: free). */
#define KHEAP_LIVE_WAYS 8
struct live_bucket {
	__u64 ptr[KHEAP_LIVE_WAYS];
};

/* Tracked objects of a site whose address the allocator handed out again
 * while still tracked: their free happened on a path without a tracepoint
 * (kfree_bulk, kvfree_rcu batches) or was dropped (BPF recursion). Frees
 * that were seen are not summed in the kernel: user space derives them as
 * allocated - outstanding - unseen, which keeps the free path to one map
 * operation. */
struct site_unseen {
	__u64 count;
	__u64 bytes_alloc;
};

/* leaks: one object whose cache SLUB merged into another, and the cache
 * its code asked for (bpf/kheap/asked_cache.c). User space writes obj and
 * cache (the struct kmem_cache * it was allocated from); the `asked_cache`
 * program writes name, the creating protocol's name, or leaves it empty
 * when the object does not prove it. */
#define KHEAP_ASKED_BATCH 64
struct asked_slot {
	__u64 obj;
	__u64 cache;
	char name[KHEAP_CACHE_NAME_LEN];
};

struct asked_batch {
	struct asked_slot slot[KHEAP_ASKED_BATCH];
};

/* The kernel's tick counter and CLOCK_MONOTONIC read together. Two samples
 * give the tick rate: CONFIG_HZ is not readable everywhere (libbpf refuses
 * a __kconfig extern when the kernel config file is missing, as on Debian
 * 6.1 without /boot). */
struct clock_sample {
	__u64 jiffies;
	__u64 ns;
};

/* Which tasks are counted (task_filter.bpf.h). */
struct task_filter {
	/* kheap's own process: its map reads allocate in the kernel */
	__u32 ignore_tgid;
	__u8 pids;     /* only processes in pid_filter */
	__u8 comm_set; /* only tasks named comm */
	/* only tasks in a cgroup of cgroup_filter or below one */
	__u8 cgroups;
	char comm[KHEAP_COMM_LEN];
};

/* Settings user space fixes before load (read-only data, so the verifier
 * prunes the branches a run does not use). One object serves record, top,
 * slab and leaks: track_live is the leaks mode. */
struct kheap_config {
	__u64 min_size;
	__u64 max_size; /* 0: no upper bound */
	__u64 gfp_account_mask;
	/* SLAB_ACCOUNT, from the kernel's BTF like gfp_account_mask */
	__u64 slab_account_mask;
	struct task_filter filter;
	/* N-1 for about one stack in N; 0: every event */
	__u32 stack_sample_mask;
	/* leaks: track an object when hash(address) & mask == 0, so its
	 * allocation and its free are both traced or both skipped; 0: all */
	__u32 ptr_sample_mask;
	__u8 capture_stacks;
	__u8 by_process;
	__u8 by_cgroup;
	/* key stacks by who made them too (process and cgroup, or interrupt
	 * context), for the labels of exported profiles */
	__u8 stack_owners;
	__u8 latency_active; /* lat_starts is shared with the latency object */
	__u8 track_live;     /* remember every object until its free */
	/* bit (1 << enum kheap_source) per source beyond kmalloc whose
	 * programs are loaded; separates the layers between them */
	__u8 sources;
	__u8 page_shift;
	/* entries of backing_ranges in use: page ranges first, then vmap
	 * ranges; 0 of a kind: its events are not classified */
	__u32 backing_ranges;
	__u32 vmap_ranges;
	/* leaks: buckets of the object table (kheap/live_objects.c); 0: the
	 * object hash map alone (kernels without BPF atomics) */
	__u32 live_buckets;
	/* vmalloc through kprobes: allocations take the stack captured at
	 * alloc_vmap_area's entry (given_stacks), not their own */
	__u8 given_stacks;
	/* kfree events ask the object's slab for its cache (top, slab, serve:
	 * frees per cache; the kfunc only) */
	__u8 kfree_caches;
	/* an allocation's context is tested (kheap/interrupt_context.c): for
	 * the interrupt rows (by_cgroup, by_process) or a filter of tasks,
	 * which leaves interrupts out; one load on the default path */
	__u8 tests_context;
	/* kheap's own events are told by own_process_on_cpu, which a
	 * sched_switch program keeps, not by the tgid
	 * (kheap/own_process.c) */
	__u8 own_process_by_switch;
	/* bpf_get_current_task_btf() is there (5.11+, the kernel's own BTF):
	 * the current task's fields are loaded directly, not copied through
	 * bpf_probe_read_kernel() (20-40 ns less per event on 6.18) */
	__u8 task_btf;
};

/* cache_frees keys of kfree events (cfg.kfree_caches): the cache's address
 * with this bit set, apart from kmem_cache_free's (a struct kmem_cache is
 * aligned), so user space joins them to the kmalloc rows of that cache. */
#define KHEAP_KFREE_CACHE_TAG 2

/* --latency: time inside the allocator entry points, per call site. */
#define KHEAP_LAT_STARTS 16384

/* Per task: when and from where the timed allocator call was entered. Shared
 * with the record object, which takes its call sites from here while the
 * exit probes' trampolines hide the real return address. */
struct lat_start {
	__u64 ts;
	__u64 call_site;
	__u64 func_ip;
	/* Calls entered while this one runs, on the same task: an interrupt's
	 * allocation inside the timed one. They are not timed (one start per
	 * task) and must not take the outer call's start away. */
	__u32 nested;
	__u32 pad;
	/* The caller of the first of them, for the record object's sites. */
	__u64 nested_call_site;
};

struct lat_key {
	__u64 call_site; /* the caller; 0 if it could not be found */
	__u64 func_ip;	 /* the allocator function timed */
};

struct lat_stats {
	__u64 count;
	__u64 total_ns;
	__u64 hist[KHEAP_HIST_BUCKETS]; /* log2 buckets of nanoseconds */
};

struct lat_counters {
	__u64 missed_start; /* exits without a recorded entry */
	__u64 map_full;
	__u64 nested; /* calls inside a timed call on the same task, untimed */
};

#endif /* KHEAP_H */
