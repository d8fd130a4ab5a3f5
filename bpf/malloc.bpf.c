// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * kheap malloc: user-space allocations of traced processes, aggregated in
 * the kernel.
 *
 * Uprobes on the allocator functions of the C library (or of --lib) are
 * attached system-wide to the library file and filtered here by process, so
 * that forked children and re-exec'd programs that map the same library are
 * traced without re-attaching. Each call updates one per-CPU hash entry keyed
 * by (address space, process, function, direct caller, user stack). The attach
 * cookie of a probe says which function it sits on, so functions sharing an
 * argument layout share a program.
 *
 * With cfg.track_live, return probes map each returned block to its key and
 * free() removes it: what is left at the end is outstanding.
 *
 * Allocators call each other (glibc's realloc(NULL, n) jumps to malloc): a
 * call made while another is in progress on the same thread is the
 * allocator's own and is counted once, as the outer call (thread_state).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"
#include "kheap.h"
#include "malloc.h"
#include "kmem_classic.bpf.h"
#include "task_filter.bpf.h"
#include "stack_store.bpf.h"
#include "user_stack.bpf.h"
#include "arch.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct malloc_config cfg = {};

KHEAP_HASH(sites, struct malloc_key, struct malloc_stats, 16384);

/* Blocks allocated while tracing and not freed yet (cfg.track_live). */
KHEAP_HASH(live, struct live_key, struct live_alloc, 262144);

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

KHEAP_HASH(vmas, struct vma_key, struct vma_info, 16384);

/* execve()s per traced process: user space re-reads the mappings of a
 * process whose count changed (it may map another C library now). */
KHEAP_HASH(execs, __u32, __u32, 8192);

KHEAP_HASH(exec_paths, struct file_id, struct exec_path, 1024);

KHEAP_PERCPU_SLOT(counters, struct malloc_counters);

static struct malloc_stats zero_stats;

#define COUNT(field)                                             \
	do {                                                     \
		__u32 __zero = 0;                                \
		struct malloc_counters *__c =                    \
			bpf_map_lookup_elem(&counters, &__zero); \
		if (__c)                                         \
			__c->field++;                            \
	} while (0)

/* ---- mappings of stack frames ---- */

struct vma_walk {
	__u64 mm;
	__u64 *frames;
	__u64 caller;
	/* the last mapping found: consecutive frames often share it */
	__u64 start, end;
};

static long record_vma(struct task_struct *task, struct vm_area_struct *vma,
		       struct vma_walk *w)
{
	struct vma_key key = {.mm = w->mm, .start = vma->vm_start};
	struct vma_info info = {};
	struct file *file = vma->vm_file;
	const unsigned char *name;

	w->start = vma->vm_start;
	w->end = vma->vm_end;
	if (bpf_map_lookup_elem(&vmas, &key))
		return 0;
	info.end = vma->vm_end;
	info.pgoff = vma->vm_pgoff;
	if (file) {
		info.ino = BPF_CORE_READ(file, f_inode, i_ino);
		info.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
		name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
		bpf_probe_read_kernel_str(info.name, sizeof(info.name), name);
	}
	if (bpf_map_update_elem(&vmas, &key, &info, BPF_NOEXIST) ==
	    -7 /* E2BIG */)
		COUNT(map_full_vmas);
	return 0;
}

static long record_frame(__u64 i, struct vma_walk *w)
{
	__u64 addr;
	long err;

	if (i >= MALLOC_STACK_DEPTH)
		return 1;
	/* Frame 0 of a stack is the probed function itself; the direct
	 * caller stands in for it, as in the rows. */
	addr = i == 0 ? w->caller : w->frames[i];
	if (!addr)
		return i == 0 ? 0 : 1;
	if (addr >= w->start && addr < w->end)
		return 0;
	err = bpf_find_vma(bpf_get_current_task_btf(), addr, record_vma, w, 0);
	/* Not mapped at all: a frame-pointer walk through code built without
	 * frame pointers has wandered into data, and the rest is garbage
	 * (user space cuts the stack there too). */
	if (err == -2 /* ENOENT */)
		return 1;
	if (err)
		COUNT(vma_lookup_failed); /* -EBUSY: mmap lock contended */
	return 0;
}

/* Called once per new key, with the key's stack just captured (frames[0]
 * unused): remembers the mapping of every frame, so that addresses can be
 * turned into file offsets even after the process exits. */
static __always_inline void record_stack_vmas(struct stack_frames *frames,
					      __u64 mm, __u64 caller)
{
	struct vma_walk w = {.mm = mm, .caller = caller};

	w.frames = frames->ip;
	bpf_loop(MALLOC_STACK_DEPTH, record_frame, &w, 0);
}

/* ---- allocations ---- */

/* The state of the current thread if its process is traced. Only traced
 * threads get state (and a process stays traced while it lives), so a
 * thread that has state skips the PID filter lookup. */
static __always_inline struct thread_state *traced_thread(__u32 tgid)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct thread_state *t;

	t = bpf_task_storage_get(&threads, task, NULL, 0);
	if (t || !pid_traced(tgid))
		return t;
	t = bpf_task_storage_get(&threads, task, NULL,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t)
		COUNT(no_thread_state);
	return t;
}

