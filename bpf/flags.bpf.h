/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Flags computed without branches, for programs the verifier must walk
 * path by path.
 */
#ifndef KHEAP_FLAGS_BPF_H
#define KHEAP_FLAGS_BPF_H

/* 1 if x is non-zero, else 0, computed without a branch. `!!x` compiles to
 * a branch that sets 0 on one side and 1 on the other, and the verifier
 * then walks everything after it twice, once with each constant: one such
 * flag at the top of an event doubles the work of loading the program.
 * The asm keeps the compiler from turning the arithmetic back into one. */
static __always_inline __u8 flag_of(__u64 x)
{
	__u64 t = x | -x;

	asm volatile("" : "+r"(t));
	return t >> 63;
}

#endif /* KHEAP_FLAGS_BPF_H */
