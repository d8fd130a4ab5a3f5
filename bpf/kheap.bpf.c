// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * kheap: kernel heap allocations aggregated in the kernel. One object serves
 * every kmem subcommand; user space picks the mode before load (cfg, read-only
 * data, so the verifier drops what a run does not use):
 *
 * - record, top, slab: every traced allocation updates one entry keyed by
 *   (call site, cache), this CPU's slot of the site or else the site's entry
 *   in a hash all CPUs share (kheap/site_slots.c): exact counts, requested
 *   and allocated bytes and a log2 histogram of requested sizes. Kernel
 *   stacks are costly (2-4 us each on an ORC kernel), so by default only a
 *   random sample of events captures one; user space scales the sampled
 *   stacks to the exact per-site totals. Frees are counted per cache
 * (kheap/event_counts.c).
 * - leaks (cfg.track_live): every traced allocation is also remembered by
 *   address in `live` (a plain hash: the free may run on another CPU) with
 *   its site, stack, sizes, time and process; every free of a remembered
 *   address forgets it, in one map operation (the free path is the hot path
 *   of a leak tracer). User space walks `live` for what is outstanding and
 *   derives what was freed as allocated - outstanding - unseen
 *   (kheap/live_objects.c).
 *
 * Each hook exists three times: tp_btf (typed arguments, cheapest), raw_tp
 * (as cheap; 6.1 and 6.12 verifiers reject tp_btf reads of kmalloc's
 * `const void *ptr`) and a classic tracepoint read through CO-RE. User space
 * loads one set per run (src/kernel/attach.rs).
 *
 * Files: every header in bpf/ (*.h) stands alone: it includes the headers
 * of bpf/ it uses and needs only vmlinux.h and libbpf's headers before it;
 * the other objects share them. The .c files in bpf/kheap/ are parts of
 * this file, neither headers nor objects: each is included once, below,
 * after what it uses (`cfg`, the maps, COUNT(), on_alloc(); its first
 * comment names them), and compiles nowhere else (build.rs builds only the
 * *.bpf.c files of bpf/). They are files of their own so that each topic
 * has one, named .c as code that is not a header (as the kernel's
 * kernel/sched/build_policy.c includes its parts), with no include guards:
 * nothing includes them twice.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"
#include "flags.bpf.h"
#include "kheap.h"
#include "lat_starts.bpf.h"
#include "alloc_stats.bpf.h"
#include "kmem_classic.bpf.h"
#include "slab_cache.bpf.h"
#include "stack_store.bpf.h"
#include "sampler.bpf.h"
#include "task_filter.bpf.h"
#include "task_stack.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct kheap_config cfg = {};

/* Whether an event ran in interrupt context (reads cfg). */
#include "kheap/interrupt_context.c"

/* Written by the `clock` program, which user space runs on demand. */
struct clock_sample clock_now = {};

/* The maps keyed by what is traced are shared by all CPUs (SHARED_ADD): a
 * site's hot events are counted in this CPU's slot first
 * (kheap/site_slots.c). */
KHEAP_HASH(sites, struct site_key, struct alloc_stats, 8192);

KHEAP_HASH(stacks, struct stack_key, struct alloc_stats, 8192);

/* Per process (tgid); only updated when the report is grouped by process. */
KHEAP_HASH(procs, __u32, struct alloc_stats, 4096);

KHEAP_HASH(proc_comms, __u32, struct proc_info, 4096);

/* Per cgroup, accounted or not, and the interrupt row; only updated when
 * the report is grouped by cgroup. */
KHEAP_HASH(cgroups, struct cgroup_key, struct alloc_stats, 4096);

/* Per CPU: every free of a named cache adds here, and the values are 8
 * bytes (16 KiB a CPU at 2048 caches). */
KHEAP_PERCPU_HASH(cache_frees, __u64, struct cache_frees, 2048);

/* Written once per cache, when a cache is first seen, off the hot path. */
KHEAP_HASH(cache_names, __u64, struct cache_name, 2048);

KHEAP_PERCPU_COUNTERS(counters, struct counters)

/* Per-CPU countdown to the next sampled stack (bpf/sampler.bpf.h). */
KHEAP_PERCPU_SLOT(sample_countdown, __u32);

/* The kmem object's counters (struct counters in kheap.h). */
#define COUNT_ADD(field, n) PERCPU_COUNT_ADD(counters, field, n)
#define COUNT(field)	    COUNT_ADD(field, 1)

static __always_inline bool sample_now(void)
{
	return sample_by_countdown(&sample_countdown, cfg.stack_sample_mask);
}