/* Where an allocator call was seen: at the entry of the allocator function
 * (a uprobe on it), or at a site of the preload library after the call
 * (preload/kheap_preload.c), which describes the entry it came from. */
struct alloc_entry {
	__u64 sp; /* the stack pointer at the function's entry */
	__u64 bp; /* the caller's frame pointer */
	/* or where it is saved (read only for a sampled stack copy) */
	__u64 bp_at;
	__u64 caller; /* the return address into the direct caller */
	__u32 func;
	/* frames of the current stack above the function's entry (the
	 * preload library's site) */
	__u32 skip;
};

/* Counts the call; with cfg.track_live, leaves it pending in t->pending and
 * returns the thread's state (NULL: not counted, nothing pending). */
static __always_inline struct thread_state *
on_alloc_at(struct pt_regs *ctx, const struct alloc_entry *e, __u64 size,
	    __u64 old_ptr, __u64 memptr)
{
	__u64 sp = e->sp;
	struct malloc_key key = {.tgid = bpf_get_current_pid_tgid() >> 32};
	struct stack_frames *frames = NULL;
	struct thread_state *t;
	struct malloc_stats *s;
	bool created = false, captured;
	__u64 stack_id = 0;
	__u32 bucket;
	int level; /* of the scratch buffer taken for the stack */

	t = traced_thread(key.tgid);
	if (!t)
		return NULL;
	if (cfg.cgroups && !cgroup_traced())
		return NULL;
	key.func = e->func;
	key.mm = (__u64)bpf_get_current_task_btf()->mm;
	key.caller = e->caller;

	if (cfg.track_live ? (t->pending_active && sp <= t->pending.sp)
			   : (t->last_sp == sp && t->last_ret == key.caller &&
			      t->last_func != key.func)) {
		/* last_func stays the outer function's: the next call of
		 * the loop that called it has the same sp and return
		 * address, and is a new call. */
		COUNT(nested);
		return NULL;
	}
	t->last_sp = sp;
	t->last_ret = key.caller;
	t->last_func = key.func;
	/* A block freed before may be handed out again from here on. */
	t->free_active = 0;

	/* A stack not kept (map full, or not captured) is counted as lost. */
	level = scratch_take();
	captured = level >= 0 && capture_stack(ctx, BPF_F_USER_STACK | e->skip,
					       level, &stack_id, &frames);
	key.stack_id = captured ? (__s64)stack_id : -1;
	if (!captured)
		COUNT(lost_stacks);

	s = bpf_map_lookup_elem(&sites, &key);
	/* A row's stack is stored before the row is created, and this object
	 * never deletes stacks: a row found has its stack stored, and only a
	 * new row's stack needs looking up in the stack map. */
	if (!s && captured && frames &&
	    keep_stack(stack_id, frames) == STACK_MAP_FULL) {
		COUNT(lost_stacks);
		key.stack_id = -1;
		s = bpf_map_lookup_elem(&sites, &key);
	}
	if (!s) {
		long err = bpf_map_update_elem(&sites, &key, &zero_stats,
					       BPF_NOEXIST);
		if (err && err != -17 /* EEXIST: another CPU was first */) {
			COUNT(map_full_sites);
			s = NULL;
		} else {
			created = !err;
			s = bpf_map_lookup_elem(&sites, &key);
		}
	}
	if (s) {
		COUNT(allocs);
		if (created)
			COUNT(sites_created);
		bucket = size_bucket(size);
		SHARED_ADD(s->count, 1);
		SHARED_ADD(s->bytes, size);
		SHARED_ADD(s->hist[hist_index(bucket)], 1);
		if (created && frames) {
			/* the frames of a failed capture are stale: keep
			 * none */
			if (!captured)
				frames->ip[1] = 0;
			record_stack_vmas(frames, key.mm, key.caller);
		}
	}
	/* The frames are read up to here: the scratch goes back once, on
	 * every path that took it. */
	if (level >= 0)
		scratch_release();
	if (!s)
		return NULL;
	/* Sampled calls (and each row's first) also send a copy of the stack
	 * to be unwound without frame pointers. */
	maybe_copy_user_stack(&key, size, sp, e->bp, e->bp_at, created);

	if (cfg.track_live) {
		t->pending.key = key;
		t->pending.size = size;
		t->pending.old_ptr = old_ptr;
		t->pending.memptr = memptr;
		t->pending.sp = sp;
		t->pending_active = 1;
		return t;
	}
	return NULL;
}

