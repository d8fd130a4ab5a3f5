/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * leaks: every allocation remembered by address in `live`, with its site,
 * stack, sizes, time and process, and forgotten by its free in one map
 * operation; `unseen` counts objects whose free no tracepoint showed (their
 * address came back from the allocator while still tracked). Part of
 * kheap.bpf.c: include it there after event_counts.bpf.h.
 */
#ifndef KHEAP_LIVE_OBJECTS_BPF_H
#define KHEAP_LIVE_OBJECTS_BPF_H

/* leaks: live objects by address. Sized from user space (1 entry unless
 * cfg.track_live). Preallocated: with BPF_F_NO_PREALLOC, element allocation
 * itself runs kmalloc, which recurses into these programs (measured:
 * recursion misses and 5x slower kmem_cache_alloc events). */
KHEAP_HASH(live, __u64, struct live_obj, 262144);

/* leaks: same keys as `sites`; only on the rare path of an address reused
 * while tracked. */
KHEAP_PERCPU_HASH(unseen, struct site_key, struct site_unseen, 8192);

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
	u->count++;
	u->bytes_alloc += o->bytes_alloc;
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
	bool created = false, reused;
	__u32 bucket;
	int err; /* int: 6.1 zero-extends helper errors from 32 bits */

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
	err = bpf_map_update_elem(&live, &ptr, &obj, BPF_NOEXIST);
	reused = err == -KHEAP_EEXIST;
	if (reused) {
		/* The allocator handed out an address we still track: its
		 * free was invisible. Account the old object as freed unseen
		 * and track the new one. */
		struct live_obj *old = bpf_map_lookup_elem(&live, &ptr);

		if (old) {
			struct live_obj prev = *old;

			add_unseen(&prev);
		}
		COUNT(reused_live);
		err = bpf_map_update_elem(&live, &ptr, &obj, BPF_ANY);
	}
	if (err) {
		count_update_error(err);
		return;
	}
	if (!upsert_stats(&sites, key, req, alloc, bucket, &created)) {
		/* Keep the two views consistent: untrack what is uncounted. */
		bpf_map_delete_elem(&live, &ptr);
		if (reused) /* the entry it replaced was counted as added */
			COUNT(live_removed);
		COUNT(map_full_sites);
		return;
	}
	/* A replaced entry (reused_live) did not grow the map. */
	if (!reused)
		COUNT(live_added);
	if (created) {
		COUNT(sites_created);
		remember_cache_name(key->cache, name);
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

#endif /* KHEAP_LIVE_OBJECTS_BPF_H */
