/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * leaks: the cache a socket's code asked for, where SLUB merged it into
 * another. kmem_cache_create() of a cache SLUB merges returns the cache it
 * was merged into, so an allocation's struct kmem_cache * cannot tell
 * UNIX-STREAM from signal_cache; the socket itself can: sk_alloc() sets
 * sk_prot_creator to the struct proto whose `slab` it was allocated from
 * and whose `name` is the name that cache was created with
 * (proto_register()). A part of kheap.bpf.c, not a header (see its first
 * comment): included there once, after the globals.
 */

/* Objects in, names out: one batch per run (user space writes it, runs
 * `asked_cache`, reads it back). */
KHEAP_MAP(BPF_MAP_TYPE_ARRAY, asked_batch, __u32, struct asked_batch, 1);

/* Run by user space (BPF_PROG_RUN), never attached, as `clock` is. For each
 * object: its sk_prot_creator, read as a struct sock's, names the object's
 * cache only if that protocol's slab is the very cache the object was
 * allocated from, and its name is a string of the field's size. Otherwise
 * name stays empty: not known. Reads of an address that is no socket's
 * fail or fail the check. */
SEC("raw_tp")
int asked_cache(void *ctx)
{
	__u32 zero = 0;
	struct asked_batch *b = bpf_map_lookup_elem(&asked_batch, &zero);
	int i;

	if (!b)
		return 0;
	for (i = 0; i < KHEAP_ASKED_BATCH; i++) {
		struct asked_slot *s = &b->slot[i];
		struct sock *sk = (struct sock *)s->obj;
		struct proto *prot;

		s->name[0] = 0;
		if (!s->obj)
			continue;
		prot = BPF_CORE_READ(sk, sk_prot_creator);
		if (!prot || (__u64)BPF_CORE_READ(prot, slab) != s->cache)
			continue;
		if (bpf_core_read(s->name, sizeof(s->name), &prot->name) ||
		    s->name[sizeof(s->name) - 1])
			s->name[0] = 0;
	}
	return 0;
}