/* At the first instruction of an allocator function (or past first
 * instructions that leave the stack pointer alone). */
static __always_inline void on_alloc(struct pt_regs *ctx, __u64 size,
				     __u64 old_ptr, __u64 memptr)
{
	struct alloc_entry e = {
		.sp = PT_REGS_SP(ctx),
		.bp = PT_REGS_FP(ctx),
		.func = bpf_get_attach_cookie(ctx),
	};

	/* The return address is at the stack pointer (or in the link
	 * register: bpf/arch.bpf.h): the caller's own frame is not set up
	 * yet, so a frame-pointer walk would skip it. */
	if (uprobe_entry_return(ctx, e.sp, &e.caller))
		e.caller = 0;
	on_alloc_at(ctx, &e, size, old_ptr, memptr);
}

SEC("uprobe")
int BPF_UPROBE(size_arg0, __u64 size)
{
	on_alloc(ctx, size, 0, 0);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(calloc_entry, __u64 nmemb, __u64 size)
{
	on_alloc(ctx, nmemb * size, 0, 0);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(align_size_args, __u64 align, __u64 size)
{
	on_alloc(ctx, size, 0, 0);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(posix_memalign_entry, __u64 memptr, __u64 align, __u64 size)
{
	on_alloc(ctx, size, 0, memptr);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(realloc_entry, __u64 ptr, __u64 size)
{
	on_alloc(ctx, size, ptr, 0);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(reallocarray_entry, __u64 ptr, __u64 nmemb, __u64 size)
{
	on_alloc(ctx, nmemb * size, ptr, 0);
	return 0;
}

/* Rust's __rust_realloc(ptr, old_size, align, new_size) */
SEC("uprobe")
int BPF_UPROBE(rust_realloc_entry, __u64 ptr, __u64 old_size, __u64 align,
	       __u64 new_size)
{
	on_alloc(ctx, new_size, ptr, 0);
	return 0;
}

/* Completes the pending call of t, which returned ret: follows the block it
 * returned, and the one it freed (realloc). */
static __always_inline void complete_alloc(struct thread_state *t, __u64 ret)
{
	struct live_key lk = {.tgid = bpf_get_current_pid_tgid() >> 32};
	struct pending_alloc *p = &t->pending;
	__u64 ptr = ret;

	t->pending_active = 0;
	if (p->memptr) {
		/* posix_memalign returns 0 and stores the block */
		ptr = 0;
		if (ret == 0)
			bpf_probe_read_user(&ptr, sizeof(ptr),
					    (void *)p->memptr);
	}
	/* realloc frees the old block when it succeeds, and when asked for
	 * 0 bytes (glibc returns NULL then). */
	if (p->old_ptr && (ptr || p->size == 0)) {
		lk.ptr = p->old_ptr;
		bpf_map_delete_elem(&live, &lk);
	}
	if (ptr) {
		struct live_alloc a = {.key = p->key, .size = p->size};

		lk.ptr = ptr;
		if (bpf_map_update_elem(&live, &lk, &a, BPF_ANY))
			COUNT(map_full_live);
	} else if (!(p->old_ptr && p->size == 0)) {
		COUNT(failed);
	}
}

/* One return probe for every allocator function: the pending call says what
 * it was. Only the return of that call (stack pointer back above its return
 * address) completes it; returns of nested calls come first and are ignored.
 * A tail call returns straight to the caller, with the same result. */
SEC("uretprobe")
int BPF_URETPROBE(alloc_return, __u64 ret)
{
	struct thread_state *t = bpf_task_storage_get(
		&threads, bpf_get_current_task_btf(), NULL, 0);

	if (!t || !t->pending_active)
		return 0;
	if (PT_REGS_SP(ctx) != t->pending.sp + KHEAP_RETURN_ADDRESS_BYTES)
		return 0;
	complete_alloc(t, ret);
	return 0;
}

/* kheap_alloc_site() of the preload library, called by its malloc family
 * after the allocator returned: the size, the block (posix_memalign's
 * already read), the return address into the caller, the function, the
 * block realloc resized, and the frame of the function, whose entry the
 * call is counted as. That frame holds the caller's frame pointer, and the
 * stack pointer at its entry is just above it. The site and the library's
 * function are the two innermost frames; the frame-pointer walk skips the
 * first, and the caller stands in for the second, as for an entry probe. */
SEC("uprobe")
int BPF_UPROBE(preload_alloc, __u64 size, __u64 block, __u64 caller, __u64 func,
	       __u64 old_block, __u64 frame)
{
	struct alloc_entry e = {
		.sp = KHEAP_ENTRY_SP_OF_FRAME(frame),
		.bp_at = frame,
		.caller = caller,
		.func = func,
		.skip = 1,
	};
	struct thread_state *t;

	t = on_alloc_at(ctx, &e, size, old_block, 0);
	if (t)
		complete_alloc(t, block);
	return 0;
}

/* A free: free(ptr), or (outer) a runtime's free that may end in another
 * probed free of the same block: operator delete (sized -> unsized -> free),
 * __rust_dealloc. Probed only with cfg.track_live. User space may attach
 * these, like the other probes, past first instructions that change no
 * argument register nor the stack pointer (src/malloc/probes.rs,
 * probe_skip). */
static __always_inline void on_free(__u64 sp, __u64 ptr, bool outer)
{
	struct live_key lk = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .ptr = ptr};
	struct thread_state *t;

	t = traced_thread(lk.tgid);
	if (!t)
		return;
	if (t->free_active && t->free_ptr == ptr && sp <= t->free_sp) {
		/* Made inside the outer free (by a call, or a jump with the
		 * same stack pointer). free() calls no other: the chain ends
		 * there. */
		if (!outer)
			t->free_active = 0;
		COUNT(nested);
		return;
	}
	if (outer) {
		t->free_active = 1;
		t->free_ptr = ptr;
		t->free_sp = sp;
	}
	if (!ptr) {
		COUNT(frees_null);
		return;
	}
	COUNT(frees);
	if (bpf_map_delete_elem(&live, &lk))
		COUNT(frees_untracked);
}

SEC("uprobe")
int BPF_UPROBE(free_entry, __u64 ptr)
{
	on_free(PT_REGS_SP(ctx), ptr, false);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(outer_free_entry, __u64 ptr)
{
	on_free(PT_REGS_SP(ctx), ptr, true);
	return 0;
}

/* kheap_free_site(block, frame) of the preload library: its free() before
 * it frees. Counted as an outer free entered at that free()'s entry: the
 * allocator's own free of the block is probed too where it is also operator
 * delete (tcmalloc), and is not counted again. Not free(NULL), which a
 * program may call many times in a row at one depth: outer, each would look
 * made inside the one before (tcmalloc's probe counts it a second time). */
SEC("uprobe")
int BPF_UPROBE(preload_free, __u64 block, __u64 frame)
{
	on_free(KHEAP_ENTRY_SP_OF_FRAME(frame), block, block != 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(exec_btf, struct task_struct *p, pid_t old_pid,
	     struct linux_binprm *bprm)
{
	__u32 tgid = p->tgid, one = 1, *n;

	if (!pid_traced(tgid))
		return 0;
	n = bpf_map_lookup_elem(&execs, &tgid);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&execs, &tgid, &one, BPF_NOEXIST);

	/* bprm->file is what runs: for a script, its interpreter, which
	 * bprm->interp names. */
	struct file_id id = {
		.ino = BPF_CORE_READ(bprm, file, f_inode, i_ino),
		.dev = BPF_CORE_READ(bprm, file, f_inode, i_sb, s_dev),
	};
	struct exec_path path = {};

	bpf_probe_read_kernel_str(path.path, sizeof(path.path),
				  BPF_CORE_READ(bprm, interp));
	bpf_map_update_elem(&exec_paths, &id, &path, BPF_NOEXIST);
	return 0;
}

/* A traced process that is gone leaves the filter, so that a new process
 * reusing its PID is not traced. Its last thread makes signal->live 0
 * before this tracepoint. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(exit_btf, struct task_struct *p)
{
	__u32 tgid = p->tgid;

	if (BPF_CORE_READ(p, signal, live.counter) != 0 || !pid_traced(tgid))
		return 0;
	bpf_map_delete_elem(&pid_filter, &tgid);
	bpf_map_delete_elem(&execs, &tgid);
	return 0;
}
