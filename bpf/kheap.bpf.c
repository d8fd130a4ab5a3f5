// SPDX-License-Identifier: GPL-2.0
/*
 * kheap: kernel heap allocations aggregated in the kernel.
 *
 * Every traced allocation updates one per-CPU hash entry keyed by
 * (call site, cache): exact counts, requested and allocated bytes and a log2
 * histogram of requested sizes. Kernel stacks are costly (~1.75 us each on an
 * ORC kernel), so by default only a random sample of events captures one;
 * user space scales the sampled stacks to the exact per-site totals.
 *
 * Each hook exists twice: as tp_btf (typed arguments, cheapest) and as a
 * classic tracepoint read through CO-RE (for kernels or configurations
 * without BTF-typed raw tracepoints). User space enables one set per run.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "kheap.h"
#include "alloc_stats.bpf.h"
#include "kmem_classic.bpf.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct kheap_config cfg = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct site_key);
	__type(value, struct alloc_stats);
} sites SEC(".maps");

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

/* Per process (tgid); only updated when the report is grouped by process. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct alloc_stats);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct proc_info);
} proc_comms SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 2048);
	__type(key, __u64);
	__type(value, struct cache_frees);
} cache_frees SEC(".maps");

/* Written once per cache, when a cache is first seen, off the hot path. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2048);
	__type(key, __u64);
	__type(value, struct cache_name);
} cache_names SEC(".maps");

/* Processes whose allocations are counted when cfg.filter_pids is set. */
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
	__type(value, struct counters);
} counters SEC(".maps");

static __always_inline struct counters *counters_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&counters, &zero);
}

#define COUNT(field)                                   \
	do {                                           \
		struct counters *__c = counters_get(); \
		if (__c)                               \
			__c->field++;                  \
	} while (0)

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

/* The common path of every allocation event. `name` is only read when the
 * (site, cache) pair is new, so the cost stays off the hot path. */
static __always_inline void record_alloc(void *ctx, struct site_key *key,
					 const void *ptr, __u64 req,
					 __u64 alloc, const char *name)
{
	bool created = false;
	__u32 bucket, tgid = 0;

	/* cfg is constant after load: with no filter and no per-process view
	 * the verifier drops this block entirely. */
	if (cfg.filter_pids || cfg.filter_comm || cfg.by_process) {
		tgid = bpf_get_current_pid_tgid() >> 32;
		if (!task_wanted(tgid))
			return;
	}
	if (req < cfg.min_size || (cfg.max_size && req > cfg.max_size))
		return;
	if (!ptr) {
		COUNT(alloc_failed);
		return;
	}

	bucket = size_bucket(req);
	if (!upsert_stats(&sites, key, req, alloc, bucket, &created)) {
		COUNT(map_full_sites);
		return;
	}
	if (created && key->cache)
		remember_cache_name(key->cache, name);

	if (cfg.by_process) {
		bool new_proc = false;

		if (!upsert_stats(&procs, &tgid, req, alloc, bucket, &new_proc))
			COUNT(map_full_procs);
		else if (new_proc) {
			struct proc_info info = {};

			bpf_get_current_comm(info.comm, sizeof(info.comm));
			bpf_map_update_elem(&proc_comms, &tgid, &info, BPF_ANY);
		}
	}

	if (!cfg.capture_stacks)
		return;
	if (cfg.stack_sample_mask &&
	    (bpf_get_prandom_u32() & cfg.stack_sample_mask))
		return;

	struct stack_key skey = {.site = *key};

	skey.stack_id = bpf_get_stackid(ctx, &stack_traces, 0);
	if (skey.stack_id < 0) {
		if (skey.stack_id == -17 /* EEXIST: hash collision */)
			COUNT(lost_stack_collision);
		else
			COUNT(lost_stack_other);
		return;
	}
	COUNT(stack_samples);
	if (!upsert_stats(&stacks, &skey, req, alloc, bucket, NULL))
		COUNT(map_full_stacks);
}

