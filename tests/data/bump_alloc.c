// A minimal allocator for tests/kernel_dependent/malloc.rs's --lib test: malloc, calloc,
// realloc and free only, from a static arena, never reused (free does
// nothing). Preloaded, it serves the program's calls to those four names;
// the rest of the family stays glibc's.
#include <stddef.h>
#include <string.h>

static char arena[64 << 20];
static size_t used;

void *malloc(size_t n)
{
	size_t at = (used + 15) & ~(size_t)15;
	// a header in front of each block keeps its size for realloc
	if (at + 16 + n > sizeof(arena))
		return NULL;
	used = at + 16 + n;
	*(size_t *)(arena + at) = n;
	return arena + at + 16;
}

void free(void *p)
{
	(void)p;
}

void *calloc(size_t n, size_t size)
{
	void *p = malloc(n * size);
	if (p)
		memset(p, 0, n * size);
	return p;
}

void *realloc(void *old, size_t n)
{
	void *p = malloc(n);
	if (p && old) {
		size_t had = *(size_t *)((char *)old - 16);
		memcpy(p, old, had < n ? had : n);
	}
	return p;
}
