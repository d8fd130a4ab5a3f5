/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The per-CPU front of the site map. Every counted allocation adds to its
 * site's entry; the hash does that with a call, a hash of the key, a bucket
 * walk and locked adds, which was most of the default path's cost above the
 * empty programs'. So each CPU first tries a table of its own: an
 * open-addressed array (lookups the verifier inlines, no hashing of the
 * whole key, no bucket walk, plain adds) where a site takes the first free
 * slot among KHEAP_SITE_SLOT_PROBES and keeps it for the rest of the run.
 * Nothing ever moves out of a slot, so user space reads a site as the sum of
 * its slots on every CPU and its entry in `sites`, with no count in two
 * places at once. Events of a site that found no slot (the probed ones held
 * by other sites) go to `sites` as before, so counts stay exact whichever
 * way an event went.
 *
 * The tables of all CPUs are one array, each CPU's table a run of
 * site_slot_mask + 1 slots at (CPU number) * (site_slot_mask + 1), written
 * by that CPU only: the same owner-only writes as a per-CPU array, but one
 * user space maps (BPF_F_MMAPABLE) and reads in place. A per-CPU array is
 * read by copying every slot of every CPU through a syscall, about 5 MB on
 * a host of 128 CPUs whether or not a slot is used, and that copy was
 * nearly all of a read's time there (issue 45); in place, a read looks at
 * each slot's count and copies the used ones only.
 *
 * A program on this CPU can run inside another (an interrupt that
 * allocates while a kmalloc event is being counted): the request's `busy`
 * sends the inner one to `sites`, so two events never claim one slot.
 *
 * A part of kheap.bpf.c, not a header (see its first comment):
 * included there once, after the definitions of `sites`, COUNT()
 * and remember_cache_name().
 */

#define KHEAP_SITE_SLOT_PROBES 4

/* Slots per CPU, minus one (a power of two; user space sizes the array to
 * this many per possible CPU before load). */
const volatile __u32 site_slot_mask = 0;

KHEAP_MMAPABLE_ARRAY(site_slots, struct site_slot, 1024);

/* Slot i of this CPU's table. A CPU number past the array (none is: user
 * space sizes it for every possible CPU) finds no slot, and its events go
 * to `sites`. */
static __always_inline struct site_slot *cpu_slot(__u32 i)
{
	__u32 at = bpf_get_smp_processor_id() * (site_slot_mask + 1) +
		   (i & site_slot_mask);

	return bpf_map_lookup_elem(&site_slots, &at);
}

/* What site_slot_add() is asked for, passed through this CPU's scratch
 * entry: a function verified on its own takes scalars only, and the key's
 * cache word can be a typed pointer (tp_btf), which a map value turns into
 * a number. `busy`: a request is under way on this CPU; a program that runs
 * inside it (an interrupt that allocates) uses `sites` instead, so two
 * events never claim one slot or overwrite one request. */
struct site_slot_request {
	struct site_key key;
	__u64 name;
	__u32 busy;
	__u32 _pad;
};

KHEAP_PERCPU_SLOT(site_slot_request, struct site_slot_request);

_Static_assert(sizeof(struct site_key) == 3 * sizeof(__u64),
	       "site keys are compared and hashed as three words");

enum site_slot_result { SLOT_NONE, SLOT_ADDED, SLOT_NEW_SITE };

/* site_slot_add() returns a site_slot_result in its low bits and, unless
 * SLOT_NONE, the slot's index above them. */
#define SLOT_RESULT_BITS 2
#define SLOT_RESULT_MASK ((1 << SLOT_RESULT_BITS) - 1)

/* Whether slot s holds the site of key words w0-w2 (call site, cache, the
 * rest), compared as words: the search's request holds them as numbers. */
static __always_inline bool slot_holds(const struct site_slot *s, __u64 w0,
				       __u64 w1, __u64 w2)
{
	return s->key.call_site == w0 && s->key.cache == w1 &&
	       *(__u64 *)&s->key.kmalloc_size == w2;
}

/* Adds the request's event to this CPU's slot of its site, claiming a free
 * one if the site has none yet. SLOT_NEW_SITE: that was the run's first
 * claim of the site. SLOT_NONE: no slot for it here. Global, not
 * inlined: the verifier walks it once per program, where inlined it was walked
 * again for every path that reaches it (leaks came near the verifier's limit of
 * a million instructions). */
