/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Reading the classic kmem tracepoint records through CO-RE: the one place
 * that knows their layouts across kernel versions (kheap.bpf.c), and the
 * other kernel structures the objects read whose layout changed (the cgroup
 * ancestors of task_filter.bpf.h). Include after vmlinux.h and the libbpf
 * headers (bpf_core_read.h).
 */
#ifndef KHEAP_KMEM_CLASSIC_BPF_H
#define KHEAP_KMEM_CLASSIC_BPF_H

#include "kheap.h"

/* Older layout of the kmalloc/kmem_cache_alloc records: before 6.1 both
 * events shared the kmem_alloc class. */
struct trace_event_raw_kmem_alloc___pre61 {
	unsigned long call_site;
	const void *ptr;
	size_t bytes_req;
	size_t bytes_alloc;
	unsigned long gfp_flags;
} __attribute__((preserve_access_index));

/* The classic record has no cache pointer; the cache name (6.18 added it as a
 * __data_loc string) identifies the cache instead, hashed into the key. */
static __always_inline __u64 name_key(const char *name)
{
	__u64 h = 0xcbf29ce484222325ULL; /* FNV-1a */
	char c[KHEAP_CACHE_NAME_LEN] = {};

	bpf_probe_read_kernel_str(c, sizeof(c), name);
#pragma unroll
	for (int i = 0; i < KHEAP_CACHE_NAME_LEN; i++) {
		if (!c[i])
			break;
		h = (h ^ (__u8)c[i]) * 0x100000001b3ULL;
	}
	/* never 0, which means "kmalloc" */
	return h | 1;
}

/* Whether the kernel charged the object to a memory cgroup, as the record
 * says (6.0+ kmem_cache_alloc has `accounted`); -1 when it has no such
 * field. */
struct trace_event_raw_kmem_cache_alloc___accounted {
	bool accounted;
} __attribute__((preserve_access_index));

/* The cache's name in the kmem_cache_alloc record (6.2+; 6.12's arm64
 * header, vmlinux/aarch64/, predates it). Laid out as in vmlinux/vmlinux.h,
 * so the x86 object's code is what it was with that header's type. */
struct trace_event_raw_kmem_cache_alloc___named {
	struct trace_entry ent;
	long unsigned int call_site;
	const void *ptr;
	u32 __data_loc_name;
} __attribute__((preserve_access_index));

/* Whether the kmem_cache_alloc and kmem_cache_free tracepoints pass the
 * cache (6.1+). Before, kmem_cache_alloc(_node) shared the kmem_alloc class
 * with kmalloc (call_site, ptr, bytes_req, bytes_alloc, gfp_flags) and
 * kmem_cache_free passed no cache (5.11-) or its name (5.12-6.0): the cache
 * is then found from the object's page (cache_of_page in slab_cache.bpf.h;
 * user space gives the bases on such kernels). A load-time constant: each
 * program keeps one branch. */
static __always_inline bool cache_events_pass_cache(void)
{
	return bpf_core_type_exists(struct trace_event_raw_kmem_cache_alloc);
}

/* The fields every allocation record layout has, read through CO-RE from
 * record r (of whichever flavor) into event e. */
#define READ_ALLOC_FIELDS(r, e)                                   \
	do {                                                      \
		(e)->call_site = BPF_CORE_READ(r, call_site);     \
		(e)->ptr = BPF_CORE_READ(r, ptr);                 \
		(e)->bytes_req = BPF_CORE_READ(r, bytes_req);     \
		(e)->bytes_alloc = BPF_CORE_READ(r, bytes_alloc); \
	} while (0)

/* One allocation event, whichever record layout it came in. */
struct kmem_alloc_event {
	__u64 call_site;
	const void *ptr;
	__u64 bytes_req;
	__u64 bytes_alloc;
	__u64 gfp_flags;
	/* kmem_cache_alloc only: the record's own verdict on memcg charging
	 * (1/0), or -1 when the record has none */
	int accounted;
	/* kmem_cache_alloc only: the cache's name when the record has it
	 * (6.18+), else NULL. */
	const char *name;
};

static __always_inline void read_kmalloc_record(void *ctx,
						struct kmem_alloc_event *e)
{
	if (bpf_core_type_exists(struct trace_event_raw_kmalloc)) {
		struct trace_event_raw_kmalloc *r = ctx;

		READ_ALLOC_FIELDS(r, e);
		e->gfp_flags = BPF_CORE_READ(r, gfp_flags);
	} else {
		struct trace_event_raw_kmem_alloc___pre61 *r = ctx;

		READ_ALLOC_FIELDS(r, e);
		e->gfp_flags = BPF_CORE_READ(r, gfp_flags);
	}
	e->name = NULL;
	e->accounted = -1;
}

