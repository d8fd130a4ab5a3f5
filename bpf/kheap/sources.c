/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The kernel allocators beside the slab (--source): the page allocator,
 * vmalloc and percpu. Each event goes through the same on_alloc()/on_free()
 * as kmalloc, under a site key whose `source` names the allocator, so sites,
 * stacks, processes, cgroups and live objects work alike for all of them.
 *
 * raw_tp programs (and, for vmalloc before 6.2, fentry or kprobes on the
 * functions the tracepoints sit in): the tracepoints' arguments are the
 * tracepoints' prototypes, which are the same on 6.1, 6.12 and 6.18, and they
 * cost what tp_btf costs. Their autoload is off unless the run asks for the
 * source, so the default (slab only) loads and pays for none of this.
 *
 * A part of kheap.bpf.c, not a header (see its first comment):
 * included there once, after on_alloc() and on_free().
 */

/* Frees of a source: the total free counter and the source's own. Under
 * leaks, true when the object was not tracked. */
static __always_inline bool count_source_free(const void *ptr, __u32 source)
{
	struct counters *c;

	if (cfg.track_live)
		return track_free((__u64)ptr);
	if (task_left_out(true))
		return false;
	c = counters_slot();
	if (!c)
		return false;
	if (!ptr) {
		c->frees_null++;
		return false;
	}
	c->frees++;
	c->source_frees[source & (KHEAP_SOURCES - 1)]++;
	return false;
}

/* ---- page allocator: kmem:mm_page_alloc, mm_page_free ---- */

KHEAP_MAP(BPF_MAP_TYPE_ARRAY, backing_ranges, __u32, struct backing_range,
	  KHEAP_BACKING_RANGES);

KHEAP_PERCPU_SLOT(backing_scratch, struct backing_frames);

/* The label of the first of ranges [first, end) of backing_ranges that holds
 * one of the event's innermost frames, or `none`. A short stack
 * (KHEAP_BACKING_DEPTH frames) keeps the unwinding cheap. */
static __always_inline __u32 stack_label(void *ctx, __u32 first, __u32 end,
					 __u32 none)
{
	__u32 zero = 0;
	struct backing_frames *f;
	long len;

	if (first >= end)
		return none;
	f = bpf_map_lookup_elem(&backing_scratch, &zero);
	if (!f)
		return none;
	len = bpf_get_stack(ctx, f->ip, sizeof(f->ip), 0);
	if (len <= 0)
		return none;
	for (__u32 i = 0; i < KHEAP_BACKING_DEPTH; i++) {
		__u64 ip;

		if (i >= len / 8)
			break;
		ip = f->ip[i];
		for (__u32 r = 0; r < KHEAP_BACKING_RANGES; r++) {
			__u32 idx = first + r;
			struct backing_range *b;

			if (idx >= end)
				break;
			b = bpf_map_lookup_elem(&backing_ranges, &idx);
			if (b && ip >= b->start && ip < b->end)
				return b->label;
		}
	}
	return none;
}

/* What a page allocation is for: a page whose innermost frames pass
 * through a slab, vmalloc or percpu function that allocates backing pages
 * (allocate_slab, __vmalloc_area_node, pcpu_alloc_pages…; the ranges come
 * from user space) backs that source, which counts the bytes already. The
 * short stack leaves out pages allocated deeper below those functions (the
 * page tables of a vmalloc mapping). */
static __always_inline __u8 page_use(void *ctx)
{
	return stack_label(ctx, 0, cfg.backing_ranges, KHEAP_PAGE_DIRECT);
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
		.kmalloc_accounted = flag_of(gfp_flags & cfg.gfp_account_mask),
		.source = KHEAP_SOURCE_PAGE,
	};

	if (page)
		key.page_use = page_use(ctx);

	on_alloc(ctx, false, &key, page, bytes, bytes, key.kmalloc_accounted,
		 NULL, 0);
	return 0;
}

/* Every page freed passes free_pages_prepare(), which fires mm_page_free,
 * also those freed in batches (free_unref_folios/free_unref_page_list),
 * which fire mm_page_free_batched besides: that one is not traced, or each
 * batched page would count as two frees. */
SEC("raw_tp/mm_page_free")
int page_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 order = ctx->args[1];

	/* A page allocated before tracing: the accounting's page row needs
	 * its bytes (MemFree rises by them), which no live entry holds. */
	if (count_source_free((const void *)ctx->args[0], KHEAP_SOURCE_PAGE))
		COUNT_ADD(page_bytes_freed_untracked,
			  1ULL << ((cfg.page_shift + order) & 63));
	return 0;
}

/* ---- vmalloc: vmalloc:alloc_vmap_area, free_vmap_area_noflush ---- */

/* Every vmap area: vmalloc proper, vmap, ioremap and vm_map_ram blocks,
 * told apart by the function on the stack that asked for the area
 * (__vmalloc_node_range, vmap, __ioremap_caller…; ranges after the page
 * ones). Exact per area, unlike the sampled stacks, and only vmalloc events
 * pay for the unwinding (they are rare). The size is the area's, guard page
 * included; the free event has no size, so leaks keeps it with the live
 * area. */
static __always_inline void count_vmap_area(void *ctx, __u64 addr, __u64 size,
					    __u32 kind)
{
	struct site_key key = {
		.source = KHEAP_SOURCE_VMALLOC,
		.vmap_kind = kind,
	};

	on_alloc(ctx, false, &key, (const void *)addr, size, size, false, NULL,
		 0);
}

