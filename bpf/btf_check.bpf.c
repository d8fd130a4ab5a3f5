// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Whether a BTF file given with --btf describes the running kernel: this
 * program reads the kernel's release string through the file's layouts of
 * task_struct, nsproxy and uts_namespace (CO-RE relocated against the file).
 * Another kernel's BTF puts those fields elsewhere, and what comes back is
 * not `uname -r`. Run once with BPF_PROG_TEST_RUN (src/kernel/btf_check.rs).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

char release[65] = {};

SEC("raw_tp")
int read_release(void *ctx)
{
	struct task_struct *t = (void *)bpf_get_current_task();

	BPF_CORE_READ_STR_INTO(&release, t, nsproxy, uts_ns, name.release);
	return 0;
}
