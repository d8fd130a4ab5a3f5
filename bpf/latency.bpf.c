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
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"
#include "kheap.h"
#include "lat_starts.bpf.h"
#include "task_stack.bpf.h"
#include "arch.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

KHEAP_HASH(latencies, struct lat_key, struct lat_stats, 8192);

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
	SHARED_ADD(st->count, 1);
	SHARED_ADD(st->total_ns, delta);
	SHARED_ADD(st->hist[hist_index(size_bucket(delta))], 1);
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

/* fentry: the caller of the timed function, read from the trampoline's
 * frame. Unwinding cannot find it on a kernel with the frame-pointer
 * unwinder (Ubuntu's): at the function's first instruction the caller has
 * no frame of its own yet, so the unwinder goes from the trampoline to the
 * caller's caller. Above the program's context (the saved arguments) every
 * x86-64 trampoline since 5.5 keeps the return value's slot (when an fexit
 * is attached), its saved rbp, the return address into the traced
 * function (func+5, or +9 after an endbr64) and the one into the caller.
 * The saved rbp is checked too: on a frame-pointer kernel it points into
 * the task's stack, which no argument or stale return-value slot does.
 * Where it does not (rbp is a general register on ORC kernels; an
 * interrupt's stack), the unwinder, right on ORC kernels, is asked. */
#if KHEAP_TRAMPOLINE_FRAME
#define TRAMPOLINE_SLOTS 10

/* Seen on Debian's 7.2: with an fexit attached, the traced function enters
 * the trampoline without a return address into it, neither in the
 * trampoline's frame nor on the unwound stack, so neither search above
 * finds one. Above the arguments, the return value's slot and the saved
 * rbp is then the return address into the caller. It is taken only if the
 * unwinder lists it too. bpf_get_func_arg_cnt is 5.17's: on older kernels
 * the verifier never sees this code. */
static __always_inline __u64 caller_above_jump(void *ctx, const __u64 *slots)
{
	__u64 frames[CALLER_STACK_DEPTH] = {};
	__u64 at, caller = 0;
	long n;

	if (!bpf_core_enum_value_exists(enum bpf_func_id,
					BPF_FUNC_get_func_arg_cnt))
		return 0;
	at = bpf_get_func_arg_cnt(ctx) + 2;
#pragma unroll
	for (int i = 0; i < TRAMPOLINE_SLOTS; i++) {
		if (i == at)
			caller = slots[i];
	}
	if (!caller)
		return 0;
	n = bpf_get_stack(ctx, frames, sizeof(frames), 0);
#pragma unroll
	for (int i = 0; i < CALLER_STACK_DEPTH; i++) {
		if (i * 8 + 8 <= n && frames[i] == caller)
			return caller;
	}
	return 0;
}

static __always_inline __u64 caller_from_trampoline(void *ctx)
{
	__u64 func = bpf_get_func_ip(ctx);
	__u64 stack = task_stack_base(false);
	__u64 slots[TRAMPOLINE_SLOTS] = {};

	if (bpf_probe_read_kernel(slots, sizeof(slots), ctx))
		return caller_from_stack(ctx);
#pragma unroll
	for (int i = 1; i < TRAMPOLINE_SLOTS - 1; i++) {
		if (slots[i] - func < 16 && on_task_stack(slots[i - 1], stack))
			return slots[i + 1];
	}
	func = caller_from_stack(ctx);
	return func ? func : caller_above_jump(ctx, slots);
}
#else
/* The unwinder finds it (bpf/arch.bpf.h). */
#define caller_from_trampoline(ctx) caller_from_stack(ctx)
#endif

/* The kretprobe trampoline's address (from kallsyms; 0 if not found). */
const volatile __u64 kretprobe_return = 0;

/* kprobes: the return address at the function's entry (on top of the
 * stack, or in the link register: bpf/arch.bpf.h), which is the caller, unless
 * the kretprobe on the same function has put its trampoline there first. Then
 * the unwinder recovers the real one (right on ORC kernels; a frame-pointer
 * unwinder skips the caller, as at fentry). Without the trampoline's address,
 * the top of the stack is not trusted. */
static __always_inline __u64 caller_from_kprobe(struct pt_regs *regs)
{
	__u64 ret = 0;

	if (kretprobe_return && !kprobe_entry_return(regs, &ret) && ret &&
	    ret != kretprobe_return)
		return ret;
	return caller_from_stack(regs);
}

/* kprobes: one program, attached to every resolved allocator function. */
SEC("kprobe")
int BPF_KPROBE(lat_enter_kprobe)
{
	on_enter(ctx, caller_from_kprobe(ctx));
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
#define FENTRY_SLOT(n)                                      \
	SEC("fentry/__kmalloc_noprof")                      \
	int BPF_PROG(lat_enter_fentry##n)                   \
	{                                                   \
		on_enter(ctx, caller_from_trampoline(ctx)); \
		return 0;                                   \
	}                                                   \
	SEC("fexit/__kmalloc_noprof")                       \
	int BPF_PROG(lat_exit_fexit##n)                     \
	{                                                   \
		on_exit();                                  \
		return 0;                                   \
	}

FENTRY_SLOT(0)
FENTRY_SLOT(1)
FENTRY_SLOT(2)
FENTRY_SLOT(3)
FENTRY_SLOT(4)
FENTRY_SLOT(5)
