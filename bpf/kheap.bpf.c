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

/* The latency object's per-task entry records (fd reused from it). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KHEAP_LAT_STARTS);
	__type(key, __u64);
	__type(value, struct lat_start);
} lat_starts SEC(".maps");

/* Per-CPU countdown to the next sampled stack. Refilled with a random gap
 * of 1..2N (mean ~N): a helper call once per sample instead of per event,
 * and random gaps keep periodic allocation patterns from aliasing. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} sample_countdown SEC(".maps");

static __always_inline bool sample_now(void)
{
	__u32 zero = 0;
	__u32 *left = bpf_map_lookup_elem(&sample_countdown, &zero);

	if (!left)
		return false;
	if (*left > 1) {
		(*left)--;
		return false;
	}
	*left = (bpf_get_prandom_u32() & (2 * cfg.stack_sample_mask + 1)) + 1;
	return true;
}

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

/* Records a cache's name the first time the cache is seen. The name comes
 * either as a string (tp_btf, classic records) or is read from the struct
 * kmem_cache (raw_tp), only here, off the hot path. */
static __always_inline void remember_cache_name(__u64 cache, const char *name,
						const struct kmem_cache *s)
{
	struct cache_name n = {};

	if (!cache)
		return;
	if (!name && s)
		name = BPF_CORE_READ(s, name);
	if (!name)
		return;
	bpf_probe_read_kernel_str(n.name, sizeof(n.name), name);
	bpf_map_update_elem(&cache_names, &cache, &n, BPF_NOEXIST);
}

static __always_inline void count_process(__u32 tgid, __u64 req, __u64 alloc,
					  __u32 bucket)
{
	bool new_proc = false;

	if (!upsert_stats(&procs, &tgid, req, alloc, bucket, &new_proc)) {
		COUNT(map_full_procs);
	} else if (new_proc) {
		struct proc_info info = {};

		bpf_get_current_comm(info.comm, sizeof(info.comm));
		bpf_map_update_elem(&proc_comms, &tgid, &info, BPF_ANY);
	}
}

/* Captures the kernel stack and counts the event under it. Returns false if
 * the stack or its entry could not be recorded (counted as lost). */
static __always_inline bool record_stack(void *ctx, struct site_key *key,
					 __u64 req, __u64 alloc, __u32 bucket,
					 const char *name,
					 const struct kmem_cache *s)
{
	struct stack_key skey = {.site = *key};
	bool created = false;

	/* int: ids fit, and errors are 32-bit on every kernel */
	int id = bpf_get_stackid(ctx, &stack_traces, 0);

	if (id < 0) {
		if (id == -KHEAP_EEXIST) /* hash collision */
			COUNT(lost_stack_collision);
		else
			COUNT(lost_stack_other);
		return false;
	}
	skey.stack_id = id;
	if (!upsert_stats(&stacks, &skey, req, alloc, bucket, &created)) {
		COUNT(map_full_stacks);
		return false;
	}
	COUNT(stack_samples);
	if (created && (name || s))
		remember_cache_name(key->cache, name, s);
	return true;
}

/* The common path of every allocation event. `name` is only read when the
 * (site, cache) pair is new, so the cost stays off the hot path. */
static __always_inline void record_alloc(void *ctx, struct site_key *key,
					 const void *ptr, __u64 req,
					 __u64 alloc, const char *name,
					 const struct kmem_cache *s)
{
	bool created = false;
	__u32 bucket, tgid = 0;

	/* With --latency, exit probes hide the real return address. */
	if (cfg.latency_active) {
		__u64 tid = bpf_get_current_pid_tgid();
		struct lat_start *ls = bpf_map_lookup_elem(&lat_starts, &tid);

		if (ls && ls->call_site)
			key->call_site = ls->call_site;
	}

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
	if (cfg.by_process)
		count_process(tgid, req, alloc, bucket);

	/* Exact-stacks mode: the per-stack entry is the only update, and user
	 * space sums stacks into sites. An event whose stack is lost still
	 * lands in the site map below, so site totals stay exact. */
	if (cfg.capture_stacks && !cfg.stack_sample_mask &&
	    record_stack(ctx, key, req, alloc, bucket, name, s))
		return;

	if (!upsert_stats(&sites, key, req, alloc, bucket, &created)) {
		COUNT(map_full_sites);
		return;
	}
	if (created)
		remember_cache_name(key->cache, name, s);

	if (!cfg.capture_stacks || !cfg.stack_sample_mask)
		return;
	/* A site's first allocation always gets a stack, so every site can be
	 * attributed to its caller; after that, about one event in N. */
	if (created || sample_now())
		record_stack(ctx, key, req, alloc, bucket, NULL, NULL);
}

