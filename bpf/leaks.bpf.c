// SPDX-License-Identifier: GPL-2.0
/*
 * kheap leaks: which traced allocations are still outstanding.
 *
 * Every traced allocation is remembered by address in `live` (a plain hash:
 * the free may run on another CPU) with its site, stack, sizes, time and
 * process; every free of a remembered address forgets it (one map operation:
 * the free path is the hot path of a leak tracer). Per site, allocations are
 * summed in a per-CPU map; user space walks `live` for what is outstanding
 * and its ages, and derives what was freed as allocated - outstanding.
 *
 * Frees of addresses never remembered (allocated before tracing began) are
 * only counted. With pointer sampling, an address is traced or skipped by a
 * hash of its value, so allocation and free always agree.
 *
 * Each hook exists twice: as tp_btf (typed arguments, cheapest) and as a
 * classic tracepoint read through CO-RE, for kernels without BTF-typed raw
 * tracepoints. User space enables one set per run.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "kheap.h"
#include "leaks.h"
#include "alloc_stats.bpf.h"
#include "kmem_classic.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define KHEAP_E2BIG  7
#define KHEAP_ENOENT 2

const volatile struct leaks_config cfg = {};

/* Written by the `clock` program, which user space runs on demand. */
struct clock_sample clock_now = {};

/* Resized from user space before load (--max-objects). Preallocated: with
 * BPF_F_NO_PREALLOC, element allocation itself runs kmalloc, which recurses
 * into these programs (measured: recursion misses and 5x slower
 * kmem_cache_alloc events). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, __u64);
	__type(value, struct live_obj);
} live SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct site_key);
	__type(value, struct alloc_stats);
} sites SEC(".maps");

/* Same keys as `sites`; only on the rare path of an address reused while
 * tracked. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct site_key);
	__type(value, struct site_unseen);
} unseen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct stack_key);
	__type(value, struct alloc_stats);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 8192);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, KHEAP_STACK_DEPTH * sizeof(__u64));
} stack_traces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2048);
	__type(key, __u64);
	__type(value, struct cache_name);
} cache_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u8);
} pid_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct leak_counters);
} counters SEC(".maps");

static const struct site_unseen zero_unseen;

#define COUNT(field)                                             \
	do {                                                     \
		__u32 __zero = 0;                                \
		struct leak_counters *__c =                      \
			bpf_map_lookup_elem(&counters, &__zero); \
		if (__c)                                         \
			__c->field++;                            \
	} while (0)

/* Fibonacci hashing: allocations are aligned, so the low bits of an address
 * are mostly zero; the high bits of the product mix all of them. */
static __always_inline bool ptr_traced(__u64 ptr)
{
	if (!cfg.ptr_sample_mask)
		return true;
	return (((ptr * 0x9E3779B97F4A7C15ULL) >> 40) & cfg.ptr_sample_mask) ==
	       0;
}

static __always_inline bool task_wanted(__u32 tgid)
{
	if (cfg.filter_pids && !bpf_map_lookup_elem(&pid_filter, &tgid))
		return false;
	if (cfg.filter_comm && !comm_is(cfg.comm))
		return false;
	return true;
}

