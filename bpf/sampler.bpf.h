/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-CPU countdown sampling: a countdown slot is refilled with a random
 * gap of 1..2N (mean ~N, N = mask + 1), so a helper is called once per
 * sample instead of once per event, and random gaps keep periodic
 * allocation patterns from aliasing. Include after vmlinux.h and the libbpf
 * headers; declare each countdown with KHEAP_PERCPU_SLOT(name, __u32)
 * (maps.bpf.h).
 */
#ifndef KHEAP_SAMPLER_BPF_H
#define KHEAP_SAMPLER_BPF_H

static __always_inline bool sample_by_countdown(void *countdown, __u32 mask)
{
	__u32 zero = 0;
	__u32 *left = bpf_map_lookup_elem(countdown, &zero);

	if (!left)
		return false;
	if (*left > 1) {
		(*left)--;
		return false;
	}
	*left = (bpf_get_prandom_u32() & (2 * mask + 1)) + 1;
	return true;
}

#endif /* KHEAP_SAMPLER_BPF_H */
