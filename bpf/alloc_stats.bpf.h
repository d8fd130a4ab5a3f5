/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers shared by the BPF objects that aggregate allocations into
 * struct alloc_stats (kheap.bpf.c, leaks.bpf.c). Include after vmlinux.h,
 * the libbpf headers and kheap.h.
 */
#ifndef KHEAP_ALLOC_STATS_BPF_H
#define KHEAP_ALLOC_STATS_BPF_H

#define KHEAP_EEXIST 17

static __always_inline __u32 size_bucket(__u64 v)
{
	__u32 r, shift;

	if (v == 0)
		return 0;
	/* floor(log2(v)) without loops, then +1 so that bucket 0 is size 0 */
	r = (v > 0xFFFFFFFFULL) << 5;
	v >>= r;
	shift = (v > 0xFFFF) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	r += 1;
	return r < KHEAP_HIST_BUCKETS ? r : KHEAP_HIST_BUCKETS - 1;
}

static __always_inline void stats_add(struct alloc_stats *s, __u64 req,
				      __u64 alloc, __u32 bucket)
{
	s->count++;
	s->bytes_req += req;
	s->bytes_alloc += alloc;
	if (bucket < KHEAP_HIST_BUCKETS)
		s->hist[bucket]++;
}

/* A zeroed value to insert new hash entries from (too big for the stack). */
static struct alloc_stats zero_stats;

/* Adds to an existing entry, or creates it. Returns false if the map is full.
 * A racing insert on another CPU (-EEXIST) is retried as a lookup. */
static __always_inline bool upsert_stats(void *map, void *key, __u64 req,
					 __u64 alloc, __u32 bucket,
					 bool *created)
{
	struct alloc_stats *s = bpf_map_lookup_elem(map, key);

	if (!s) {
		long err =
			bpf_map_update_elem(map, key, &zero_stats, BPF_NOEXIST);
		if (err && err != -KHEAP_EEXIST)
			return false;
		if (created && !err)
			*created = true;
		s = bpf_map_lookup_elem(map, key);
		if (!s)
			return false;
	}
	stats_add(s, req, alloc, bucket);
	return true;
}

/* Whether the current task's command name is `want` (NUL-terminated). */
static __always_inline bool comm_is(const volatile char *want)
{
	char comm[KHEAP_COMM_LEN];

	bpf_get_current_comm(comm, sizeof(comm));
#pragma unroll
	for (int i = 0; i < KHEAP_COMM_LEN; i++) {
		if (comm[i] != want[i])
			return false;
		if (comm[i] == 0)
			return true;
	}
	return true;
}

#endif /* KHEAP_ALLOC_STATS_BPF_H */
