// SPDX-License-Identifier: GPL-2.0
/*
 * The benchmark's floor: programs that do nothing on the hooks kheap uses.
 * scripts/bench attaches them (examples/empty_tracer.rs) to measure what the
 * kernel charges for running any BPF program on a kmem event, so that kheap's
 * cost can be stated as a multiple of it.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

SEC("raw_tp/kmalloc")
int empty_kmalloc(void *ctx)
{
	return 0;
}

SEC("raw_tp/kmem_cache_alloc")
int empty_cache_alloc(void *ctx)
{
	return 0;
}

SEC("raw_tp/kfree")
int empty_kfree(void *ctx)
{
	return 0;
}

SEC("raw_tp/kmem_cache_free")
int empty_cache_free(void *ctx)
{
	return 0;
}
