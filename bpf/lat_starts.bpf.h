/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * --latency: per task, when and from where the timed allocator call was
 * entered. Written by latency.bpf.c; kheap.bpf.c reuses the same map (its fd
 * is handed over before load) to take call sites from it while the exit
 * probes' trampolines hide the real return address. Include after vmlinux.h
 * and the libbpf headers.
 */
#ifndef KHEAP_LAT_STARTS_BPF_H
#define KHEAP_LAT_STARTS_BPF_H

#include "maps.bpf.h"
#include "kheap.h"

KHEAP_HASH(lat_starts, __u64, struct lat_start, KHEAP_LAT_STARTS);

#endif /* KHEAP_LAT_STARTS_BPF_H */