static __always_inline void record_cache_free(const void *ptr, __u64 cache,
					      const char *name,
					      const struct kmem_cache *s)
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
		remember_cache_name(cache, name, s);
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

	record_alloc(ctx, &key, ptr, req, alloc, NULL, NULL);
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

	record_alloc(ctx, &key, ptr, s->object_size, s->size, s->name, NULL);
	return 0;
}

SEC("tp_btf/kfree")
int BPF_PROG(kfree_btf, unsigned long call_site, const void *ptr)
{
	record_cache_free(ptr, 0, NULL, NULL);
	return 0;
}

SEC("tp_btf/kmem_cache_free")
int BPF_PROG(cache_free_btf, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s)
{
	record_cache_free(ptr, (__u64)s, s->name, NULL);
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

/* ---- raw_tp: untyped raw tracepoint arguments ----
 * As cheap as tp_btf, but without the verifier's BTF checks on the
 * arguments: 6.1 and 6.12 reject tp_btf reads of kmalloc's `const void *ptr`
 * ("arg1 type UNKNOWN is not a struct"), raw_tp loads there. */

SEC("raw_tp/kmalloc")
int kmalloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	on_kmalloc(ctx, ctx->args[0], (const void *)ctx->args[1], ctx->args[2],
		   ctx->args[3], ctx->args[4]);
	return 0;
}

SEC("raw_tp/kmem_cache_alloc")
int cache_alloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const struct kmem_cache *s = (const void *)ctx->args[2];
	struct site_key key = {.call_site = ctx->args[0], .cache = (__u64)s};

	record_alloc(ctx, &key, (const void *)ctx->args[1],
		     BPF_CORE_READ(s, object_size), BPF_CORE_READ(s, size),
		     NULL, s);
	return 0;
}

SEC("raw_tp/kfree")
int kfree_raw(struct bpf_raw_tracepoint_args *ctx)
{
	record_cache_free((const void *)ctx->args[1], 0, NULL, NULL);
	return 0;
}

SEC("raw_tp/kmem_cache_free")
int cache_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	record_cache_free((const void *)ctx->args[1], ctx->args[2], NULL,
			  (const void *)ctx->args[2]);
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
	on_kmalloc(ctx, e.call_site, e.ptr, e.bytes_req, e.bytes_alloc,
		   e.gfp_flags);
	return 0;
}

/* The classic record has no cache pointer: the cache's name (a __data_loc
 * string since 6.18), hashed, or its object size stands in for it. */
SEC("tracepoint/kmem/kmem_cache_alloc")
int cache_alloc_tp(void *ctx)
{
	struct kmem_alloc_event e;
	struct site_key key = {};

	read_cache_alloc_record(ctx, &e);
	key.call_site = e.call_site;
	key.cache = classic_cache_key(&e);
	record_alloc(ctx, &key, e.ptr, e.bytes_req, e.bytes_alloc, e.name,
		     NULL);
	return 0;
}

SEC("tracepoint/kmem/kfree")
int kfree_tp(struct trace_event_raw_kfree *r)
{
	record_cache_free(BPF_CORE_READ(r, ptr), 0, NULL, NULL);
	return 0;
}

SEC("tracepoint/kmem/kmem_cache_free")
int cache_free_tp(struct trace_event_raw_kmem_cache_free *r)
{
	const char *name = cache_free_record_name(r);

	record_cache_free(BPF_CORE_READ(r, ptr), name ? name_key(name) : 0,
			  name, NULL);
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