/* The kind of the area being allocated, from the current stack. */
static __always_inline __u32 vmap_kind_here(void *ctx)
{
	return stack_label(ctx, cfg.backing_ranges,
			   cfg.backing_ranges + cfg.vmap_ranges,
			   KHEAP_VMAP_OTHER);
}

SEC("raw_tp/alloc_vmap_area")
int vmalloc_alloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	/* failed: addr holds an error, not an area */
	count_vmap_area(ctx, ctx->args[5] ? 0 : ctx->args[0], ctx->args[1],
			vmap_kind_here(ctx));
	return 0;
}

SEC("raw_tp/free_vmap_area_noflush")
int vmalloc_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	count_source_free((const void *)ctx->args[0], KHEAP_SOURCE_VMALLOC);
	return 0;
}

/* Kernels before 6.2 (6.1) have no vmalloc tracepoints: the functions they
 * sit in are hooked instead, fentry where allowed, kprobes otherwise (user
 * space loads one pair, only then). The area alloc_vmap_area() returns
 * holds its start and end (the tracepoint's addr and size: same quantity,
 * guard page included); reading them there needs none of its arguments,
 * whose number changes between kernels. */
static __always_inline void
count_returned_area(void *ctx, const struct vmap_area *va, __u32 kind)
{
	__u64 start;

	/* ERR_PTR(-ENOMEM/-EBUSY): a failed allocation of unknown size */
	if ((unsigned long)va >= (unsigned long)-4095) {
		count_vmap_area(ctx, 0, 0, kind);
		return;
	}
	start = BPF_CORE_READ(va, va_start);
	count_vmap_area(ctx, start, BPF_CORE_READ(va, va_end) - start, kind);
}

static __always_inline void count_area_free(const struct vmap_area *va)
{
	count_source_free((const void *)BPF_CORE_READ(va, va_start),
			  KHEAP_SOURCE_VMALLOC);
}

SEC("fexit/alloc_vmap_area")
int vmalloc_alloc_fexit(__u64 *ctx)
{
	__u64 ret = 0;

	bpf_get_func_ret(ctx, &ret);
	count_returned_area(ctx, (const struct vmap_area *)ret,
			    vmap_kind_here(ctx));
	return 0;
}

SEC("fentry/free_vmap_area_noflush")
int BPF_PROG(vmalloc_free_fentry, struct vmap_area *va)
{
	count_area_free(va);
	return 0;
}

/* On the kprobe path the area is labelled, and its stack captured, at
 * alloc_vmap_area's entry: before Linux 5.15 a kretprobe's stack ends at
 * kretprobe_trampoline, and the caller that asked for the area is not on
 * it. Kept per thread until the return counts the area (a thread is in one
 * alloc_vmap_area at a time; an entry whose return was missed is replaced
 * by the thread's next). */
struct vmap_entry {
	__u32 kind;
	__u32 pad;
	long len; /* bytes of frames; <= 0: no stack */
	struct stack_frames frames;
};

static const struct vmap_entry no_vmap_entry;

/* Resized from user space: 1 entry unless vmalloc goes through kprobes. */
KHEAP_HASH(vmap_entries, __u32, struct vmap_entry, 1024);

SEC("kprobe/alloc_vmap_area")
int BPF_KPROBE(vmalloc_alloc_kprobe)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct vmap_entry *e;

	bpf_map_update_elem(&vmap_entries, &tid, &no_vmap_entry, BPF_ANY);
	e = bpf_map_lookup_elem(&vmap_entries, &tid);
	if (!e)
		return 0;
	e->kind = vmap_kind_here(ctx);
	if (cfg.capture_stacks)
		e->len = bpf_get_stack(ctx, e->frames.ip, sizeof(e->frames.ip),
				       0);
	return 0;
}

SEC("kretprobe/alloc_vmap_area")
int BPF_KRETPROBE(vmalloc_alloc_kretprobe, struct vmap_area *va)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), zero = 0, level;
	struct vmap_entry *e = bpf_map_lookup_elem(&vmap_entries, &tid);
	struct stack_frames *scratch;
	struct given_stack *g;
	int taken;

	if (!e) {
		/* its entry was not seen (attached in between) */
		count_returned_area(ctx, va, vmap_kind_here(ctx));
		return 0;
	}
	taken = e->len > 0 ? scratch_take() : -1;
	level = taken;
	scratch =
		taken >= 0 ? bpf_map_lookup_elem(&stack_scratch, &level) : NULL;
	g = bpf_map_lookup_elem(&given_stacks, &zero);
	if (scratch && g) {
		bpf_probe_read_kernel(scratch, sizeof(*scratch), &e->frames);
		g->ctx = (__u64)ctx;
		g->len = e->len;
		g->level = level;
	}
	count_returned_area(ctx, va, e->kind);
	if (g)
		g->ctx = 0;
	if (taken >= 0)
		scratch_release();
	bpf_map_delete_elem(&vmap_entries, &tid);
	return 0;
}

SEC("kprobe/free_vmap_area_noflush")
int BPF_KPROBE(vmalloc_free_kprobe, struct vmap_area *va)
{
	count_area_free(va);
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
		.kmalloc_accounted = flag_of(gfp_flags & cfg.gfp_account_mask),
		.source = KHEAP_SOURCE_PERCPU,
	};

	on_alloc(ctx, false, &key, (const void *)ctx->args[7], ctx->args[3],
		 ctx->args[8], key.kmalloc_accounted, NULL, 0);
	return 0;
}

SEC("raw_tp/percpu_free_percpu")
int percpu_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	count_source_free((const void *)ctx->args[2], KHEAP_SOURCE_PERCPU);
	return 0;
}
