// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * libkheap-preload.so: probe sites for `kheap malloc -- CMD`.
 *
 * A uprobe on the C library's malloc traps into the kernel on entry, again
 * on return (to learn the block) and once more in free: three kernel entries
 * per malloc+free pair, which cost more than the bpftrace one-liner kheap is
 * measured against (docs/benchmarks.md). This library, preloaded into the
 * traced command, defines the malloc family: each function calls the
 * definition that comes next in the search order (the C library's, or
 * jemalloc's or tcmalloc's when the program links one), then passes through
 * kheap_alloc_site() with everything the BPF program needs in argument
 * registers. free() passes through kheap_free_site() before freeing, while
 * the block is still its caller's (another thread cannot be handed the same
 * address and report it first).
 *
 * The sites start with a 5-byte NOP: Linux 6.18 and later turn a uprobe on
 * one into a call that enters the kernel without a trap; older kernels trap
 * on it like on any probed instruction. Not probed, a site costs a call and
 * a NOP. Forked children use other sites (see not_forked).
 *
 * Built with frame pointers: a site's frame_address argument is the frame of
 * the malloc-family function that called it, from which the BPF side finds
 * the stack as it was at that function's entry (bpf/malloc.bpf.c).
 *
 * The function numbers are the attach cookies of src/allocators.rs (its C
 * table's order), checked by a unit test there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

enum kheap_func {
	KHEAP_MALLOC = 0,
	KHEAP_CALLOC = 1,
	KHEAP_REALLOC = 2,
	KHEAP_REALLOCARRAY = 3,
	KHEAP_POSIX_MEMALIGN = 4,
	KHEAP_ALIGNED_ALLOC = 5,
	KHEAP_MEMALIGN = 6,
	KHEAP_VALLOC = 7,
	KHEAP_PVALLOC = 8,
};

#define VISIBLE __attribute__((visibility("default")))

/* (size, block, caller, function, old block, frame address) */
void kheap_alloc_site(size_t size, void *block, void *caller,
		      unsigned long func, void *old_block, void *frame);
/* (block, frame address) */
void kheap_free_site(void *block, void *frame);
/* The same, for forked children (see not_forked) */
void kheap_alloc_site_forked(size_t size, void *block, void *caller,
			     unsigned long func, void *old_block, void *frame);
void kheap_free_site_forked(void *block, void *frame);

/* The sites: a 5-byte NOP (nopl 0x0(%rax,%rax,1)) for the kernel to
 * optimize; the forked ones start with a jump to the next instruction,
 * which it emulates (a cheap trap) and never optimizes. Not push %rbp: on
 * 6.18 a stack captured at a probe on push %rbp gets the return address
 * added as a second frame (seen: the caller came twice), and the site's
 * frame would not be the only one to skip. */
#define SITE(name, first)                         \
	".globl " name "\n"                       \
	".type " name ", @function\n"             \
	".p2align 4\n" name ":\n" first "\tret\n" \
	".size " name ", .-" name "\n"
#if defined(__x86_64__)
#define NOP5	 "\t.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
#define JMP_NEXT "\t.byte 0xeb, 0x00\n" /* jmp .+2 */
#elif defined(__aarch64__)
/* arm64 kernels optimize no uprobe: both kinds of site are a NOP, which
 * the kernel emulates. */
#define NOP5	 "\tnop\n"
#define JMP_NEXT "\tnop\n"
#else
#error "the preload library is built for x86_64 and aarch64 only"
#endif

__asm__(".text\n" SITE("kheap_alloc_site", NOP5) SITE("kheap_free_site", NOP5)
		SITE("kheap_alloc_site_forked", JMP_NEXT)
			SITE("kheap_free_site_forked", JMP_NEXT));

/*
 * Linux 6.18 rewrites an optimized site into a call to a trampoline page it
 * maps into the process, but a forked child inherits the rewritten code
 * without the trampoline's mapping, and dies on its first call there
 * (SIGSEGV; seen with bpftrace alone). So the process that loaded this
 * library marks a page that fork() wipes: in a child it reads 0, and the
 * child uses the sites the kernel never rewrites. A vfork() child shares
 * the parent's memory, so it should see the trampoline too (not tested: it
 * normally only execs). Before the constructor ran,
 * the forked sites are used too.
 */
static volatile unsigned char *not_forked;

/* Inlined: the site must be called from the malloc-family function itself,
 * whose frame the BPF side skips. */
#define INLINE static inline __attribute__((always_inline))

INLINE int may_use_optimized_sites(void)
{
	return not_forked && *not_forked;
}

INLINE void alloc_site(size_t size, void *block, void *caller,
		       unsigned long func, void *old_block, void *frame)
{
	if (may_use_optimized_sites())
		kheap_alloc_site(size, block, caller, func, old_block, frame);
	else
		kheap_alloc_site_forked(size, block, caller, func, old_block,
					frame);
}

INLINE void free_site(void *block, void *frame)
{
	if (may_use_optimized_sites())
		kheap_free_site(block, frame);
	else
		kheap_free_site_forked(block, frame);
}

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void *(*next_reallocarray)(void *, size_t, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static void *(*next_memalign)(size_t, size_t);
static void *(*next_valloc)(size_t);
static void *(*next_pvalloc)(size_t);
static void (*next_free)(void *);

/*
 * dlsym() may allocate (glibc's calloc for its error state) while the next
 * definitions are looked up: those calls are served from this arena and
 * never freed. Nothing else uses it.
 */
static _Alignas(16) unsigned char bootstrap[16384];
static size_t bootstrap_used;
static int resolving;

static void *bootstrap_alloc(size_t size)
{
	size_t start = (bootstrap_used + 15) & ~(size_t)15;

	if (size > sizeof(bootstrap) - start)
		return NULL;
	bootstrap_used = start + size;
	return bootstrap + start;
}

static int in_bootstrap(const void *p)
{
	return (const unsigned char *)p >= bootstrap &&
	       (const unsigned char *)p < bootstrap + sizeof(bootstrap);
}

/* Before main (from the loader and constructors), in one thread. */
static void resolve(void)
{
	if (next_malloc || resolving)
		return;
	resolving = 1;
	next_calloc = dlsym(RTLD_NEXT, "calloc");
	next_realloc = dlsym(RTLD_NEXT, "realloc");
	next_reallocarray = dlsym(RTLD_NEXT, "reallocarray");
	next_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
	next_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
	next_memalign = dlsym(RTLD_NEXT, "memalign");
	next_valloc = dlsym(RTLD_NEXT, "valloc");
	next_pvalloc = dlsym(RTLD_NEXT, "pvalloc");
	next_free = dlsym(RTLD_NEXT, "free");
	/* last: its being set says every other one is */
	next_malloc = dlsym(RTLD_NEXT, "malloc");
	resolving = 0;
}

__attribute__((constructor)) static void init(void)
{
	void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (page != MAP_FAILED && !madvise(page, 4096, MADV_WIPEONFORK)) {
		*(unsigned char *)page = 1;
		not_forked = page;
	}
	resolve();
}

#define FRAME  __builtin_frame_address(0)
#define CALLER __builtin_return_address(0)

VISIBLE void *malloc(size_t size)
{
	void *p;

	if (!next_malloc) {
		resolve();
		if (!next_malloc)
			return bootstrap_alloc(size);
	}
	p = next_malloc(size);
	alloc_site(size, p, CALLER, KHEAP_MALLOC, NULL, FRAME);
	return p;
}

VISIBLE void *calloc(size_t n, size_t size)
{
	void *p;

	if (!next_malloc) {
		resolve();
		if (!next_malloc) {
			/* the arena is zeroed and never reused */
			if (size && n > SIZE_MAX / size)
				return NULL;
			return bootstrap_alloc(n * size);
		}
	}
	p = next_calloc(n, size);
	alloc_site(n * size, p, CALLER, KHEAP_CALLOC, NULL, FRAME);
	return p;
}

VISIBLE void free(void *p)
{
	if (in_bootstrap(p))
		return;
	free_site(p, FRAME);
	if (!next_malloc)
		resolve();
	if (next_free)
		next_free(p);
}

VISIBLE void *realloc(void *old, size_t size)
{
	void *p;

	if (!next_malloc || in_bootstrap(old)) {
		resolve();
		if (!next_malloc || in_bootstrap(old)) {
			/* a bootstrap block is copied out, never resized */
			p = next_malloc ? next_malloc(size)
					: bootstrap_alloc(size);
			if (p && old) {
				size_t room = bootstrap + sizeof(bootstrap) -
					      (unsigned char *)old;
				memcpy(p, old, size < room ? size : room);
			}
			return p;
		}
	}
	p = next_realloc(old, size);
	alloc_site(size, p, CALLER, KHEAP_REALLOC, old, FRAME);
	return p;
}

VISIBLE void *reallocarray(void *old, size_t n, size_t size)
{
	void *p;

	resolve();
	if (!next_reallocarray) {
		errno = ENOMEM;
		return NULL;
	}
	p = next_reallocarray(old, n, size);
	alloc_site(n * size, p, CALLER, KHEAP_REALLOCARRAY, old, FRAME);
	return p;
}

VISIBLE int posix_memalign(void **out, size_t align, size_t size)
{
	int err;

	resolve();
	if (!next_posix_memalign)
		return ENOMEM;
	err = next_posix_memalign(out, align, size);
	alloc_site(size, err ? NULL : *out, CALLER, KHEAP_POSIX_MEMALIGN, NULL,
		   FRAME);
	return err;
}

/* The rest only forward: (name, function number, parameters, arguments). */
#define FORWARD(name, id, params, args)                       \
	VISIBLE void *name params                             \
	{                                                     \
		void *p;                                      \
                                                              \
		resolve();                                    \
		if (!next_##name) {                           \
			errno = ENOMEM;                       \
			return NULL;                          \
		}                                             \
		p = next_##name args;                         \
		alloc_site(size, p, CALLER, id, NULL, FRAME); \
		return p;                                     \
	}

FORWARD(aligned_alloc, KHEAP_ALIGNED_ALLOC, (size_t align, size_t size),
	(align, size))
FORWARD(memalign, KHEAP_MEMALIGN, (size_t align, size_t size), (align, size))
FORWARD(valloc, KHEAP_VALLOC, (size_t size), (size))
FORWARD(pvalloc, KHEAP_PVALLOC, (size_t size), (size))