/* Records a cache's name the first time the cache is seen. The name comes
 * either as a string (tp_btf, classic records) or is read from the struct
 * kmem_cache at `cache` (raw_tp, resolved kmalloc caches), only here, off
 * the hot path. The cache travels as a number, not a typed pointer: a
 * maybe-NULL pointer carried through the event path would double the states
 * the verifier walks there (3x the load time of kmalloc_btf). */
static __always_inline void remember_cache_name(__u64 cache, const char *name)
{
	struct cache_name n = {};

	/* No test of `cache` itself: a branch on it would make the verifier
	 * tell its values apart in every state before. No cache (0), an
	 * unresolved one (KHEAP_CACHE_UNRESOLVED) and an odd key (a size class
	 * standing in for an unknown cache) are no kernel addresses: the read
	 * fails and leaves name NULL. */
	if (!name)
		name = BPF_CORE_READ((struct kmem_cache *)cache, name);
	if (!name)
		return;
	bpf_probe_read_kernel_str(n.name, sizeof(n.name), name);
	bpf_map_update_elem(&cache_names, &cache, &n, BPF_NOEXIST);
}

/* Whether an event is kheap's own. */
#include "kheap/own_process.c"
/* The per-CPU front of `sites`. */
#include "kheap/site_slots.c"
/* record, top, slab: what an event adds to the counts of its site, stack,
 * process, cgroup and cache. */
#include "kheap/event_counts.c"
/* leaks: objects tracked by address until their free. */
#include "kheap/live_objects.c"

/* The common path of every allocation event. `name` is only read when the
 * (site, cache) pair is new, so the cost stays off the hot path. `accounted`
 * is only computed by callers when cfg.by_cgroup. `site_hint`: what the
 * event knows of its site's slot (count_site()), or 0; leaks uses none. */
static __always_inline void on_alloc(void *ctx, bool classic,
				     struct site_key *key, const void *ptr,
				     __u64 req, __u64 alloc, bool accounted,
				     const char *name, __u32 site_hint)
{
	bool interrupt = false;
	__u32 tgid = 0;

	/* With --latency, exit probes hide the real return address. */
	if (cfg.latency_active) {
		__u64 tid = bpf_get_current_pid_tgid();
		struct lat_start *ls = bpf_map_lookup_elem(&lat_starts, &tid);

		__u64 caller =
			ls ? (ls->nested ? ls->nested_call_site : ls->call_site)
			   : 0;

		if (caller)
			key->call_site = caller;
	}

	/* An allocation in interrupt context is not the running task's: it
	 * goes to the interrupt row, and no filter of tasks (PIDs, command
	 * name, cgroups) matches it. */
	if (cfg.tests_context) {
		interrupt = in_interrupt_context(ctx, classic);
		if (interrupt && tasks_filtered(&cfg.filter))
			return;
	}
	/* cfg is constant after load: the tgid is asked for only where a
	 * filter, a per-process view or live objects need it; otherwise only
	 * whether the event is kheap's own (kheap/own_process.c). An
	 * interrupt known as such is not kheap's even when it lands on kheap's
	 * thread (only kheap's own exclusion is left to test here: a filter of
	 * tasks has returned above). */
	if (tasks_filtered(&cfg.filter) || cfg.by_process || cfg.track_live) {
		tgid = bpf_get_current_pid_tgid() >> 32;
		if (!interrupt && !task_passes(&cfg.filter, tgid))
			return;
	} else if (!interrupt && task_left_out(true)) {
		return;
	}
	if (req < cfg.min_size || (cfg.max_size && req > cfg.max_size))
		return;
	if (!ptr) {
		COUNT(alloc_failed);
		return;
	}
	COUNT(allocs);
	if (cfg.track_live)
		track_alloc(ctx, classic, key, (__u64)ptr, req, alloc, tgid,
			    accounted, interrupt, name);
	else
		count_alloc(ctx, classic, key, req, alloc, tgid, accounted,
			    interrupt, name, site_hint);
}

static __always_inline void on_free(const void *ptr, __u64 cache,
				    const char *name)
{
	if (cfg.track_live)
		track_free((__u64)ptr);
	else
		count_free(ptr, cache, name, 0);
}

/* A kfree(): the event names no cache; with cfg.kfree_caches (top, slab)
 * the kernel is asked for the object's, counted under a tag that user
 * space joins to that cache's kmalloc row. */
static __always_inline void on_kfree(const void *ptr)
{
	if (cfg.kfree_caches && !cfg.track_live)
		count_free(ptr, kfree_cache_kfunc(ptr), NULL,
			   KHEAP_KFREE_CACHE_TAG);
	else
		on_free(ptr, 0, NULL);
}

