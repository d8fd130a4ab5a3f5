// SPDX-License-Identifier: GPL-2.0
/*
 * kheap --latency: time spent inside the slab allocator entry points, per
 * call site. Entry and exit are fentry/fexit where the kernel allows them,
 * kprobe/kretprobe otherwise (user space enables one pair). The call site is
 * not visible at a function's entry through fentry, so the kmem tracepoint
 * that fires inside the allocator fills it into the per-task start record.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "kheap.h"

char LICENSE[] SEC("license") = "GPL";

struct lat_start {
	__u64 ts;
	__u64 call_site;
	__u64 func_ip;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct lat_start);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct lat_key);
	__type(value, struct lat_stats);
} latencies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lat_counters);
} lat_counters SEC(".maps");

static struct lat_stats zero_lat;

static __always_inline __u32 log2_bucket(__u64 v)
{
	__u32 b = 0;

	/* bounded loop: buckets as in kheap.h (0 for 0, b for [2^(b-1), 2^b))
	 */
	for (int i = 0; i < KHEAP_HIST_BUCKETS - 1 && v; i++) {
		v >>= 1;
		b++;
	}
	return b;
}

static __always_inline void count(int missed_start)
{
	__u32 zero = 0;
	struct lat_counters *c = bpf_map_lookup_elem(&lat_counters, &zero);

	if (!c)
		return;
	if (missed_start)
		c->missed_start++;
	else
		c->map_full++;
}

static __always_inline void on_enter(void *ctx)
{
	__u64 tid = bpf_get_current_pid_tgid();
	struct lat_start s = {
		.func_ip = bpf_get_func_ip(ctx),
		.ts = bpf_ktime_get_ns(),
	};

	if (bpf_map_update_elem(&starts, &tid, &s, BPF_ANY))
		count(0);
}

static __always_inline void on_exit(void)
{
	__u64 tid = bpf_get_current_pid_tgid();
	struct lat_start *s = bpf_map_lookup_elem(&starts, &tid);
	struct lat_stats *st;
	struct lat_key key = {};
	__u64 delta;

	if (!s) {
		count(1);
		return;
	}
	delta = bpf_ktime_get_ns() - s->ts;
	key.call_site = s->call_site;
	key.func_ip = s->func_ip;
	bpf_map_delete_elem(&starts, &tid);

	st = bpf_map_lookup_elem(&latencies, &key);
	if (!st) {
		bpf_map_update_elem(&latencies, &key, &zero_lat, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&latencies, &key);
		if (!st) {
			count(0);
			return;
		}
	}
	st->count++;
	st->total_ns += delta;
	st->hist[log2_bucket(delta) & (KHEAP_HIST_BUCKETS - 1)]++;
}

/* The allocation tracepoint fires inside the allocator, before it returns:
 * the only cheap place where the caller (call_site) is known. */
static __always_inline void note_call_site(__u64 call_site)
{
	__u64 tid = bpf_get_current_pid_tgid();
	struct lat_start *s = bpf_map_lookup_elem(&starts, &tid);

	if (s && !s->call_site)
		s->call_site = call_site;
}

SEC("tp_btf/kmalloc")
int BPF_PROG(lat_kmalloc, unsigned long call_site)
{
	note_call_site(call_site);
	return 0;
}

SEC("tp_btf/kmem_cache_alloc")
int BPF_PROG(lat_cache_alloc, unsigned long call_site)
{
	note_call_site(call_site);
	return 0;
}

/* kprobes: one program, attached to every resolved allocator function. */
SEC("kprobe")
int BPF_KPROBE(lat_enter_kprobe)
{
	on_enter(ctx);
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
#define FENTRY_SLOT(n)                    \
	SEC("fentry/__kmalloc_noprof")    \
	int BPF_PROG(lat_enter_fentry##n) \
	{                                 \
		on_enter(ctx);            \
		return 0;                 \
	}                                 \
	SEC("fexit/__kmalloc_noprof")     \
	int BPF_PROG(lat_exit_fexit##n)   \
	{                                 \
		on_exit();                \
		return 0;                 \
	}

FENTRY_SLOT(0)
FENTRY_SLOT(1)
FENTRY_SLOT(2)
FENTRY_SLOT(3)
FENTRY_SLOT(4)
FENTRY_SLOT(5)
