/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Helpers for BPF objects that aggregate allocations into struct
 * alloc_stats (kheap.bpf.c). Include after
 * vmlinux.h, the libbpf headers and kheap.h (which brings size_bucket()).
 */
#ifndef KHEAP_ALLOC_STATS_BPF_H
#define KHEAP_ALLOC_STATS_BPF_H

static __always_inline void stats_add(struct alloc_stats *s, __u64 req,
				      __u64 alloc, __u32 bucket)
{
	s->count++;
	s->bytes_req += req;
	s->bytes_alloc += alloc;
	s->hist[hist_index(bucket)]++;
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

/* Adds to the entry of `key`, made if missing. False: the map is full. */
static __always_inline bool upsert_stats(void *map, void *key, __u64 req,
					 __u64 alloc, __u32 bucket,
					 bool *created)
{
	struct alloc_stats *s = stats_entry(map, key, created);

	if (!s)
		return false;
	stats_add(s, req, alloc, bucket);
	return true;
}

#endif /* KHEAP_ALLOC_STATS_BPF_H */
