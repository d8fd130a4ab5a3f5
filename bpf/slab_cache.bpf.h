/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The slab cache a kmalloc'ed object really lives in. The kmalloc
 * tracepoint names no cache, and the size is no way to guess it: since 6.11
 * kmem_buckets_alloc() (msg_msg, memdup_user) allocates from bucket caches
 * of its own, CONFIG_RANDOM_KMALLOC_CACHES spreads kmalloc over
 * kmalloc-rnd-NN-<size> copies, and accounted memory lives in kmalloc-cg-*.
 * The object's slab knows: address -> struct page (the direct map) -> its
 * head page -> slab_cache, as the kernel's virt_to_slab() does
 * (slab_page.bpf.h).
 *
 * Include after vmlinux.h and the libbpf headers (bpf_core_read.h).
 */
#ifndef KHEAP_SLAB_CACHE_BPF_H
#define KHEAP_SLAB_CACHE_BPF_H

#include "maps.bpf.h"
#include "kheap.h"
#include "arch.bpf.h"
#include "slab_page.bpf.h"

/* 6.13+ names the cache of an address itself: a kfunc of the kernel's
 * common set, which every kind of program may call (tp_btf, raw_tp and
 * classic tracepoints alike). libbpf resolves a kfunc extern through the
 * kernel's own BTF and refuses to load an object that has one where the
 * kernel exposes none, even with a BTF file given (--btf): build.rs also
 * compiles this object with KHEAP_NO_KFUNCS for those kernels. Where the
 * kernel has no such kfunc, the call is left in a branch the verifier
 * knows is never taken (bpf_ksym_exists). */
#ifdef KHEAP_NO_KFUNCS
#define kmem_cache_kfunc_exists() false
#else
extern struct kmem_cache *bpf_get_kmem_cache(__u64 addr) __ksym __weak;
#define kmem_cache_kfunc_exists() bpf_ksym_exists(bpf_get_kmem_cache)
#endif

/* Without the kfunc (before 6.13, or no BTF of the kernel's own), the page
 * is found through the direct map and vmemmap bases (slab_page.bpf.h).
 * x86-64: both are variables randomized with KASLR; user space looks their
 * addresses up in /proc/kallsyms (data symbols are listed with
 * CONFIG_KALLSYMS_ALL, as distribution kernels have), and they are read at
 * the first event. Not __ksym externs: libbpf would read all of kallsyms on
 * every load of the object, which takes seconds on slow machines. arm64:
 * the bases are compile-time constants of the kernel's, which user space
 * derives from the kernel's data and checks before the load
 * (src/kernel/kmem/page_map.rs), and stores in direct_map_base and
 * vmemmap_base below. 0: unknown, and kmalloc events keep no cache (user
 * space says so in the report). */
const volatile __u64 direct_map_base_addr = 0;
const volatile __u64 vmemmap_base_addr = 0;
/* Resolve kmalloc caches at all (user space clears it where it cannot). */
const volatile __u8 resolve_kmalloc_caches = 0;

/* The bases' values, read once (they never change after boot): a .bss load
 * per event instead of two probe reads. Set before the load on arm64. */
__u64 direct_map_base = 0;
__u64 vmemmap_base = 0;
/* log2 of the running kernel's page size (set by user space; arm64 kernels
 * have 4, 16 or 64 KiB pages, x86-64's are 4 KiB: KHEAP_SLAB_PAGE_SHIFT). */
const volatile __u8 slab_page_shift = 12;

/* Objects up to 2 pages come from kmalloc caches (SLUB's
 * KMALLOC_MAX_CACHE_SIZE); larger ones from the page allocator
 * (kmalloc_large), whose pages have no slab to ask. */
#define KHEAP_KMALLOC_MAX_CACHE_SIZE (2ULL << KHEAP_SLAB_PAGE_SHIFT)

static __always_inline struct kmem_cache *cache_of_page(const void *ptr)
{
	__u64 base = direct_map_base, map = vmemmap_base;

	if (!base || !map) {
		if (!direct_map_base_addr || !vmemmap_base_addr)
			return NULL;
		bpf_probe_read_kernel(&base, sizeof(base),
				      (const void *)direct_map_base_addr);
		bpf_probe_read_kernel(&map, sizeof(map),
				      (const void *)vmemmap_base_addr);
		if (!base || !map)
			return NULL;
		direct_map_base = base;
		vmemmap_base = map;
	}
	return slab_cache_at(ptr, base, map, KHEAP_SLAB_PAGE_SHIFT);
}

