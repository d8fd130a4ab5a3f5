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
 *
 * Kernels before 5.17 take the legacy path (cfg.legacy, malloc.h says what
 * it replaces): the same maps and counting code, the kernel's missing
 * features replaced where they are used.
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
/* The uprobe programs call them with preemption off (cfg.no_preempt). */
#define KHEAP_SCRATCH_HELPERS_STATIC
#include "stack_store.bpf.h"
#include "user_stack.bpf.h"
#include "arch.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct malloc_config cfg = {};

/* cfg.legacy: how slot N's program reads its arguments (enum
 * malloc_layout), set before load; a known constant to the verifier. */
const volatile __u8 slot_layouts[MALLOC_SLOTS] = {};

KHEAP_HASH(sites, struct malloc_key, struct malloc_stats, 16384);

/* Blocks allocated while tracing and not freed yet (cfg.track_live). */
KHEAP_HASH(live, struct live_key, struct live_alloc, 262144);

/* Per-thread state. cfg.legacy: user space makes this a preallocated hash
 * keyed by thread id before load (task storage is 5.11), and the thread's
 * entry is deleted when it exits. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

static struct thread_state zero_thread;

KHEAP_HASH(vmas, struct vma_key, struct vma_info, 16384);

/* execve()s per traced process: user space re-reads the mappings of a
 * process whose count changed (it may map another C library now). */
KHEAP_HASH(execs, __u32, __u32, 8192);

KHEAP_HASH(exec_paths, struct file_id, struct exec_path, 1024);

KHEAP_PERCPU_COUNTERS(counters, struct malloc_counters)

static struct malloc_stats zero_stats;

/* The malloc object's counters (struct malloc_counters in malloc.h). */
#define COUNT(field) PERCPU_COUNT_ADD(counters, field, 1)

/* Helpers given `legacy` take the legacy path's way where it is true: a
 * constant in each program, so that a program has one way's code only (5.10
 * refuses a program that holds bpf_loop's callback even where it is never
 * reached). The legacy path's programs are *_legacy and slot_N. */

