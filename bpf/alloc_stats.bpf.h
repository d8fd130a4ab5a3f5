/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Helpers for BPF objects that aggregate allocations into struct
 * alloc_stats (kheap.bpf.c). Include after vmlinux.h and the libbpf headers.
 */
#ifndef KHEAP_ALLOC_STATS_BPF_H
#define KHEAP_ALLOC_STATS_BPF_H

#include "maps.bpf.h"
#include "kheap.h"

/* Adds an event to this CPU's own entry (a per-CPU slot). */
static __always_inline void stats_add(struct alloc_stats *s, __u64 req,
				      __u64 alloc, __u32 bucket)
{
	s->count++;
	s->bytes_req += req;
	s->bytes_alloc += alloc;
	s->hist[hist_index(bucket)]++;
}

/* Adds an event to an entry every CPU adds to (a shared hash entry). */
static __always_inline void stats_add_shared(struct alloc_stats *s, __u64 req,
					     __u64 alloc, __u32 bucket)
{
	SHARED_ADD(s->count, 1);
	SHARED_ADD(s->bytes_req, req);
	SHARED_ADD(s->bytes_alloc, alloc);
	SHARED_ADD(s->hist[hist_index(bucket)], 1);
}

/* A zeroed value to insert new hash entries from (too big for the stack). */
static struct alloc_stats zero_stats;

/* The entry of `key`, created (zeroed) if missing: NULL if the map is full.
 * A racing insert on another CPU (-EEXIST) is retried as a lookup. */
static __always_inline struct alloc_stats *stats_entry(void *map, void *key,
						       bool *created)
{
	struct alloc_stats *s = bpf_map_lookup_elem(map, key);

	if (!s) {
		/* int: 6.1 zero-extends helper errors from 32 bits. */
		int err =
			bpf_map_update_elem(map, key, &zero_stats, BPF_NOEXIST);
		if (err && err != -KHEAP_EEXIST)
			return NULL;
		if (created && !err)
			*created = true;
		s = bpf_map_lookup_elem(map, key);
	}
	return s;
}

/* Adds to the entry of `key` in a shared map, made if missing. False: the
 * map is full. */
static __always_inline bool upsert_stats(void *map, void *key, __u64 req,
					 __u64 alloc, __u32 bucket,
					 bool *created)
{
	struct alloc_stats *s = stats_entry(map, key, created);

	if (!s)
		return false;
	stats_add_shared(s, req, alloc, bucket);
	return true;
}

#endif /* KHEAP_ALLOC_STATS_BPF_H */
