// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * kheap --latency: time spent inside the slab allocator entry points, per
 * call site. Entry and exit are fentry/fexit where the kernel allows them,
 * kprobe/kretprobe otherwise (user space enables one pair).
 *
 * Both exit mechanisms replace the timed function's return address, so the
 * kmem tracepoints inside it report a trampoline as call_site. The entry
 * program therefore finds the real caller itself and publishes it in
 * `lat_starts`, which the record object shares (map fd reuse) to fix its
 * call sites while latency is measured.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "kheap.h"
#include "lat_starts.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

KHEAP_PERCPU_HASH(latencies, struct lat_key, struct lat_stats, 8192);

KHEAP_PERCPU_SLOT(lat_counters, struct lat_counters);

static struct lat_stats zero_lat;

#define STALE_START_NS 1000000000ULL

enum lat_loss { LAT_MISSED_START, LAT_MAP_FULL, LAT_NESTED };

static __always_inline void count(enum lat_loss what)
{
	__u32 zero = 0;
	struct lat_counters *c = bpf_map_lookup_elem(&lat_counters, &zero);

	if (!c)
		return;
	if (what == LAT_MISSED_START)
		c->missed_start++;
	else if (what == LAT_MAP_FULL)
		c->map_full++;
	else
		c->nested++;
}

static __always_inline void on_enter(void *ctx, __u64 caller)
{
	__u64 tid = bpf_get_current_pid_tgid(), now = bpf_ktime_get_ns();
	struct lat_start *outer = bpf_map_lookup_elem(&lat_starts, &tid);
	struct lat_start s;

	/* An interrupt allocating inside a timed call runs as the same task:
	 * overwriting the start would lose the outer call at its exit. A start
	 * older than STALE_START_NS is taken as one whose exit never ran (a
	 * kretprobe without a free instance) and replaced. */
	if (outer && now - outer->ts < STALE_START_NS) {
		if (!outer->nested++)
			outer->nested_call_site = caller;
		return;
	}
	s = (struct lat_start){
		.func_ip = bpf_get_func_ip(ctx),
		.call_site = caller,
	};
	/* last, so the work above is not timed */
	s.ts = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&lat_starts, &tid, &s, BPF_ANY))
		count(LAT_MAP_FULL);
}

static __always_inline void on_exit(void)
{
	__u64 tid = bpf_get_current_pid_tgid();
	struct lat_start *s = bpf_map_lookup_elem(&lat_starts, &tid);
	struct lat_stats *st;
	struct lat_key key = {};
	__u64 delta;

	if (!s) {
		count(LAT_MISSED_START);
		return;
	}
	if (s->nested) {
		s->nested--;
		count(LAT_NESTED);
		return;
	}
	delta = bpf_ktime_get_ns() - s->ts;
	key.call_site = s->call_site;
	key.func_ip = s->func_ip;
	bpf_map_delete_elem(&lat_starts, &tid);

	st = bpf_map_lookup_elem(&latencies, &key);
	if (!st) {
		bpf_map_update_elem(&latencies, &key, &zero_lat, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&latencies, &key);
		if (!st) {
			count(LAT_MAP_FULL);
			return;
		}
	}
	st->count++;
	st->total_ns += delta;
	st->hist[hist_index(size_bucket(delta))]++;
}

/* The caller of the timed function, from the stack: the frame after the
 * function's own entry (func+0..15: the kprobe's address, or func+5/+9
 * where it calls the fentry trampoline). */
#define CALLER_STACK_DEPTH 8

static __always_inline __u64 caller_from_stack(void *ctx)
{
	__u64 frames[CALLER_STACK_DEPTH] = {};
	__u64 func = bpf_get_func_ip(ctx);
	long n = bpf_get_stack(ctx, frames, sizeof(frames), 0);

#pragma unroll
	for (int i = 0; i < CALLER_STACK_DEPTH - 1; i++) {
		if (i * 8 + 16 <= n && frames[i] - func < 16)
			return frames[i + 1];
	}
	return 0;
}

/* kprobes: one program, attached to every resolved allocator function. */
SEC("kprobe")
int BPF_KPROBE(lat_enter_kprobe)
{
	/* Not the return address at sp: the kretprobe on the same function
	 * has already replaced it with its trampoline. The unwinder recovers
	 * the real one. */
	on_enter(ctx, caller_from_stack(ctx));
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(lat_exit_kretprobe)
{
	on_exit();
	return 0;
}

/* fentry/fexit programs bind to one function each at load time; user space
 * retargets these slots to the allocator functions the kernel has (the
 * placeholder names below are replaced before load) and turns off the rest. */
#define FENTRY_SLOT(n)                                 \
	SEC("fentry/__kmalloc_noprof")                 \
	int BPF_PROG(lat_enter_fentry##n)              \
	{                                              \
		on_enter(ctx, caller_from_stack(ctx)); \
		return 0;                              \
	}                                              \
	SEC("fexit/__kmalloc_noprof")                  \
	int BPF_PROG(lat_exit_fexit##n)                \
	{                                              \
		on_exit();                             \
		return 0;                              \
	}

FENTRY_SLOT(0)
FENTRY_SLOT(1)
FENTRY_SLOT(2)
FENTRY_SLOT(3)
FENTRY_SLOT(4)
FENTRY_SLOT(5)
