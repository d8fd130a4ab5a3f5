/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Kernel stacks stored by content. A BPF stack-trace map hashes each stack
 * into a bucket and refuses (EEXIST) every later capture of a stack whose
 * bucket another stack holds, for the rest of the run. Here the stack is
 * copied into per-CPU scratch with bpf_get_stack(), hashed over its frames
 * (64 bits), and kept in a hash map keyed by that hash: two different stacks
 * only collide if their 63-bit hashes are equal (odds ~n^2/2^64, about 1e-11
 * for 16k stacks), and a full map is counted, never confused with another
 * stack. Include after vmlinux.h and the libbpf headers.
 */
#ifndef KHEAP_STACK_STORE_BPF_H
#define KHEAP_STACK_STORE_BPF_H

#include "maps.bpf.h"
#include "kheap.h"

/* Resized from user space before load (twice the stacks kept: idle stacks
 * are deleted by `kheap top`, and a stack is stored before its counts). */
KHEAP_HASH(stack_traces, __u64, struct stack_frames, 16384);

/* Stacks being captured (too big for the BPF stack), one buffer per level
 * of nesting on a CPU: a program can run inside another on the same CPU
 * (an interrupt allocating while a task's event is being captured: seen
 * on 6.18 for another of kheap's programs; by the kernel's source, raw
 * tracepoints before 6.2 nest even the same one), and with a single
 * buffer the inner capture overwrote the outer one's frames, which were
 * then stored as the outer event's stack (seen on 6.18: writev's kmalloc-192
 * events under the frames of a timer's it_real_fn). Levels: task, soft
 * interrupt, hard interrupt, NMI. */
#define KHEAP_SCRATCH_LEVELS 4
KHEAP_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, stack_scratch, __u32, struct stack_frames,
	  KHEAP_SCRATCH_LEVELS);

/* The scratch buffers taken on this CPU. A program that runs inside another
 * ends before the outer one goes on, so this counts up and back down like
 * a stack without atomics. */
KHEAP_PERCPU_SLOT(stack_scratch_used, __u32);

/* The scratch helpers below are global functions: the verifier checks each
 * once, on its own, rather than at every capture of every program. An
 * object whose programs call them with preemption off defines
 * KHEAP_SCRATCH_HELPERS_STATIC before including this header: verifiers
 * from 6.10 (bpf_preempt_disable) to 6.12 refuse any call to a global
 * function with preemption off ("global function calls are not allowed
 * with preemption disabled"), and a static function is checked at each
 * call instead. */
#ifdef KHEAP_SCRATCH_HELPERS_STATIC
#define KHEAP_SCRATCH_HELPER static __noinline
#else
#define KHEAP_SCRATCH_HELPER __noinline
#endif

/* Takes this CPU's next scratch buffer: its level, to look it up and to give
 * back with scratch_release(), or -1 when all are taken (more than four
 * programs nested: not expected). */
KHEAP_SCRATCH_HELPER int scratch_take(void)
{
	__u32 zero = 0, level;
	__u32 *used = bpf_map_lookup_elem(&stack_scratch_used, &zero);

	if (!used)
		return -1;
	level = *used;
	if (level >= KHEAP_SCRATCH_LEVELS)
		return -1;
	*used = level + 1;
	return level;
}

KHEAP_SCRATCH_HELPER int scratch_release(void)
{
	__u32 zero = 0;
	__u32 *used = bpf_map_lookup_elem(&stack_scratch_used, &zero);

	if (used && *used)
		*used -= 1;
	return 0;
}

enum stack_result {
	STACK_OK,
	STACK_NOT_CAPTURED, /* bpf_get_stack failed */
	STACK_MAP_FULL,
};

/* The hash (> 0) of the first `len` bytes of frames in this CPU's scratch
 * buffer of `level`. As a global function the verifier checks it once
 * instead of walking its 64 iterations again for every state that reaches
 * a capture (that walk was 60% of what verifying kmalloc_btf took). It
 * looks the scratch up itself: a global function may take no pointer on
 * older kernels (5.10 accepts scalars and the context only). */
