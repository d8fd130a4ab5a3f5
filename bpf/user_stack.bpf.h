/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sampled copies of user stacks for unwinding in user space (as perf
 * --call-graph dwarf does): the registers an unwinder needs and the top
 * USER_STACK_BYTES of the stack (from the page holding the stack pointer)
 * go into a ring buffer. Calls that are not
 * sampled cost one per-CPU countdown decrement (bpf/sampler.bpf.h).
 * Include after vmlinux.h and the libbpf headers.
 */
#ifndef KHEAP_USER_STACK_BPF_H
#define KHEAP_USER_STACK_BPF_H

#include "maps.bpf.h"
#include "user_stack.h"
#include "sampler.bpf.h"

/* Off (0) unless user space asks for copies; then one call in about
 * user_stack_sample_mask + 1 is copied (mask 0: every call), plus the
 * first call of each new row. */
const volatile __u8 user_stack_copy = 0;
const volatile __u32 user_stack_sample_mask = 0;

/* Sized from user space before load. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} user_stacks SEC(".maps");

KHEAP_PERCPU_COUNTERS(user_stack_counters, struct user_stack_counters)

/* Never set: puts the record's type into the object's BTF, where the Rust
 * skeleton's types come from (a ring buffer map names no value type). */
struct user_stack_sample *user_stack_sample_type;

KHEAP_PERCPU_SLOT(user_stack_countdown, __u32);

#define USER_STACK_COUNT(field) PERCPU_COUNT_ADD(user_stack_counters, field, 1)

#define USER_STACK_PAGE 4096

/* Copies the stack pages from the one holding sp up: USER_STACK_BYTES if
 * they can all be read, else the pages up to the first that cannot. Near
 * the top of a main thread's stack the kernel leaves up to 8 KiB untouched
 * (exec randomises the first stack pointer), and an untouched page cannot
 * be read here. Whole pages at fixed offsets keep the verifier's bounds
 * simple. Returns the bytes copied. */
static __always_inline __u32 copy_stack_top(__u8 *dst, __u64 start)
{
	__u32 copied = 0;

	if (!bpf_probe_read_user(dst, USER_STACK_BYTES, (void *)start))
		return USER_STACK_BYTES;
#pragma unroll
	for (int i = 0; i < USER_STACK_BYTES / USER_STACK_PAGE; i++) {
		if (bpf_probe_read_user(dst + i * USER_STACK_PAGE,
					USER_STACK_PAGE,
					(void *)(start + i * USER_STACK_PAGE)))
			break;
		copied += USER_STACK_PAGE;
	}
	return copied;
}

/* Whether a copy wakes the reader (submit flags). A wakeup is an irq_work:
 * a self-interrupt on the traced CPU (a VM exit in a guest) and a context
 * switch to kheap, once per copy when the reader keeps up. The reader looks
 * at the ring every few milliseconds anyway, so only a new row's copy (read
 * while its process still lives: user space reads its mappings then) and
 * the copy that fills the ring past a quarter (so a burst cannot fill it
 * before the next look) wake it. */
static __always_inline __u64 copy_wakeup(bool first)
{
	__u64 quarter = bpf_ringbuf_query(&user_stacks, BPF_RB_RING_SIZE) / 4;
	__u64 waiting = bpf_ringbuf_query(&user_stacks, BPF_RB_AVAIL_DATA);

	if (first || (waiting >= quarter &&
		      waiting < quarter + sizeof(struct user_stack_sample) +
					BPF_RINGBUF_HDR_SZ))
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

/* Called on the counted path of an allocator call: copies this call's stack
 * if it is sampled. sp and bp are the stack and frame pointers at the
 * allocator's entry (where user space starts unwinding); with bp_at, the
 * frame pointer is read from that user address instead, and only for a copy.
 * `first` forces a copy (a new row). */
static __always_inline void maybe_copy_user_stack(const struct malloc_key *key,
						  __u64 size, __u64 sp,
						  __u64 bp, __u64 bp_at,
						  bool first)
{
	struct user_stack_sample *s;

	if (!user_stack_copy)
		return;
	if (!first && user_stack_sample_mask &&
	    !sample_by_countdown(&user_stack_countdown, user_stack_sample_mask))
		return;
	s = bpf_ringbuf_reserve(&user_stacks, sizeof(*s), 0);
	if (!s) {
		USER_STACK_COUNT(dropped);
		return;
	}
	s->key = *key;
	s->size = size;
	s->sp = sp;
	s->bp = bp;
	if (bp_at && bpf_probe_read_user(&s->bp, sizeof(s->bp), (void *)bp_at))
		s->bp = 0;
	s->pad = 0;
	s->start = s->sp & ~(__u64)(USER_STACK_PAGE - 1);
	s->len = copy_stack_top(s->data, s->start);
	if (!s->len) {
		USER_STACK_COUNT(copy_failed);
		bpf_ringbuf_discard(s, 0);
		return;
	}
	USER_STACK_COUNT(sampled);
	bpf_ringbuf_submit(s, copy_wakeup(first));
}

#endif /* KHEAP_USER_STACK_BPF_H */