__noinline int site_slot_add(__u64 req, __u64 alloc, __u32 bucket)
{
	__u32 zero = 0;
	struct site_slot_request *r =
		bpf_map_lookup_elem(&site_slot_request, &zero);
	struct site_slot *slot = NULL;
	bool claim = false;
	__u64 w0, w1, w2;
	__u32 first, at = 0;

	if (!r)
		return SLOT_NONE;
	w0 = r->key.call_site;
	w1 = r->key.cache;
	w2 = *(__u64 *)&r->key.kmalloc_size;
	/* A multiplicative hash: call sites, caches and sizes differ in few
	 * bits each. */
	first = ((w0 ^ (w1 * 0xff51afd7ed558ccdULL) ^ w2) *
		 0x9e3779b97f4a7c15ULL) >>
		32;
	for (__u32 p = 0; p < KHEAP_SITE_SLOT_PROBES; p++) {
		__u32 i = (first + p) & site_slot_mask;
		struct site_slot *s = cpu_slot(i);

		if (!s)
			break;
		if (!s->stats.count) {
			slot = s;
			at = i;
			claim = true;
			break;
		}
		if (slot_holds(s, w0, w1, w2)) {
			slot = s;
			at = i;
			break;
		}
	}
	if (!slot)
		return SLOT_NONE;
	if (claim) {
		slot->key = r->key;
		remember_cache_name(w1, (const char *)r->name);
		/* The key and the name before the count: a reader that sees
		 * the count finds both (struct site_slot). */
		asm volatile("" ::: "memory");
	}
	stats_add(&slot->stats, req, alloc, bucket);
	at <<= SLOT_RESULT_BITS;
	if (!claim)
		return at | SLOT_ADDED;
	/* Each site also gets an empty entry in `sites`, made by the first
	 * CPU that sees it: the site is new to the run only then, and gets
	 * its first stack once, not once per CPU. */
	if (bpf_map_update_elem(&sites, &r->key, &zero_stats, BPF_NOEXIST))
		return at | SLOT_ADDED;
	return at | SLOT_NEW_SITE;
}

/* The slot a hint names (SITE_HINT_SLOT()), if it holds the event's site:
 * a plain array load and a key compare, no search. */
static __always_inline struct site_slot *hinted_slot(const struct site_key *key,
						     __u32 hint)
{
	struct site_slot *s;

	if (!SITE_HINT_SLOT(hint))
		return NULL;
	s = cpu_slot(SITE_HINT_SLOT(hint) - 1);
	if (!s || !slot_holds(s, key->call_site, key->cache,
			      *(__u64 *)&key->kmalloc_size))
		return NULL;
	return s;
}

/* Counts an event under its site: in this CPU's slot, or else in `sites`.
 * A site new on this CPU or in `sites` has its cache's name recorded first,
 * so that a reader who finds its counts finds the name too. *created (if
 * given): the site is new to the run (it gets a first stack). `hint`: what
 * the event knows of its slot (SITE_HINT_KMALLOC); a kmalloc event's slot
 * found by search is remembered in the memo, so the site's next events on
 * this CPU go straight to it. False: `sites` was full. */
static __always_inline bool count_site(const struct site_key *key, __u64 req,
				       __u64 alloc, __u32 bucket,
				       const char *name, bool *created,
				       __u32 hint)
{
	__u32 zero = 0;
	struct site_slot_request *r;
	struct site_slot *hinted = hinted_slot(key, hint);
	int added = SLOT_NONE, result;
	struct alloc_stats *s;
	bool new_entry = false;

	if (hinted) {
		stats_add(&hinted->stats, req, alloc, bucket);
		return true;
	}
	r = bpf_map_lookup_elem(&site_slot_request, &zero);
	if (r && !r->busy) {
		r->busy = 1;
		r->key = *key;
		r->name = (__u64)name;
		added = site_slot_add(req, alloc, bucket);
		r->busy = 0;
	}
	result = added & SLOT_RESULT_MASK;
	if ((hint & SITE_HINT_KMALLOC) && result != SLOT_NONE)
		kmalloc_memo_remember_slot(key, added >> SLOT_RESULT_BITS);
	/* The new-site case is written out twice below (slot and map): one
	 * test of either made the verifier walk `leaks --by cgroup` 9%
	 * longer (827,629 instructions against 760,391). */
	if (result == SLOT_NEW_SITE) {
		COUNT(sites_created);
		if (created)
			*created = true;
	}
	if (result != SLOT_NONE)
		return true;
	s = bpf_map_lookup_elem(&sites, key);
	if (!s) {
		remember_cache_name(key->cache, name);
		s = stats_entry(&sites, (void *)key, &new_entry);
		if (!s)
			return false;
	}
	stats_add_shared(s, req, alloc, bucket);
	if (new_entry) {
		COUNT(sites_created);
		if (created)
			*created = true;
	}
	return true;
}
