/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Whether an allocation event ran in interrupt context (hard or soft
 * interrupt, NMI), where the current task is only whoever was interrupted:
 * such an allocation is no task's.
 *
 * The preempt count says so, but it is a per-CPU variable, readable only as
 * a typed ksym, which needs CONFIG_KALLSYMS_ALL (without it the whole object
 * fails to load). Two tests stand in for it:
 *
 * - Where the event's arguments are. Raw tracepoint arguments (tp_btf,
 *   raw_tp) are an array on the kernel stack of the code that fired the
 *   event. On x86-64, an interrupt of kernel code runs on the per-CPU IRQ
 *   stack, and an NMI on its own, so arguments off the current task's stack
 *   mean interrupt context. Classic tracepoint records are in a per-CPU
 *   buffer instead (and their common_flags are overwritten for BPF); see
 *   record_off_task_stack().
 * - Brackets. An interrupt of user mode runs on the task's own stack (which
 *   is empty then), and so do the softirqs run as it ends, so the first test
 *   cannot see it: a timer's signal, a network card's receive refill, made
 *   while a process computes, would be that process's. Programs on the
 *   entry and exit tracepoints of interrupt handlers keep a per-CPU record
 *   of the brackets open (below). Interrupts of user mode without such
 *   tracepoints (other system vectors) are not bracketed: what they
 *   allocate is still the interrupted task's. Softirqs run by ksoftirqd
 *   are bracketed too, so they are no task's either.
 *
 * A part of kheap.bpf.c, not a header (see its first comment):
 * included there once, after `cfg` (kheap.h's struct kheap_config).
 */

/* The brackets open on this CPU: a bit per kind of handler (below). None of
 * these handlers runs inside another of its kind on one CPU, so a bit is
 * enough, and a kind's exit clears only its own: an exit whose entry came
 * before the attach, or before its entry program was attached, clears a bit
 * that is not set and leaves the other kinds' brackets open. User space
 * attaches each kind's exit program before its entry program, so no bit is
 * set without its clear watched. A bracket program interrupted between its
 * load and its store is interrupted by whole brackets, which leave the
 * word as they found it. */
KHEAP_PERCPU_SLOT(interrupts_open, __u32);

enum interrupt_kind {
	INTERRUPT_SOFTIRQ = 1 << 0,
	INTERRUPT_IRQ_HANDLER = 1 << 1,
	INTERRUPT_LOCAL_TIMER = 1 << 2,
	INTERRUPT_IRQ_WORK = 1 << 3,
	INTERRUPT_CALL_FUNCTION = 1 << 4,
	INTERRUPT_CALL_FUNCTION_SINGLE = 1 << 5,
};

static __always_inline void bracket_open(__u32 kind)
{
	__u32 zero = 0;
	__u32 *open = bpf_map_lookup_elem(&interrupts_open, &zero);

	if (open)
		*open |= kind;
}

static __always_inline void bracket_close(__u32 kind)
{
	__u32 zero = 0;
	__u32 *open = bpf_map_lookup_elem(&interrupts_open, &zero);

	if (open)
		*open &= ~kind;
}

static __always_inline bool brackets_open(void)
{
	__u32 zero = 0;
	__u32 *open = bpf_map_lookup_elem(&interrupts_open, &zero);

	return open && *open;
}

/* The programs, raw_tp on every kernel kheap supports (they read no
 * argument), attached by user space to the tracepoints their names say:
 * soft interrupts, device interrupt handlers, and the x86 system vectors
 * that run callbacks (the local timer's hrtimers, irq_work, function
 * calls). As no handler of these kinds runs inside another of its kind,
 * the kernel never skips one of these programs as recursive, which would
 * lose half a bracket. (hrtimer_expire_entry/exit would: a hard hrtimer
 * can interrupt a soft one's program.) */
#define KHEAP_BRACKET(prog, action, kind) \
	SEC("raw_tp")                     \
	int prog(void *ctx)               \
	{                                 \
		action(kind);             \
		return 0;                 \
	}

KHEAP_BRACKET(softirq_exit_raw, bracket_close, INTERRUPT_SOFTIRQ)
KHEAP_BRACKET(softirq_entry_raw, bracket_open, INTERRUPT_SOFTIRQ)
KHEAP_BRACKET(irq_handler_exit_raw, bracket_close, INTERRUPT_IRQ_HANDLER)
KHEAP_BRACKET(irq_handler_entry_raw, bracket_open, INTERRUPT_IRQ_HANDLER)
KHEAP_BRACKET(local_timer_exit_raw, bracket_close, INTERRUPT_LOCAL_TIMER)
KHEAP_BRACKET(local_timer_entry_raw, bracket_open, INTERRUPT_LOCAL_TIMER)
KHEAP_BRACKET(irq_work_exit_raw, bracket_close, INTERRUPT_IRQ_WORK)
KHEAP_BRACKET(irq_work_entry_raw, bracket_open, INTERRUPT_IRQ_WORK)
KHEAP_BRACKET(call_function_exit_raw, bracket_close, INTERRUPT_CALL_FUNCTION)
KHEAP_BRACKET(call_function_entry_raw, bracket_open, INTERRUPT_CALL_FUNCTION)
KHEAP_BRACKET(call_function_single_exit_raw, bracket_close,
	      INTERRUPT_CALL_FUNCTION_SINGLE)
KHEAP_BRACKET(call_function_single_entry_raw, bracket_open,
	      INTERRUPT_CALL_FUNCTION_SINGLE)

/* Whether a kernel stack address is off the current task's stack. */
static __always_inline bool off_task_stack(__u64 at)
{
	return !on_task_stack(at, task_stack_base(cfg.task_btf));
}

/* A classic tracepoint's record: before it runs the program,
 * perf_trace_run_bpf_submit() stores in the record's first 8 bytes the
 * pt_regs the event filled (perf_fetch_caller_regs()), whose sp is the frame
 * of the perf_trace_<event> function: on the stack of the code that fired
 * the event. */
static __always_inline bool record_off_task_stack(void *ctx)
{
	struct pt_regs *regs = NULL;

	if (bpf_probe_read_kernel(&regs, sizeof(regs), ctx) || !regs)
		return false;
	return off_task_stack(BPF_CORE_READ(regs, sp));
}

/* Whether the event of context `ctx` (a classic tracepoint's record when
 * `classic`, else raw tracepoint arguments) ran in interrupt context.
 * A subprogram, not inlined: inlined into the sampled-stack path, its map
 * lookup and reads took registers that moved values of the path every
 * event takes onto the stack (more stores and loads per event, with no
 * run asking for the test). Called, it keeps its registers to itself. */
static __noinline bool in_interrupt_context(void *ctx, bool classic)
{
	/* Both tests, whatever the first says: one branch less for the
	 * verifier to walk on every path after (an interrupt is rare, its
	 * cost does not matter). */
	bool off_stack = classic ? record_off_task_stack(ctx)
				 : off_task_stack((__u64)ctx);

	return off_stack | brackets_open();
}
