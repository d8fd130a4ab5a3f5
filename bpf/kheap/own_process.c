/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Whether an event is kheap's own. kheap's map reads allocate in the kernel,
 * and that is not the workload, so its process is left out
 * (cfg.filter.ignore_tgid). Asking for the current tgid is a helper call on
 * every event; where no filter or per-process count needs the tgid anyway,
 * a tp_btf program on sched_switch (kernels with BTF of their own) keeps one
 * per-CPU word that says whether a thread of kheap's process runs on this CPU,
 * and an event reads that word (cfg.own_process_by_switch; the per-CPU lookup
 * is inlined).
 *
 * The word is right from the first switch the program sees on a CPU. User
 * space attaches it before any event program and sleeps until the CPU it
 * runs on has switched to it since (src/kernel/kmem/start.rs): kheap's other
 * threads are asleep then, and each is seen as it is switched in. Between
 * the sched_switch tracepoint and the switch itself the scheduler runs with
 * interrupts off and allocates nothing.
 *
 * A part of kheap.bpf.c, not a header (see its first comment):
 * included there once, after `cfg`.
 */

/* 1 while a thread of kheap's process runs on this CPU. */
KHEAP_PERCPU_SLOT(own_process_on_cpu, __u32);

/* Whether the current task is a thread of kheap's process. */
static __always_inline bool own_process_runs(void)
{
	__u32 zero = 0;
	__u32 *on;

	if (!cfg.own_process_by_switch)
		return (bpf_get_current_pid_tgid() >> 32) ==
		       cfg.filter.ignore_tgid;
	on = bpf_map_lookup_elem(&own_process_on_cpu, &zero);
	return on && *on;
}

/* Whether an event's task is left out: by the filter of tasks (PIDs, a
 * command name, cgroups, and then kheap itself), or, with `own_too`, for
 * being kheap's own. */
static __always_inline bool task_left_out(bool own_too)
{
	if (tasks_filtered(&cfg.filter))
		return !task_passes(&cfg.filter,
				    bpf_get_current_pid_tgid() >> 32);
	return own_too && cfg.filter.ignore_tgid && own_process_runs();
}

/* tp_btf only: next->tgid is then one load, where raw_tp's untyped
 * arguments need a bpf_probe_read_kernel() (about 50 ns more per switch on
 * this machine's 6.18, twice what the empty program costs). The first three
 * arguments are the same on every kernel kheap supports. */
SEC("tp_btf/sched_switch")
int BPF_PROG(own_switch_btf, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	__u32 zero = 0;
	__u32 *on = bpf_map_lookup_elem(&own_process_on_cpu, &zero);

	if (on)
		*on = next->tgid == cfg.filter.ignore_tgid;
	return 0;
}
