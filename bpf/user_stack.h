/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Copies of the top of a user stack, sent to user space to be unwound from
 * .eh_frame (src/malloc/unwind.rs): code built without frame pointers stops
 * a frame-pointer walk after a frame or two. Shared by
 * bpf/user_stack.bpf.h and the Rust side (skeleton types).
 */
#ifndef KHEAP_USER_STACK_H
#define KHEAP_USER_STACK_H

#include "malloc.h"

/* Bytes of stack copied from the page holding the stack pointer up: frames
 * within them are unwound. Whole pages. */
#define USER_STACK_BYTES 16384

/* One sampled allocator call, as a ring-buffer record. */
struct user_stack_sample {
	struct malloc_key key; /* the row the call was counted in */
	__u64 size;	       /* bytes asked for */
	/* Registers at the allocator's entry: the return address is at sp,
	 * so the caller's frame has ip = key.caller, sp = sp + 8, bp = bp. */
	__u64 sp;
	__u64 bp;
	__u64 start; /* the address data[0] was copied from */
	__u32 len;   /* bytes of data valid, from start up */
	__u32 pad;
	__u8 data[USER_STACK_BYTES];
};

/* Per-CPU: nothing is dropped silently. */
struct user_stack_counters {
	__u64 sampled;	   /* copies sent */
	__u64 dropped;	   /* the ring buffer was full */
	__u64 copy_failed; /* the stack could not be read */
};

#endif /* KHEAP_USER_STACK_H */
