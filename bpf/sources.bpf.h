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

KHEAP_MAP(BPF_MAP_TYPE_ARRAY, backing_ranges, __u32, struct backing_range,
	  KHEAP_BACKING_RANGES);

KHEAP_PERCPU_SLOT(backing_scratch, struct backing_frames);

/* What a page allocation is for: a page whose innermost frames pass
 * through a slab, vmalloc or percpu function that allocates backing pages
 * (allocate_slab, __vmalloc_area_node, pcpu_alloc_pages…; the ranges come
 * from user space) backs that source, which counts the bytes already. A
 * short stack (KHEAP_BACKING_DEPTH frames) keeps the unwinding cheap and
 * leaves out pages allocated deeper below those functions (the page tables
 * of a vmalloc mapping). */
static __always_inline __u8 page_use(void *ctx)
{
	__u32 zero = 0;
	struct backing_frames *f;
	long len;

	if (!cfg.backing_ranges)
		return KHEAP_PAGE_DIRECT;
	f = bpf_map_lookup_elem(&backing_scratch, &zero);
	if (!f)
		return KHEAP_PAGE_DIRECT;
	len = bpf_get_stack(ctx, f->ip, sizeof(f->ip), 0);
	if (len <= 0)
		return KHEAP_PAGE_DIRECT;
	for (__u32 i = 0; i < KHEAP_BACKING_DEPTH; i++) {
		__u64 ip;

		if (i >= len / 8)
			break;
		ip = f->ip[i];
		for (__u32 r = 0; r < KHEAP_BACKING_RANGES; r++) {
			__u32 idx = r;
			struct backing_range *b;

			if (r >= cfg.backing_ranges)
				break;
			b = bpf_map_lookup_elem(&backing_ranges, &idx);
			if (b && ip >= b->start && ip < b->end)
				return b->page_use;
		}
	}
	return KHEAP_PAGE_DIRECT;
}

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
	};

	if (page)
		key.page_use = page_use(ctx);

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