/* The current thread's state (created if asked and it has none). */
static __always_inline struct thread_state *current_thread_state(bool create,
								 bool legacy)
{
	struct thread_state *t;
	__u32 tid;

	if (!legacy)
		return bpf_task_storage_get(
			&threads, bpf_get_current_task_btf(), NULL,
			create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	tid = (__u32)bpf_get_current_pid_tgid();
	t = bpf_map_lookup_elem(&threads, &tid);
	if (t || !create)
		return t;
	/* Fails when the map is full: the caller counts no_thread_state. */
	bpf_map_update_elem(&threads, &tid, &zero_thread, BPF_NOEXIST);
	return bpf_map_lookup_elem(&threads, &tid);
}

/* The current address space (its struct mm_struct's address). */
static __always_inline __u64 current_mm(bool legacy)
{
	struct task_struct *task;

	if (!legacy)
		return (__u64)bpf_get_current_task_btf()->mm;
	task = (void *)bpf_get_current_task();
	return (__u64)BPF_CORE_READ(task, mm);
}

/* cfg.no_preempt (malloc.h says why): preemption is off from the first
 * instruction of an uprobe program's body to its last, before anything is
 * written to the program's stack. Both calls are known at load (cfg is
 * read-only data, the kfunc's presence a constant), so the verifier sees
 * them paired. */
extern void bpf_preempt_disable(void) __ksym __weak;
extern void bpf_preempt_enable(void) __ksym __weak;

static __always_inline void probe_enter(void)
{
	if (cfg.no_preempt && bpf_ksym_exists(bpf_preempt_disable))
		bpf_preempt_disable();
}

static __always_inline void probe_leave(void)
{
	if (cfg.no_preempt && bpf_ksym_exists(bpf_preempt_enable))
		bpf_preempt_enable();
}

/* ---- mappings of stack frames ---- */

struct vma_walk {
	__u64 mm;
	__u64 *frames;
	__u64 caller;
	/* the last mapping found: consecutive frames often share it */
	__u64 start, end;
};

/* Records one mapping of address space mm, unless it is recorded already. */
static __always_inline void save_vma(__u64 mm, __u64 start, __u64 end,
				     __u64 pgoff, struct file *file)
{
	struct vma_key key = {.mm = mm, .start = start};
	struct vma_info info = {};
	const unsigned char *name;

	if (bpf_map_lookup_elem(&vmas, &key))
		return;
	info.end = end;
	info.pgoff = pgoff;
	if (file) {
		info.ino = BPF_CORE_READ(file, f_inode, i_ino);
		info.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
		name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
		bpf_probe_read_kernel_str(info.name, sizeof(info.name), name);
	}
	if (bpf_map_update_elem(&vmas, &key, &info, BPF_NOEXIST) ==
	    -7 /* E2BIG */)
		COUNT(map_full_vmas);
}

static long record_vma(struct task_struct *task, struct vm_area_struct *vma,
		       struct vma_walk *w)
{
	w->start = vma->vm_start;
	w->end = vma->vm_end;
	save_vma(w->mm, vma->vm_start, vma->vm_end, vma->vm_pgoff,
		 vma->vm_file);
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

/* Deeper than the red-black tree of an address space can be: at most
 * 2 * log2(n + 1) for n mappings, and vm.max_map_count is 65530. */
#define VMA_TREE_DEPTH 40

/* cfg.legacy (no bpf_find_vma): records the mapping of the current address
 * space (mm) that holds addr, found in its VMA tree as the kernel's
 * find_vma() finds it, read without its lock (the thread is in the
 * allocator, not changing its mappings; another thread may be, and the
 * reads then fail or miss, counted as failed). Returns 0 when recorded, 1
 * when addr is not mapped, 2 when the walk failed. A global function: the
 * verifier checks it once, not once per frame of the caller's loop. */
__noinline int record_frame_vma_legacy(__u64 mm, __u64 addr)
{
	struct task_struct *task = (void *)bpf_get_current_task();
	struct mm_struct___rb *m;
	struct rb_node *node;
	__u64 off;

	if (!cfg.legacy)
		return 2;
	m = (void *)BPF_CORE_READ(task, mm);
	node = BPF_CORE_READ(m, mm_rb.rb_node);
	off = bpf_core_field_offset(struct vm_area_struct___rb, vm_rb);
	for (int i = 0; i < VMA_TREE_DEPTH; i++) {
		struct vm_area_struct *v;
		__u64 start, end;

		if (!node)
			return 1;
		v = (void *)node - off;
		end = BPF_CORE_READ(v, vm_end);
		if (end <= addr) {
			node = BPF_CORE_READ(node, rb_right);
			continue;
		}
		start = BPF_CORE_READ(v, vm_start);
		if (start <= addr) {
			save_vma(mm, start, end, BPF_CORE_READ(v, vm_pgoff),
				 BPF_CORE_READ(v, vm_file));
			return 0;
		}
		node = BPF_CORE_READ(node, rb_left);
	}
	return 2;
}

/* Called once per new key, with the key's stack just captured (frames[0]
 * unused): remembers the mapping of every frame, so that addresses can be
 * turned into file offsets even after the process exits. */
static __always_inline void record_stack_vmas(struct stack_frames *frames,
					      __u64 mm, __u64 caller,
					      bool legacy)
{
	struct vma_walk w = {.mm = mm, .caller = caller};

	w.frames = frames->ip;
	if (!legacy) {
		bpf_loop(MALLOC_STACK_DEPTH, record_frame, &w, 0);
		return;
	}
	for (__u32 i = 0; i < MALLOC_STACK_DEPTH; i++) {
		__u64 addr = i == 0 ? caller : frames->ip[i];
		int err;

		if (!addr) {
			if (i == 0)
				continue;
			break;
		}
		err = record_frame_vma_legacy(mm, addr);
		if (err == 1)
			break; /* not mapped: as record_frame */
		if (err)
			COUNT(vma_lookup_failed);
	}
}

/* ---- allocations ---- */

/* The state of the current thread if its process is traced. Only traced
 * threads get state (and a process stays traced while it lives), so a
 * thread that has state skips the PID filter lookup. */
static __always_inline struct thread_state *traced_thread(__u32 tgid,
							  bool legacy)
{
	struct thread_state *t;

	t = current_thread_state(false, legacy);
	if (t || !pid_traced(tgid))
		return t;
	t = current_thread_state(true, legacy);
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
	    __u64 old_ptr, __u64 memptr, bool legacy)
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

	t = traced_thread(key.tgid, legacy);
	if (!t)
		return NULL;
	if (cfg.cgroups && !cgroup_traced())
		return NULL;
	key.func = e->func;
	key.mm = current_mm(legacy);
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
		if (!key.caller)
			COUNT(caller_unreadable);
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
			record_stack_vmas(frames, key.mm, key.caller, legacy);
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

/* A return address read at a function's entry is another tracer's when a
 * uretprobe (bpftrace's, BCC memleak's, another kheap's with --outstanding)
 * sits on a function that jumped here without a call of its own (operator
 * new[] ends in a jump to operator new): the kernel replaced that
 * function's return address with its uretprobe trampoline, the first slot
 * of the process's XOL page, and keeps the real one in the task's newest
 * return instance. Read as is, the call would look like no nested call
 * and be counted at an anonymous address. */
static __always_inline __u64 past_uretprobe_trampoline(__u64 ret)
{
	struct task_struct *task;
	struct return_instance *newest;
	__u64 trampoline;

	/* The trampoline starts a page (4 KiB or larger): any other return
	 * address costs this test only, not the three reads below. */
	if (ret & 4095)
		return ret;
	task = (void *)bpf_get_current_task();
	trampoline = BPF_CORE_READ(task, mm, uprobes_state.xol_area, vaddr);
	if (!trampoline || ret != trampoline)
		return ret;
	newest = BPF_CORE_READ(task, utask, return_instances);
	return newest ? BPF_CORE_READ(newest, orig_ret_vaddr) : ret;
}

/* At the first instruction of allocator function func (or past first
 * instructions that leave the stack pointer alone). */
static __always_inline void on_alloc_func(struct pt_regs *ctx, __u64 size,
					  __u64 old_ptr, __u64 memptr,
					  __u32 func, bool legacy)
{
	struct alloc_entry e = {
		.sp = PT_REGS_SP(ctx),
		.bp = PT_REGS_FP(ctx),
		.func = func,
	};

	/* The return address is at the stack pointer (or in the link
	 * register: bpf/arch.bpf.h): the caller's own frame is not set up
	 * yet, so a frame-pointer walk would skip it. */
	if (uprobe_entry_return(ctx, e.sp, &e.caller))
		e.caller = 0;
	else
		e.caller = past_uretprobe_trampoline(e.caller);
	on_alloc_at(ctx, &e, size, old_ptr, memptr, legacy);
}

/* The function is the probe's attach cookie. */
static __always_inline void on_alloc(struct pt_regs *ctx, __u64 size,
				     __u64 old_ptr, __u64 memptr)
{
	probe_enter();
	on_alloc_func(ctx, size, old_ptr, memptr, bpf_get_attach_cookie(ctx),
		      false);
	probe_leave();
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

/* The legacy path's allocation entry: a function of its own, which the
 * object holds once and every slot_N program calls (inlined into each, the
 * forty-odd programs made the object 25 times bigger). */
static __noinline int on_alloc_legacy(struct pt_regs *ctx, __u64 size,
				      __u64 old_ptr, __u64 memptr, __u32 func)
{
	on_alloc_func(ctx, size, old_ptr, memptr, func, true);
	return 0;
}

/* cfg.legacy (no attach cookies): one program per allocator function, its
 * slot, reading its arguments as its layout says. */
static __always_inline void on_slot(struct pt_regs *ctx, __u32 func)
{
	__u64 a0 = PT_REGS_PARM1(ctx), a1 = PT_REGS_PARM2(ctx);
	__u64 a2 = PT_REGS_PARM3(ctx), a3 = PT_REGS_PARM4(ctx);

	if (func >= MALLOC_SLOTS)
		return;
	switch (slot_layouts[func]) {
	case MALLOC_LAYOUT_SIZE:
		on_alloc_legacy(ctx, a0, 0, 0, func);
		break;
	case MALLOC_LAYOUT_CALLOC:
		on_alloc_legacy(ctx, a0 * a1, 0, 0, func);
		break;
	case MALLOC_LAYOUT_ALIGN_SIZE:
		on_alloc_legacy(ctx, a1, 0, 0, func);
		break;
	case MALLOC_LAYOUT_POSIX_MEMALIGN:
		on_alloc_legacy(ctx, a2, 0, a0, func);
		break;
	case MALLOC_LAYOUT_REALLOC:
		on_alloc_legacy(ctx, a1, a0, 0, func);
		break;
	case MALLOC_LAYOUT_REALLOCARRAY:
		on_alloc_legacy(ctx, a1 * a2, a0, 0, func);
		break;
	case MALLOC_LAYOUT_RUST_REALLOC:
		on_alloc_legacy(ctx, a3, a0, 0, func);
		break;
	}
}

/* The slot programs hand their call to one program that does the work
 * (slot_call_legacy, through a tail call): the kernel verifies every
 * program it loads on its own, and forty-four copies of the allocation
 * path took 10 of the 13 s a malloc run needed to start in a 5.10 guest.
 * The function's number goes through this CPU's slot: the kernels that take
 * the legacy path (before 5.17) run a uprobe's programs with preemption
 * off, so nothing else runs on the CPU between the slot program's write
 * and the tail call's read. */
KHEAP_PERCPU_SLOT(slot_func, __u32);

/* Holds slot_call_legacy (put there by user space on the legacy path). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} slot_call SEC(".maps");

SEC("uprobe")
int slot_call_legacy(struct pt_regs *ctx)
{
	__u32 zero = 0;
	__u32 *func = bpf_map_lookup_elem(&slot_func, &zero);

	if (func)
		on_slot(ctx, *func);
	return 0;
}

/* A tail call that does not happen (an empty program array) leaves the
 * call uncounted: counted as no_thread_state, as a call whose thread
 * state cannot be had. */
#define SLOT_PROG(n)                                                  \
	SEC("uprobe")                                                 \
	int slot_##n(struct pt_regs *ctx)                             \
	{                                                             \
		__u32 zero = 0;                                       \
		__u32 *func = bpf_map_lookup_elem(&slot_func, &zero); \
                                                                      \
		if (func) {                                           \
			*func = n;                                    \
			bpf_tail_call(ctx, &slot_call, 0);            \
		}                                                     \
		COUNT(no_thread_state);                               \
		return 0;                                             \
	}

/* clang-format off */
SLOT_PROG(0) SLOT_PROG(1) SLOT_PROG(2) SLOT_PROG(3) SLOT_PROG(4)
SLOT_PROG(5) SLOT_PROG(6) SLOT_PROG(7) SLOT_PROG(8) SLOT_PROG(9)
SLOT_PROG(10) SLOT_PROG(11) SLOT_PROG(12) SLOT_PROG(13) SLOT_PROG(14)
SLOT_PROG(15) SLOT_PROG(16) SLOT_PROG(17) SLOT_PROG(18) SLOT_PROG(19)
SLOT_PROG(20) SLOT_PROG(21) SLOT_PROG(22) SLOT_PROG(23) SLOT_PROG(24)
SLOT_PROG(25) SLOT_PROG(26) SLOT_PROG(27) SLOT_PROG(28) SLOT_PROG(29)
SLOT_PROG(30) SLOT_PROG(31) SLOT_PROG(32) SLOT_PROG(33) SLOT_PROG(34)
SLOT_PROG(35) SLOT_PROG(36) SLOT_PROG(37) SLOT_PROG(38) SLOT_PROG(39)
SLOT_PROG(40) SLOT_PROG(41) SLOT_PROG(42) SLOT_PROG(43)
	/* clang-format on */

	/* Completes the pending call of t, which returned ret: follows the
	 * block it returned, and the one it freed (realloc). */
	static __always_inline
	void complete_alloc(struct thread_state *t, __u64 ret)
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
static __always_inline void on_return(struct pt_regs *ctx, __u64 ret,
				      bool legacy)
{
	struct thread_state *t = current_thread_state(false, legacy);

	if (!t || !t->pending_active)
		return;
	if (PT_REGS_SP(ctx) != t->pending.sp + KHEAP_RETURN_ADDRESS_BYTES)
		return;
	complete_alloc(t, ret);
}

SEC("uretprobe")
int BPF_URETPROBE(alloc_return, __u64 ret)
{
	probe_enter();
	on_return(ctx, ret, false);
	probe_leave();
	return 0;
}

SEC("uretprobe")
int BPF_URETPROBE(alloc_return_legacy, __u64 ret)
{
	on_return(ctx, ret, true);
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
static __always_inline void on_preload_alloc(struct pt_regs *ctx, __u64 size,
					     __u64 block, __u64 caller,
					     __u64 func, __u64 old_block,
					     __u64 frame, bool legacy)
{
	struct alloc_entry e = {
		.sp = KHEAP_ENTRY_SP_OF_FRAME(frame),
		.bp_at = frame,
		.caller = caller,
		.func = func,
		.skip = 1,
	};
	struct thread_state *t;

	t = on_alloc_at(ctx, &e, size, old_block, 0, legacy);
	if (t)
		complete_alloc(t, block);
}

SEC("uprobe")
int BPF_UPROBE(preload_alloc, __u64 size, __u64 block, __u64 caller, __u64 func,
	       __u64 old_block, __u64 frame)
{
	probe_enter();
	on_preload_alloc(ctx, size, block, caller, func, old_block, frame,
			 false);
	probe_leave();
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(preload_alloc_legacy, __u64 size, __u64 block, __u64 caller,
	       __u64 func, __u64 old_block, __u64 frame)
{
	on_preload_alloc(ctx, size, block, caller, func, old_block, frame,
			 true);
	return 0;
}

/* A free: free(ptr), or (outer) a runtime's free that may end in another
 * probed free of the same block: operator delete (sized -> unsized -> free),
 * __rust_dealloc. Probed only with cfg.track_live. User space may attach
 * these, like the other probes, past first instructions that change no
 * argument register nor the stack pointer (src/allocators.rs,
 * probe_skip). */
static __always_inline void on_free(__u64 sp, __u64 ptr, bool outer,
				    bool legacy)
{
	struct live_key lk = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .ptr = ptr};
	struct thread_state *t;

	t = traced_thread(lk.tgid, legacy);
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
	probe_enter();
	on_free(PT_REGS_SP(ctx), ptr, false, false);
	probe_leave();
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(free_entry_legacy, __u64 ptr)
{
	on_free(PT_REGS_SP(ctx), ptr, false, true);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(outer_free_entry, __u64 ptr)
{
	probe_enter();
	on_free(PT_REGS_SP(ctx), ptr, true, false);
	probe_leave();
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(outer_free_entry_legacy, __u64 ptr)
{
	on_free(PT_REGS_SP(ctx), ptr, true, true);
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
	probe_enter();
	on_free(KHEAP_ENTRY_SP_OF_FRAME(frame), block, block != 0, false);
	probe_leave();
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(preload_free_legacy, __u64 block, __u64 frame)
{
	on_free(KHEAP_ENTRY_SP_OF_FRAME(frame), block, block != 0, true);
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
	__u32 tgid = p->tgid, tid = p->pid;

	/* Each thread's exit: its state goes (task storage goes with the
	 * task). */
	if (cfg.legacy)
		bpf_map_delete_elem(&threads, &tid);
	if (BPF_CORE_READ(p, signal, live.counter) != 0 || !pid_traced(tgid))
		return 0;
	bpf_map_delete_elem(&pid_filter, &tgid);
	bpf_map_delete_elem(&execs, &tgid);
	return 0;
}
