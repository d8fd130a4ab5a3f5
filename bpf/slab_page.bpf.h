/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The slab cache of a direct-mapped address through its struct page, as the
 * kernel's virt_to_slab() does with SPARSEMEM_VMEMMAP: the address's page is
 * `map + ((ptr - base) >> page_shift)` struct pages, its compound head holds
 * slab_cache. `base` is a direct-map address and `map` its struct page
 * (x86-64: page_offset_base and vmemmap_base; arm64: the address and page of
 * physical address 0, src/kernel/kmem/page_map.rs). Shared by kheap's event
 * path (slab_cache.bpf.h) and the check of the bases
 * (page_map.bpf.c), so that what is checked is what runs.
 *
 * Include after vmlinux.h and the libbpf headers (bpf_core_read.h).
 */
#ifndef KHEAP_SLAB_PAGE_BPF_H
#define KHEAP_SLAB_PAGE_BPF_H

/* Before 5.17 the slab's fields were in struct page itself. */
struct page___preslab {
	struct kmem_cache *slab_cache;
} __attribute__((preserve_access_index));

/* 7.1 renamed a tail page's compound_head to compound_info: bit 0 still
 * marks a tail, and the rest is the head's address or, where the kernel
 * uses HugeTLB's vmemmap optimization with a power-of-2 struct page, a mask
 * that turns the tail's address into the head's (page & info). */
struct page___compound_info {
	unsigned long compound_info;
} __attribute__((preserve_access_index));

/* The head of `page`'s compound page (itself if it is none). */
static __always_inline struct page *compound_head_of(struct page *page)
{
	__u64 info;

	if (bpf_core_field_exists(struct page___compound_info, compound_info)) {
		info = BPF_CORE_READ((struct page___compound_info *)page,
				     compound_info);
		if (!(info & 1))
			return page;
		/* A head lies at or below its tails; a mask (its high bits
		 * all set) lies above every struct page. */
		if (info - 1 <= (__u64)page)
			return (void *)(info - 1);
		return (void *)((__u64)page & info);
	}
	info = BPF_CORE_READ(page, compound_head);
	return info & 1 ? (void *)(info - 1) : page;
}

/* The slab cache of the page that holds `ptr` (NULL below `base`, or where
 * a read fails). Not checked to be a slab: callers compare the cache's
 * size with what they know of the object. */
static __always_inline struct kmem_cache *
slab_cache_at(const void *ptr, __u64 base, __u64 map, __u32 page_shift)
{
	struct page *page;

	if ((__u64)ptr < base)
		return NULL;
	page = (void *)(map + (((__u64)ptr - base) >> page_shift) *
				      bpf_core_type_size(struct page));
	/* A tail page of a multi-page slab leads to its head. */
	page = compound_head_of(page);
	if (bpf_core_type_exists(struct slab))
		return BPF_CORE_READ((struct slab *)page, slab_cache);
	return BPF_CORE_READ((struct page___preslab *)page, slab_cache);
}

#endif /* KHEAP_SLAB_PAGE_BPF_H */
