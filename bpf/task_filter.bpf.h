/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Which tasks a BPF object counts: the PID filter map, the fork follower
 * that adds children of traced processes (and its tp_btf program), and the
 * command-name match. One copy for every object (kheap.bpf.c, malloc.bpf.c).
 * Include after vmlinux.h and the libbpf headers.
 */
#ifndef KHEAP_TASK_FILTER_BPF_H
#define KHEAP_TASK_FILTER_BPF_H

#include "maps.bpf.h"
#include "kheap.h"
#include "kmem_classic.bpf.h"

/* Processes (tgids) whose events are counted when a PID filter is on: filled
 * by user space and by follow_fork(). */
KHEAP_HASH(pid_filter, __u32, __u8, 8192);

static __always_inline bool pid_traced(__u32 tgid)
{
	return bpf_map_lookup_elem(&pid_filter, &tgid) != NULL;
}

/* A child process of a traced process is traced too. New threads share their
 * tgid and need nothing. */
static __always_inline void follow_fork(__u32 parent_tgid, __u32 child_tgid)
{
	__u8 one = 1;

	if (parent_tgid != child_tgid && pid_traced(parent_tgid))
		bpf_map_update_elem(&pid_filter, &child_tgid, &one, BPF_ANY);
}

/* cgroup v2 ids (directory inode numbers) whose tasks, and their
 * descendants', are counted when the cgroup filter is on: filled by user
 * space (--cgroup). */
KHEAP_HASH(cgroup_filter, __u64, __u8, 64);

/* Deeper cgroups are matched on their first KHEAP_CGROUP_MAX_DEPTH levels,
 * which is where any target lies in practice (systemd: 3-6 levels). */
#define KHEAP_CGROUP_MAX_DEPTH 32

/* Whether the current task is in a target cgroup or below one: its own
 * cgroup, then each ancestor from the root down (0 past the task's own
 * level; ancestor_cgroup_id() in kmem_classic.bpf.h). */
static __always_inline bool cgroup_traced(void)
{
	__u64 id = bpf_get_current_cgroup_id();
	struct cgroup___ancestor_ids *cg;

	if (bpf_map_lookup_elem(&cgroup_filter, &id))
		return true;
	cg = ancestors_of_current();
	for (int level = 1; level < KHEAP_CGROUP_MAX_DEPTH; level++) {
		id = ancestor_cgroup_id(cg, level);
		if (!id)
			return false;
		if (bpf_map_lookup_elem(&cgroup_filter, &id))
			return true;
	}
	return false;
}

/* Whether the current task's command name is `want` (NUL-terminated). */
static __always_inline bool comm_is(const volatile char *want)
{
	char comm[KHEAP_COMM_LEN];

	bpf_get_current_comm(comm, sizeof(comm));
#pragma unroll
	for (int i = 0; i < KHEAP_COMM_LEN; i++) {
		if (comm[i] != want[i])
			return false;
		if (comm[i] == 0)
			return true;
	}
	return true;
}

/* Whether only some tasks' events are counted (kheap's own exclusion aside).
 * Constant after load. */
static __always_inline bool tasks_filtered(const volatile struct task_filter *f)
{
	return f->pids || f->comm_set || f->cgroups;
}

static __always_inline bool task_passes(const volatile struct task_filter *f,
					__u32 tgid)
{
	if (f->ignore_tgid && tgid == f->ignore_tgid)
		return false;
	if (f->pids && !pid_traced(tgid))
		return false;
	if (f->comm_set && !comm_is(f->comm))
		return false;
	if (f->cgroups && !cgroup_traced())
		return false;
	return true;
}

/* The fork follower on typed arguments, which give tgids (the classic
 * record has thread ids). Every object that follows children loads it. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(fork_btf, struct task_struct *parent, struct task_struct *child)
{
	follow_fork(parent->tgid, child->tgid);
	return 0;
}

#endif /* KHEAP_TASK_FILTER_BPF_H */