KHEAP_SCRATCH_HELPER __u64 scratch_stack_hash(__u32 level, long len)
{
	struct stack_frames *f = bpf_map_lookup_elem(&stack_scratch, &level);
	__u64 h = 0xcbf29ce484222325ULL;

	if (!f)
		return 1;
	for (int i = 0; i < KHEAP_STACK_DEPTH; i++) {
		if (i * 8 >= len)
			break;
		/* multiply-xorshift: every bit of every frame reaches the
		 * high bits */
		h = (h ^ f->ip[i]) * 0x9E3779B97F4A7C15ULL;
		h ^= h >> 29;
	}
	/* positive and non-zero: 0 means "no stack" to user space */
	h &= 0x7FFFFFFFFFFFFFFFULL;
	return h ? h : 1;
}

/* Captures the current stack (kernel, or user with BPF_F_USER_STACK in
 * flags) into the scratch buffer of `level` and sets *id to its hash
 * (> 0). *frames is set to the buffer even when the capture fails. Returns
 * whether a stack was captured. */
static __always_inline bool capture_stack(void *ctx, __u64 flags, __u32 level,
					  __u64 *id,
					  struct stack_frames **frames)
{
	struct stack_frames *f = bpf_map_lookup_elem(&stack_scratch, &level);
	long len;

	if (!f)
		return false;
	/* bpf_get_stack zeroes the buffer past the last frame, so equal
	 * stacks are equal buffers. */
	*frames = f;
	len = bpf_get_stack(ctx, f->ip, sizeof(f->ip), flags);
	if (len <= 0)
		return false;
	*id = scratch_stack_hash(level, len);
	return true;
}

/* A stack captured before the running program, for it (vmalloc's on the
 * kprobe path, kheap/sources.c): the program copies its frames into a
 * scratch buffer it took and marks them here with its context, so that a
 * program interrupting it on this CPU does not take them for its own. */
struct given_stack {
	__u64 ctx;
	long len;    /* bytes of frames in the scratch */
	__u32 level; /* the scratch buffer's */
	__u32 _pad;
};

KHEAP_PERCPU_SLOT(given_stacks, struct given_stack);

/* The length of the stack given to the program of context `ctx`, or 0 when
 * it must capture its own. */
static __always_inline long given_stack_len(void *ctx)
{
	__u32 zero = 0;
	struct given_stack *g = bpf_map_lookup_elem(&given_stacks, &zero);

	return g && g->ctx == (__u64)ctx ? g->len : 0;
}

/* Stores a captured stack under its hash if it is not stored yet. */
static __always_inline enum stack_result keep_stack(__u64 id,
						    struct stack_frames *f)
{
	int err;

	if (bpf_map_lookup_elem(&stack_traces, &id))
		return STACK_OK;
	/* int: 6.1 zero-extends helper errors from 32 bits */
	err = bpf_map_update_elem(&stack_traces, &id, f, BPF_NOEXIST);
	if (err && err != -KHEAP_EEXIST)
		return STACK_MAP_FULL;
	return STACK_OK;
}

/* Captures the current stack and stores it if it is new (capture_stack,
 * then keep_stack) in a scratch buffer taken and given back. */
static __always_inline enum stack_result store_stack(void *ctx, __u64 flags,
						     __u64 *id)
{
	struct stack_frames *frames = NULL;
	enum stack_result r = STACK_NOT_CAPTURED;
	int level = scratch_take();

	if (level < 0)
		return STACK_NOT_CAPTURED;
	if (capture_stack(ctx, flags, level, id, &frames))
		r = keep_stack(*id, frames);
	scratch_release();
	return r;
}

/* Stores the stack given to the program (given_stack_len(), > 0), which
 * is in the scratch buffer its giver took, as store_stack() stores a
 * captured one. */
static __always_inline enum stack_result store_given_stack(long len, __u64 *id)
{
	__u32 zero = 0;
	struct given_stack *g = bpf_map_lookup_elem(&given_stacks, &zero);
	struct stack_frames *f;
	__u32 level;

	if (!g)
		return STACK_NOT_CAPTURED;
	level = g->level;
	f = bpf_map_lookup_elem(&stack_scratch, &level);
	if (!f)
		return STACK_NOT_CAPTURED;
	*id = scratch_stack_hash(level, len);
	return keep_stack(*id, f);
}

#endif /* KHEAP_STACK_STORE_BPF_H */