static __always_inline void remember_cache_name(__u64 cache, const char *name)
{
	struct cache_name n = {};

	if (!cache || !name)
		return;
	bpf_probe_read_kernel_str(n.name, sizeof(n.name), name);
	bpf_map_update_elem(&cache_names, &cache, &n, BPF_NOEXIST);
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

static __always_inline void track_alloc(void *ctx, struct site_key *key,
					__u64 ptr, __u64 req, __u64 alloc,
					const char *name)
{
	struct live_obj obj = {.site = *key, .stack_id = -1};
	bool created = false;
	__u64 pid_tgid;
	__u32 bucket;
	/* int, not long: 6.1 hands helper errors back zero-extended from 32
	 * bits (-E2BIG arrives as 0xfffffff9), seen in the 6.1 VM test. */
	int err;

	pid_tgid = bpf_get_current_pid_tgid();
	if ((cfg.filter_pids || cfg.filter_comm) &&
	    !task_wanted(pid_tgid >> 32))
		return;
	if (req < cfg.min_size || (cfg.max_size && req > cfg.max_size))
		return;
	if (!ptr) {
		COUNT(alloc_failed);
		return;
	}
	if (!ptr_traced(ptr))
		return;

	bucket = size_bucket(req);
	if (cfg.capture_stacks &&
	    !(cfg.stack_sample_mask &&
	      (bpf_get_prandom_u32() & cfg.stack_sample_mask))) {
		int id = bpf_get_stackid(ctx, &stack_traces, 0);

		if (id >= 0) {
			struct stack_key skey = {.site = *key, .stack_id = id};

			COUNT(stack_samples);
			if (upsert_stats(&stacks, &skey, req, alloc, bucket,
					 NULL))
				obj.stack_id = id;
			else
				COUNT(map_full_stacks);
		} else if (id == -KHEAP_EEXIST) {
			COUNT(lost_stack_collision);
		} else {
			COUNT(lost_stack_other);
		}
	}

	obj.bytes_req = req;
	obj.bytes_alloc = alloc;
	/* Jiffies, not bpf_ktime_get_ns(): measured 60-70 ns cheaper per
	 * allocation on a KVM guest, and a tick is fine for ages. */
	obj.ts = bpf_jiffies64();
	obj.tgid = pid_tgid >> 32;
	err = bpf_map_update_elem(&live, &ptr, &obj, BPF_NOEXIST);
	if (err == -KHEAP_EEXIST) {
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
		COUNT(map_full_sites);
		return;
	}
	if (created && key->cache)
		remember_cache_name(key->cache, name);
}

static __always_inline void track_free(__u64 ptr)
{
	int err; /* see track_alloc */

	if (!ptr) {
		COUNT(frees_null);
		return;
	}
	if (!ptr_traced(ptr))
		return;
	/* With a process filter most frees are of objects never tracked: a
	 * lockless lookup rejects them cheaper than a failed delete, which
	 * takes the bucket lock (71 vs 87 ns per untracked free, measured).
	 * Without a filter most frees are of tracked objects, and the lookup
	 * would only add to them. */
	if ((cfg.filter_pids || cfg.filter_comm) &&
	    !bpf_map_lookup_elem(&live, &ptr)) {
		COUNT(frees_untracked);
		return;
	}
	err = bpf_map_delete_elem(&live, &ptr);
	if (err == -KHEAP_ENOENT)
		COUNT(frees_untracked);
	else if (err)
		COUNT(map_busy);
}

SEC("tp_btf/kmalloc")
int BPF_PROG(kmalloc_btf, unsigned long call_site, const void *ptr,
	     size_t bytes_req, size_t bytes_alloc, gfp_t gfp_flags, int node)
{
	struct site_key key = {
		.call_site = call_site,
		.kmalloc_size = bytes_alloc,
		.kmalloc_accounted = !!(gfp_flags & cfg.gfp_account_mask),
	};

	track_alloc(ctx, &key, (__u64)ptr, bytes_req, bytes_alloc, NULL);
	return 0;
}

SEC("tp_btf/kmem_cache_alloc")
int BPF_PROG(cache_alloc_btf, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s, gfp_t gfp_flags, int node)
{
	struct site_key key = {.call_site = call_site, .cache = (__u64)s};

	track_alloc(ctx, &key, (__u64)ptr, s->object_size, s->size, s->name);
	return 0;
}

SEC("tp_btf/kfree")
int BPF_PROG(kfree_btf, unsigned long call_site, const void *ptr)
{
	track_free((__u64)ptr);
	return 0;
}

SEC("tp_btf/kmem_cache_free")
int BPF_PROG(cache_free_btf, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s)
{
	track_free((__u64)ptr);
	return 0;
}

/* With `-- CMD`, children of traced processes are traced too. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(fork_btf, struct task_struct *parent, struct task_struct *child)
{
	__u32 parent_tgid = parent->tgid, child_tgid = child->tgid;
	__u8 one = 1;

	if (bpf_map_lookup_elem(&pid_filter, &parent_tgid))
		bpf_map_update_elem(&pid_filter, &child_tgid, &one, BPF_ANY);
	return 0;
}

/* ---- raw_tp: untyped arguments (6.1 and 6.12 refuse the tp_btf reads) ---- */

SEC("raw_tp/kmalloc")
int kmalloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	struct site_key key = {
		.call_site = ctx->args[0],
		.kmalloc_size = ctx->args[3],
		.kmalloc_accounted = !!(ctx->args[4] & cfg.gfp_account_mask),
	};

	track_alloc(ctx, &key, ctx->args[1], ctx->args[2], ctx->args[3], NULL);
	return 0;
}

