// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The benchmark's floor: programs that do nothing on the hooks kheap uses.
 * scripts/bench attaches them (examples/empty_tracer.rs) to measure what the
 * kernel charges for running any BPF program on a kmem event, so that kheap's
 * cost can be stated as a multiple of it.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define EMPTY(prog, tracepoint)    \
	SEC("raw_tp/" #tracepoint) \
	int prog(void *ctx)        \
	{                          \
		return 0;          \
	}

EMPTY(empty_kmalloc, kmalloc)
EMPTY(empty_cache_alloc, kmem_cache_alloc)
EMPTY(empty_kfree, kfree)
EMPTY(empty_cache_free, kmem_cache_free)
/* kheap's record tells its own process by the CPU's task switches */
EMPTY(empty_sched_switch, sched_switch)
