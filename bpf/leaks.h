/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Structs shared by bpf/leaks.bpf.c (outstanding-object tracking) and the
 * Rust side (src/leaks/), which uses the skeleton's generated types.
 */
#ifndef KHEAP_LEAKS_H
#define KHEAP_LEAKS_H

#include "kheap.h"

/* One object allocated while tracing and not yet seen freed, keyed by its
 * address. Kept small (48 bytes): there is one per live object. */
struct live_obj {
	struct site_key site;
	/* Sampled (or, with exact stacks, every) allocation stack; < 0: none.
	 */
	__s32 stack_id;
	/* u32 is enough: kmalloc() and slab objects are far below 4 GiB. */
	__u32 bytes_req;
	__u32 bytes_alloc;
	__u32 tgid;
	/* jiffies64 at the allocation (see struct clock_sample). */
	__u64 ts;
};

/* Tracked objects of a site whose address the allocator handed out again
 * while still tracked: their free happened on a path without a tracepoint
 * (kfree_bulk, kvfree_rcu batches) or was dropped (BPF recursion). Frees that
 * were seen are not summed in the kernel: user space derives them as
 * allocated - outstanding - unseen, which keeps the free path to one map
 * operation. */
struct site_unseen {
	__u64 count;
	__u64 bytes_alloc;
};

/* Per-CPU event counters: nothing is dropped silently. */
struct leak_counters {
	/* Frees of objects allocated before tracing began (or never tracked
	 * because a map was full): ignored, so they are no negative growth. */
	__u64 frees_untracked;
	__u64 frees_null;
	__u64 alloc_failed;
	/* An allocation returned an address that was still tracked. */
	__u64 reused_live;
	__u64 map_full_live;
	/* A map update refused because its bucket lock was held on this CPU
	 * (an interrupt hit the tracer while it updated the same map). */
	__u64 map_busy;
	__u64 map_full_sites;
	__u64 map_full_stacks;
	__u64 stack_samples;
	__u64 lost_stack_collision;
	__u64 lost_stack_other;
};

/* The kernel's tick counter and CLOCK_MONOTONIC read together. Two samples
 * give the tick rate: CONFIG_HZ is not readable everywhere (libbpf refuses
 * to load a __kconfig extern when the kernel config file is missing, as on
 * Debian 6.1 without /boot). */
struct clock_sample {
	__u64 jiffies;
	__u64 ns;
};

struct leaks_config {
	__u64 min_size;
	__u64 max_size; /* 0: no upper bound */
	__u64 gfp_account_mask;
	/* Track an object when hash(address) & mask == 0: its allocation and
	 * its free are always both traced or both skipped. 0: every object. */
	__u32 ptr_sample_mask;
	/* Capture a stack when (random & mask) == 0; 0: every allocation. */
	__u32 stack_sample_mask;
	__u8 capture_stacks;
	__u8 filter_pids;
	__u8 filter_comm;
	__u8 _pad;
	char comm[KHEAP_COMM_LEN];
};

#endif /* KHEAP_LEAKS_H */