/* Whether a kmalloc event's object is looked up in its slab: resolution on,
 * an object, and one of at most KHEAP_KMALLOC_MAX_CACHE_SIZE bytes (the
 * event's bytes_alloc; larger ones are no slab objects). */
static __always_inline bool kmalloc_cache_wanted(const void *ptr, __u64 alloc)
{
	return resolve_kmalloc_caches && ptr &&
	       alloc <= KHEAP_KMALLOC_MAX_CACHE_SIZE;
}

/* The cache of a kmalloc'ed object, asked of the kernel (6.13+), or NULL. The
 * answer is checked against the event: a kmalloc event's bytes_alloc is its
 * cache's object size, so a cache of another size is not the object's and is
 * not used. A typed pointer: a plain load, no helper call. */
static __always_inline struct kmem_cache *kmalloc_cache_kfunc(const void *ptr,
							      __u64 alloc)
{
#ifdef KHEAP_NO_KFUNCS
	return NULL;
#else
	struct kmem_cache *s = bpf_get_kmem_cache((__u64)ptr);

	return s && s->size == alloc ? s : NULL;
#endif
}

/* The cache a kfree()'d object lives in, or 0: asked of the kernel's kfunc
 * only (6.13+). The page walk of older kernels would need
 * the page's slab flag first: a kfree() of a kmalloc_large() object has no
 * slab, and its page's slab_cache is some other field. */
static __always_inline __u64 kfree_cache_kfunc(const void *ptr)
{
#ifdef KHEAP_NO_KFUNCS
	return 0;
#else
	struct kmem_cache *s;

	if (!ptr || !kmem_cache_kfunc_exists())
		return 0;
	s = bpf_get_kmem_cache((__u64)ptr);
	return s ? (__u64)s : 0;
#endif
}

/* The same through the object's page (kernels without the kfunc): its
 * address, or KHEAP_CACHE_UNRESOLVED when none of the event's size was
 * found. */
static __always_inline __u64 kmalloc_cache_by_page(const void *ptr, __u64 alloc)
{
	struct kmem_cache *s = cache_of_page(ptr);

	if (!s || BPF_CORE_READ(s, size) != alloc)
		return KHEAP_CACHE_UNRESOLVED;
	return (__u64)s;
}

/* The cache of a kmalloc'ed object, however this kernel and program can
 * find it: an address, or KHEAP_CACHE_UNRESOLVED.
 * Returned as a number (a volatile load of what was stored), never as the
 * kfunc's typed pointer: the verifier would tell the two apart in every
 * later state of the event path (2.4x its instructions). */
static __always_inline __u64 kmalloc_cache_resolve(const void *ptr, __u64 alloc,
						   __u64 *store)
{
	if (kmem_cache_kfunc_exists()) {
		struct kmem_cache *s = kmalloc_cache_kfunc(ptr, alloc);

		if (s)
			*store = (__u64)s;
		else
			*store = KHEAP_CACHE_UNRESOLVED;
	} else {
		*store = kmalloc_cache_by_page(ptr, alloc);
	}
	return *(volatile __u64 *)store;
}

/*
 * Which cache a kmalloc() lands in is the kernel's function of the call
 * site, the size class and the GFP flags: kmalloc_type() picks the kind
 * (normal, cgroup-charged, reclaimable, DMA) from the flags and, with
 * CONFIG_RANDOM_KMALLOC_CACHES, the copy from a hash of the caller's
 * address and a boot-time seed; a bucketed allocation (msg_msg,
 * memdup_user) uses the buckets its call site names. So the answer for one
 * (call site, size, flags) is looked up once and remembered per CPU: a
 * plain load per event instead of a kfunc call (or three probe reads),
 * which was a third of the default path's cost.
 *
 * A direct-mapped table: a slot keeps the last key that hashed to it, so a
 * collision costs a lookup, never a wrong answer. Each slot asks the slab
 * again after KHEAP_KMALLOC_MEMO_USES events and counts an answer that
 * changed (counters.cache_memo_stale; the report shows it): the rule above
 * has no exception in the kernel, but a module unloaded and another loaded
 * at its addresses would reuse a call site.
 */
