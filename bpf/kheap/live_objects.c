/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * leaks: every allocation remembered by address, with its site, stack,
 * sizes, time and process, and forgotten by its free; `unseen` counts
 * objects whose free no tracepoint showed (their address came back from the
 * allocator while still tracked). A part of kheap.bpf.c, not a header (see
 * its first comment): included there once, after event_counts.c.
 *
 * Objects are kept in a table of arrays (live_buckets, live_slots): an
 * address picks a bucket of 8 slots, one cache line of addresses, and takes
 * a free slot with cmpxchg; its free clears the slot. A bucket that is full
 * spills into the `live` hash map. The kernel's hash map costs about 235 ns
 * per allocation and free (hashing, the bucket lock, its free list); the
 * table a few loads and one atomic. Kernels without BPF atomics (5.12) get
 * the object built with KHEAP_NO_ATOMICS and keep every object in `live`.
 */

/* leaks: live objects by address. Sized from user space (1 entry unless
 * cfg.track_live). Preallocated: with BPF_F_NO_PREALLOC, element allocation
 * itself runs kmalloc, which recurses into these programs (measured:
 * recursion misses and 5x slower kmem_cache_alloc events). */
KHEAP_HASH(live, __u64, struct live_obj, 262144);

/* leaks: the object table, sized from user space (cfg.live_buckets buckets
 * and 8 slots each; 1 entry each without it). Slot i of bucket b is
 * live_slots[b * KHEAP_LIVE_WAYS + i]. Mapped by user space, which reads
 * them from memory: a full table is 16 MiB, too much to copy every
 * --interval through the syscall. */
KHEAP_MMAPABLE_ARRAY(live_buckets, struct live_bucket, 1);
KHEAP_MMAPABLE_ARRAY(live_slots, struct live_obj, 1);

/* Objects in `live` (spilled from full buckets): while there are none, a
 * free the table does not know is of an untracked object, and no hash map
 * operation is needed to learn it. */
__u64 live_spilled;

/* leaks: same keys as `sites`; only on the rare path of an address reused
 * while tracked. */
KHEAP_HASH(unseen, struct site_key, struct site_unseen, 8192);

static const struct site_unseen zero_unseen;

/* Whether an object's address is sampled (leaks --sample N). Allocations
 * are aligned and sit in runs (objects of one slab, pages of one block), so
 * every bit of the address must move every bit of the hash: a full 64-bit
 * finalizer (MurmurHash3's fmix64). A middle slice of a Fibonacci product,
 * used before, picked nearly all or none of 16 consecutive pages (its step
 * per 4 KiB was 3.96 of 4), and estimates of 4 KiB objects came out 30%
 * high. */
static __always_inline bool ptr_traced(__u64 ptr)
{
	__u64 h = ptr;

	if (!cfg.ptr_sample_mask)
		return true;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return (h & cfg.ptr_sample_mask) == 0;
}

/* The table's answers. */
enum live_table_result {
	LIVE_STORED,
	LIVE_REPLACED, /* the address was still tracked: *prev was its object */
	LIVE_NO_ROOM,  /* no table, or its bucket is full */
};

#ifndef KHEAP_NO_ATOMICS
/* The bucket of an address. Objects are aligned and sit in runs, so every
 * bit of the address is mixed in (fmix64's first half), and the mix's low
 * 32 bits are scaled to the bucket count with a multiply, not a division. */
static __always_inline __u32 live_bucket_of(__u64 ptr)
{
	__u64 h = ptr ^ (ptr >> 33);

	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return ((h & 0xffffffffULL) * cfg.live_buckets) >> 32;
}

static __always_inline struct live_obj *live_slot(__u32 bucket, __u32 way)
{
	__u32 i = bucket * KHEAP_LIVE_WAYS + way;

	return bpf_map_lookup_elem(&live_slots, &i);
}

/* The bucket of ptr in the table (its index in *b), or NULL without a
 * table. */
static __always_inline struct live_bucket *live_bucket_lookup(__u64 ptr,
							      __u32 *b)
{
	if (!cfg.live_buckets)
		return NULL;
	*b = live_bucket_of(ptr);
	return bpf_map_lookup_elem(&live_buckets, b);
}

/* Stores obj under ptr in the table: in ptr's slot if the address is still
 * tracked (its free was unseen), else in a free slot of its bucket. */
