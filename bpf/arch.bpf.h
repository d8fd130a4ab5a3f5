/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What differs by CPU architecture in the BPF objects, in one place (user
 * space's differences are in src/arch.rs). The target comes from
 * -D__TARGET_ARCH_<arch>, which libbpf-cargo sets from the cargo target
 * (build.rs compiles against vmlinux/ for x86_64, vmlinux/aarch64/ for
 * aarch64). bpf_tracing.h's PT_REGS_* macros name the registers.
 *
 * Where a call leaves its return address:
 * - x86-64: `call` pushes it; at a function's first instruction it is at
 *   the stack pointer, and the return pops it (sp + 8).
 * - arm64: `bl` puts it in the link register (x30); the stack pointer is
 *   the caller's until the function's prologue, and after the return.
 *
 * Include after vmlinux.h and the libbpf headers.
 */
#ifndef KHEAP_ARCH_BPF_H
#define KHEAP_ARCH_BPF_H

#if defined(__TARGET_ARCH_x86)

/* Bytes the call's return address takes on the stack: the stack pointer
 * after the return is the one at the entry plus this. */
#define KHEAP_RETURN_ADDRESS_BYTES 8

/* The return address at a kprobe on a function's first instruction. */
static __always_inline long kprobe_entry_return(struct pt_regs *regs,
						__u64 *ret)
{
	return bpf_probe_read_kernel(ret, sizeof(*ret),
				     (void *)PT_REGS_SP(regs));
}

/* The same at a uprobe on a user function's first instruction, whose stack
 * pointer `sp` the caller has read already. */
static __always_inline long uprobe_entry_return(struct pt_regs *regs, __u64 sp,
						__u64 *ret)
{
	return bpf_probe_read_user(ret, sizeof(*ret), (void *)sp);
}

/* The stack pointer at the entry of the function whose frame pointer is
 * `frame` (after `push %rbp; mov %rsp, %rbp`): just above the saved one. */
#define KHEAP_ENTRY_SP_OF_FRAME(frame) ((frame) + 8)

/* The fentry trampoline's frame has a known layout (latency.bpf.c's
 * caller_from_trampoline). */
#define KHEAP_TRAMPOLINE_FRAME 1

/* The page size of the slab page walk (slab_cache.bpf.h): x86-64's pages
 * are 4 KiB, a constant shift. */
#define KHEAP_SLAB_PAGE_SHIFT 12

#elif defined(__TARGET_ARCH_arm64)

#define KHEAP_RETURN_ADDRESS_BYTES     0

static __always_inline long kprobe_entry_return(struct pt_regs *regs,
						__u64 *ret)
{
	*ret = PT_REGS_RET(regs);
	return 0;
}

static __always_inline long uprobe_entry_return(struct pt_regs *regs, __u64 sp,
						__u64 *ret)
{
	*ret = PT_REGS_RET(regs);
	return 0;
}

/* The frame record (x29, x30) is at the bottom of the frame: the stack
 * pointer at the entry is at least 16 bytes above it (exactly there for a
 * frame that holds nothing else). A lower bound: calls made from the
 * function are below it, its caller's above. */
#define KHEAP_ENTRY_SP_OF_FRAME(frame) ((frame) + 16)

/* The arm64 trampoline's frame is not read: the unwinder finds the caller
 * (arm64 kernels always unwind by frame pointers, and the trampoline makes
 * a frame for the traced function). */
#define KHEAP_TRAMPOLINE_FRAME	       0

/* arm64 kernels have 4, 16 or 64 KiB pages: the running kernel's, set by
 * user space (slab_cache.bpf.h's slab_page_shift). */
#define KHEAP_SLAB_PAGE_SHIFT	       (slab_page_shift)

#else
#error "kheap's BPF objects are built for x86 and arm64 only (bpf/arch.bpf.h)"
#endif

#endif /* KHEAP_ARCH_BPF_H */
