/* SPDX-License-Identifier: GPL-2.0 */
/*
 * --latency: per task, when and from where the timed allocator call was
 * entered. Written by latency.bpf.c; kheap.bpf.c reuses the same map (its fd
 * is handed over before load) to take call sites from it while the exit
 * probes' trampolines hide the real return address.
 */
#ifndef KHEAP_LAT_STARTS_BPF_H
#define KHEAP_LAT_STARTS_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KHEAP_LAT_STARTS);
	__type(key, __u64);
	__type(value, struct lat_start);
} lat_starts SEC(".maps");

#endif /* KHEAP_LAT_STARTS_BPF_H */