static __always_inline enum live_table_result
live_table_store(__u64 ptr, const struct live_obj *obj, struct live_obj *prev)
{
	__u32 b = 0;
	struct live_bucket *bucket = live_bucket_lookup(ptr, &b);
	struct live_obj *slot;
	int i;

	if (!bucket)
		return LIVE_NO_ROOM;
	for (i = 0; i < KHEAP_LIVE_WAYS; i++) {
		if (bucket->ptr[i] != ptr)
			continue;
		slot = live_slot(b, i);
		if (!slot)
			return LIVE_NO_ROOM;
		*prev = *slot;
		*slot = *obj;
		return LIVE_REPLACED;
	}
	for (i = 0; i < KHEAP_LIVE_WAYS; i++) {
		/* Another CPU may take the same free slot: the one whose
		 * cmpxchg finds it still 0 has it. */
		if (bucket->ptr[i] ||
		    __sync_val_compare_and_swap(&bucket->ptr[i], 0, ptr))
			continue;
		/* The address is published before the object is written:
		 * only its own free could read the slot sooner, and that
		 * cannot run before the allocator has returned. */
		slot = live_slot(b, i);
		if (slot)
			*slot = *obj;
		return LIVE_STORED;
	}
	return LIVE_NO_ROOM;
}

/* Clears ptr's slot. True when the table had it. */
static __always_inline bool live_table_forget(__u64 ptr)
{
	__u32 b = 0;
	struct live_bucket *bucket = live_bucket_lookup(ptr, &b);
	int i;

	if (!bucket)
		return false;
	for (i = 0; i < KHEAP_LIVE_WAYS; i++) {
		if (bucket->ptr[i] == ptr) {
			bucket->ptr[i] = 0;
			return true;
		}
	}
	return false;
}

static __always_inline bool live_spill_possible(void)
{
	return !cfg.live_buckets || live_spilled;
}

static __always_inline void live_spill_count(bool added)
{
	if (cfg.live_buckets)
		__sync_fetch_and_add(&live_spilled, added ? 1 : -1);
}
#else
/* KHEAP_NO_ATOMICS: the hash map alone (user space sets no table). */
static __always_inline enum live_table_result
live_table_store(__u64 ptr, const struct live_obj *obj, struct live_obj *prev)
{
	return LIVE_NO_ROOM;
}

static __always_inline bool live_table_forget(__u64 ptr)
{
	return false;
}

static __always_inline bool live_spill_possible(void)
{
	return true;
}

static __always_inline void live_spill_count(bool added)
{
}
#endif

/* Whether ptr is among the objects spilled into the hash map (with the
 * table in use; without it, the hash map's own update tells). */
static __always_inline bool spilled_in_hash(__u64 ptr)
{
	return cfg.live_buckets && live_spilled &&
	       bpf_map_lookup_elem(&live, &ptr);
}

static __always_inline void count_update_error(int err)
{
	if (err == -KHEAP_E2BIG)
		COUNT(map_full_live);
	else
		COUNT(map_busy);
}

/* Accounts a tracked object whose free no tracepoint showed. */
static __always_inline void add_unseen(const struct live_obj *o)
{
	struct site_unseen *u = bpf_map_lookup_elem(&unseen, &o->site);

	if (!u) {
		bpf_map_update_elem(&unseen, &o->site, &zero_unseen,
				    BPF_NOEXIST);
		u = bpf_map_lookup_elem(&unseen, &o->site);
		if (!u) {
			COUNT(map_full_sites);
			return;
		}
	}
	SHARED_ADD(u->count, 1);
	SHARED_ADD(u->bytes_alloc, o->bytes_alloc);
}