struct kmalloc_memo {
	__u64 call_site;
	__u64 cache;
	__u32 gfp_flags;
	__u32 size;
	__u32 uses_left;
	/* This CPU's slot of the event's site (kheap/site_slots.c), plus
	 * one; 0: not known yet. Only a hint: it is checked against the
	 * slot's key. */
	__u32 site_slot;
};

#define KHEAP_KMALLOC_MEMO_SLOTS 1024
#define KHEAP_KMALLOC_MEMO_USES	 4096

/* Slots per CPU, minus one: a power of two up to KHEAP_KMALLOC_MEMO_SLOTS,
 * fewer on machines of many CPUs (user space sizes the map to match before
 * load, src/kernel/kmem/config.rs), so that the memo's memory does not grow
 * with the CPU count. */
const volatile __u32 kmalloc_memo_mask = KHEAP_KMALLOC_MEMO_SLOTS - 1;

KHEAP_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, kmalloc_memo, __u32, struct kmalloc_memo,
	  KHEAP_KMALLOC_MEMO_SLOTS);

/* What an event tells count_site() about its site: SITE_HINT_KMALLOC for a
 * kmalloc event (count_site() then remembers the slot it finds in the memo),
 * or'ed with the slot the memo remembers for it, plus one (0: none). Events
 * of other kinds pass 0. The flag is a constant where the hint is made, so
 * the compiler drops what it guards from other programs. */
#define SITE_HINT_KMALLOC    (1U << 31)
#define SITE_HINT_SLOT(hint) ((hint) & ~SITE_HINT_KMALLOC)

/* The memo's table index of a call site. Fibonacci hashing: call sites are
 * byte addresses, so the top bits of the product spread them over the
 * slots (the mask keeps the lowest of those ten bits where there are fewer
 * slots). */
static __always_inline __u32 kmalloc_memo_index(__u64 call_site)
{
	return ((call_site * 0x9e3779b97f4a7c15ULL) >> 54) & kmalloc_memo_mask;
}

/* The cache of a kmalloc event's object (see above). *stale: the slot's
 * periodic check found the remembered answer wrong. *site_slot: this CPU's
 * slot of the event's site, plus one, if the memo knows it (else 0). A
 * program run inside this one on the CPU (an interrupt that allocates, on
 * kernels that let a raw tracepoint's program nest in itself) may rewrite the
 * entry meanwhile: the slot is then at worst another site's, and
 * count_site() checks it against the event's key. */
static __always_inline __u64 kmalloc_cache_of(const void *ptr, __u64 alloc,
					      __u64 call_site, __u64 gfp_flags,
					      bool *stale, __u32 *site_slot)
{
	__u32 i = kmalloc_memo_index(call_site);
	struct kmalloc_memo *m = bpf_map_lookup_elem(&kmalloc_memo, &i);
	__u64 old;

	if (!m) /* not reached: the index is below the slot count */
		return KHEAP_CACHE_UNRESOLVED;
	if (m->call_site == call_site && m->size == alloc &&
	    m->gfp_flags == (__u32)gfp_flags) {
		if (--m->uses_left) {
			*site_slot = m->site_slot;
			return m->cache;
		}
		old = m->cache;
		m->uses_left = KHEAP_KMALLOC_MEMO_USES;
		if (kmalloc_cache_resolve(ptr, alloc, &m->cache) != old) {
			m->site_slot = 0;
			*stale = true;
		}
		return m->cache;
	}
	m->call_site = call_site;
	m->size = alloc;
	m->gfp_flags = gfp_flags;
	m->uses_left = KHEAP_KMALLOC_MEMO_USES;
	m->site_slot = 0;
	return kmalloc_cache_resolve(ptr, alloc, &m->cache);
}

/* Remembers that a kmalloc event's site is counted in this CPU's slot
 * `slot` (count_site(), after a search found it), if the memo entry of its
 * call site is the event's (with --latency the key names another call
 * site). */
static __always_inline void
kmalloc_memo_remember_slot(const struct site_key *key, __u32 slot)
{
	__u32 i = kmalloc_memo_index(key->call_site);
	struct kmalloc_memo *m = bpf_map_lookup_elem(&kmalloc_memo, &i);

	if (m && m->call_site == key->call_site && m->cache == key->cache &&
	    m->size == key->kmalloc_size)
		m->site_slot = slot + 1;
}

#endif /* KHEAP_SLAB_CACHE_BPF_H */
