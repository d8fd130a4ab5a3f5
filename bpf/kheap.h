/* SPDX-License-Identifier: GPL-2.0 */
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
	/* struct kmem_cache * for kmem_cache_alloc(); 0 for kmalloc(), whose
	 * events carry no cache, so the size class stands in for it. */
	__u64 cache;
	__u32 kmalloc_size;
	__u32 kmalloc_accounted;
};

struct stack_key {
	struct site_key site;
	__s64 stack_id;
};

struct cache_frees {
	__u64 frees;
};

struct cache_name {
	char name[KHEAP_CACHE_NAME_LEN];
};

struct proc_info {
	char comm[KHEAP_COMM_LEN];
};

/* Per-CPU event counters: everything that is dropped, sampled or only
 * counted is reported, never silently lost. */
struct counters {
	__u64 frees;
	__u64 frees_null;
	__u64 stack_samples;
	__u64 lost_stack_collision;
	__u64 lost_stack_other;
	__u64 map_full_sites;
	__u64 map_full_stacks;
	__u64 map_full_procs;
	__u64 map_full_caches;
	__u64 alloc_failed;
};

/* Settings user space fixes before load (read-only data, so the verifier
 * prunes the branches a run does not use). */
struct kheap_config {
	__u64 min_size;
	__u64 max_size; /* 0: no upper bound */
	__u64 gfp_account_mask;
	__u32 stack_sample_mask; /* N-1 for about one stack in N; 0: every
				    event */
	__u8 filter_pids;
	__u8 filter_comm;
	__u8 by_process;
	__u8 capture_stacks;
	__u8 latency_active; /* lat_starts is shared with the latency object */
	char comm[KHEAP_COMM_LEN];
};

/* --latency: time inside the allocator entry points, per call site. */
#define KHEAP_LAT_STARTS 16384

/* Per task: when and from where the timed allocator call was entered. Shared
 * with the record object, which takes its call sites from here while the
 * exit probes' trampolines hide the real return address. */
struct lat_start {
	__u64 ts;
	__u64 call_site;
	__u64 func_ip;
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
};

#endif /* KHEAP_H */
