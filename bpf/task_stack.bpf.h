/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The current task's kernel stack, for the kmem object's interrupt test
 * (kheap/interrupt_context.c) and latency's trampoline frame
 * (latency.bpf.c). */
#ifndef KHEAP_TASK_STACK_BPF_H
#define KHEAP_TASK_STACK_BPF_H

/* x86-64 THREAD_SIZE, a task's kernel stack (16 KiB; 32 KiB only with
 * KASAN, not in distribution kernels). */
#define KHEAP_THREAD_SIZE (16 * 1024)

/* The lowest address of the current task's kernel stack: through the typed
 * task where the program may ask for it (`typed`: bpf_get_current_task_btf,
 * 5.11), else read through CO-RE. */
static __always_inline __u64 task_stack_base(bool typed)
{
	struct task_struct *t;

	if (typed)
		return (__u64)bpf_get_current_task_btf()->stack;
	t = (void *)bpf_get_current_task();
	return (__u64)BPF_CORE_READ(t, stack);
}

/* Whether `at` lies on the kernel stack that starts at `base`. Compared,
 * not subtracted: `at` may be a program's context pointer, on which the
 * verifier refuses arithmetic. */
static __always_inline bool on_task_stack(__u64 at, __u64 base)
{
	return at >= base && at < base + KHEAP_THREAD_SIZE;
}

#endif
