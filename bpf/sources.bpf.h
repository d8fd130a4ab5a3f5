/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The kernel allocators beside the slab (--source): the page allocator,
 * vmalloc and percpu. Each event goes through the same on_alloc()/on_free()
 * as kmalloc, under a site key whose `source` names the allocator, so sites,
 * stacks, processes, cgroups and live objects work alike for all of them.
 *
 * Only raw_tp programs: their arguments are the tracepoints' prototypes,
 * which are the same on 6.1, 6.12 and 6.18, and they cost what tp_btf
 * costs. Their autoload is off unless the run asks for the source, so the
 * default (slab only) loads and pays for none of this.
 *
 * Included by kheap.bpf.c after on_alloc() and on_free().
 */
#ifndef KHEAP_SOURCES_BPF_H
#define KHEAP_SOURCES_BPF_H

/* Frees of a source: the total free counter and the source's own. */
static __always_inline void count_source_free(const void *ptr, __u32 source)
{
	struct counters *c;

	if (cfg.track_live) {
		track_free((__u64)ptr);
		return;
	}
	if (filter_active(&cfg.filter) &&
	    !task_passes(&cfg.filter, bpf_get_current_pid_tgid() >> 32))
		return;
	c = counters_get();
	if (!c)
		return;
	if (!ptr) {
		c->frees_null++;
		return;
	}
	c->frees++;
	c->source_frees[source & (KHEAP_SOURCES - 1)]++;
}

/* ---- page allocator: kmem:mm_page_alloc, mm_page_free(_batched) ---- */

/* Pages carry no call site: the site is (order, use) and the sampled stacks
 * name the callers. Live pages are keyed by their struct page. */
SEC("raw_tp/mm_page_alloc")
int page_alloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const void *page = (const void *)ctx->args[0];
	__u32 order = ctx->args[1];
	__u64 gfp_flags = ctx->args[2];
	__u64 bytes = 1ULL << ((cfg.page_shift + order) & 63);
	struct site_key key = {
		.kmalloc_size = order,
		.kmalloc_accounted = !!(gfp_flags & cfg.gfp_account_mask),
		.source = KHEAP_SOURCE_PAGE,
		.page_use = KHEAP_PAGE_DIRECT,
	};

	on_alloc(ctx, false, &key, page, bytes, bytes, key.kmalloc_accounted,
		 NULL, NULL);
	return 0;
}

SEC("raw_tp/mm_page_free")
int page_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	count_source_free((const void *)ctx->args[0], KHEAP_SOURCE_PAGE);
	return 0;
}

SEC("raw_tp/mm_page_free_batched")
int page_free_batched_raw(struct bpf_raw_tracepoint_args *ctx)
{
	count_source_free((const void *)ctx->args[0], KHEAP_SOURCE_PAGE);
	return 0;
}

/* ---- vmalloc: vmalloc:alloc_vmap_area, free_vmap_area_noflush ---- */

/* Every vmap area: vmalloc proper, vmap, ioremap and vm_map_ram blocks. The
 * size includes the guard page; the free event has no size, so leaks keeps
 * it with the live area. Kernels before 6.x (6.1) have no such tracepoint. */
SEC("raw_tp/alloc_vmap_area")
int vmalloc_alloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 addr = ctx->args[0];
	__u64 size = ctx->args[1];
	struct site_key key = {.source = KHEAP_SOURCE_VMALLOC};

	/* failed: addr holds an error, not an area */
	if (ctx->args[5])
		addr = 0;
	on_alloc(ctx, false, &key, (const void *)addr, size, size, false, NULL,
		 NULL);
	return 0;
}

SEC("raw_tp/free_vmap_area_noflush")
int vmalloc_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	count_source_free((const void *)ctx->args[0], KHEAP_SOURCE_VMALLOC);
	return 0;
}

/* ---- percpu: percpu:percpu_alloc_percpu, percpu_free_percpu ---- */

/* bytes_alloc is the real footprint: size on every possible CPU, plus the
 * memcg pointers the kernel keeps per object. */
SEC("raw_tp/percpu_alloc_percpu")
int percpu_alloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 gfp_flags = ctx->args[9];
	struct site_key key = {
		.call_site = ctx->args[0],
		.kmalloc_accounted = !!(gfp_flags & cfg.gfp_account_mask),
		.source = KHEAP_SOURCE_PERCPU,
	};

	on_alloc(ctx, false, &key, (const void *)ctx->args[7], ctx->args[3],
		 ctx->args[8], key.kmalloc_accounted, NULL, NULL);
	return 0;
}

SEC("raw_tp/percpu_free_percpu")
int percpu_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	count_source_free((const void *)ctx->args[2], KHEAP_SOURCE_PERCPU);
	return 0;
}

#endif /* KHEAP_SOURCES_BPF_H */
