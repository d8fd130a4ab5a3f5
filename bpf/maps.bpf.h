/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * One way to declare a BPF map, so every object declares its maps in one
 * line each. Sizes given here are defaults: user space resizes most maps
 * before load.
 */
#ifndef KHEAP_MAPS_BPF_H
#define KHEAP_MAPS_BPF_H

#define KHEAP_MAP(map_type, name, key_type, value_type, entries) \
	struct {                                                 \
		__uint(type, map_type);                          \
		__uint(max_entries, entries);                    \
		__type(key, key_type);                           \
		__type(value, value_type);                       \
	} name SEC(".maps")

#define KHEAP_HASH(name, key_type, value_type, entries) \
	KHEAP_MAP(BPF_MAP_TYPE_HASH, name, key_type, value_type, entries)
#define KHEAP_PERCPU_HASH(name, key_type, value_type, entries) \
	KHEAP_MAP(BPF_MAP_TYPE_PERCPU_HASH, name, key_type, value_type, entries)
/* An array user space maps (mmap) and reads in place. */
#define KHEAP_MMAPABLE_ARRAY(name, value_type, entries) \
	struct {                                        \
		__uint(type, BPF_MAP_TYPE_ARRAY);       \
		__uint(map_flags, BPF_F_MMAPABLE);      \
		__uint(max_entries, entries);           \
		__type(key, __u32);                     \
		__type(value, value_type);              \
	} name SEC(".maps")
/* A per-CPU array of one slot: counters and scratch space. */
#define KHEAP_PERCPU_SLOT(name, value_type) \
	KHEAP_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, name, __u32, value_type, 1)

/*
 * Adds to a value of a map that every CPU writes (a plain hash, not a
 * per-CPU one): one locked add. Per-CPU hashes cost one value per possible
 * CPU for every entry (281 MiB for 8192 histograms on 128 CPUs), so the
 * maps keyed by what is traced are shared, and only small fronts and
 * counters stay per CPU (docs/design/kernel.md, "Kernel memory"). The
 * result is never used, so clang emits BPF's plain atomic add (BPF_XADD),
 * which every kernel kheap runs on accepts, not a fetching one (5.12).
 */
#define SHARED_ADD(lvalue, n) ((void)__sync_fetch_and_add(&(lvalue), (n)))

#endif /* KHEAP_MAPS_BPF_H */
