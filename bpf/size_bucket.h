/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The log2 size bucket shared by every BPF object: bucket 0 holds size 0,
 * bucket b >= 1 holds [2^(b-1), 2^b); the last bucket also takes everything
 * larger. src/model.rs (Hist) reads the buckets with the same rule.
 */
#ifndef KHEAP_SIZE_BUCKET_H
#define KHEAP_SIZE_BUCKET_H

#define KHEAP_HIST_BUCKETS 32 /* a power of two: indexes are masked */

static __always_inline __u32 size_bucket(__u64 v)
{
	__u32 r = 0;

	if (v == 0)
		return 0;
		/* floor(log2(v)) by halving steps, without branches; then +1 so
		 * that bucket 0 is size 0 */
#pragma unroll
	for (__u32 shift = 32; shift > 0; shift >>= 1) {
		__u32 step = (v >> shift ? 1 : 0) * shift;

		v >>= step;
		r += step;
	}
	r += 1;
	return r < KHEAP_HIST_BUCKETS ? r : KHEAP_HIST_BUCKETS - 1;
}

/* A histogram index the verifier can bound. The compiler knows a bucket is
 * already < KHEAP_HIST_BUCKETS and would drop a plain mask as redundant, and
 * the 6.1 verifier loses the bound size_bucket() established once the
 * register is copied: the empty asm hides the value so the mask stays. */
static __always_inline __u32 hist_index(__u32 bucket)
{
	asm volatile("" : "+r"(bucket));
	return bucket & (KHEAP_HIST_BUCKETS - 1);
}

#endif /* KHEAP_SIZE_BUCKET_H */