/* Counts a kmalloc-family event whose key names its cache (or not). */
static __always_inline void count_kmalloc(void *ctx, bool classic,
					  struct site_key *key, const void *ptr,
					  __u64 req, __u64 alloc,
					  __u32 site_hint)
{
	/* Bucket caches are created SLAB_ACCOUNT: charged to the memcg
	 * without __GFP_ACCOUNT. */
	bool accounted = key->kmalloc_accounted;
	const struct kmem_cache *s = (const void *)key->cache;

	if (cfg.by_cgroup && !accounted && key->cache > KHEAP_CACHE_UNRESOLVED)
		accounted = flag_of(BPF_CORE_READ(s, flags) &
				    cfg.slab_account_mask);
	on_alloc(ctx, classic, key, ptr, req, alloc, accounted, NULL,
		 site_hint);
}

/* A kmalloc-family event: keyed by the cache the object really lives in
 * (slab_cache.bpf.h), or by its size alone when that is unknown (above the
 * kmalloc caches, or where the kernel gives no way to find it; user space
 * tells which). */
static __always_inline void on_kmalloc(void *ctx, bool classic, __u64 call_site,
				       const void *ptr, __u64 req, __u64 alloc,
				       __u64 gfp_flags)
{
	/* __GFP_ACCOUNT's bit lives in an anonymous enum (6.10+) or a macro
	 * (older), neither reachable through CO-RE: user space reads it from
	 * the kernel's BTF. */
	struct site_key key = {
		.call_site = call_site,
		.kmalloc_size = alloc,
		.kmalloc_accounted = flag_of(gfp_flags & cfg.gfp_account_mask),
	};
	__u32 site_slot = 0;

	if (kmalloc_cache_wanted(ptr, alloc)) {
		bool stale = false;

		key.cache = kmalloc_cache_of(ptr, alloc, call_site, gfp_flags,
					     &stale, &site_slot);
		if (stale)
			COUNT(cache_memo_stale);
	}
	count_kmalloc(ctx, classic, &key, ptr, req, alloc,
		      SITE_HINT_KMALLOC | site_slot);
}

/* Whether a kmem_cache_alloc() is charged to a memory cgroup: asked for by
 * the caller (__GFP_ACCOUNT) or always, for the cache (SLAB_ACCOUNT). */
static __always_inline bool cache_accounted(__u64 gfp_flags, __u64 slab_flags)
{
	return flag_of((gfp_flags & cfg.gfp_account_mask) |
		       (slab_flags & cfg.slab_account_mask));
}

/* The page allocator, vmalloc and percpu (--source). */
#include "kheap/sources.c"

/* ---- tp_btf: typed raw tracepoint arguments ---- */

SEC("tp_btf/kmalloc")
int BPF_PROG(kmalloc_btf, unsigned long call_site, const void *ptr,
	     size_t bytes_req, size_t bytes_alloc, gfp_t gfp_flags, int node)
{
	on_kmalloc(ctx, false, call_site, ptr, bytes_req, bytes_alloc,
		   gfp_flags);
	return 0;
}

SEC("tp_btf/kmem_cache_alloc")
int BPF_PROG(cache_alloc_btf, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s, gfp_t gfp_flags, int node)
{
	struct site_key key = {.call_site = call_site, .cache = (__u64)s};
	bool accounted = false;

	if (cfg.by_cgroup)
		accounted = cache_accounted(gfp_flags, s->flags);
	on_alloc(ctx, false, &key, ptr, s->object_size, s->size, accounted,
		 s->name, 0);
	return 0;
}

SEC("tp_btf/kfree")
int BPF_PROG(kfree_btf, unsigned long call_site, const void *ptr)
{
	on_kfree(ptr);
	return 0;
}

SEC("tp_btf/kmem_cache_free")
int BPF_PROG(cache_free_btf, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s)
{
	on_free(ptr, (__u64)s, s->name);
	return 0;
}

/* ---- raw_tp: untyped raw tracepoint arguments ---- */

/* Also attached to kmalloc_node on kernels that have it (before 6.1), whose
 * first five arguments are kmalloc's. */
SEC("raw_tp/kmalloc")
int kmalloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const void *ptr = (const void *)ctx->args[1];

	on_kmalloc(ctx, false, ctx->args[0], ptr, ctx->args[2], ctx->args[3],
		   ctx->args[4]);
	return 0;
}

/* Also attached to kmem_cache_alloc_node on kernels that have it (before
 * 6.1), whose arguments are the same. */
