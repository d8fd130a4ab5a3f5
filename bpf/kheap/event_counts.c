/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What record, top and slab count per event (kheap.bpf.c's count_alloc and
 * count_free, and the process, cgroup and stack entries they update): one
 * update of the event's site on the default path (its slot on this CPU),
 * the rest only where a load-time constant in `cfg` asks for it. Stacks are
 * also what leaks samples (record_stack).
 *
 * A part of kheap.bpf.c, not a header (see its first comment):
 * included there once, after its maps, `cfg`, COUNT() and
 * remember_cache_name().
 */

/* --by process: the allocating task's process, or the interrupt row (an
 * allocation in interrupt context is not the interrupted task's). */
static __always_inline void count_process(__u32 tgid, bool interrupt, __u64 req,
					  __u64 alloc, __u32 bucket)
{
	bool new_proc = false;

	if (interrupt)
		tgid = KHEAP_INTERRUPT_TGID;
	if (!upsert_stats(&procs, &tgid, req, alloc, bucket, &new_proc)) {
		COUNT(map_full_procs);
	} else if (new_proc) {
		struct proc_info info = {};

		COUNT(procs_created);
		if (interrupt)
			return;
		bpf_get_current_comm(info.comm, sizeof(info.comm));
		info.cgroup = bpf_get_current_cgroup_id();
		bpf_map_update_elem(&proc_comms, &tgid, &info, BPF_ANY);
	}
}

/* --by cgroup: the allocating task's cgroup, or the interrupt row. */
static __always_inline void count_cgroup(bool accounted, bool interrupt,
					 __u64 req, __u64 alloc, __u32 bucket)
{
	struct cgroup_key key = {.accounted = accounted};
	bool created = false;

	if (interrupt)
		key.interrupt = 1;
	else
		key.cgroup = bpf_get_current_cgroup_id();
	if (!upsert_stats(&cgroups, &key, req, alloc, bucket, &created))
		COUNT(map_full_cgroups);
	else if (created)
		COUNT(cgroups_created);
}

/* cfg.stack_owners: who made a sampled stack's allocation. One made in
 * interrupt context is not the interrupted task's: it gets no process and
 * no cgroup (the same test as --by cgroup's interrupt row). *interrupt is
 * the event's context: tested here unless every event tests it
 * (cfg.tests_context, on_alloc()), then taken as it is. Only on the
 * sampled stack path. */
static __always_inline void stack_owner(void *ctx, bool classic,
					struct stack_key *skey, bool *interrupt)
{
	if (!cfg.tests_context)
		*interrupt = in_interrupt_context(ctx, classic);
	skey->interrupt = *interrupt;
	if (*interrupt)
		return;
	skey->tgid = bpf_get_current_pid_tgid() >> 32;
	skey->cgroup = bpf_get_current_cgroup_id();
}

/* The name of a process that made a new stack entry: its main thread's
 * (what ps and /proc/PID/comm show), not the allocating thread's, which
 * may be a helper thread ("ctrl-c" in kheap-load). Rewritten at each new
 * entry, so a process named before its exec (a `-- CMD` child) ends up
 * under its new name; the cgroup of its first allocation (--by process)
 * stays. */
static __always_inline void remember_comm(__u32 tgid)
{
	struct task_struct *task = (void *)bpf_get_current_task();
	struct proc_info *known = bpf_map_lookup_elem(&proc_comms, &tgid);
	struct proc_info info = {};

	BPF_CORE_READ_STR_INTO(&info.comm, task, group_leader, comm);
	info.cgroup = known ? known->cgroup : bpf_get_current_cgroup_id();
	bpf_map_update_elem(&proc_comms, &tgid, &info, BPF_ANY);
}

/* Captures the kernel stack and counts the event under it (and, with
 * cfg.stack_owners, under who made it: *interrupt is the event's context,
 * as stack_owner() takes and sets it). `names_cache`: a new stack entry
 * records its cache's name (exact stacks, where no site entry does).
 * Returns the stack's id, or 0 if the stack or its entry could not be
 * recorded (counted as lost). */