SEC("raw_tp/kmem_cache_alloc")
int cache_alloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const struct kmem_cache *s = (const void *)ctx->args[2];
	struct site_key key = {.call_site = ctx->args[0], .cache = (__u64)s};

	track_alloc(ctx, &key, ctx->args[1], BPF_CORE_READ(s, object_size),
		    BPF_CORE_READ(s, size), BPF_CORE_READ(s, name));
	return 0;
}

SEC("raw_tp/kfree")
int kfree_raw(struct bpf_raw_tracepoint_args *ctx)
{
	track_free(ctx->args[1]);
	return 0;
}

SEC("raw_tp/kmem_cache_free")
int cache_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	track_free(ctx->args[1]);
	return 0;
}

SEC("raw_tp/sched_process_fork")
int fork_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const struct task_struct *parent = (const void *)ctx->args[0];
	const struct task_struct *child = (const void *)ctx->args[1];
	__u32 parent_tgid = BPF_CORE_READ(parent, tgid);
	__u32 child_tgid = BPF_CORE_READ(child, tgid);
	__u8 one = 1;

	if (bpf_map_lookup_elem(&pid_filter, &parent_tgid))
		bpf_map_update_elem(&pid_filter, &child_tgid, &one, BPF_ANY);
	return 0;
}

/* ---- classic tracepoints, fields read through CO-RE ---- */

SEC("tracepoint/kmem/kmalloc")
int kmalloc_tp(void *ctx)
{
	struct kmem_alloc_event e;

	read_kmalloc_record(ctx, &e);
	struct site_key key = {
		.call_site = e.call_site,
		.kmalloc_size = e.bytes_alloc,
		.kmalloc_accounted = !!(e.gfp_flags & cfg.gfp_account_mask),
	};

	track_alloc(ctx, &key, (__u64)e.ptr, e.bytes_req, e.bytes_alloc, NULL);
	return 0;
}

SEC("tracepoint/kmem/kmem_cache_alloc")
int cache_alloc_tp(void *ctx)
{
	struct kmem_alloc_event e;
	struct site_key key = {};

	read_cache_alloc_record(ctx, &e);
	key.call_site = e.call_site;
	key.cache = classic_cache_key(&e);
	track_alloc(ctx, &key, (__u64)e.ptr, e.bytes_req, e.bytes_alloc,
		    e.name);
	return 0;
}

SEC("tracepoint/kmem/kfree")
int kfree_tp(struct trace_event_raw_kfree *r)
{
	track_free((__u64)BPF_CORE_READ(r, ptr));
	return 0;
}

SEC("tracepoint/kmem/kmem_cache_free")
int cache_free_tp(struct trace_event_raw_kmem_cache_free *r)
{
	track_free((__u64)BPF_CORE_READ(r, ptr));
	return 0;
}

SEC("tracepoint/sched/sched_process_fork")
int fork_tp(struct trace_event_raw_sched_process_fork *r)
{
	__u32 parent = BPF_CORE_READ(r, parent_pid);
	__u32 child = BPF_CORE_READ(r, child_pid);
	__u8 one = 1;

	if (bpf_map_lookup_elem(&pid_filter, &parent))
		bpf_map_update_elem(&pid_filter, &child, &one, BPF_ANY);
	return 0;
}

/* Run by user space (BPF_PROG_RUN) when it reads the objects: the jiffies
 * now, to turn the jiffies stamps of objects into ages. */
SEC("syscall")
int clock(void *ctx)
{
	clock_now.jiffies = bpf_jiffies64();
	clock_now.ns = bpf_ktime_get_ns();
	return 0;
}
