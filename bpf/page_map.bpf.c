// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * What user space needs to establish the slab page walk's bases on kernels
 * whose bases are no variables (arm64: compile-time constants that differ by
 * configuration and version; src/kernel/kmem/page_map.rs): two programs, run
 * with BPF_PROG_TEST_RUN before kheap's own object loads.
 *
 * - read_kernel: `read_len` bytes of kernel memory at `read_addr` into
 *   `read_buf` (`read_err`: the helper's result).
 * - check_bases: the slab cache each of `check_ptrs` lives in, found with
 *   the candidate bases by the event path's own code (slab_page.bpf.h), into
 *   `check_caches` (0: none found).
 *
 * Both also give the kernel's sizes of struct page and struct mem_section.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "slab_page.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define PAGE_MAP_READ_MAX 4096
#define PAGE_MAP_CHECKS	  16

__u64 read_addr = 0;
__u32 read_len = 0;
__s64 read_err = 0;
__u8 read_buf[PAGE_MAP_READ_MAX] = {};

__u64 check_base = 0;
__u64 check_map = 0;
__u32 check_shift = 0;
__u64 check_ptrs[PAGE_MAP_CHECKS] = {};
__u64 check_caches[PAGE_MAP_CHECKS] = {};

__u32 struct_page_size = 0;
__u32 mem_section_size = 0;

static __always_inline void sizes(void)
{
	struct_page_size = bpf_core_type_size(struct page);
	mem_section_size = bpf_core_type_size(struct mem_section);
}

SEC("raw_tp")
int read_kernel(void *ctx)
{
	__u32 len = read_len;

	sizes();
	if (len > PAGE_MAP_READ_MAX)
		len = PAGE_MAP_READ_MAX;
	read_err = bpf_probe_read_kernel(read_buf, len, (void *)read_addr);
	return 0;
}

SEC("raw_tp")
int check_bases(void *ctx)
{
	__u64 base = check_base, map = check_map;
	__u32 shift = check_shift & 63;

	sizes();
	for (int i = 0; i < PAGE_MAP_CHECKS; i++) {
		__u64 ptr = check_ptrs[i];

		check_caches[i] = ptr ? (__u64)slab_cache_at((void *)ptr, base,
							     map, shift)
				      : 0;
	}
	return 0;
}
