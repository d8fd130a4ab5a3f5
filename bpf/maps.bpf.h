/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * One way to declare a BPF map, so every object declares its maps in one
 * line each, and one way to add to a counter, per CPU or shared. Sizes
 * given here are defaults: user space resizes most maps before load.
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
 * A per-CPU slot of counters, `name`, and name_slot(), which returns this
 * CPU's slot (NULL only if the lookup fails, which the verifier makes
 * every caller test). The lookup is a function rather than statements
 * pasted into every use, so that clang can merge the lookups of counters
 * bumped on different paths into one.
 */
#define KHEAP_PERCPU_COUNTERS(name, value_type)              \
	KHEAP_PERCPU_SLOT(name, value_type);                 \
	static __always_inline value_type *name##_slot(void) \
	{                                                    \
		__u32 zero = 0;                              \
                                                             \
		return bpf_map_lookup_elem(&name, &zero);    \
	}

/*
 * Adds n to `field` of this CPU's slot of counters declared with
 * KHEAP_PERCPU_COUNTERS(name, ...): how every object bumps its counters.
 * Each object (and user_stack.bpf.h) has counters of its own, so the map is
 * named at each use. Each CPU writes only its own slot: a plain add, no
 * atomics.
 */
#define PERCPU_COUNT_ADD(name, field, n)                      \
	do {                                                  \
		typeof(name##_slot()) __slot = name##_slot(); \
		if (__slot)                                   \
			__slot->field += (n);                 \
	} while (0)

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