static __always_inline void record_cache_free(const void *ptr, __u64 cache,
					      const char *name)
{
	struct cache_frees *f;

	if ((cfg.filter_pids || cfg.filter_comm) &&
	    !task_wanted(bpf_get_current_pid_tgid() >> 32))
		return;
	if (!ptr) {
		COUNT(frees_null);
		return;
	}
	COUNT(frees);
	if (!cache)
		return;
	f = bpf_map_lookup_elem(&cache_frees, &cache);
	if (f) {
		f->frees++;
		return;
	}
	struct cache_frees one = {.frees = 1};

	if (bpf_map_update_elem(&cache_frees, &cache, &one, BPF_NOEXIST) == 0)
		remember_cache_name(cache, name);
	else if (!bpf_map_lookup_elem(&cache_frees, &cache))
		COUNT(map_full_caches);
}

static __always_inline bool gfp_accounted(__u64 gfp_flags)
{
	/* __GFP_ACCOUNT's bit lives in an anonymous enum (6.10+) or a macro
	 * (older), neither reachable through CO-RE: user space reads it from
	 * the kernel's BTF. */
	return gfp_flags & cfg.gfp_account_mask;
}

static __always_inline void on_kmalloc(void *ctx, __u64 call_site,
				       const void *ptr, __u64 req, __u64 alloc,
				       __u64 gfp_flags)
{
	struct site_key key = {
		.call_site = call_site,
		.kmalloc_size = alloc,
		.kmalloc_accounted = gfp_accounted(gfp_flags),
	};

	record_alloc(ctx, &key, ptr, req, alloc, NULL);
}

/* ---- tp_btf: typed raw tracepoint arguments ---- */

SEC("tp_btf/kmalloc")
int BPF_PROG(kmalloc_btf, unsigned long call_site, const void *ptr,
	     size_t bytes_req, size_t bytes_alloc, gfp_t gfp_flags, int node)
{
	on_kmalloc(ctx, call_site, ptr, bytes_req, bytes_alloc, gfp_flags);
	return 0;
}

SEC("tp_btf/kmem_cache_alloc")
int BPF_PROG(cache_alloc_btf, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s, gfp_t gfp_flags, int node)
{
	struct site_key key = {.call_site = call_site, .cache = (__u64)s};

	record_alloc(ctx, &key, ptr, s->object_size, s->size, s->name);
	return 0;
}

SEC("tp_btf/kfree")
int BPF_PROG(kfree_btf, unsigned long call_site, const void *ptr)
{
	record_cache_free(ptr, 0, NULL);
	return 0;
}

SEC("tp_btf/kmem_cache_free")
int BPF_PROG(cache_free_btf, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s)
{
	record_cache_free(ptr, (__u64)s, s->name);
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

/* ---- classic tracepoints, fields read through CO-RE ---- */

SEC("tracepoint/kmem/kmalloc")
int kmalloc_tp(void *ctx)
{
	struct kmem_alloc_event e;

	read_kmalloc_record(ctx, &e);
	on_kmalloc(ctx, e.call_site, e.ptr, e.bytes_req, e.bytes_alloc,
		   e.gfp_flags);
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
	record_alloc(ctx, &key, e.ptr, e.bytes_req, e.bytes_alloc, e.name);
	return 0;
}

SEC("tracepoint/kmem/kfree")
int kfree_tp(struct trace_event_raw_kfree *r)
{
	record_cache_free(BPF_CORE_READ(r, ptr), 0, NULL);
	return 0;
}

SEC("tracepoint/kmem/kmem_cache_free")
int cache_free_tp(struct trace_event_raw_kmem_cache_free *r)
{
	const char *name = cache_free_record_name(r);

	record_cache_free(BPF_CORE_READ(r, ptr), name ? name_key(name) : 0,
			  name);
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