SEC("raw_tp/kmem_cache_alloc")
int cache_alloc_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const void *ptr = (const void *)ctx->args[1];
	struct site_key key = {.call_site = ctx->args[0]};
	/* Read once, each from its own slot: clang would otherwise load one
	 * of args[3]/args[4] through a computed pointer, which verifiers
	 * refuse ("dereference of modified ctx ptr"). */
	__u64 arg2 = ctx->args[2], arg3 = ctx->args[3], arg4 = ctx->args[4];
	const struct kmem_cache *s;
	bool accounted = false;
	__u64 req, alloc, gfp_flags;

	barrier_var(arg3);
	barrier_var(arg4);
	if (cache_events_pass_cache()) {
		s = (const void *)arg2;
		req = BPF_CORE_READ(s, object_size);
		alloc = BPF_CORE_READ(s, size);
		gfp_flags = arg3;
		key.cache = (__u64)s;
	} else {
		/* before 6.1: (call_site, ptr, bytes_req, bytes_alloc, gfp) */
		s = ptr ? cache_of_page(ptr) : NULL;
		req = arg2;
		alloc = arg3;
		gfp_flags = arg4;
		/* Unknown cache (no bases): the object size stands in, as
		 * for classic records. */
		key.cache = s ? (__u64)s : ((alloc << 1) | 1);
	}
	if (cfg.by_cgroup)
		accounted = cache_accounted(gfp_flags,
					    s ? BPF_CORE_READ(s, flags) : 0);
	on_alloc(ctx, false, &key, ptr, req, alloc, accounted, NULL, 0);
	return 0;
}

SEC("raw_tp/kfree")
int kfree_raw(struct bpf_raw_tracepoint_args *ctx)
{
	on_kfree((const void *)ctx->args[1]);
	return 0;
}

SEC("raw_tp/kmem_cache_free")
int cache_free_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const void *ptr = (const void *)ctx->args[1];
	const struct kmem_cache *s;

	if (cache_events_pass_cache())
		s = (const void *)ctx->args[2];
	else /* before 6.1 the event passes no cache (or only its name) */
		s = ptr && !cfg.track_live ? cache_of_page(ptr) : NULL;
	on_free(ptr, (__u64)s, NULL);
	return 0;
}

SEC("raw_tp/sched_process_fork")
int fork_raw(struct bpf_raw_tracepoint_args *ctx)
{
	const struct task_struct *parent = (const void *)ctx->args[0];
	const struct task_struct *child = (const void *)ctx->args[1];

	follow_fork(BPF_CORE_READ(parent, tgid), BPF_CORE_READ(child, tgid));
	return 0;
}

/* ---- classic tracepoints, fields read through CO-RE ---- */

SEC("tracepoint/kmem/kmalloc")
int kmalloc_tp(void *ctx)
{
	struct kmem_alloc_event e;

	read_kmalloc_record(ctx, &e);
	on_kmalloc(ctx, true, e.call_site, e.ptr, e.bytes_req, e.bytes_alloc,
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
	on_alloc(ctx, true, &key, e.ptr, e.bytes_req, e.bytes_alloc,
		 e.accounted >= 0 ? e.accounted
				  : flag_of(e.gfp_flags & cfg.gfp_account_mask),
		 e.name, 0);
	return 0;
}

SEC("tracepoint/kmem/kfree")
int kfree_tp(void *ctx)
{
	on_kfree(free_record_ptr(ctx));
	return 0;
}

SEC("tracepoint/kmem/kmem_cache_free")
int cache_free_tp(void *ctx)
{
	const char *name = cache_free_record_name(ctx);

	on_free(free_record_ptr(ctx), name ? name_key(name) : 0, name);
	return 0;
}

/* The classic record has thread ids, not tgids: a fork from a process's main
 * thread is followed (its tid is the tgid); a new thread adds its own tid,
 * which no tgid lookup ever matches. */
SEC("tracepoint/sched/sched_process_fork")
int fork_tp(struct trace_event_raw_sched_process_fork *r)
{
	follow_fork(BPF_CORE_READ(r, parent_pid), BPF_CORE_READ(r, child_pid));
	return 0;
}

/* leaks: the cache a merged cache's socket was asked for (run on demand). */
#include "kheap/asked_cache.c"

/* Run by user space (BPF_PROG_RUN) when it reads live objects: the jiffies
 * now, to turn the jiffies stamps of objects into ages. A raw_tp program,
 * never attached: kernels run those on demand since 5.10 (syscall
 * programs came with 5.14). */
SEC("raw_tp")
int clock(void *ctx)
{
	clock_now.jiffies = bpf_jiffies64();
	clock_now.ns = bpf_ktime_get_ns();
	return 0;
}