static __always_inline __s64 record_stack(void *ctx, bool classic,
					  struct site_key *key, __u64 req,
					  __u64 alloc, __u32 bucket,
					  const char *name, bool names_cache,
					  bool *interrupt)
{
	struct stack_key skey = {.site = *key};
	struct alloc_stats *s;
	bool created = false;
	__u64 id = 0;
	/* constant 0 unless vmalloc is traced through kprobes */
	long given = cfg.given_stacks ? given_stack_len(ctx) : 0;

	switch (given > 0 ? store_given_stack(given, &id)
			  : store_stack(ctx, 0, &id)) {
	case STACK_OK:
		break;
	case STACK_MAP_FULL:
		COUNT(map_full_stacks);
		return 0;
	default:
		COUNT(lost_stack_other);
		return 0;
	}
	skey.stack_id = id;
	if (cfg.stack_owners)
		stack_owner(ctx, classic, &skey, interrupt);
	s = bpf_map_lookup_elem(&stacks, &skey);
	if (!s) {
		/* Exact stacks count no site: the stack names the cache, and
		 * before its entry exists (count_site() says why). */
		if (names_cache)
			remember_cache_name(key->cache, name);
		s = stats_entry(&stacks, &skey, &created);
		if (!s) {
			COUNT(map_full_stacks);
			return 0;
		}
	}
	stats_add_shared(s, req, alloc, bucket);
	COUNT(stack_samples);
	if (created) {
		COUNT(stacks_created);
		if (cfg.stack_owners && !skey.interrupt)
			remember_comm(skey.tgid);
	}
	return id;
}

/* record/top/slab: counts the event under its site (and stack). */
static __always_inline void count_alloc(void *ctx, bool classic,
					struct site_key *key, __u64 req,
					__u64 alloc, __u32 tgid, bool accounted,
					bool interrupt, const char *name,
					__u32 site_hint)
{
	bool created = false;
	__u32 bucket = size_bucket(req);

	if (cfg.by_process)
		count_process(tgid, interrupt, req, alloc, bucket);
	if (cfg.by_cgroup)
		count_cgroup(accounted, interrupt, req, alloc, bucket);

	/* Exact-stacks mode: the per-stack entry is the only update, and user
	 * space sums stacks into sites. An event whose stack is lost still
	 * lands in the site map below, so site totals stay exact. */
	if (cfg.capture_stacks && !cfg.stack_sample_mask &&
	    record_stack(ctx, classic, key, req, alloc, bucket, name, true,
			 &interrupt))
		return;

	if (!count_site(key, req, alloc, bucket, name, &created, site_hint)) {
		COUNT(map_full_sites);
		return;
	}

	if (!cfg.capture_stacks || !cfg.stack_sample_mask)
		return;
	/* A site's first allocation always gets a stack, so every site can be
	 * attributed to its caller; after that, about one event in N. */
	if (created || sample_now())
		record_stack(ctx, classic, key, req, alloc, bucket, NULL, false,
			     &interrupt);
}

/* record/top/slab: frees per cache. */
static __always_inline void count_free(const void *ptr, __u64 cache,
				       const char *name, __u64 tag)
{
	struct cache_frees *f;
	/* kheap leaves its own events out (cfg.filter.ignore_tgid). A
	 * kfree() names no cache and only adds to the total of frees, so it
	 * is tested for being kheap's only where that costs a per-CPU load
	 * (cfg.own_process_by_switch), not a helper call: `cache` is the
	 * constant 0 in kfree programs. */
	if (task_left_out(cache || cfg.own_process_by_switch))
		return;
	if (!ptr) {
		COUNT(frees_null);
		return;
	}
	COUNT(frees);
	if (!cache)
		return;
	/* +, not |: the verifier refuses bitwise operators on the kfunc's
	 * typed pointer; the tag bit is clear in an aligned address. */
	__u64 key = cache + tag;

	f = bpf_map_lookup_elem(&cache_frees, &key);
	if (f) {
		f->frees++;
		return;
	}
	struct cache_frees one = {.frees = 1};

	/* The name first (count_site() says why). */
	remember_cache_name(cache, name);
	if (!bpf_map_update_elem(&cache_frees, &key, &one, BPF_NOEXIST))
		return;
	/* Another CPU made the entry first: this CPU's part of it is zero. */
	f = bpf_map_lookup_elem(&cache_frees, &key);
	if (f)
		f->frees++;
	else
		COUNT(map_full_caches);
}