static __always_inline void read_cache_alloc_record(void *ctx,
						    struct kmem_alloc_event *e)
{
	e->name = NULL;
	e->gfp_flags = 0;
	e->accounted = -1;
	if (bpf_core_type_exists(struct trace_event_raw_kmem_cache_alloc)) {
		struct trace_event_raw_kmem_cache_alloc *r = ctx;
		struct trace_event_raw_kmem_cache_alloc___accounted *a = ctx;
		struct trace_event_raw_kmem_cache_alloc___named *n = ctx;

		READ_ALLOC_FIELDS(r, e);
		e->gfp_flags = BPF_CORE_READ(r, gfp_flags);
		if (bpf_core_field_exists(a->accounted))
			e->accounted = BPF_CORE_READ(a, accounted);
		if (bpf_core_field_exists(n->__data_loc_name)) {
			__u32 loc = BPF_CORE_READ(n, __data_loc_name);

			e->name = (const char *)ctx + (loc & 0xFFFF);
		}
	} else {
		struct trace_event_raw_kmem_alloc___pre61 *r = ctx;

		READ_ALLOC_FIELDS(r, e);
		e->gfp_flags = BPF_CORE_READ(r, gfp_flags);
	}
}

/* The cache key of a classic kmem_cache_alloc event: its name hashed, or,
 * without a name, the object size is the best stand-in for a cache. */
static __always_inline __u64 classic_cache_key(const struct kmem_alloc_event *e)
{
	return e->name ? name_key(e->name) : ((e->bytes_alloc << 1) | 1);
}

/* The freed object of a classic kfree or kmem_cache_free record: before
 * 5.12 both events shared the kmem_free class. */
struct trace_event_raw_kmem_free___pre512 {
	unsigned long call_site;
	const void *ptr;
} __attribute__((preserve_access_index));

static __always_inline const void *free_record_ptr(void *ctx)
{
	if (bpf_core_type_exists(struct trace_event_raw_kfree))
		return BPF_CORE_READ((struct trace_event_raw_kfree *)ctx, ptr);
	return BPF_CORE_READ((struct trace_event_raw_kmem_free___pre512 *)ctx,
			     ptr);
}

/* The cache name of a classic kmem_cache_free record (5.12+), or NULL. */
static __always_inline const char *cache_free_record_name(void *ctx)
{
	struct trace_event_raw_kmem_cache_free *r = ctx;

	if (!bpf_core_type_exists(struct trace_event_raw_kmem_cache_free))
		return NULL;
	if (bpf_core_field_exists(r->__data_loc_name)) {
		__u32 loc = BPF_CORE_READ(r, __data_loc_name);

		return (const char *)r + (loc & 0xFFFF);
	}
	return NULL;
}

/* The cgroup v2 ancestors of the current task (--cgroup). Tracing programs
 * may call bpf_get_current_ancestor_cgroup_id from 5.14 on; before, the
 * verifier refuses it ("unknown func"). Those kernels keep each cgroup's
 * ancestors' ids in the cgroup itself (`ancestor_ids[level]`, the root's at
 * 0 and its own at `level`), until 6.0 replaced them with pointers
 * (`ancestors[]`): where the ids are there they are read through CO-RE,
 * which gives what the helper gives; elsewhere the helper is called. A
 * load-time constant: each kernel's programs keep one branch. */
struct cgroup___ancestor_ids {
	int level;
	__u64 ancestor_ids[];
} __attribute__((preserve_access_index));

static __always_inline bool cgroup_ancestors_by_core(void)
{
	return bpf_core_field_exists(struct cgroup___ancestor_ids,
				     ancestor_ids);
}

/* The current task's cgroup v2 cgroup when the ancestors are read through
 * CO-RE, else NULL (the helper needs none). */
static __always_inline struct cgroup___ancestor_ids *ancestors_of_current(void)
{
	struct task_struct *t;

	if (!cgroup_ancestors_by_core())
		return NULL;
	t = (void *)bpf_get_current_task();
	return (void *)BPF_CORE_READ(t, cgroups, dfl_cgrp);
}

/* The id of the ancestor at `level` (0 is the root) of the current task's
 * cgroup `cg` (from ancestors_of_current()), or 0 when the cgroup is not
 * that deep, as the helper answers. */
static __always_inline __u64
ancestor_cgroup_id(struct cgroup___ancestor_ids *cg, int level)
{
	__u64 id = 0;

	if (!cgroup_ancestors_by_core())
		return bpf_get_current_ancestor_cgroup_id(level);
	if (!cg || level < 0 || level > BPF_CORE_READ(cg, level))
		return 0;
	bpf_probe_read_kernel(
		&id, sizeof(id),
		(void *)cg +
			bpf_core_field_offset(struct cgroup___ancestor_ids,
					      ancestor_ids) +
			level * sizeof(__u64));
	return id;
}

/* Before 6.1 an address space's mappings were a red-black tree (mm_rb,
 * each vm_area_struct's vm_rb), now a maple tree: malloc's legacy path
 * (kernels without bpf_find_vma, 5.17) walks the tree. */
struct mm_struct___rb {
	struct rb_root mm_rb;
} __attribute__((preserve_access_index));

struct vm_area_struct___rb {
	struct rb_node vm_rb;
} __attribute__((preserve_access_index));

#endif /* KHEAP_KMEM_CLASSIC_BPF_H */
