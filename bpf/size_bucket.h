/* SPDX-License-Identifier: GPL-2.0 */
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
	__u32 r, shift;

	if (v == 0)
		return 0;
	/* floor(log2(v)) without loops, then +1 so that bucket 0 is size 0 */
	r = (v > 0xFFFFFFFFULL) << 5;
	v >>= r;
	shift = (v > 0xFFFF) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
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