/* leaks: remembers the object by address, then counts it under its site. */
static __always_inline void track_alloc(void *ctx, bool classic,
					struct site_key *key, __u64 ptr,
					__u64 req, __u64 alloc, __u32 tgid,
					bool accounted, bool interrupt,
					const char *name)
{
	struct live_obj obj = {
		.site = *key,
		.accounted = accounted,
	};
	struct live_obj prev = {};
	bool reused, in_table;
	enum live_table_result stored;
	__u32 bucket;
	int err = 0; /* int: 6.1 zero-extends helper errors from 32 bits */

	if (!ptr_traced(ptr))
		return;
	bucket = size_bucket(req);
	/* A sampled stack learns (with cfg.stack_owners) whether this is
	 * interrupt context: the object then has no task's cgroup either, as
	 * its stack entry has none. */
	if (cfg.capture_stacks && (!cfg.stack_sample_mask || sample_now()))
		obj.stack_id = record_stack(ctx, classic, key, req, alloc,
					    bucket, NULL, false, &interrupt);
	obj.interrupt = interrupt;
	obj.bytes_req = req;
	obj.bytes_alloc = alloc;
	/* Jiffies, not bpf_ktime_get_ns(): measured 60-70 ns cheaper per
	 * allocation on a KVM guest, and a tick is fine for ages. */
	obj.ts = bpf_jiffies64();
	obj.tgid = tgid;
	/* Every outstanding object names its cgroup: process rows carry it
	 * even without --by cgroup. */
	if (!interrupt)
		obj.cgroup = bpf_get_current_cgroup_id();
	/* An address spilled into the hash map is looked for there first,
	 * so that it is never tracked twice. */
	if (spilled_in_hash(ptr))
		stored = LIVE_NO_ROOM;
	else
		stored = live_table_store(ptr, &obj, &prev);
	in_table = stored != LIVE_NO_ROOM;
	reused = stored == LIVE_REPLACED;
	if (!in_table) {
		/* Counted first: a free that follows must find it counted. */
		live_spill_count(true);
		err = bpf_map_update_elem(&live, &ptr, &obj, BPF_NOEXIST);
		if (err == -KHEAP_EEXIST) {
			struct live_obj *old = bpf_map_lookup_elem(&live, &ptr);

			/* Replaced: unless its free just took it. */
			if (old) {
				prev = *old;
				reused = true;
			}
			err = bpf_map_update_elem(&live, &ptr, &obj, BPF_ANY);
		}
		/* Not added: refused, or in place of a counted entry. */
		if (err || reused)
			live_spill_count(false);
	}
	if (reused) {
		/* The allocator handed out an address we still track: its
		 * free was invisible. Account the old object as freed unseen
		 * and track the new one. */
		add_unseen(&prev);
		COUNT(reused_live);
	}
	if (err) {
		count_update_error(err);
		return;
	}
	/* A replaced entry (reused_live) did not grow the map. Counted before
	 * the site, so that what follows is the same however the object was
	 * stored: the verifier then walks count_site() once, not once for each
	 * way (on 6.18: `leaks` 302,650 instructions against 362,363, `leaks
	 * --by cgroup` 402,801 against 843,912). */
	if (!reused)
		COUNT(live_added);
	/* No hint (count_site()): with it, the verifier walked the
	 * unfiltered `leaks --by cgroup` 9% longer on 6.18 (900,636
	 * instructions against 828,116, of its limit of a million). */
	if (!count_site(key, req, alloc, bucket, name, NULL, 0)) {
		/* Keep the two views consistent: untrack what is uncounted,
		 * from the table or, spilled, from the hash map. */
		if (!live_table_forget(ptr) &&
		    !bpf_map_delete_elem(&live, &ptr))
			live_spill_count(false);
		COUNT(live_removed);
		COUNT(map_full_sites);
		return;
	}
	/* Allocations per cgroup, beside what each still holds. */
	if (cfg.by_cgroup)
		count_cgroup(accounted, interrupt, req, alloc, bucket);
}

/* leaks: forgets a freed object. Any task may free it. True when the object
 * was not tracked (allocated before tracing, or not kept). */
static __always_inline bool track_free(__u64 ptr)
{
	int err; /* see track_alloc */

	if (!ptr) {
		COUNT(frees_null);
		return false;
	}
	if (!ptr_traced(ptr))
		return false;
	if (live_table_forget(ptr)) {
		COUNT(live_removed);
		return false;
	}
	/* Nothing spilled from the table: the object was not tracked. */
	if (!live_spill_possible()) {
		COUNT(frees_untracked);
		return true;
	}
	/* With a process filter most frees are of objects never tracked: a
	 * lockless lookup rejects them cheaper than a failed delete, which
	 * takes the bucket lock (71 vs 87 ns per untracked free, measured).
	 * Without a filter most frees are of tracked objects, and the lookup
	 * would only add to them. */
	if ((cfg.filter.pids || cfg.filter.comm_set) &&
	    !bpf_map_lookup_elem(&live, &ptr)) {
		COUNT(frees_untracked);
		return true;
	}
	err = bpf_map_delete_elem(&live, &ptr);
	if (!err) {
		live_spill_count(false);
		COUNT(live_removed);
		return false;
	}
	if (err == -KHEAP_ENOENT) {
		COUNT(frees_untracked);
		return true;
	}
	COUNT(map_busy);
	return false;
}
